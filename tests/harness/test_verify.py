"""verify_run refuses unpublished, incomplete or corrupted runs before evaluating anything."""

from __future__ import annotations

import json

import pytest
from tfc_harness import manifest, publish, s3io, verify

BUCKET = "verify"
MODULE = "digits"


@pytest.fixture
def published_run(s3_client, tmp_path):
    """A run laid out as the chief publishes it (fake model files; enough for the integrity checks)."""
    s3_client.create_bucket(Bucket=BUCKET)
    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"pb" * 50)
    (model / "variables" / "variables.index").write_bytes(b"idx")
    metrics = dict({k: 0 for k in publish.METRICS_KEYS}, headline="test_loss")
    doc = publish.publish_run(s3_client, BUCKET, "runs/c/r1", model, metrics, run_id="r1", cluster="c",
                              log=lambda m: None)
    return "runs/c/r1", doc


def test_publish_layout(s3_client, published_run):
    prefix, doc = published_run
    keys = sorted(s3io.list_keys(s3_client, BUCKET, prefix))
    assert keys == [f"{prefix}/{n}" for n in ("_SUCCESS", "manifest.json", "metrics.json",
                                               "model/saved_model.pb", "model/variables/variables.index")]
    stored = json.loads(s3io.get_bytes(s3_client, BUCKET, f"{prefix}/manifest.json"))
    assert stored == doc and set(doc) == {"files", "run_id", "cluster", "created"}


def test_refuses_run_without_success_marker(s3_client, published_run, tmp_path):
    prefix, _ = published_run
    s3_client.delete_object(Bucket=BUCKET, Key=f"{prefix}/_SUCCESS")
    with pytest.raises(verify.VerificationError, match="_SUCCESS is missing"):
        verify.verify_run(s3_client, BUCKET, prefix, tmp_path / "dl", MODULE, "datasets/x")
    assert not (tmp_path / "dl").exists()


def test_names_the_corrupted_file(s3_client, published_run, tmp_path):
    prefix, _ = published_run
    s3io.upload_bytes(s3_client, b"xyz", BUCKET, f"{prefix}/model/variables/variables.index")  # same size
    with pytest.raises(manifest.ManifestMismatch, match="model/variables/variables.index: sha256"):
        verify.verify_run(s3_client, BUCKET, prefix, tmp_path / "dl", MODULE, "datasets/x")


def test_names_a_file_the_manifest_does_not_list(s3_client, published_run, tmp_path):
    prefix, _ = published_run
    s3io.upload_bytes(s3_client, b"extra", BUCKET, f"{prefix}/model/assets/extra.txt")
    with pytest.raises(manifest.ManifestMismatch, match="model/assets/extra.txt: not listed"):
        verify.verify_run(s3_client, BUCKET, prefix, tmp_path / "dl", MODULE, "datasets/x")


def test_publish_requires_all_metrics(s3_client, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "f").write_bytes(b"1")
    with pytest.raises(ValueError, match="metrics lack"):
        publish.publish_run(s3_client, BUCKET, "runs/x", tmp_path / "m", {"test_accuracy": 1.0},
                            run_id="r", cluster="c")
    everything_but_the_headline = dict({k: 0 for k in publish.METRICS_KEYS}, headline="test_auc")
    with pytest.raises(ValueError, match=r"metrics lack \['test_auc'\]"):
        publish.publish_run(s3_client, BUCKET, "runs/x", tmp_path / "m", everything_but_the_headline,
                            run_id="r", cluster="c")


@pytest.mark.parametrize("recomputed, published, problem", [
    ({"test_loss": 0.5, "test_auc": 0.9}, {"test_loss": 0.5, "test_auc": 0.9}, None),
    ({"test_loss": 0.5, "test_auc": 0.9}, {"test_loss": 0.5004, "test_auc": 0.9}, None),   # within tolerance
    ({"test_loss": 0.5, "test_auc": 0.9}, {"test_loss": 0.5, "test_auc": 0.95},
     "test_auc: recomputed 0.9, the chief published 0.95"),
    ({"test_loss": 0.5}, {"test_loss": 0.5, "test_auc": 0.9}, "test_auc: not recomputed"),
    ({"test_loss": 0.5, "test_mae": 3.0}, {"test_loss": 0.5}, "test_mae: missing from metrics.json"),
])
def test_compare_recomputed_with_published(recomputed, published, problem):
    problems = verify.compare(recomputed, dict(published, test_examples=10))
    assert problems == ([problem] if problem else [])


def test_metric_lines_lead_with_the_headline():
    lines = verify.metric_lines({"test_loss": 0.25, "test_auc": 0.93456, "headline": "test_auc", "n": 4})
    assert lines == ["test auc: 0.9346", "test loss: 0.2500"]
    lines = verify.metric_lines({"test_loss": 0.5, "test_macro_f1": 0.8, "test_top2": 0.9, "test_acc": 0.7,
                                 "headline": "test_macro_f1", "n": 4})      # the module's order, the loss last
    assert lines == ["test macro_f1: 0.8000", "test top2: 0.9000", "test acc: 0.7000", "test loss: 0.5000"]


def test_cli_reports_failure(published_run, moto_endpoint, tmp_path, capsys):
    prefix, _ = published_run
    rc = verify.main(["--bucket", BUCKET, "--run-prefix", "runs/c/none", "--dest", str(tmp_path / "d"),
                      "--endpoint", moto_endpoint, "--module", MODULE, "--dataset-prefix", "datasets/x"])
    assert rc == 1 and "verification failed" in capsys.readouterr().err
