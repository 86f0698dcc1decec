"""Checks shared by jobs and sessions: image, limits, inputs, network and secret bindings."""

from dataclasses import replace
from typing import Any

from sandcell.domain.errors import FieldError, ImageUnavailable
from sandcell.domain.limits import Limits, out_of_range
from sandcell.domain.records import InputRef, Tenant
from sandcell.ports.images import ImageCatalog
from sandcell.ports.secrets import NetworkValidator
from sandcell.ports.store import Store


class RequestValidator:
    def __init__(
        self,
        store: Store,
        images: ImageCatalog,
        default_limits: Limits,
        max_limits: Limits,
        network: NetworkValidator | None,
    ) -> None:
        self.store, self.images, self.network = store, images, network
        self.default_limits, self.max_limits = default_limits, max_limits

    def image_errors(
        self, tenant: Tenant, image: str, *, session: bool = False
    ) -> list[FieldError]:
        if tenant.images is not None and image not in tenant.images:
            return [FieldError("image", f"image {image!r} is not allowed for this tenant")]
        try:
            found = self.images.get(image)
        except ImageUnavailable:
            known = ", ".join(self.images.names()) or "none"
            return [FieldError("image", f"unknown image {image!r}; available: {known}")]
        if session and not found.kernel:
            # Sessions run an IPython kernel; without it the sandbox would boot and then fail.
            return [FieldError("image", f"image {image!r} has no IPython: it runs jobs only")]
        return []

    def limits(self, tenant: Tenant, requested: dict[str, Any]) -> tuple[Limits, list[FieldError]]:
        """The caller's limits over the defaults, each within the tenant's maxima."""
        maximum = replace(self.max_limits, **tenant.limits)
        problems = out_of_range(requested, maximum)
        errors = [FieldError(f"limits.{name}", msg) for name, msg in problems.items()]
        defaults = {
            name: min(getattr(self.default_limits, name), getattr(maximum, name))
            for name in Limits.names()
        }
        return Limits(**(defaults | requested)), errors

    def input_errors(self, tenant: Tenant, inputs: list[InputRef]) -> list[FieldError]:
        errors, seen = [], set()
        for i, ref in enumerate(inputs):
            if ref.path in seen:
                errors.append(FieldError(f"inputs.{i}.path", "duplicate input path"))
            seen.add(ref.path)
            if self.store.get_file(tenant.id, ref.file_id) is None:
                errors.append(FieldError(f"inputs.{i}.file_id", "no such file"))
        return errors

    def network_errors(
        self, tenant: Tenant, network: dict[str, Any], secrets: list[dict[str, Any]]
    ) -> list[FieldError]:
        allow = list(network.get("allow", []))
        if not allow and not secrets:
            return []
        if self.network is None:
            # Fail closed: without an egress proxy a request asking for network is refused,
            # never run under a policy other than the one it asked for.
            return [FieldError("network.allow", "egress is not enabled on this server")]
        errors = self.network.check(allow, secrets)
        names = [str(spec.get("name", "")) for spec in secrets]
        found = self.store.secret_ciphertexts(tenant.id, names)
        errors += [
            FieldError(f"secrets.{i}.name", "no such secret; create it with POST /v1/secrets")
            for i, name in enumerate(names)
            if name not in found
        ]
        return errors
