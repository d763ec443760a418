"""Podman, set up for building and running the project's image on a machine that reaches
no container registry (tests/deploy/test_image.py, docs/deploy.md "CI").

* The base image the Dockerfile names (``docker.io/library/debian:bookworm-slim``) is made
  locally: a minimal Debian bookworm from ``debootstrap`` (Debian's package registry),
  cached as a tarball outside the repository, ``podman import``-ed, plus the host's own
  additions to its trust store (``/usr/local/share/ca-certificates``) so that builds
  behind a TLS-intercepting proxy reach PyPI. The Dockerfile itself knows nothing of this.
* Podman gets a containers.conf and a storage.conf of its own (pointed at by
  ``CONTAINERS_CONF`` / ``CONTAINERS_STORAGE_CONF``, only in the environment of the podman
  commands run from here) with what works here as root: cgroupfs, the file events
  logger, runc, modest ulimits, and an image store under the cache directory.
* ``python tests/deploy/imagebuild.py --prune`` (scripts/test runs it after the suite)
  removes every image from that store: the images are rebuilt from the tarball, which is
  all the cache keeps (about 120 MB instead of about 2 GB of layers).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BASE_IMAGE = "docker.io/library/debian:bookworm-slim"  # the Dockerfile's default BASE_IMAGE
ROOTFS_IMAGE = "localhost/agent-bridge-test/bookworm-debootstrap"
DEBIAN_MIRROR = os.environ.get("AGENT_BRIDGE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
TOOLS = ("podman", "runc", "debootstrap")

CONTAINERS_CONF = """\
# Written by tests/deploy/imagebuild.py.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""

