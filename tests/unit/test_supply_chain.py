"""Supply chain (issue 14, item 5): the controller and the nodes install only hash-pinned packages.

The controller's venv comes from requirements.lock (requirements.txt is its input), checkov's from its own
lock, the nodes' packages from one lock per TensorFlow package and release in the tensorflow role.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import jinja2
import pytest
import yaml
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tfcluster import config, tfsupport
from tfcluster.errors import ConfigError
from tfcluster.wheelhouse import read_lock

ROLE = REPO / "roles" / "tensorflow"
_spec = importlib.util.spec_from_file_location("uv_setup", REPO / "scripts" / "uv_setup.py")
uv_setup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(uv_setup)


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
    # pip installs uv alone, from uv's entry of the lock; uv installs everything else
    assert 'PIP=("$VENV/bin/pip" install' in text
    assert '"$PYTHON" scripts/uv_setup.py entry uv requirements.lock >"$uv_lock"' in text
    assert '"${PIP[@]}" --no-deps --require-hashes -r "$uv_lock"' in text
    # uv is given pip's sources as separate arguments (scripts/uv_setup.py, NUL-separated)
    assert '"$VENV/bin/pip" config list | "$PYTHON" scripts/uv_setup.py sources >"$sources"' in text
    assert "mapfile -d '' -t pip_sources <\"$sources\"" in text
    uv_definition = re.search(r'^UV=\("\$VENV/bin/uv" pip install [^)]*\)$', text, re.M)
    assert uv_definition
    words = uv_definition.group(0).split()
    assert '"${pip_sources[@]}")' in words
    # the .pyc files written at install, as pip writes them: where PYTHONDONTWRITEBYTECODE is set, nothing else
    # writes them, and every start compiled what it imported (the suite took 24 min against 17.5);
    # unsafe-best-match: a locked version found on a later index (uv's default stops at the first that has the
    # package: absl-py's locked release is not on this machine's local mirror); no uv configuration file
    for flag in ("--compile-bytecode", "--no-config", "--index-strategy unsafe-best-match"):
        assert flag in uv_definition.group(0), flag
    # each lock also constrains the build dependencies of what it builds from source, hash-checked
    assert '"${UV[@]}" --python "$VENV/bin/python" --require-hashes -r requirements.lock -b requirements.lock' in text
    assert ('"${UV[@]}" --python "$VENV/checkov/bin/python" --require-hashes -r requirements-checkov.lock \\\n'
            '-b requirements-checkov.lock') in text
    # the project and the harness: nothing fetched (no dependencies, the locked setuptools builds them)
    assert '"${UV[@]}" --python "$VENV/bin/python" --no-deps --no-build-isolation -e . -e train' in text
    # those four installs and no other, each through one of the two definitions
    assert len(re.findall(r"\$\{(PIP|UV)\[@\]\}", text)) == 4
    assert len(re.findall(r"pip\" install|uv\" pip install|pip install|-m pip", text)) == 2
    # a change to the bootstrap itself reinstalls (a venv without .pyc files got the fix)
    assert '[ scripts/bootstrap.sh -nt "$stamp" ] || [ scripts/uv_setup.py -nt "$stamp" ]' in text
    assert "requirements.txt" not in text  # the input of the lock, never installed from
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(BOOTSTRAP\):.*requirements\.lock.*requirements-checkov\.lock.*scripts/uv_setup\.py",
                     makefile, re.M)


def test_uv_entry_of_the_lock_is_its_pin_with_every_hash_and_nothing_else(tmp_path):
    """What pip installs uv from: a requirements file holding uv's entry only, every hash the lock has."""
    lock = REPO / "requirements.lock"
    entry = next(e for e in _entries(lock) if e.startswith("uv=="))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "uv_setup.py"), "entry", "uv", str(lock)],
                         capture_output=True, text=True, check=True).stdout
    written = tmp_path / "uv.txt"
    written.write_text(out)
    assert _entries(written) == [entry.rstrip()]
    assert re.findall(r"sha256:\w+", out) == re.findall(r"sha256:\w+", entry)
    assert not out.rstrip().endswith("\\")
    missing = subprocess.run([sys.executable, str(REPO / "scripts" / "uv_setup.py"), "entry", "nope", str(lock)],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "pins no nope" in missing.stderr and not missing.stdout


def _sources(listing: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "uv_setup.py"), "sources"], input=listing,
                          capture_output=True, text=True)


def test_uv_gets_the_indexes_and_ca_file_pip_install_would_take():
    """``pip config list``'s merged sections: the environment over [install] over [global]; other sections
    (pip download's, pip freeze's) and other keys are not pip install's sources. Lists split on spaces and on
    line breaks (pip.conf's usual form), each value an argument of its own."""
    listing = "\n".join([
        ":env:.find-links='/opt/wheels'",
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
        "global.index-url='https://mirror.example/simple'",
        "install.index-url='https://install.example/simple'",
        "install.trusted-host='\\nmirror.example\\nother.example'",
        "download.find-links='/elsewhere'",
        "global.timeout='60'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        ":env:.extra-index-url='https://env.example/simple\\nfile:///a b'",
    ])
    out = _sources(listing)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\0") == [
        "--index-url", "https://install.example/simple",
        "--extra-index-url", "https://env.example/simple", "--extra-index-url", "file:///a",
        "--extra-index-url", "b",
        "--find-links", "/opt/wheels",
        "--allow-insecure-host", "mirror.example", "--allow-insecure-host", "other.example",
        "--cert", "/etc/ssl/certs/ca-certificates.crt",
        "",     # every argument ends with a NUL, the last one too
    ]
    assert _sources("").stdout == ""
    assert uv_setup.uv_arguments(uv_setup.pip_settings(":env:.no-index='1'")) == ["--no-index"]
    assert uv_setup.uv_arguments(uv_setup.pip_settings("global.no-index='false'")) == []


@pytest.mark.parametrize("key, instead", [("proxy", "HTTPS_PROXY"), ("client-cert", "SSL_CLIENT_CERT")])
def test_a_pip_setting_uv_cannot_take_is_one_clear_error(key, instead):
    out = _sources(f"global.index-url='https://mirror.example/simple'\ninstall.{key}='http://p.example:3128'")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert f"{key}='http://p.example:3128'" in out.stderr and instead in out.stderr


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
