"""An image: a named, versioned, approved root filesystem with a recorded digest."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Image:
    name: str
    version: str
    digest: str  # "sha256:<hex>" over the root filesystem's paths, modes and contents
    rootfs: Path
    python: str = "/usr/bin/python3.11"  # interpreters are started by absolute path
    kernel: bool = True  # it has IPython, so it can host a session's kernel
