"""The controller-side wheelhouse: TensorFlow and the harness's packages, downloaded once.

Nodes install from their copy of it with ``pip --no-index``, so a cluster of N nodes downloads the
~270 MB TensorFlow wheel once, not N times, and nodes need no route to a package index.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .errors import TfclusterError
from .paths import state_root

EXTRA_PACKAGES = ("boto3",)


def package_for(gpus: int) -> str:
    return "tensorflow" if gpus else "tensorflow-cpu"


def path_for(version: str, package: str = "tensorflow-cpu") -> Path:
    return state_root() / "_wheelhouse" / f"{package}-{version}-py{sys.version_info.major}{sys.version_info.minor}"


def ensure(version: str, package: str = "tensorflow-cpu", log=print) -> Path:
    """Download the wheels unless a complete wheelhouse is there already; return its directory."""
    target = path_for(version, package)
    marker = target / ".complete"
    if marker.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    log(f"downloading {package}=={version} and {', '.join(EXTRA_PACKAGES)} into {target} (once)")
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
           "-d", str(target), f"{package}=={version}", *EXTRA_PACKAGES]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise TfclusterError(f"could not download {package}=={version}: {res.stderr.strip()[-1500:]}")
    marker.write_text(f"{package}=={version}\n")
    return target
