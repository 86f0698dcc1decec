"""Images: the real debootstrap-built `python` and `python-data` images, manifests and digests,
the catalog."""

import json
import os
import shutil
import stat
import time
from dataclasses import replace
from importlib.metadata import distributions
from pathlib import Path

import pytest

from sandcell.domain.errors import ImageUnavailable
from sandcell.domain.images import Image
from sandcell.runtime.digest import tree_digest
from sandcell.runtime.guest_mounts import ensure_guest_package
from sandcell.runtime.images import (
    LOOKED_UP_S,
    RECIPES,
    STATX_COMPAT,
    FilesystemImageCatalog,
    Recipe,
    _build_preloads,
    build_image,
    pin_mismatches,
    verify,
)
from sandcell.runtime.mirror import debian_mirror
from tests.integration.conftest import IMAGE_DIR

# --- the built image (needs root: debootstrap) -----------------------------------------------


@pytest.mark.gvisor
def test_building_again_returns_the_same_image_without_rebuilding(python_image: Image) -> None:
    manifest_before = (python_image.rootfs.parent / "manifest.json").read_text()
    started = time.monotonic()
    again = build_image("python", IMAGE_DIR)
    assert time.monotonic() - started < 5  # no debootstrap the second time
    assert again == python_image
    assert (python_image.rootfs.parent / "manifest.json").read_text() == manifest_before


@pytest.mark.gvisor
def test_manifest_records_what_was_built(python_image: Image) -> None:
    manifest = json.loads((python_image.rootfs.parent / "manifest.json").read_text())
    assert manifest["name"] == "python" and manifest["version"] == RECIPES["python"].version
    assert manifest["digest"] == python_image.digest
    assert manifest["digest"].startswith("sha256:") and len(manifest["digest"]) == 71
    assert manifest["python"] == "/usr/bin/python3.11"
    assert manifest["recipe"] == RECIPES["python"].as_dict()
    assert manifest["built_at"].endswith("+00:00")


@pytest.mark.gvisor
def test_python_data_manifest_records_the_pinned_versions_and_its_digest(
    python_data_image: Image,
) -> None:
    manifest = json.loads((python_data_image.rootfs.parent / "manifest.json").read_text())
    recipe = RECIPES["python-data"]
    assert manifest["version"] == recipe.version and manifest["recipe"] == recipe.as_dict()
    pins = recipe.pins()
    assert set(pins) == {"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-ipython"}
    assert {name: manifest["packages"][name] for name in pins} == pins
    assert manifest["digest"] == python_data_image.digest
    assert manifest["digest"].startswith("sha256:") and len(manifest["digest"]) == 71
    # What Python itself sees in the image: the upstream versions behind those Debian pins.
    site = python_data_image.rootfs / "usr/lib/python3/dist-packages"
    found = {d.metadata["Name"].lower(): d.version for d in distributions(path=[str(site)])}
    wanted = {"numpy": "1.24.2", "pandas": "1.5.3", "matplotlib": "3.6.3", "ipython": "8.5.0"}
    assert {name: found.get(name) for name in wanted} == wanted


@pytest.mark.gvisor
def test_rootfs_is_hardened(python_image: Image) -> None:
    root = python_image.rootfs
    assert (root / "usr/bin/python3.11").is_file()
    for mount_point in ("job", "input", "workspace", "output", "tmp"):
        assert (root / mount_point).is_dir(), mount_point
    assert (root / "etc/resolv.conf").read_text() == ""  # no DNS, no host resolver
    assert (root / "etc/hostname").read_text() == "sandbox\n"  # not the build host's name
    assert list((root / "var/cache/apt").iterdir()) == []
    assert list((root / "var/lib/apt/lists").iterdir()) == []
    setid = [
        os.path.join(d, f)
        for d, _, files in os.walk(root)
        for f in files
        if not os.path.islink(os.path.join(d, f))
        and os.lstat(os.path.join(d, f)).st_mode & (stat.S_ISUID | stat.S_ISGID)
    ]
    assert setid == []


@pytest.mark.gvisor
def test_every_process_of_the_image_preloads_its_statx(python_image: Image) -> None:
    library, source = STATX_COMPAT
    assert RECIPES["python"].preload == RECIPES["python-data"].preload == (STATX_COMPAT,)
    root = python_image.rootfs
    assert (root / "etc/ld.so.preload").read_text() == f"/{library}\n"
    built = root / library
    assert built.read_bytes()[:4] == b"\x7fELF" and stat.S_IMODE(built.stat().st_mode) == 0o644
    assert "AT_NO_AUTOMOUNT" in source


