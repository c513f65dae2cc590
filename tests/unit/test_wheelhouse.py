"""The harness bundle is reproducible, so an unchanged harness is not copied again."""

from __future__ import annotations

import tarfile
import urllib.request

from tfcluster import wheelhouse
from tfcluster.paths import TRAIN_DIR


def test_bundle_is_reproducible_and_complete(tmp_path):
    a, id_a = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "a")
    b, id_b = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "b")
    assert id_a == id_b and a.read_bytes() == b.read_bytes()
    names = tarfile.open(a).getnames()
    assert "tfc_harness/__init__.py" in names and "models/digits.py" in names
    assert not any("__pycache__" in n for n in names)


def test_bundle_changes_with_a_user_model(tmp_path):
    user = tmp_path / "mymodel.py"
    user.write_text("def build_model():\n    pass\n")
    _, plain = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "a")
    bundle, with_user = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "b", str(user))
    assert plain != with_user
    assert "models/mymodel.py" in tarfile.open(bundle).getnames()


def test_serve_exposes_the_directory_on_the_given_host_only_while_open(tmp_path):
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
    with wheelhouse.serve(tmp_path, "127.0.0.1") as url:
        assert url.startswith("http://127.0.0.1:")
        assert urllib.request.urlopen(url + "x-1.0-py3-none-any.whl", timeout=5).read() == b"wheel"
    try:
        urllib.request.urlopen(url, timeout=2)
        raise AssertionError("server still answering after the block")
    except OSError:
        pass


def test_the_package_rule_is_the_tensorflow_roles_table():
    """One home: the wheelhouse downloads what the tensorflow role installs, both read roles/tensorflow/vars."""
    import platform

    import pytest
    import yaml

    from tests.conftest import REPO
    from tfcluster import tfsupport, wheelhouse
    from tfcluster.errors import ConfigError

    table = yaml.safe_load((REPO / "roles" / "tensorflow" / "vars" / "main.yml").read_text())
    assert tfsupport.package_for(2, "x86_64") == table["_tensorflow_gpu_package"] == "tensorflow[and-cuda]"
    for arch, package in table["_tensorflow_packages_by_arch"].items():
        assert tfsupport.package_for(0, arch) == package
    assert tfsupport.package_for(0, "aarch64") == "tensorflow"     # tensorflow-cpu has no aarch64 wheels
    with pytest.raises(ConfigError, match="s390x"):
        tfsupport.package_for(0, "s390x")
    assert wheelhouse.packages_for([0, 0, 1]) == sorted({table["_tensorflow_packages_by_arch"][platform.machine()],
                                                        "tensorflow[and-cuda]"})
