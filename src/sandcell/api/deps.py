"""What routes need from the composition root, and who is calling."""

from dataclasses import dataclass
from typing import Annotated

from anyio import to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sandcell.ports.images import ImageCatalog
from sandcell.ports.store import Store
from sandcell.services.auth import AuthService, Principal
from sandcell.services.files import FileService
from sandcell.services.jobs import JobService
from sandcell.services.secrets import SecretService
from sandcell.services.sessions import SessionService


@dataclass(frozen=True)
class Services:
    store: Store
    images: ImageCatalog
    auth: AuthService
    jobs: JobService
    files: FileService
    secrets: SecretService
    sessions: SessionService
    signed_url_ttl_s: float
    default_image: str


def services_of(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def services(request: Request) -> Services:
    """Async on purpose: FastAPI runs a sync dependency in a worker thread, a hop per request
    (about 1 ms on a busy host) for what is an attribute read."""
    return services_of(request)


bearer = HTTPBearer(auto_error=False, description="an API key: sc_<id>_<secret>")


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Async: a key checked lately is known without a read, and without a thread's hop."""
    header = f"Bearer {credentials.credentials}" if credentials else None
    auth = services_of(request).auth
    known = auth.at_hand(header)
    return known if known is not None else await to_thread.run_sync(auth.authenticate, header)


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    who.require("admin")
    return who


Svc = Annotated[Services, Depends(services)]
Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
