"""Submit-time validation of a job's network policy, with the proxy's own parsing rules."""

from typing import Any

from sandcell.domain.errors import FieldError
from sandcell.egress.errors import EgressConfigError
from sandcell.egress.hosts import parse_host
from sandcell.egress.policy import EgressPolicy
from sandcell.egress.secrets import SecretRule

PROBE_VALUE = "probe"  # stands in for the real value, which the API never reads back


class EgressValidator:
    def check(self, allow: list[str], secrets: list[dict[str, Any]]) -> list[FieldError]:
        try:
            policy = EgressPolicy.build(allow)
        except EgressConfigError as exc:
            return exc.errors
        errors: list[FieldError] = []
        for index, spec in enumerate(secrets):
            try:
                rule = SecretRule.from_spec(spec, value=PROBE_VALUE, index=index)
            except EgressConfigError as exc:
                errors += exc.errors
                continue
            for host in sorted(rule.hosts):
                if not policy.allows_host(parse_host(host)):
                    errors.append(
                        FieldError(f"secrets.{index}.hosts", f"{host} is not in network.allow")
                    )
        return errors
