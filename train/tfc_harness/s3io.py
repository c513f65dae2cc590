"""boto3 access to the object store: client factory and retrying transfers.

Credentials come from the environment only (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional
``AWS_SESSION_TOKEN``; region ``AWS_DEFAULT_REGION`` when the settings give none).  They are handed to
boto3 directly, so no credentials file is read or written, and nothing here prints them.  The one
exception is real AWS (no endpoint) without static keys: then boto3's default chain is used so that an
instance role can supply them.

Every call to the store goes through :func:`with_retries` (bounded tries, exponential back-off), the one
retry layer (botocore's own is off), and transfers use one :class:`boto3.s3.transfer.TransferConfig`
(multipart above 8 MiB), but for downloads from a client made with ``whole_objects=True``: the local store (a
``moto`` server) serves a byte range by reading and copying the whole object, so there each object is one
GET (:data:`WHOLE_OBJECT_CONFIG`). The controller uses the same client factory and the same retries.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import boto3
import botocore.config
from boto3.exceptions import S3TransferFailedError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

T = TypeVar("T")

TRANSFER_CONFIG = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024,
                                 max_concurrency=4, use_threads=True)
#: downloads from a store that serves a byte range by reading the whole object (the local store, moto 5: its
#: range GET copies the object, then slices it): one GET per object, its first part as large as any object
#: (with checksums validated only when required, s3transfer skips its HEAD and asks for the first part's
#: range). A 256 MiB object from moto on loopback came at 47 MB/s in 8 MiB ranged parts, 641 MB/s in one GET
WHOLE_OBJECT_CONFIG = TransferConfig(multipart_threshold=1 << 40, multipart_chunksize=1 << 40, use_threads=False)
DEFAULT_TRIES = 5
DEFAULT_BASE_DELAY_S = 0.5
_MAX_DELAY_S = 8.0
# Client errors worth another try (throttling, server-side trouble); other 4xx errors are final.
_RETRYABLE_CODES = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
                    "RequestTimeout", "RequestTimeTooSkewed", "Throttling", "ThrottlingException"}
_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
# Answers of a store without multi-object delete (POST ?delete): delete per key instead. GCS's S3
# interface long lacked it, and botocore >= 1.36 sends the body checksum as x-amz-checksum-crc32, where
# older S3-compatible stores want Content-MD5: both answer 400/501 with one of these codes.
_NO_MULTI_DELETE_CODES = {"NotImplemented", "InvalidArgument", "InvalidRequest", "MalformedXML",
                          "MethodNotAllowed", "MissingContentMD5", "InvalidDigest", "XAmzContentSHA256Mismatch"}
_NO_MULTI_DELETE_HOSTS = ("storage.googleapis.com",)


class CredentialsMissing(RuntimeError):
    """No S3 credentials in the environment for an S3-compatible endpoint."""


class TransferError(RuntimeError):
    """An S3 transfer failed after all tries (or with an error that retrying cannot fix)."""


def make_client(endpoint: str | None = None, region: str | None = None, credentials: dict | None = None,
                whole_objects: bool = False):
    """An S3 client for ``endpoint`` (None: AWS) with credentials from ``credentials`` or the environment;
    ``whole_objects``: :func:`download_file` gets each object in one GET (:data:`WHOLE_OBJECT_CONFIG`).

    botocore's own retries are off: :func:`with_retries` is the one retry layer (bounded, logged), so a
    failing store is tried a known number of times, not botocore's attempts times ours.
    """
    env = credentials if credentials is not None else os.environ
    kwargs = {}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        kwargs = {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
                  "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
                  "aws_session_token": env.get("AWS_SESSION_TOKEN") or None}
    elif endpoint:
        raise CredentialsMissing(
            f"no S3 credentials for {endpoint}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
            "environment of this process")
    config = botocore.config.Config(connect_timeout=10, read_timeout=60,
                                    retries={"total_max_attempts": 1, "mode": "standard"},
                                    s3={"addressing_style": "path"} if endpoint else None,
                                    **checksum_settings(endpoint))
    session = boto3.session.Session()
    client = session.client("s3", endpoint_url=endpoint or None,
                            region_name=region or env.get("AWS_DEFAULT_REGION") or os.environ.get(
                                "AWS_DEFAULT_REGION") or "us-east-1",
                            config=config, **kwargs)
    client.tfc_download_config = WHOLE_OBJECT_CONFIG if whole_objects else TRANSFER_CONFIG
    return client


def checksum_settings(endpoint: str | None) -> dict:
    """botocore Config arguments for ``endpoint``: checksums only where an operation requires them off AWS.

    Since botocore 1.36 every upload carries CRC checksum headers (and trailers on streamed bodies) and every
    download validates one; GCS's S3 interface and older S3-compatible stores reject those requests. AWS
    itself (no endpoint) keeps botocore's defaults.
    """
    if not endpoint:
        return {}
    return {"request_checksum_calculation": "when_required", "response_checksum_validation": "when_required"}


def client_from_settings(settings):
    """:func:`make_client` for a :class:`tfc_harness.settings.Settings` (or its ``s3`` part)."""
    s3 = getattr(settings, "s3", settings)
    return make_client(s3.endpoint, s3.region, whole_objects=s3.whole_object_gets)


def join_key(*parts: str) -> str:
    """``join_key("runs/x/", "/model", "a.pb") == "runs/x/model/a.pb"``"""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return code in _RETRYABLE_CODES or (status.startswith("5") and code != "NotImplemented")
    return isinstance(exc, (BotoCoreError, S3UploadFailedError, S3TransferFailedError, ConnectionError,
                            TimeoutError))


def with_retries(fn: Callable[[], T], what: str, *, tries: int = DEFAULT_TRIES,
                 base_delay_s: float = DEFAULT_BASE_DELAY_S, sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] | None = print) -> T:
    """Call ``fn`` until it succeeds, at most ``tries`` times, sleeping 0.5, 1, 2, 4... s between tries.

    Only botocore errors, timeouts, transfer failures and 5xx/throttling client errors are retried;
    the last error is re-raised wrapped in :class:`TransferError` naming ``what``.
    """
    if tries < 1:
        raise ValueError("tries must be >= 1")
    for attempt in range(1, tries + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified just below
            if not _retryable(exc):
                raise TransferError(f"{what} failed: {exc}") from exc
            if attempt == tries:
                raise TransferError(f"{what} failed after {tries} tries: {exc}") from exc
            delay = min(base_delay_s * 2 ** (attempt - 1), _MAX_DELAY_S)
            if log:
                log(f"{what}: {type(exc).__name__}: {exc}; retry {attempt}/{tries - 1} in {delay:.1f}s")
            sleep(delay)
    raise AssertionError("unreachable")


def upload_file(client, path: str | os.PathLike, bucket: str, key: str, **retry) -> None:
    """Upload one local file (multipart when large)."""
    with_retries(lambda: client.upload_file(str(path), bucket, key, Config=TRANSFER_CONFIG),
                 f"upload {path} to s3://{bucket}/{key}", **retry)


def upload_bytes(client, data: bytes, bucket: str, key: str, **retry) -> None:
    """Upload an in-memory object (a fresh buffer on every try)."""
    with_retries(lambda: client.upload_fileobj(io.BytesIO(data), bucket, key, Config=TRANSFER_CONFIG),
                 f"upload s3://{bucket}/{key}", **retry)


def download_file(client, bucket: str, key: str, path: str | os.PathLike, **retry) -> Path:
    """Download one object to ``path`` (parent dirs created; written to a temp name, then renamed)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")

    def _get():
        client.download_file(bucket, key, str(tmp), Config=getattr(client, "tfc_download_config", TRANSFER_CONFIG))
        os.replace(tmp, target)

    try:
        with_retries(_get, f"download s3://{bucket}/{key}", **retry)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def get_bytes(client, bucket: str, key: str, **retry) -> bytes:
    return with_retries(lambda: client.get_object(Bucket=bucket, Key=key)["Body"].read(),
                        f"get s3://{bucket}/{key}", **retry)


