"""The trusted egress proxy: allowlist, DNS pinning, secret header injection, audit.

The worker uses it through the Egress port:

    egress = ProxyEgress(state_dir)  # operator settings as keywords
    session = egress.open(job_id, allow, secrets, image_ca=rootfs / "etc/ssl/certs/...")
    spec = SandboxSpec(..., env=job_env | session.env(), egress=session.attachment)
    ...
    session.close(); record(session.events())

Underneath, one proxy per job:

    policy = EgressPolicy.build(["api.example.com", "*.corp.example"])
    secrets = (SecretRule.from_spec(spec, value=looked_up_value),)
    proxy = EgressProxy(EgressConfig(policy, secrets), on_event=record)
    proxy.start_unix(socket_path)  # or, for tests: host, port = proxy.start()
    ...
    proxy.stop()
"""

from sandcell.egress.audit import EgressEvent, EventSink
from sandcell.egress.certs import JobCertificateAuthority
from sandcell.egress.config import EgressConfig, ProxyLimits
from sandcell.egress.env import CA_BUNDLE_VARIABLES, ca_bundle, sandbox_env
from sandcell.egress.errors import EgressConfigError, EgressDenied
from sandcell.egress.gateway import ProxyEgress, ProxySession
from sandcell.egress.policy import EgressPolicy
from sandcell.egress.resolve import Resolver, StaticResolver, SystemResolver
from sandcell.egress.secrets import Redactor, SecretRule
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
    "ProxyEgress",
    "ProxyLimits",
    "ProxySession",
    "Redactor",
    "Resolver",
    "SecretRule",
    "StaticResolver",
    "SystemResolver",
    "ca_bundle",
    "sandbox_env",
]
