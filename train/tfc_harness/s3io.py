"""boto3 access to the object store: client factory and retrying transfers.

Credentials come from the environment only (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional
``AWS_SESSION_TOKEN``; region ``AWS_DEFAULT_REGION`` when the settings give none).  They are handed to
boto3 directly, so no credentials file is read or written, and nothing here prints them.  The one
exception is real AWS (no endpoint) without static keys: then boto3's default chain is used so that an
instance role can supply them.

Every upload and download goes through :func:`with_retries` (bounded tries, exponential back-off) and uses
one :class:`boto3.s3.transfer.TransferConfig` (multipart above 8 MiB).
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
DEFAULT_TRIES = 5
DEFAULT_BASE_DELAY_S = 0.5
_MAX_DELAY_S = 8.0
# Client errors worth another try (throttling, server-side trouble); other 4xx errors are final.
_RETRYABLE_CODES = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
                    "RequestTimeout", "RequestTimeTooSkewed", "Throttling", "ThrottlingException"}
_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}


class CredentialsMissing(RuntimeError):
    """No S3 credentials in the environment for an S3-compatible endpoint."""


class TransferError(RuntimeError):
    """An S3 transfer failed after all tries (or with an error that retrying cannot fix)."""


def make_client(endpoint: str | None = None, region: str | None = None):
    """An S3 client for ``endpoint`` (None: AWS) with credentials taken from the environment."""
    env = os.environ
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
                                    retries={"max_attempts": 3, "mode": "standard"},
                                    s3={"addressing_style": "path"} if endpoint else None)
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint or None,
                          region_name=region or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                          config=config, **kwargs)


def client_from_settings(settings):
    """:func:`make_client` for a :class:`tfc_harness.settings.Settings` (or its ``s3`` part)."""
    s3 = getattr(settings, "s3", settings)
    return make_client(s3.endpoint, s3.region)


def join_key(*parts: str) -> str:
    """``join_key("runs/x/", "/model", "a.pb") == "runs/x/model/a.pb"``"""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return code in _RETRYABLE_CODES or status.startswith("5")
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
        client.download_file(bucket, key, str(tmp), Config=TRANSFER_CONFIG)
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
    """True when the object exists (a 404 is an answer, not an error)."""
    def _head() -> bool:
        try:
            client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in _NOT_FOUND_CODES:
                return False
            raise
    return with_retries(_head, f"head s3://{bucket}/{key}", **retry)


def list_keys(client, bucket: str, prefix: str) -> Iterator[str]:
    """Every key under ``prefix/`` (the prefix is treated as a folder)."""
    folder = prefix.strip("/") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder)
    for page in with_retries(lambda: list(pages), f"list s3://{bucket}/{folder}"):
        for obj in page.get("Contents", []):
            yield obj["Key"]


def delete_keys(client, bucket: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        chunk = [{"Key": k} for k in keys[start:start + 1000]]
        with_retries(lambda chunk=chunk: client.delete_objects(Bucket=bucket, Delete={"Objects": chunk}),
                     f"delete {len(chunk)} objects in s3://{bucket}")
