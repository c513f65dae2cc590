"""Manifest building and the sha256/size check."""

from __future__ import annotations

import hashlib

import pytest
from tfc_harness import manifest


@pytest.fixture
def model_dir(tmp_path):
    root = tmp_path / "saved"
    (root / "variables").mkdir(parents=True)
    (root / "saved_model.pb").write_bytes(b"graph" * 100)
    (root / "variables" / "variables.index").write_bytes(b"index")
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(bytes(range(256)))
    return root


def test_build_manifest_lists_every_file(model_dir):
    files = manifest.model_files(model_dir)
    assert list(files) == ["model/saved_model.pb", "model/variables/variables.data-00000-of-00001",
                           "model/variables/variables.index"]
    doc = manifest.build_manifest(files, run_id="r1", cluster="c1", created="2026-01-01T00:00:00Z")
    assert doc["run_id"] == "r1" and doc["cluster"] == "c1" and doc["created"] == "2026-01-01T00:00:00Z"
    assert doc["files"]["model/variables/variables.index"] == {
        "sha256": hashlib.sha256(b"index").hexdigest(), "size": 5}


def _publishable(model_dir):
    """The manifest and a directory laid out as verify downloads it (model/ under a root)."""
    doc = manifest.build_manifest(manifest.model_files(model_dir), run_id="r", cluster="c")
    root = model_dir.parent / "download"
    (root / "model").parent.mkdir(parents=True, exist_ok=True)
    model_dir.rename(root / "model")
    return doc, root


def test_check_passes_on_intact_files(model_dir):
    doc, root = _publishable(model_dir)
    assert manifest.check_files(doc, root) == sorted(doc["files"])


def test_check_names_the_corrupted_file(model_dir):
    doc, root = _publishable(model_dir)
    target = root / "model" / "variables" / "variables.data-00000-of-00001"
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF                      # same size, different content
    target.write_bytes(bytes(data))
    with pytest.raises(manifest.ManifestMismatch, match=r"model/variables/variables.data-00000-of-00001: sha256"):
        manifest.check_files(doc, root)


def test_check_names_missing_and_truncated_files(model_dir):
    doc, root = _publishable(model_dir)
    (root / "model" / "saved_model.pb").write_bytes(b"short")
    with pytest.raises(manifest.ManifestMismatch, match=r"model/saved_model.pb: size 5 != manifest 500"):
        manifest.check_files(doc, root)
    (root / "model" / "saved_model.pb").unlink()
    with pytest.raises(manifest.ManifestMismatch, match=r"model/saved_model.pb: missing"):
        manifest.check_files(doc, root)


def test_check_refuses_paths_outside_root(tmp_path):
    doc = {"files": {"../evil": {"sha256": "0", "size": 0}}}
    with pytest.raises(manifest.ManifestMismatch, match="escapes"):
        manifest.check_files(doc, tmp_path / "root")


def test_empty_manifest_is_an_error(tmp_path):
    with pytest.raises(manifest.ManifestMismatch, match="no files"):
        manifest.check_files({"files": {}}, tmp_path)
    with pytest.raises(ValueError):
        manifest.build_manifest({}, run_id="r", cluster="c")
