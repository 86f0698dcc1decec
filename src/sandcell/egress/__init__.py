"""The trusted egress proxy: allowlist, DNS pinning, secret header injection, audit.

policy = EgressPolicy.build(["api.example.com", "*.corp.example"])
secrets = (SecretRule.from_spec(spec, value=looked_up_value),)
proxy = EgressProxy(EgressConfig(policy, secrets, listen_host=veth_ip), on_event=record)
host, port = proxy.start()
env = sandbox_env(f"http://{host}:{port}", "/etc/sandcell/ca-bundle.pem")
...
proxy.stop()
"""

from sandcell.egress.audit import EgressEvent, EventSink
from sandcell.egress.certs import JobCertificateAuthority
from sandcell.egress.config import EgressConfig, ProxyLimits
from sandcell.egress.env import CA_BUNDLE_VARIABLES, ca_bundle, sandbox_env
from sandcell.egress.errors import EgressConfigError, EgressDenied
from sandcell.egress.policy import EgressPolicy
from sandcell.egress.resolve import Resolver, StaticResolver, SystemResolver
from sandcell.egress.secrets import RedactingFilter, Redactor, SecretRule
from sandcell.egress.server import EgressProxy, EgressServer

__all__ = [
    "CA_BUNDLE_VARIABLES",
    "EgressConfig",
    "EgressConfigError",
    "EgressDenied",
    "EgressEvent",
    "EgressPolicy",
    "EgressProxy",
    "EgressServer",
    "EventSink",
    "JobCertificateAuthority",
    "ProxyLimits",
    "RedactingFilter",
    "Redactor",
    "Resolver",
    "SecretRule",
    "StaticResolver",
    "SystemResolver",
    "ca_bundle",
    "sandbox_env",
]
