"""The image catalog port: which approved images exist and where their root is."""

from typing import Protocol

from sandcell.domain.images import Image


class ImageCatalog(Protocol):
    def get(self, name: str) -> Image:
        """The built image called `name`; raise ImageUnavailable if it is not built."""

    def names(self) -> list[str]:
        """Names of the images that are built and usable."""
