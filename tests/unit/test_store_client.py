"""The controller's S3 client: checksum settings per endpoint (issue 8, item 5)."""

from __future__ import annotations

from tfcluster import config, store


def _spec(**overrides):
    return config.resolve({}, overrides)


def test_s3_compatible_endpoint_gets_checksums_only_when_required(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    creds = tmp_path / "s3.env"
    creds.write_text("AWS_ACCESS_KEY_ID=AKIDEXAMPLE\nAWS_SECRET_ACCESS_KEY=secret\n")
    creds.chmod(0o600)
    spec = _spec(**{"provider": "local", "storage.endpoint": "https://storage.googleapis.com",
                    "storage.credentials_file": str(creds)})
    cfg = store.client(spec).meta.config
    assert cfg.request_checksum_calculation == "when_required"
    assert cfg.response_checksum_validation == "when_required"


def test_aws_keeps_botocore_checksum_defaults(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    spec = _spec(**{"provider": "im", "storage.bucket": "my-runs"})
    assert store.endpoint_for(spec) is None
    assert store.client(spec).meta.config.request_checksum_calculation == "when_supported"
