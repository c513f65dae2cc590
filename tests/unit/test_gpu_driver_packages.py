"""gpu_driver's package choice per distribution (issue 8, item 9), rendered for a cloud kernel.

The driver installation cannot run on these machines (no GPU): what is checked is that the packages
match the running kernel's flavour, with no DKMS build lacking its headers.
"""

from __future__ import annotations

import jinja2
import yaml

from tests.conftest import REPO

ROLE = REPO / "roles" / "gpu_driver"


def _packages(distribution: str, kernel: str) -> dict[str, list[str]]:
    raw = yaml.safe_load((ROLE / "vars" / f"{distribution}.yml").read_text())
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    ctx = {"ansible_facts": {"kernel": kernel}, "gpu_driver_branch": defaults["gpu_driver_branch"]}
    return {key: [env.from_string(item).render(ctx) for item in value]
            for key, value in raw.items() if isinstance(value, list)}


def test_debian_builds_against_the_headers_of_the_running_cloud_kernel():
    pkgs = _packages("Debian", "6.1.0-28-cloud-amd64")
    assert pkgs["_gpu_driver_prerequisites"][0] == "linux-headers-6.1.0-28-cloud-amd64"
    assert "nvidia-driver" in pkgs["_gpu_driver_packages"] and "nvidia-smi" in pkgs["_gpu_driver_packages"]
    assert set(pkgs["_gpu_driver_components"]) == {"contrib", "non-free", "non-free-firmware"}


def test_ubuntu_takes_prebuilt_signed_modules_for_the_running_kernel_and_no_dkms():
    pkgs = _packages("Ubuntu", "6.8.0-1015-aws")
    assert pkgs["_gpu_driver_packages"] == ["linux-modules-nvidia-550-server-6.8.0-1015-aws",
                                            "nvidia-headless-no-dkms-550-server", "nvidia-utils-550-server"]
    assert not [p for p in pkgs["_gpu_driver_packages"] if p.endswith("-dkms") or "driver-550" in p]
    assert pkgs["_gpu_driver_prerequisites"] == []


def test_headers_come_before_the_driver_and_a_missing_module_is_named():
    tasks = yaml.safe_load((ROLE / "tasks" / "install.yml").read_text())
    names = [t["name"] for t in tasks]
    assert names.index("Enable the archive components that carry the driver") < \
        names.index("Install what the driver's kernel module needs first (headers of the running kernel)") < \
        names.index("Install the NVIDIA driver") < \
        names.index("Find the driver's kernel module for the running kernel") < \
        names.index("Load the driver now if it was just installed")
    check = next(t for t in tasks if t["name"].startswith("Fail when no module"))
    assert "inventory_hostname" in check["ansible.builtin.assert"]["fail_msg"]
