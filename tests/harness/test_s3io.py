"""Retry policy, credentials handling and small S3 helpers."""

from __future__ import annotations

from pathlib import Path

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
    assert {o["Key"]: o["Size"] for o in s3io.list_objects(s3_client, "iobucket", "p/")} == {
        "p/g.txt": 5, "p/q/f.bin": 1000}
    assert s3io.list_folders(s3_client, "iobucket", "p") == ["q"]
    assert s3io.list_folders(s3_client, "iobucket", "x") == []
    out = s3io.download_file(s3_client, "iobucket", "p/q/f.bin", tmp_path / "d" / "f.bin")
    assert out.read_bytes() == b"x" * 1000 and not list((tmp_path / "d").glob(".*"))
    with pytest.raises(s3io.TransferError, match="s3://iobucket/p/none"):
        s3io.download_file(s3_client, "iobucket", "p/none", tmp_path / "d" / "none")


def _ranges_of_downloads(client, bucket, key, dest) -> tuple[list, Path]:
    """The Range header of every GetObject ``s3io.download_file`` sent (None: no Range)."""
    seen = []
    client.meta.events.register("before-send.s3.GetObject", lambda request, **_: seen.append(
        request.headers.get("Range")))
    out = s3io.download_file(client, bucket, key, dest)
    return seen, out


def test_a_whole_objects_client_downloads_an_object_in_one_get(moto_endpoint, s3_client, bucket, tmp_path):
    """The local store (moto) reads the whole object to serve any byte range of it: a client made for it
    (``whole_objects=True``) gets each object with one plain GET; any other keeps ranged parts."""
    payload = bytes(range(256)) * (40 << 12)                   # 40 MiB: 5 ranged parts of 8 MiB
    s3io.upload_bytes(s3_client, payload, bucket, "big.bin")
    ranged, out = _ranges_of_downloads(s3_client, bucket, "big.bin", tmp_path / "a.bin")
    assert len(ranged) == 5 and all(r and r.startswith(b"bytes=") for r in ranged), ranged
    assert out.read_bytes() == payload
    whole_client = s3io.make_client(moto_endpoint, "us-east-1", whole_objects=True)
    whole, out = _ranges_of_downloads(whole_client, bucket, "big.bin", tmp_path / "b.bin")
    # one GET: no Range, or (checksums validated only when required: s3transfer skips its HEAD) a first part
    # that holds the whole object
    assert len(whole) == 1 and whole[0] in (None, f"bytes=0-{(1 << 40) - 1}".encode()), whole
    assert out.read_bytes() == payload


def test_settings_choose_whole_object_gets(monkeypatch):
    from tfc_harness.settings import S3Location

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    base = {"endpoint": "http://10.0.0.1:9555", "region": "us-east-1", "bucket": "b", "run_prefix": "r",
            "checkpoint_prefix": "c", "dataset_prefix": "d"}
    assert s3io.client_from_settings(S3Location(**base)).tfc_download_config is s3io.TRANSFER_CONFIG
    whole = s3io.client_from_settings(S3Location(**base, whole_object_gets=True))
    assert whole.tfc_download_config is s3io.WHOLE_OBJECT_CONFIG


# -- issue 8 item 4: "already published?" must not HEAD (403 for a missing key under a prefix-scoped role)
def test_exists_lists_with_the_key_as_prefix_and_never_heads():
    from botocore.stub import Stubber

    client = _offline_client()
    stub = Stubber(client)
    # a longer key under the same prefix is no proof that the key itself exists
    stub.add_response("list_objects_v2", {"Contents": [{"Key": "runs/r/_SUCCESS.tmp"}], "KeyCount": 1},
                      {"Bucket": "b", "Prefix": "runs/r/_SUCCESS", "MaxKeys": 1})
    stub.add_response("list_objects_v2", {"Contents": [{"Key": "runs/r/_SUCCESS"}], "KeyCount": 1},
                      {"Bucket": "b", "Prefix": "runs/r/_SUCCESS", "MaxKeys": 1})
    stub.add_response("list_objects_v2", {"KeyCount": 0},
                      {"Bucket": "b", "Prefix": "runs/r/_SUCCESS", "MaxKeys": 1})
    with stub:
        assert s3io.exists(client, "b", "runs/r/_SUCCESS") is False
        assert s3io.exists(client, "b", "runs/r/_SUCCESS") is True
        assert s3io.exists(client, "b", "runs/r/_SUCCESS") is False
        stub.assert_no_pending_responses()


