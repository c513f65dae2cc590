"""Which CPython versions a TensorFlow release installs on, and which pip package a node installs: the
tables in roles/tensorflow/vars/main.yml, which the tensorflow role reads too (one home for both rules).

The tensorflow role checks each node's Python against the same table (its first task), so a user's own
image is refused on the node, naming it; for a provider's default image, whose Python is known, tfcluster
refuses the mismatch before anything is created (:func:`check_default_image`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import ConfigError
from .paths import REPO

TABLE = REPO / "roles" / "tensorflow" / "vars" / "main.yml"
_KEY = "_tensorflow_python_support"
#: the nodes' hash-pinned lock files, one per TensorFlow package and release (scripts/lock.py writes them)
LOCKS = REPO / "roles" / "tensorflow" / "files" / "locks"


@dataclass(frozen=True)
class DefaultImage:
    """A provider's default image: what a user gets with ``nodes.<role>.image: ''``."""

    name: str
    python: str
    ssh_user: str


@functools.cache
def _role_vars() -> dict:
    return yaml.safe_load(TABLE.read_text())


def package_for(gpus: int, arch: str) -> str:
    """The TensorFlow pip package of a node with ``gpus`` GPUs and CPU ``arch`` (``platform.machine()``):
    CUDA and cuDNN come as wheels with the GPU package; the CPU package depends on the architecture."""
    data = _role_vars()
    if gpus:
        return data["_tensorflow_gpu_package"]
    try:
        return data["_tensorflow_packages_by_arch"][arch]
    except KeyError:
        raise ConfigError("controller platform", arch, "a CPU TensorFlow publishes Linux wheels for: "
                          + ", ".join(data["_tensorflow_packages_by_arch"])) from None


def lock_file(package: str, version: str) -> Path:
    """The lock file pinning, with hashes, TensorFlow ``package`` at ``version``, its dependencies and the
    harness's packages: ``tensorflow[and-cuda]`` 2.21.0 -> ``locks/tensorflow-and-cuda-2.21.0.txt`` (the
    tensorflow role names it by the same rule, ``_tensorflow_lock_file``)."""
    return LOCKS / f"{package.replace('[', '-').replace(']', '')}-{version}.txt"


def harness_packages() -> list[str]:
    """What the harness needs on a node besides TensorFlow (locked at the controller's pins)."""
    return list(_role_vars()["_tensorflow_harness_packages"])


@functools.cache
def locked_releases() -> tuple[str, ...]:
    """The TensorFlow releases whose every package (CPU per architecture, GPU) has a node lock file."""
    data = _role_vars()
    packages = {data["_tensorflow_gpu_package"], *data["_tensorflow_packages_by_arch"].values()}
    found = {p.name for p in LOCKS.glob("*.txt")}
    versions = {p.stem.rsplit("-", 1)[1] for p in LOCKS.glob("*.txt")}
    return tuple(sorted((v for v in versions if all(lock_file(p, v).name in found for p in packages)),
                        key=lambda v: tuple(int(x) for x in v.split("."))))


@functools.cache
def table() -> dict[str, tuple[str, ...]]:
    """``{"2.21": ("3.10", ...), ...}`` from the role's vars file."""
    data = _role_vars()[_KEY]
    return {str(k): tuple(str(v) for v in versions) for k, versions in data.items()}


def minor(version: str) -> str:
    """``"2.21.0"`` -> ``"2.21"``."""
    return ".".join(version.split(".")[:2])


def pythons_for(version: str) -> tuple[str, ...] | None:
    """The CPython versions TensorFlow ``version`` has wheels for; None for a release not in the table."""
    return table().get(minor(version))


def check_default_image(spec, provider: str, image: DefaultImage) -> None:
    """Refuse a TensorFlow release that the default image's Python cannot install (roles using it only)."""
    from .config import ROLES

    roles = [r for r in ROLES if spec.count(r) and not spec.nodes[r].image]
    if not roles:
        return
    version = spec.tensorflow.version
    pythons = pythons_for(version)
    known = ", ".join(f"{k}.x" for k in table())
    if pythons is None:
        raise ConfigError("tensorflow.version", version,
                          f"a release whose Python support tfcluster knows: {known} "
                          f"(roles/tensorflow/vars/main.yml; add a row only after checking PyPI's wheels)")
    if image.python not in pythons:
        usable = ", ".join(k + ".x" for k, v in table().items() if image.python in v)
        raise ConfigError("tensorflow.version", version,
                          f"a release with wheels for Python {image.python}, the Python of {provider}'s default "
                          f"image {image.name} used by nodes.{roles[0]} ({usable}); TensorFlow {minor(version)} "
                          f"supports Python {', '.join(pythons)}. Or set nodes.<role>.image to an image whose "
                          "Python it supports")