def exists(client, bucket: str, key: str, **retry) -> bool:
    """True when the object exists.

    Asked with a listing that has the key as its prefix, not a HEAD: S3 answers a HEAD of a missing key
    with 403, not 404, unless the caller holds s3:ListBucket on the whole bucket, and the nodes' AWS role
    may list only under the run's prefixes (an ``s3:prefix`` condition, which a HEAD does not carry). The
    key itself sorts first among the keys it prefixes, so one listed key is enough.
    """
    resp = with_retries(lambda: client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1),
                        f"look for s3://{bucket}/{key}", **retry)
    return any(obj.get("Key") == key for obj in resp.get("Contents", []))


def etag(client, bucket: str, key: str, **retry) -> str | None:
    """The object's ETag without quotes, or None when there is no such object (asked with a listing, as
    :func:`exists` is, for the same reason)."""
    resp = with_retries(lambda: client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1),
                        f"look up s3://{bucket}/{key}", **retry)
    found = [obj for obj in resp.get("Contents", []) if obj.get("Key") == key]
    return str(found[0].get("ETag", "")).strip('"') if found else None


def list_objects(client, bucket: str, prefix: str, tries: int = DEFAULT_TRIES,
                 log: Callable[[str], None] | None = print) -> Iterator[dict]:
    """The listing entry (``Key``, ``Size``, ``ETag``...) of every object under ``prefix/`` (a folder);
    ``tries`` and ``log`` as :func:`with_retries` takes them."""
    folder = prefix.strip("/") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder)
    for page in with_retries(lambda: list(pages), f"list s3://{bucket}/{folder}", tries=tries, log=log):
        yield from page.get("Contents", [])