def test_a_preload_that_does_not_compile_or_leads_out_fails_the_build(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    broken = Recipe("x", "1", (), preload=(("usr/lib/x.so", "int f( {"),))
    with pytest.raises(ImageUnavailable, match=r"image 'x': cannot compile usr/lib/x\.so: .*error"):
        _build_preloads(broken, rootfs)
    (rootfs / "usr").mkdir(exist_ok=True)
    (rootfs / "usr" / "out").symlink_to(tmp_path)
    outside = Recipe("x", "1", (), preload=(("usr/out/lib/x.so", "int f(void) { return 0; }"),))
    with pytest.raises(ImageUnavailable, match=r"usr/out/lib/x\.so leads out of the rootfs"):
        _build_preloads(outside, rootfs)
    assert not (tmp_path / "lib").exists()
    made = Recipe("x", "1", (), preload=(("usr/lib/y.so", "int f(void) { return 0; }"),))
    _build_preloads(made, rootfs)
    assert (rootfs / "etc/ld.so.preload").read_text() == "/usr/lib/y.so\n"
    assert (rootfs / "usr/lib/y.so").read_bytes()[:4] == b"\x7fELF"


@pytest.mark.gvisor
def test_catalog_serves_the_built_image_and_verify_checks_it(python_image: Image) -> None:
    catalog = FilesystemImageCatalog(IMAGE_DIR)
    assert "python" in catalog.names()
    assert catalog.get("python") == python_image
    verify(python_image)
    ensure_guest_package(python_image.rootfs)  # as while sandboxes run: not the image's
    verify(python_image, full=True)  # re-hash: the tree is still what the manifest says
    with pytest.raises(ImageUnavailable, match="rebuilt"):
        verify(replace(python_image, digest="sha256:" + "0" * 64))


# --- catalog, digest and mirror on small trees (no root needed) ------------------------------


def _fake_build(images_dir: Path, name: str, version: str, built_at: str) -> Path:
    version_dir = images_dir / name / version
    (version_dir / "rootfs").mkdir(parents=True)
    manifest = {
        "name": name,
        "version": version,
        "digest": "sha256:" + "a" * 64,
        "built_at": built_at,
        "recipe": {},
        "python": "/usr/bin/python3.11",
    }
    (version_dir / "manifest.json").write_text(json.dumps(manifest))
    return version_dir


def test_catalog_says_how_to_build_a_missing_image(tmp_path: Path) -> None:
    catalog = FilesystemImageCatalog(tmp_path)
    with pytest.raises(ImageUnavailable) as missing:
        catalog.get("python-data")
    assert missing.value.detail == (
        "image 'python-data' is not built; run `sandcell image build python-data`"
    )
    assert catalog.names() == []


@pytest.mark.parametrize("name", ["../etc", "/abs", "Python", "a/b", "", "x" * 40])
def test_catalog_rejects_names_that_could_walk_the_disk(tmp_path: Path, name: str) -> None:
    with pytest.raises(ImageUnavailable, match="not a valid image name"):
        FilesystemImageCatalog(tmp_path).get(name)


def test_catalog_serves_the_newest_complete_build(tmp_path: Path) -> None:
    _fake_build(tmp_path, "python", "1", "2026-01-01T00:00:00+00:00")
    newest = _fake_build(tmp_path, "python", "2", "2026-02-01T00:00:00+00:00")
    half = _fake_build(tmp_path, "python", "3", "2026-03-01T00:00:00+00:00")
    shutil.rmtree(half / "rootfs")  # a manifest without its rootfs is not usable
    (tmp_path / "python" / ".build-4-x").mkdir()  # an unfinished build is ignored
    image = FilesystemImageCatalog(tmp_path).get("python")
    assert (image.version, image.rootfs) == ("2", newest / "rootfs")
    assert FilesystemImageCatalog(tmp_path).names() == ["python"]


def test_a_new_build_is_served_within_a_second_of_the_last_look(tmp_path: Path) -> None:
    catalog = FilesystemImageCatalog(tmp_path)
    _fake_build(tmp_path, "python", "1", "2026-01-01T00:00:00+00:00")
    assert catalog.get("python").version == "1"
    _fake_build(tmp_path, "python", "2", "2026-02-01T00:00:00+00:00")
    looked = time.monotonic()
    while (served := catalog.get("python").version) == "1":
        assert time.monotonic() - looked < LOOKED_UP_S + 0.5
        time.sleep(0.05)
    assert served == "2"


def test_pins_are_exact_debian_versions_and_a_mismatch_is_named() -> None:
    recipe = Recipe("x", "1", ("python3.11-minimal", "python3-numpy=1:1.24.2-1+deb12u1"))
    assert recipe.package_names() == ["python3.11-minimal", "python3-numpy"]
    assert recipe.pins() == {"python3-numpy": "1:1.24.2-1+deb12u1"}
    assert pin_mismatches(recipe, {"python3-numpy": "1:1.24.2-1+deb12u1"}) == []
    assert pin_mismatches(recipe, {"python3-numpy": "1:1.24.2-1+deb12u2"}) == [
        "python3-numpy 1:1.24.2-1+deb12u2 (pinned 1:1.24.2-1+deb12u1)"
    ]
    assert pin_mismatches(recipe, {}) == ["python3-numpy missing (pinned 1:1.24.2-1+deb12u1)"]


def test_building_an_unknown_recipe_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ImageUnavailable, match="no recipe for image 'ruby'; known: python"):
        build_image("ruby", tmp_path)


