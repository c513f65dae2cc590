"""Supply chain (issue 14, item 5): the controller and the nodes install only hash-pinned packages.

The controller's venv comes from requirements.lock (requirements.txt is its input), checkov's from its own
lock, the nodes' packages from one lock per TensorFlow package and release in the tensorflow role.
"""

from __future__ import annotations

import re

import jinja2
import pytest
import yaml
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tfcluster import config, tfsupport
from tfcluster.errors import ConfigError
from tfcluster.wheelhouse import read_lock

ROLE = REPO / "roles" / "tensorflow"


def _pins(requirements) -> dict[str, str]:
    """{canonical name: version} of a human-edited requirements file."""
    found = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)$", line.strip())
        if m:
            found[canonicalize_name(m.group(1))] = m.group(3)
        else:
            assert not line.strip() or line.startswith("#"), f"{requirements.name}: not an exact pin: {line}"
    return found


def _entries(lock) -> list[str]:
    """The lock's requirement entries, each with its continuation lines."""
    text = lock.read_text().replace("\\\n", " ")
    return [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]


def _assert_hash_pinned(lock):
    entries = _entries(lock)
    assert entries, f"{lock}: no requirements"
    for entry in entries:
        assert re.match(r"^[A-Za-z0-9_.-]+==[^\s;]+", entry), f"{lock.name}: not pinned with ==: {entry[:80]}"
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), f"{lock.name}: no --hash: {entry[:80]}"


@pytest.mark.parametrize("source, lock", [("requirements.txt", "requirements.lock"),
                                          ("requirements-checkov.txt", "requirements-checkov.lock")])
def test_each_lock_pins_its_input_at_the_same_versions_and_hashes_every_line(source, lock):
    _assert_hash_pinned(REPO / lock)
    locked = {name: version for name, version in read_lock(REPO / lock)}
    for name, version in _pins(REPO / source).items():
        assert locked.get(name) == version, f"{lock}: {name} is {locked.get(name)}, {source} pins {version}"


def test_bootstrap_installs_from_the_locks_with_hashes_only():
    script = (REPO / "scripts" / "bootstrap.sh").read_text()
    text = "\n".join(line.strip() for line in script.splitlines() if not line.strip().startswith("#"))
    assert 'PIP=("$VENV/bin/pip" install' in text
    assert '"${PIP[@]}" --require-hashes -r requirements.lock' in text
    assert '"$VENV/checkov/bin/pip" install' in text and "--require-hashes -r requirements-checkov.lock" in text
    # the project and the harness: nothing fetched (no dependencies, the locked setuptools builds them)
    assert '"${PIP[@]}" --no-deps --no-build-isolation -e . -e train' in text
    # the PIP definition and its two uses, checkov's pip: no other install
    assert len(re.findall(r"\$\{PIP\[@\]\}|bin/pip\" install", text)) == 4
    assert "requirements.txt" not in text  # the input of the lock, never installed from
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(BOOTSTRAP\):.*requirements\.lock.*requirements-checkov\.lock", makefile, re.M)


def test_setuptools_is_locked_because_the_editable_installs_use_no_build_isolation():
    assert ("setuptools", _pins(REPO / "requirements.txt")["setuptools"]) in read_lock(REPO / "requirements.lock")


# -- nodes --------------------------------------------------------------------------------------------------
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
PACKAGES = sorted({ROLE_VARS["_tensorflow_gpu_package"], *ROLE_VARS["_tensorflow_packages_by_arch"].values()})


def test_every_release_of_the_table_is_locked_for_every_package_and_the_default_is_among_them():
    releases = tfsupport.locked_releases()
    assert {tfsupport.minor(v) for v in releases} == set(tfsupport.table())
    assert config.FIELDS["tensorflow.version"].default in releases
    # nothing else lies in the directory: every lock is one a node can select
    expected = {tfsupport.lock_file(p, v).name for p in PACKAGES for v in releases}
    assert {p.name for p in tfsupport.LOCKS.iterdir()} == expected


@pytest.mark.parametrize("package", PACKAGES)
def test_a_node_lock_pins_tensorflow_and_the_harness_at_the_controllers_versions_with_hashes(package):
    controller = _pins(REPO / "requirements.txt")
    for version in tfsupport.locked_releases():
        lock = tfsupport.lock_file(package, version)
        _assert_hash_pinned(lock)
        pinned = set(read_lock(lock))
        assert (canonicalize_name(package.split("[")[0]), version) in pinned
        for name in tfsupport.harness_packages():
            assert (canonicalize_name(name), controller[canonicalize_name(name)]) in pinned, f"{lock.name}: {name}"
        if "and-cuda" in package:  # CUDA and cuDNN come as wheels: locked too (statically checked only)
            assert any(name.startswith("nvidia-cudnn") for name, _ in pinned), lock.name


def test_the_roles_lock_file_name_is_tfclusters():
    template = jinja2.Environment().from_string(ROLE_VARS["_tensorflow_lock_file"])
    for package in PACKAGES:
        name = template.render(__tensorflow_package=package, tensorflow_version="2.21.0")
        assert tfsupport.lock_file(package, "2.21.0").name == name


def _install_tasks():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    return [t for t in tasks if "ansible.builtin.pip" in t]


def test_nodes_install_only_from_the_lock_with_require_hashes():
    tasks = _install_tasks()
    assert {t["when"] for t in tasks} == {"tensorflow_source == 'wheelhouse'", "tensorflow_source == 'index'"}
    for task in tasks:
        pip = task["ansible.builtin.pip"]
        assert "name" not in pip and pip["requirements"] == "{{ _tensorflow_lock_dest }}", task["name"]
        assert "--require-hashes" in pip["extra_args"] and "--only-binary=:all:" in pip["extra_args"]
    copy = next(t for t in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
                if t["name"] == "Copy the lock file of the node's packages")
    assert copy["ansible.builtin.copy"]["src"] == "locks/{{ _tensorflow_lock_file }}"
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert "tensorflow_extra_packages" not in defaults  # nothing installs beside the lock


def test_trusted_host_only_for_a_served_wheelhouse_and_never_without_the_hash_check():
    """pip reads find-links over plain http only from hosts it is told to trust (localhost aside); the
    served wheelhouse is on the cluster's private bridge, and the hashes vouch for each wheel."""
    wheelhouse = next(t for t in _install_tasks() if t["when"] == "tensorflow_source == 'wheelhouse'")
    args = wheelhouse["ansible.builtin.pip"]["extra_args"]
    assert "--trusted-host" in args and "--require-hashes" in args
    assert "if tensorflow_wheelhouse_url | length > 0 else ''" in args.split("--trusted-host")[1]
    index = next(t for t in _install_tasks() if t["when"] == "tensorflow_source == 'index'")
    assert "--trusted-host" not in index["ansible.builtin.pip"]["extra_args"]


def test_a_release_without_a_lock_is_refused_before_anything_is_created(monkeypatch):
    with pytest.raises(ConfigError) as err:
        config.resolve(overrides={"tensorflow.version": "2.21.1"})  # in the table (2.21), not locked
    assert err.value.field == "tensorflow.version" and "locked with hashes" in err.value.allowed
    assert "2.21.0" in err.value.allowed and "scripts/lock.py --release 2.21.1" in err.value.allowed