def list_keys(client, bucket: str, prefix: str, tries: int = DEFAULT_TRIES,
              log: Callable[[str], None] | None = print) -> Iterator[str]:
    """Every key under ``prefix/`` (the prefix is treated as a folder)."""
    for obj in list_objects(client, bucket, prefix, tries=tries, log=log):
        yield obj["Key"]


def list_folders(client, bucket: str, prefix: str) -> list[str]:
    """The names of the folders directly under ``prefix/`` (``runs/c/`` -> ``["run1", "run2"]``), sorted."""
    folder = prefix.strip("/") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder, Delimiter="/")
    return sorted(common["Prefix"][len(folder):].strip("/")
                  for page in with_retries(lambda: list(pages), f"list s3://{bucket}/{folder}")
                  for common in page.get("CommonPrefixes", []))


def _multi_delete_refused(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(error.get("Code", "")) in _NO_MULTI_DELETE_CODES or status in (400, 405, 501)


def _endpoint_host(client) -> str:
    from urllib.parse import urlsplit

    return urlsplit(getattr(client.meta, "endpoint_url", "") or "").hostname or ""


def delete_keys(client, bucket: str, keys: list[str], **retry) -> None:
    """Delete ``keys``: 1000 per multi-object delete, or one by one where the store has no such request.

    A store named in ``_NO_MULTI_DELETE_HOSTS`` is asked per key from the start; any other store that
    refuses the first multi-object delete as unsupported is asked per key from then on. Keys a multi-object
    delete reports as failed raise :class:`TransferError`.
    """
    per_key = _endpoint_host(client) in _NO_MULTI_DELETE_HOSTS
    for start in range(0, len(keys), 1000):
        chunk = keys[start:start + 1000]
        if not per_key:
            try:
                with_retries(lambda chunk=chunk: _delete_many(client, bucket, chunk),
                             f"delete {len(chunk)} objects in s3://{bucket}", **retry)
                continue
            except TransferError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, ClientError) and _multi_delete_refused(cause)):
                    raise
                per_key = True
        for key in chunk:
            with_retries(lambda key=key: client.delete_object(Bucket=bucket, Key=key),
                         f"delete s3://{bucket}/{key}", **retry)


def _delete_many(client, bucket: str, chunk: list[str]) -> None:
    _raise_failed(bucket, client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk],
                                                                       "Quiet": True}))


def _raise_failed(bucket: str, resp: dict) -> None:
    errors = resp.get("Errors") or []
    if errors:
        first = errors[0]
        raise TransferError(f"delete in s3://{bucket}: {len(errors)} object(s) not deleted, e.g. "
                            f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}".rstrip())