def _small_tree(root: Path) -> Path:
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "file").write_bytes(b"content")
    (root / "link").symlink_to("dir/file")
    (root / "empty").mkdir()
    return root


def test_digest_is_deterministic_and_ignores_timestamps(tmp_path: Path) -> None:
    first = _small_tree(tmp_path / "a")
    second = _small_tree(tmp_path / "b")
    os.utime(second / "dir" / "file", (0, 0))
    assert tree_digest(first) == tree_digest(second)
    assert tree_digest(first).startswith("sha256:")


@pytest.mark.parametrize("change", ["content", "mode", "link", "new-file", "rename"])
def test_digest_changes_with_any_content_mode_or_link_change(tmp_path: Path, change: str) -> None:
    root = _small_tree(tmp_path / "t")
    before = tree_digest(root)
    if change == "content":
        (root / "dir" / "file").write_bytes(b"Content")
    elif change == "mode":
        (root / "dir" / "file").chmod(0o600)
    elif change == "link":
        (root / "link").unlink()
        (root / "link").symlink_to("dir/other")
    elif change == "new-file":
        (root / "empty" / "x").write_bytes(b"")
    else:
        (root / "dir" / "file").rename(root / "dir" / "file2")
    assert tree_digest(root) != before


def test_a_host_mount_point_counts_as_the_empty_directory_a_build_leaves(tmp_path: Path) -> None:
    """What is bound on the guest package's mount point while sandboxes run is not the image's;
    a mount point digested so matches the tree as built; the rest of the tree still counts."""
    root = _small_tree(tmp_path / "t")
    (root / "empty").chmod(0o755)
    if os.geteuid() == 0:
        os.chown(root / "empty", 0, 0)
    as_built = tree_digest(root)
    assert tree_digest(root, ("empty",)) == as_built
    (root / "empty" / "package.py").write_bytes(b"x")
    (root / "empty").chmod(0o700)
    assert tree_digest(root, ("empty",)) == as_built
    (root / "dir" / "file").write_bytes(b"changed")
    assert tree_digest(root, ("empty",)) != as_built


def test_mirror_comes_from_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.local/debian-security\nSuites: bookworm-security\n\n"
        "# comment\nTypes: deb deb-src\nURIs: http://mirror.local/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror(apt_dir=tmp_path) == "http://mirror.local/debian"


def test_mirror_falls_back_to_sources_list_then_the_default(tmp_path: Path) -> None:
    assert debian_mirror(apt_dir=tmp_path) == "http://deb.debian.org/debian"
    (tmp_path / "sources.list").write_text(
        "deb http://x.local/debian bookworm-updates main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://x.local/debian bookworm main\n"
    )
    assert debian_mirror(apt_dir=tmp_path) == "http://x.local/debian"


@pytest.mark.gvisor
def test_only_an_image_with_ipython_can_host_a_session_kernel(
    python_image: Image, python_data_image: Image
) -> None:
    assert python_data_image.kernel and not python_image.kernel
    assert (python_data_image.rootfs / "usr/lib/python3/dist-packages/IPython").is_dir()
    assert not (python_image.rootfs / "usr/lib/python3/dist-packages/IPython").exists()
