"""Images: build an approved root filesystem once, record its digest, find it again.

Layout under `images_dir`::

    <name>/<version>/manifest.json   name, version, digest, built_at, recipe, python
    <name>/<version>/rootfs/         the read-only root every sandbox of that image shares

A build happens in a temporary sibling directory and is renamed into place only when it is
complete, so a crash mid-build never leaves something that looks like a usable image.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandcell.domain.errors import ImageUnavailable
from sandcell.domain.images import Image
from sandcell.ports.egress import GUEST_CA_BUNDLE, GUEST_SOCKET_DIR
from sandcell.ports.runtime import GUEST_CHANNEL_DIR
from sandcell.ports.sessions import GUEST_PACKAGE_DIR
from sandcell.runtime.digest import tree_digest
from sandcell.runtime.guest_mounts import release_guest_package
from sandcell.runtime.mirror import debian_mirror

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
MANIFEST = "manifest.json"
MOUNT_POINTS = ("job", "input", "workspace", "output")  # the root is read-only: made at build
# Where a job with egress gets its proxy socket dir and CA bundle: made at build for the same
# reason. (runsc 20221219 would make a missing one itself, in the shared host rootfs, despite
# root.readonly, changing the image under its digest: bundle.require_mount_points refuses.)
EGRESS_MOUNT_DIR = GUEST_SOCKET_DIR.lstrip("/")
EGRESS_MOUNT_FILE = GUEST_CA_BUNDLE.lstrip("/")
BUILD_TIMEOUT_S = 900
COMPILE_TIMEOUT_S = 120
COMPILE_SHARED = ("cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-x", "c")  # source: stdin
# Made by the host's C compiler at build: statx for the runsc this runs on (statx_compat.c).
STATX_COMPAT = (
    "usr/lib/sandcell/libstatx-compat.so",
    (Path(__file__).parent / "statx_compat.c").read_text(),
)
PRELOAD_LIST = "etc/ld.so.preload"
# Bound on the host while sandboxes run (guest_mounts.ensure_guest_package): not the image's.
HOST_MOUNT_POINTS = (GUEST_PACKAGE_DIR.lstrip("/"),)


@dataclass(frozen=True)
class Recipe:
    """How an image is made. Changing any field makes the next build replace the image."""

    name: str
    version: str
    # Debian packages for debootstrap; `name=version` pins one to an exact Debian version.
    packages: tuple[str, ...]
    suite: str = "bookworm"
    variant: str = "minbase"
    # pip requirements (pinned) installed into the rootfs after debootstrap; `python-data`
    # will use it (numpy, pandas, matplotlib). Not implemented yet: see `_install_pip`.
    pip: tuple[str, ...] = ()
    python: str = "/usr/bin/python3.11"
    # (path in the rootfs, text) written after debootstrap, e.g. a headless matplotlibrc.
    files: tuple[tuple[str, str], ...] = ()
    # (path in the rootfs, C source): shared libraries compiled at build and preloaded into
    # every process of the image (/etc/ld.so.preload), e.g. STATX_COMPAT.
    preload: tuple[tuple[str, str], ...] = ()

    def package_names(self) -> list[str]:
        return [package.partition("=")[0] for package in self.packages]

    def pins(self) -> dict[str, str]:
        """Package -> the exact Debian version the recipe requires."""
        split = (package.partition("=") for package in self.packages)
        return {name: version for name, _, version in split if version}

    def as_dict(self) -> dict[str, Any]:
        # JSON's shape (lists all the way down), so it compares equal to a manifest's recipe.
        data: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        for later in ("files", "preload"):  # recipes built before a field existed stay up to date
            if not data[later]:
                del data[later]
        return data


# What programs and agents reach for in any peer's image: `python3` and `python`, and `ps`,
# `free` and `top` (procps).
COMMANDS = ("python3", "python-is-python3", "procps")

RECIPES: dict[str, Recipe] = {
    "python": Recipe(
        name="python",
        # 2: mount points for the egress socket and CA bundle; 3: guest channel; 4: statx and
        # the commands below
        version="4",
        packages=(*("python3.11-minimal", "libpython3.11-stdlib", "ca-certificates"), *COMMANDS),
        preload=(STATX_COMPAT,),
    ),
    # Debian's own builds from the configured mirror. numpy, pandas, matplotlib and IPython
    # are pinned: a mirror that serves other versions fails the build (debootstrap cannot
    # choose a version). The manifest records every installed package's version. IPython
    # runs session kernels. The rest is what model-written analysis code imports most, as in
    # peers' code-interpreter images: seaborn, scikit-learn, openpyxl (pandas' .xlsx), and
    # requests and Beautiful Soup for an allowed host.
    "python-data": Recipe(
        name="python-data",
        # 2: the guest channel's mount point; 3: the pins; 4: statx and COMMANDS; 5: the rest of
        # the packages. A new version is a new directory, so sandboxes running on version 4
        # keep their root while 5 is built.
        version="5",
        packages=(
            *("python3.11-minimal", "libpython3.11-stdlib", "ca-certificates", "socat"),
            *COMMANDS,
            "python3-numpy=1:1.24.2-1+deb12u1",  # numpy 1.24.2
            "python3-pandas=1.5.3+dfsg-2",  # pandas 1.5.3
            "python3-matplotlib=3.6.3-1+b1",  # matplotlib 3.6.3
            "python3-ipython=8.5.0-4",  # IPython 8.5.0
            *("python3-seaborn", "python3-sklearn", "python3-openpyxl"),
            *("python3-requests", "python3-bs4"),
        ),
        # Debian's site rc says TkAgg; a sandbox has no display. Defaults come from mpl-data.
        files=(("etc/matplotlibrc", "backend: Agg\n"),),
        preload=(STATX_COMPAT,),
    ),
}


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    digest: str
    built_at: str
    recipe: dict[str, Any]
    python: str
    mirror: str = ""
    packages: dict[str, str] = field(default_factory=dict)  # every installed package: version

    def image(self, version_dir: Path) -> Image:
        rootfs = version_dir / "rootfs"
        return Image(self.name, self.version, self.digest, rootfs, self.python, self.has_ipython())

    def has_ipython(self) -> bool:
        pip = (spec.partition("=")[0].lower() for spec in self.recipe.get("pip", []))
        return "python3-ipython" in self.packages or "ipython" in pip


def build_image(name: str, images_dir: Path, *, force: bool = False) -> Image:
    """Build image `name` into `images_dir` unless it is already built from the same recipe."""
    recipe = _recipe(name)
    final = images_dir / recipe.name / recipe.version
    existing = _read_manifest(final)
    if existing and _built_from(existing, recipe) and not force:
        return existing.image(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Same parent as the final directory: the rename into place is atomic on one filesystem.
    work = Path(tempfile.mkdtemp(prefix=f".build-{recipe.version}-", dir=final.parent))
    work.chmod(0o755)  # the API reads manifests without root; mkdtemp makes it 0700
    try:
        _build_into(recipe, work)
        done = _read_manifest(final)
        # A concurrent build of the same recipe that finished first stays: its digest is
        # the recorded one, and sandboxes may already run on its root.
        if force or not (done and _built_from(done, recipe)):
            _install(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    installed = _read_manifest(final)  # ours, or a concurrent build's that got there first
    if installed is None:
        raise ImageUnavailable(f"image {name!r}: build finished but no manifest is in place")
    return installed.image(final)


LOOKED_UP_S = 1.0


def verify(image: Image, *, full: bool = False) -> None:
    """Raise ImageUnavailable unless `image` is still what its manifest says.

    The cheap check (manifest digest and rootfs present) runs before every job; `full`
    re-hashes the whole tree and is meant for `sandcell image verify` and audits.
    """
    version_dir = image.rootfs.parent
    manifest = _read_manifest(version_dir)
    if manifest is None or manifest.digest != image.digest or not image.rootfs.is_dir():
        raise ImageUnavailable(f"image {image.name!r} {image.version} is missing or was rebuilt")
    if full and tree_digest(image.rootfs, HOST_MOUNT_POINTS) != image.digest:
        raise ImageUnavailable(f"image {image.name!r} {image.version}: digest no longer matches")


class FilesystemImageCatalog:
    """The ImageCatalog over `images_dir`: trusts manifests, checks the rootfs exists.

    An image found is served for LOOKED_UP_S without another look at the disk (every submit
    and every claim asks for one): a new build is served within that.
    """

    def __init__(self, images_dir: Path) -> None:
        self.images_dir = images_dir
        self._found: dict[str, tuple[Image, float]] = {}

    def get(self, name: str) -> Image:
        if not NAME.match(name):  # names come from requests: never let them walk the disk
            raise ImageUnavailable(f"image {name!r} is not a valid image name")
        found = self._found.get(name)
        if found is not None and time.monotonic() - found[1] < LOOKED_UP_S:
            return found[0]
        builds = self._builds(name)
        if not builds:
            raise ImageUnavailable(
                f"image {name!r} is not built; run `sandcell image build {name}`"
            )
        version_dir, manifest = builds[-1]
        image = manifest.image(version_dir)
        self._found[name] = (image, time.monotonic())
        return image

    def names(self) -> list[str]:
        if not self.images_dir.is_dir():
            return []
        found = (p.name for p in self.images_dir.iterdir() if NAME.match(p.name))
        return sorted(name for name in found if self._builds(name))

    def _builds(self, name: str) -> list[tuple[Path, Manifest]]:
        """Usable builds of `name`, oldest first (the last one is served)."""
        base = self.images_dir / name
        if not base.is_dir():
            return []
        builds = []
        for version_dir in base.iterdir():
            manifest = _read_manifest(version_dir)
            if manifest and manifest.name == name and (version_dir / "rootfs").is_dir():
                builds.append((version_dir, manifest))
        return sorted(builds, key=lambda b: b[1].built_at)


def _built_from(manifest: Manifest, recipe: Recipe) -> bool:
    return manifest.recipe == recipe.as_dict()


def _recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        known = ", ".join(sorted(RECIPES))
        raise ImageUnavailable(f"no recipe for image {name!r}; known: {known}") from None


def _build_into(recipe: Recipe, work: Path) -> Manifest:
    rootfs = work / "rootfs"
    mirror = debian_mirror()
    _debootstrap(recipe, rootfs, mirror)
    packages = _installed_packages(rootfs)
    wrong = pin_mismatches(recipe, packages)
    if wrong:
        raise ImageUnavailable(
            f"image {recipe.name!r}: the mirror {mirror} did not serve the pinned versions: "
            + "; ".join(wrong)
            + ". Point apt at a (snapshot) mirror that serves them, or change the pins."
        )
    _install_pip(recipe, rootfs)
    _harden(rootfs)
    _write_files(recipe, rootfs)
    _build_preloads(recipe, rootfs)
    manifest = Manifest(
        name=recipe.name,
        version=recipe.version,
        digest=tree_digest(rootfs, HOST_MOUNT_POINTS),
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
        recipe=recipe.as_dict(),
        python=recipe.python,
        mirror=mirror,
        packages=packages,
    )
    if not (rootfs / recipe.python.lstrip("/")).exists():
        raise ImageUnavailable(f"image {recipe.name!r}: {recipe.python} missing after build")
    _write_json(work / MANIFEST, asdict(manifest))
    return manifest


def _debootstrap(recipe: Recipe, rootfs: Path, mirror: str) -> None:
    cmd = [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.package_names())}",
        recipe.suite,
        str(rootfs),
        mirror,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageUnavailable(f"image {recipe.name!r}: debootstrap failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-2000:]
        raise ImageUnavailable(f"image {recipe.name!r}: debootstrap failed:\n{tail}")


def _install_pip(recipe: Recipe, rootfs: Path) -> None:
    if recipe.pip:  # python-data will pip-install pinned wheels here, offline from a cache
        raise ImageUnavailable(f"image {recipe.name!r}: pip steps are not supported yet")


def _write_files(recipe: Recipe, rootfs: Path) -> None:
    for relpath, text in recipe.files:
        _replace_file(_inside(recipe, rootfs, relpath), text)  # a symlink there is replaced


def _build_preloads(recipe: Recipe, rootfs: Path) -> None:
    """Compile each preload library into the rootfs and list them in /etc/ld.so.preload."""
    if not recipe.preload:
        return
    for relpath, source in recipe.preload:
        target = _inside(recipe, rootfs, relpath)
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                [*COMPILE_SHARED, "-o", str(target), "-"],
                input=source,
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            detail = f"image {recipe.name!r}: cannot compile {relpath}: {exc}"
            raise ImageUnavailable(detail) from exc
        if done.returncode != 0:
            detail = done.stderr.strip()[-1000:]
            raise ImageUnavailable(f"image {recipe.name!r}: cannot compile {relpath}: {detail}")
        target.chmod(0o644)
    listed = "".join(f"/{relpath}\n" for relpath, _ in recipe.preload)
    _replace_file(_inside(recipe, rootfs, PRELOAD_LIST), listed)


def _inside(recipe: Recipe, rootfs: Path, relpath: str) -> Path:
    """`rootfs/relpath`, unless its directory leads out of the rootfs (a symlink in it)."""
    path = rootfs / relpath
    parent = path.parent
    while not parent.exists():  # made later: the part that exists must not lead out
        parent = parent.parent
    if not parent.resolve().is_relative_to(rootfs.resolve()):
        raise ImageUnavailable(f"image {recipe.name!r}: {relpath} leads out of the rootfs")
    return path


def pin_mismatches(recipe: Recipe, installed: dict[str, str]) -> list[str]:
    """Each pinned package whose installed version is not its pin, said for a person."""
    return [
        f"{name} {installed.get(name, 'missing')} (pinned {version})"
        for name, version in recipe.pins().items()
        if installed.get(name) != version
    ]


def _installed_packages(rootfs: Path) -> dict[str, str]:
    """Package -> version of everything dpkg in the rootfs has installed."""
    cmd = ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f"]
    cmd.append("${db:Status-Abbrev}\t${Package}\t${Version}\n")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageUnavailable(f"cannot list the image's packages: {done.stderr.strip()[-300:]}")
    rows = (line.split("\t") for line in done.stdout.splitlines())
    return {row[1]: row[2] for row in rows if len(row) == 3 and row[0].startswith("ii")}


def _harden(rootfs: Path) -> None:
    """Strip what a sandbox must not see or use from a fresh debootstrap tree."""
    for mount_point in MOUNT_POINTS:
        (rootfs / mount_point).mkdir(mode=0o755, exist_ok=True)
    (rootfs / EGRESS_MOUNT_DIR).mkdir(mode=0o755, parents=True, exist_ok=True)
    (rootfs / EGRESS_MOUNT_FILE).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _replace_file(rootfs / EGRESS_MOUNT_FILE, "")
    # Where the guest package (sessions' kernel, jobs' sandcell_guest) and a job's guest channel
    # are mounted from the host (read-only): not part of the image.
    for guest_dir in (GUEST_PACKAGE_DIR, GUEST_CHANNEL_DIR):
        (rootfs / guest_dir.lstrip("/")).mkdir(mode=0o755, parents=True, exist_ok=True)
    # debootstrap copies the host's resolver and hostname; a sandbox gets neither.
    _replace_file(rootfs / "etc/resolv.conf", "")
    _replace_file(rootfs / "etc/hostname", "sandbox\n")
    _replace_file(rootfs / "etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    for cache in ("var/cache/apt", "var/lib/apt/lists"):
        _empty_dir(rootfs / cache)
    _drop_setid_bits(rootfs)


def _replace_file(path: Path, text: str) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(text)
    path.chmod(0o644)


def _empty_dir(path: Path) -> None:
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _drop_setid_bits(rootfs: Path) -> None:
    """No setuid/setgid binaries: no_new_privs already neuters them; this is belt and braces."""
    for dirpath, _dirs, files in os.walk(rootfs):
        for name in files:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if mode & 0o6000 and not os.path.islink(path):
                os.chmod(path, mode & 0o1777)


def _install(work: Path, final: Path) -> None:
    """Move a finished build to `final`, replacing an older build of the same version."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        final.rename(old)
    try:
        work.rename(final)
    except OSError:
        if old is not None:
            old.rename(final)
        if _read_manifest(final) is None:  # a concurrent build did not win either
            raise
    if old is not None:
        release_guest_package(old / "rootfs")  # else rmtree would walk into the package
        shutil.rmtree(old, ignore_errors=True)


def _read_manifest(version_dir: Path) -> Manifest | None:
    try:
        data = json.loads((version_dir / MANIFEST).read_text())
        known = {f.name for f in fields(Manifest)}  # newer builds may add fields: ignore them
        return Manifest(**{k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2, sort_keys=True)
        out.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
