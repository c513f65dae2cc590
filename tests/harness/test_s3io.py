"""Retry policy, credentials handling and small S3 helpers."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from tfc_harness import s3io


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


def test_retries_with_exponential_backoff_then_succeeds():
    sleeps, attempts = [], []

    def flaky():
        attempts.append(1)
        if len(attempts) < 4:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        return "ok"

    assert s3io.with_retries(flaky, "upload x", tries=5, sleep=sleeps.append, log=None) == "ok"
    assert sleeps == [0.5, 1.0, 2.0]


def test_gives_up_after_bounded_tries():
    sleeps = []

    def timeout():
        raise ReadTimeoutError(endpoint_url="http://127.0.0.1:1")

    with pytest.raises(s3io.TransferError, match="upload y failed after 3 tries"):
        s3io.with_retries(timeout, "upload y", tries=3, sleep=sleeps.append, log=None)
    assert sleeps == [0.5, 1.0]


def test_server_errors_are_retried_but_access_denied_is_not():
    calls = []

    def slow_down():
        calls.append(1)
        if len(calls) == 1:
            raise _client_error("SlowDown", 503)
        raise _client_error("AccessDenied", 403)

    with pytest.raises(s3io.TransferError, match="AccessDenied"):
        s3io.with_retries(slow_down, "put", tries=5, sleep=lambda s: None, log=None)
    assert len(calls) == 2


def test_local_file_errors_are_not_retried(tmp_path):
    calls = []

    def missing():
        calls.append(1)
        open(tmp_path / "nope")

    with pytest.raises(s3io.TransferError):
        s3io.with_retries(missing, "upload", tries=5, sleep=lambda s: None, log=None)
    assert len(calls) == 1


def test_endpoint_without_env_credentials_is_refused(monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(s3io.CredentialsMissing, match="AWS_ACCESS_KEY_ID"):
        s3io.make_client("http://127.0.0.1:9", "us-east-1")


def test_client_takes_credentials_and_region_from_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    client = s3io.make_client("http://127.0.0.1:9")
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client._request_signer._credentials.access_key == "AKIDEXAMPLE"


def test_join_key():
    assert s3io.join_key("runs/x/", "/model", "a.pb") == "runs/x/model/a.pb"
    assert s3io.join_key("a", "", "b") == "a/b"


def test_upload_download_exists_list(s3_client, tmp_path):
    s3_client.create_bucket(Bucket="iobucket")
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1000)
    s3io.upload_file(s3_client, src, "iobucket", "p/q/f.bin")
    s3io.upload_bytes(s3_client, b"hello", "iobucket", "p/g.txt")
    assert s3io.exists(s3_client, "iobucket", "p/q/f.bin") and not s3io.exists(s3_client, "iobucket", "p/none")
    assert sorted(s3io.list_keys(s3_client, "iobucket", "p")) == ["p/g.txt", "p/q/f.bin"]
    out = s3io.download_file(s3_client, "iobucket", "p/q/f.bin", tmp_path / "d" / "f.bin")
    assert out.read_bytes() == b"x" * 1000 and not list((tmp_path / "d").glob(".*"))
    with pytest.raises(s3io.TransferError, match="s3://iobucket/p/none"):
        s3io.download_file(s3_client, "iobucket", "p/none", tmp_path / "d" / "none")