# The sources an official debian:bookworm-slim image carries.
DEBIAN_SOURCES = """\
Types: deb
URIs: {mirror}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {security}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def default_subnet() -> str | None:
    """None (podman's own 10.88.0.0/16) unless an interface other than podman's bridge
    already routes into it: inside a container on podman's default network, a nested
    podman0 on the same subnet leaves the containers unreachable. Then the first of
    10.89-10.99.0.0/16 that nothing routes into."""
    routes = []
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        iface, dest, mask = fields[0], fields[1], fields[7]
        if iface == "podman0" or int(mask, 16) == 0:
            continue  # podman's own bridge; the default route
        # /proc/net/route prints each address as the hex of a little-endian integer.
        net = f"{ipaddress.IPv4Address(bytes.fromhex(dest)[::-1])}/{ipaddress.IPv4Address(bytes.fromhex(mask)[::-1])}"
        routes.append(ipaddress.IPv4Network(net, strict=False))
    for second in range(88, 100):
        candidate = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        if not any(candidate.overlaps(r) for r in routes):
            return None if second == 88 else str(candidate)
    return None


def cache_dir() -> Path:
    base = os.environ.get("AGENT_BRIDGE_DEPLOY_CACHE") or str(Path.home() / ".cache" / "agent-bridge" / "deploy")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fs_type(path: Path) -> str:
    proc = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def storage_driver(cache: Path | None = None) -> str:
    """overlay where the kernel has it (a warm build takes seconds; vfs copies the whole
    tree for every step, minutes and gigabytes), else vfs; AGENT_BRIDGE_PODMAN_STORAGE
    chooses. The kernel's overlay cannot stack its upper layers on another overlay, which
    is where the cache sits inside a container (a privileged one running this suite):
    there fuse-overlayfs does the same in user space."""
    chosen = os.environ.get("AGENT_BRIDGE_PODMAN_STORAGE")
    if chosen:
        return chosen
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        return "vfs"
    on_overlay = _fs_type(cache or cache_dir()) == "overlayfs"
    if on_overlay:
        return "fuse-overlayfs" if shutil.which("fuse-overlayfs") and Path("/dev/fuse").exists() else "vfs"
    return "overlay" if any(line.split()[-1:] == ["overlay"] for line in filesystems.splitlines()) else "vfs"


@dataclass
class Podman:
    env: dict[str, str]
    cache: Path

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["podman", *args],
            env=self.env,
            capture_output=True,
            timeout=timeout,
            check=False,
            input=input.decode() if input is not None else None,
            text=True,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0


def setup(cache: Path | None = None) -> Podman:
    cache = cache or cache_dir()
    driver = storage_driver(cache)
    conf = cache / "containers.conf"
    subnet = default_subnet()
    conf.write_text(CONTAINERS_CONF + (f'\n[network]\ndefault_subnet = "{subnet}"\n' if subnet else ""))
    storage = cache / f"storage-{driver}.conf"
    text = (
        f'[storage]\ndriver = "{"overlay" if driver == "fuse-overlayfs" else driver}"\n'
        f'graphroot = "{cache}/podman-{driver}/graph"\nrunroot = "{cache}/podman-{driver}/run"\n'
    )
    if driver == "fuse-overlayfs":
        text += f'[storage.options.overlay]\nmount_program = "{shutil.which("fuse-overlayfs")}"\n'
    storage.write_text(text)
    env = {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}
    return Podman(env=env, cache=cache)


def rootfs_tarball(cache: Path) -> Path:
    """A minimal Debian bookworm (debootstrap --variant=minbase), made once and kept."""
    tarball = cache / "bookworm-minbase.tar"
    if tarball.exists():
        return tarball
    with tempfile.TemporaryDirectory(prefix="debootstrap-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR],
            check=True,
            capture_output=True,
            timeout=900,
        )
        security = DEBIAN_MIRROR.replace("/debian", "/debian-security") if DEBIAN_MIRROR.endswith("/debian") else ""
        if security:
            (root / "etc/apt/sources.list").unlink(missing_ok=True)
            (root / "etc/apt/sources.list.d/debian.sources").write_text(
                DEBIAN_SOURCES.format(mirror=DEBIAN_MIRROR, security=security)
            )
        # What an official slim image leaves out: package caches and lists.
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
        (root / "var/lib/apt/lists/partial").mkdir(parents=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        part = tarball.with_suffix(".tar.part")
        subprocess.run(["tar", "-C", str(root), "-cf", str(part), "."], check=True, timeout=300)
        part.replace(tarball)
    return tarball


def base_image(pm: Podman) -> str:
    """``BASE_IMAGE`` in podman's store: the debootstrap tarball imported, plus the host's
    extra CA certificates (rebuilt only when those change)."""
    tarball = rootfs_tarball(pm.cache)
    stamp = f"{tarball.stat().st_size}-{int(tarball.stat().st_mtime)}"
    rootfs = f"{ROOTFS_IMAGE}:{stamp}"
    if not pm.exists(rootfs):
        pm.run("import", str(tarball), rootfs, timeout=300)
    with tempfile.TemporaryDirectory(prefix="base-", dir=pm.cache) as ctx:
        certs = Path(ctx) / "certs"
        certs.mkdir()
        for crt in sorted(EXTRA_CA_DIR.rglob("*.crt")) if EXTRA_CA_DIR.is_dir() else []:
            shutil.copy(crt, certs / crt.name)
        # ca-certificates, which the Dockerfile installs, picks these up when it builds the
        # system store (update-ca-certificates).
        (Path(ctx) / "Containerfile").write_text(f"FROM {rootfs}\nCOPY certs/ /usr/local/share/ca-certificates/\n")
        pm.run("build", "--pull=never", "--network", "host", "-t", BASE_IMAGE, ctx, timeout=300)
    return BASE_IMAGE


def build(pm: Podman, context: Path, tag: str, build_args: Sequence[str] = (), timeout: float = 1200) -> float:
    """``podman build`` of the project's Dockerfile; returns the seconds it took. Docker
    format: the OCI image format has no HEALTHCHECK."""
    start = time.monotonic()
    args = ["build", "--pull=never", "--network", "host", "--format", "docker", "-t", tag]
    for a in build_args:
        args += ["--build-arg", a]
    pm.run(*args, str(context), timeout=timeout)
    pm.run("image", "prune", "-f", check=False, timeout=120)  # earlier builds' layers
    return time.monotonic() - start


def prune(cache: Path | None = None) -> None:
    """Remove every image (and any container left behind) from the test store of each
    storage driver used so far; the debootstrap tarball stays."""
    cache = cache or cache_dir()
    conf = cache / "containers.conf"
    for storage in sorted(cache.glob("storage-*.conf")):
        env = {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}
        for args in (["rm", "--all", "--force"], ["rmi", "--all", "--force"], ["volume", "prune", "--force"]):
            subprocess.run(["podman", *args], env=env, capture_output=True, timeout=300, check=False)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--prune"]:
        sys.exit("usage: python tests/deploy/imagebuild.py --prune")
    if shutil.which("podman"):
        prune()
