"""The data formats are the modules of tfc_harness/formats: the configuration, the controller's checks and
the workers' readers all find them there, so a new format is one module."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tfc_harness import formats

from tfcluster import config
from tfcluster.errors import ConfigError


def test_the_formats_are_the_packages_modules():
    assert formats.names() == ("csv", "tfrecord")
    assert formats.get("tfrecord").needs_decode and not formats.get("csv").needs_decode
    assert formats.get("csv").named_columns and not formats.get("tfrecord").named_columns
    with pytest.raises(ValueError, match="unknown data format 'parquet'; expected one of csv, tfrecord"):
        formats.get("parquet")


def test_a_module_dropped_into_the_package_is_a_format(tmp_path, monkeypatch):
    """A copy of the harness with one more module in formats/ (``FORMAT`` a Format) lists it: nothing else to
    edit. The whole harness is copied, as formats imports its siblings (``..errors``)."""
    harness = tmp_path / "harness_copy"
    shutil.copytree(Path(formats.__path__[0]).parent, harness, ignore=shutil.ignore_patterns("__pycache__"))
    copy = harness / "formats"
    (copy / "lines_files.py").write_text(
        "from . import Format\n\n\n"
        "class Lines(Format):\n    name = 'lines'\n    summary = 'one example per line'\n\n"
        "    def start(self, s3_client, bucket, key):\n        return None\n\n"
        "    def reader(self, *, decode, columns, label):\n        return lambda filenames: filenames\n\n\n"
        "FORMAT = Lines()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        copied = importlib.import_module("harness_copy.formats")
        assert copied.names() == ("csv", "lines", "tfrecord")
        assert "lines (one example per line)" in copied.describe()
    finally:
        for name in [n for n in sys.modules if n == "harness_copy" or n.startswith("harness_copy.")]:
            del sys.modules[name]


def test_the_cluster_file_takes_exactly_the_formats():
    schema = config.json_schema()
    data = schema["$defs"]["Data"]["properties"]["format"]
    assert data["enum"] == list(formats.names())
    for name in formats.names():
        assert f"{name} (" in data["description"]
        assert config.resolve({"data": {"format": name}}).data.format == name
    with pytest.raises(ConfigError, match="data.format.*one of csv, tfrecord"):
        config.resolve({"data": {"format": "parquet"}})


def test_the_controllers_configuration_imports_no_heavy_library():
    """config imports the formats (their names, for data.format): no format module may import TensorFlow,
    numpy or boto3 when it loads, or every CLI command (down too) would pay for it."""
    code = ("import sys, tfcluster.config, tfc_harness.formats; "
            "print(sorted(m for m in ('tensorflow', 'numpy', 'boto3', 'botocore') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_the_job_checks_key_changes_with_any_format_module(tmp_path, monkeypatch):
    """A changed format module checks a job again (prepare.code_digest hashes every module of formats/)."""
    from tfc_harness import prepare

    copy = tmp_path / "tfc_harness"
    shutil.copytree(Path(prepare.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(prepare, "__file__", str(copy / "prepare.py"))
    before = prepare.code_digest(b"module").hexdigest()
    with open(copy / "formats" / "csv_files.py", "a") as f:
        f.write("# changed\n")
    assert prepare.code_digest(b"module").hexdigest() != before