def _offline_client(endpoint: str | None = None):
    import boto3

    return boto3.session.Session().client(
        "s3", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret")


# -- item 5: stores without multi-object delete, and checksum headers off AWS
def test_delete_falls_back_to_one_key_at_a_time_when_multi_delete_is_refused():
    from botocore.stub import Stubber

    client = _offline_client("http://127.0.0.1:9")
    stub = Stubber(client)
    stub.add_client_error("delete_objects", "NotImplemented", "POST ?delete is not implemented", 501)
    for key in ("c/ckpt-100.index", "c/ckpt-100.data"):
        stub.add_response("delete_object", {}, {"Bucket": "b", "Key": key})
    with stub:
        s3io.delete_keys(client, "b", ["c/ckpt-100.index", "c/ckpt-100.data"], sleep=lambda s: None, log=None)
        stub.assert_no_pending_responses()


def test_delete_of_other_client_errors_is_not_turned_into_per_key_deletes():
    from botocore.stub import Stubber

    client = _offline_client("http://127.0.0.1:9")
    stub = Stubber(client)
    stub.add_client_error("delete_objects", "AccessDenied", "no", 403)
    with stub, pytest.raises(s3io.TransferError, match="AccessDenied"):
        s3io.delete_keys(client, "b", ["c/x"], sleep=lambda s: None, log=None)


def test_delete_reports_keys_a_multi_delete_did_not_remove():
    from botocore.stub import Stubber

    client = _offline_client("http://127.0.0.1:9")
    stub = Stubber(client)
    stub.add_response("delete_objects", {"Errors": [{"Key": "c/x", "Code": "AccessDenied", "Message": "no"}]})
    with stub, pytest.raises(s3io.TransferError, match="c/x: AccessDenied"):
        s3io.delete_keys(client, "b", ["c/x"], sleep=lambda s: None, log=None)


def test_gcs_endpoint_deletes_per_key_from_the_start():
    from botocore.stub import Stubber

    client = _offline_client("https://storage.googleapis.com")
    stub = Stubber(client)
    stub.add_response("delete_object", {}, {"Bucket": "b", "Key": "c/x"})
    with stub:
        s3io.delete_keys(client, "b", ["c/x"])
        stub.assert_no_pending_responses()


def test_checksums_only_when_required_off_aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    gcs = s3io.make_client("https://storage.googleapis.com", "us-east-1").meta.config
    assert gcs.request_checksum_calculation == "when_required"
    assert gcs.response_checksum_validation == "when_required"
    aws = s3io.make_client(None, "us-east-1").meta.config
    assert aws.request_checksum_calculation == "when_supported"


def test_upload_sends_no_checksum_header_to_an_s3_compatible_store(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    sent = []
    for endpoint in ("https://storage.googleapis.com", None):
        client = s3io.make_client(endpoint, "us-east-1")

        def capture(request, **_):
            sent.append(sorted(h.lower() for h in request.headers.keys()))
            raise RuntimeError("stop before sending")

        client.meta.events.register("before-send.s3.PutObject", capture)
        with pytest.raises(RuntimeError):
            client.put_object(Bucket="b", Key="k", Body=b"data")
    gcs_headers, aws_headers = sent
    def checksum(headers):
        return [h for h in headers if "checksum" in h or h == "x-amz-trailer"]

    assert checksum(gcs_headers) == []
    assert "x-amz-sdk-checksum-algorithm" in checksum(aws_headers)  # the test sees such headers at all


def test_one_retry_layer_a_failing_store_is_asked_exactly_tries_times(monkeypatch):
    """botocore's own retries are off: with tries=3 a store that always answers 503 sees 3 requests, not 9."""
    import http.server
    import threading

    seen = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            body = b"<Error><Code>ServiceUnavailable</Code><Message>down</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = s3io.make_client(f"http://127.0.0.1:{server.server_address[1]}", "us-east-1",
                                  credentials={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
        with pytest.raises(s3io.TransferError, match="failed after 3 tries"):
            s3io.get_bytes(client, "b", "some/key", tries=3, sleep=lambda s: None, log=None)
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/b/some/key"] * 3
