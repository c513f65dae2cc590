"""Base images for local nodes: a bare Debian 12 root file system, as a cloud VM boots from.

A local node's root is an overlay on one of these, so the roles meet what they meet on a fresh cloud VM:
Debian's python3, sshd, sudo and CA certificates, a non-root login user with password-less sudo (as
cloud-init sets up on Debian's cloud images), an empty apt cache and nothing else. The image is built once
with ``mmdebstrap`` from the Debian archive, kept under ``<cache>/_images/<name>-<content key>/rootfs``
and shared, read-only, by every node of every cluster; the content key is a hash of the recipe, so a
changed recipe builds a new image and never alters one in use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import TfclusterError
from .paths import cache_root, made_once

#: the login user of the image (Debian's OpenStack and generic cloud images call it "debian")
IMAGE_USER = "debian"


@dataclass(frozen=True)
class Recipe:
    """What goes into an image; its hash names the image."""

    name: str = "debian-12"
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    security_mirror: str = "http://deb.debian.org/debian-security"
    #: what Debian's cloud images have that tfcluster's roles rely on; the roles install the rest
    packages: tuple[str, ...] = ("python3", "openssh-server", "ca-certificates", "sudo")
    user: str = IMAGE_USER
    #: bump when the build steps below change what they produce
    revision: int = 1

    @property
    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def sources(self) -> list[str]:
        """The image's apt sources: the same archive a Debian cloud image points at."""
        return [f"deb {self.mirror} {self.suite} main",
                f"deb {self.mirror} {self.suite}-updates main",
                f"deb {self.security_mirror} {self.suite}-security main"]


def default_recipe() -> Recipe:
    mirror = os.environ.get("TFCLUSTER_DEBIAN_MIRROR", "").rstrip("/")
    return Recipe(mirror=mirror) if mirror else Recipe()


def images_dir() -> Path:
    return cache_root() / "_images"


def image_dir(recipe: Recipe) -> Path:
    return images_dir() / f"{recipe.name}-{recipe.key}"


def rootfs(recipe: Recipe) -> Path:
    return image_dir(recipe) / "rootfs"


def is_built(recipe: Recipe) -> bool:
    return (image_dir(recipe) / "image.json").exists()


def _hooks(recipe: Recipe) -> list[str]:
    """mmdebstrap customize hooks ("$1" is the new root): the cloud image's user, sudo, no host keys."""
    user = recipe.user
    return [
        f'chroot "$1" useradd --create-home --shell /bin/bash --groups sudo {user}',
        # key-only logins: no password, and not "locked" ('!'), which sshd refuses without PAM
        f"chroot \"$1\" usermod --password '*' {user}",
        f'echo "{user} ALL=(ALL) NOPASSWD:ALL" > "$1/etc/sudoers.d/90-cloud-init-users"',
        'chmod 0440 "$1/etc/sudoers.d/90-cloud-init-users"',
        # every node gets host keys of its own when it boots
        'rm -f "$1"/etc/ssh/ssh_host_*',
        'rm -f "$1/etc/resolv.conf"',
    ]


def build_command(recipe: Recipe, target: Path) -> list[str]:
    cmd = ["mmdebstrap", "--quiet", "--mode=root", "--format=directory", "--variant=minbase",
           f"--include={','.join(recipe.packages)}"]
    for hook in _hooks(recipe):
        cmd.append(f"--customize-hook={hook}")
    return cmd + [recipe.suite, str(target), *recipe.sources]


def ensure(recipe: Recipe | None = None, log: Callable[[str], None] = print) -> Path:
    """The image's root file system, built first if it is not there yet (once; concurrent callers wait)."""
    recipe = recipe or default_recipe()
    final = image_dir(recipe)

    def build() -> Path:
        if shutil.which("mmdebstrap") is None:
            raise TfclusterError("mmdebstrap is not installed, so the local nodes' base image cannot be built: "
                                 "run 'make bootstrap' (or apt-get install mmdebstrap)")
        return _build(recipe, final, log)

    return made_once(images_dir() / ".lock", lambda: final / "rootfs" if is_built(recipe) else None, build)


def _build(recipe: Recipe, final: Path, log: Callable[[str], None]) -> Path:
    work = final.with_name(f".build-{final.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log(f"building the local nodes' base image {final.name} (Debian {recipe.suite}: "
        f"{', '.join(recipe.packages)}; once, about half a minute)")
    started = time.monotonic()
    res = subprocess.run(build_command(recipe, work / "rootfs"), capture_output=True, text=True,
                         env=dict(os.environ, LC_ALL="C.UTF-8"))
    if res.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise TfclusterError(f"building the base image {final.name} failed (mmdebstrap exit {res.returncode}):\n"
                             + (res.stderr or res.stdout).strip()[-2000:])
    seconds = round(time.monotonic() - started, 1)
    listed = subprocess.run(["chroot", str(work / "rootfs"), "dpkg-query", "-W", "-f=${Package}\n"],
                            capture_output=True, text=True)
    (work / "image.json").write_text(json.dumps(
        {"recipe": asdict(recipe), "key": recipe.key, "built": time.time(), "build_seconds": seconds,
         "packages": sorted(listed.stdout.split())}, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)  # a half-written one from an interrupted build
    work.rename(final)
    log(f"base image {final.name} built in {seconds:.0f}s")
    return final / "rootfs"


def user_ids(root: Path, user: str) -> tuple[int, int]:
    """The uid and gid of a user of the image (from its /etc/passwd)."""
    for line in (root / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise TfclusterError(f"the base image {root.parent.name} has no user {user}")
