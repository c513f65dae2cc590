"""Training data as files in object storage: which files a URL names, and which worker reads which.

A data URL is ``s3://bucket/<glob>`` or ``s3://bucket/<prefix>/``.  A glob is matched with
:func:`fnmatch.fnmatchcase` one ``/``-separated segment at a time, so ``*``, ``?`` and ``[...]`` never
cross a ``/``; only keys under the glob's literal part (everything before the first wildcard) are listed.
A prefix ending in ``/`` (or nothing after the bucket) takes every object under it, also in deeper
folders, but not folder markers (keys ending in ``/``).  Each file is ``{"key", "size", "etag"}``
(etag without its quotes).

:func:`assign` gives each worker its own files, balanced by size; nothing here opens a file's contents
except :func:`first_bytes`, a file's start for its format's check (:mod:`tfc_harness.formats`).  No
TensorFlow import here.
"""

from __future__ import annotations

import fnmatch
import heapq
import re

from botocore.exceptions import ClientError

from . import s3io
from .errors import counted

WILDCARDS = "*?["
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,62}$")
_ALLOWED = "s3://<bucket>/<glob> (e.g. s3://data/train-*.csv) or s3://<bucket>/<prefix>/ (ending in /)"


def parse_url(url: str) -> tuple[str, str]:
    """``s3://b/path/train-*.csv`` -> ``("b", "path/train-*.csv")``; ValueError naming the URL when bad."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"data URL {url!r}: not an s3:// URL; expected {_ALLOWED}")
    bucket, sep, path = url[len("s3://"):].partition("/")
    problem = None
    if not _BUCKET.match(bucket):
        problem = f"bad bucket name {bucket!r}"
    elif not sep:
        problem = "no key pattern or prefix after the bucket"
    elif path.startswith("/") or "//" in path:
        problem = "empty path segment (//)"
    if problem:
        raise ValueError(f"data URL {url!r}: {problem}; expected {_ALLOWED}")
    return bucket, path


def literal_prefix(pattern: str) -> str:
    """The part of ``pattern`` before its first wildcard (all of it when it has none)."""
    cut = min((i for i in (pattern.find(c) for c in WILDCARDS) if i >= 0), default=len(pattern))
    return pattern[:cut]


def is_prefix(pattern: str) -> bool:
    """True for a prefix (ending in ``/``, or empty: the whole bucket), False for a glob."""
    return pattern == "" or pattern.endswith("/")


def matches(key: str, pattern: str) -> bool:
    """True when ``key`` matches the glob ``pattern`` segment by segment (wildcards never cross ``/``)."""
    if is_prefix(pattern):
        return key.startswith(pattern) and not key.endswith("/")
    keys, parts = key.split("/"), pattern.split("/")
    return len(keys) == len(parts) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, parts, strict=True))


def listed_prefix(url: str) -> tuple[str, str]:
    """``(bucket, key prefix)`` under which every file ``url`` names lies (what is listed to find them):
    the prefix itself, or a glob's literal part (``s3://b/d/train-*.csv`` -> ``("b", "d/train-")``)."""
    bucket, pattern = parse_url(url)
    return bucket, pattern if is_prefix(pattern) else literal_prefix(pattern)


def list_files(s3_client, url: str) -> list[dict]:
    """The files ``url`` names, sorted by key: ``[{"key", "size", "etag"}]``; [] when nothing matches.
    Empty objects (markers such as Spark's ``_SUCCESS``) hold no examples and are left out."""
    _, pattern = parse_url(url)
    bucket, prefix = listed_prefix(url)

    def pages():
        return list(s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix))

    found = [{"key": obj["Key"], "size": int(obj["Size"]), "etag": str(obj.get("ETag", "")).strip('"')}
             for page in s3io.with_retries(pages, f"list s3://{bucket}/{prefix}")
             for obj in page.get("Contents", []) if matches(obj["Key"], pattern) and int(obj["Size"]) > 0]
    return sorted(found, key=lambda f: f["key"])


def folder_entries(s3_client, bucket: str, folder: str, limit: int = 100) -> list[str]:
    """What ``s3://bucket/<folder>`` holds directly (``folder``: '' or ending in '/'), in key order: its
    subfolders' prefixes (ending in '/') and its objects' keys, at most ``limit`` of them (one LIST request)."""
    page = s3io.with_retries(lambda: s3_client.list_objects_v2(Bucket=bucket, Prefix=folder, Delimiter="/",
                                                               MaxKeys=limit), f"list s3://{bucket}/{folder}")
    names = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    names += [o["Key"] for o in page.get("Contents", []) if o["Key"] != folder]
    return sorted(names)[:limit]


def assign(files: list[dict], num_workers: int) -> list[list[dict]]:
    """Disjoint per-worker lists (each sorted by key): largest file first to the least-loaded worker.

    Load is (bytes, files, worker index), so ties, empty files included, go to the worker with fewer
    files, then to the lower index; equal sizes are taken in key order.  Deterministic.
    """
    if num_workers < 1:
        raise ValueError(f"need at least one worker, not {num_workers}")
    if len(files) < num_workers:
        raise ValueError(f"{counted(len(files), 'file')} for {counted(num_workers, 'worker')}: worker {len(files)} "
                         "would have no data (every worker needs at least one file; use fewer workers or more, "
                         "smaller files)")
    shares: list[list[dict]] = [[] for _ in range(num_workers)]
    loads = [(0, 0, index) for index in range(num_workers)]
    for f in sorted(files, key=lambda f: (-f["size"], f["key"])):
        size, count, index = heapq.heappop(loads)
        shares[index].append(f)
        heapq.heappush(loads, (size + f["size"], count + 1, index))
    empty = [index for index, share in enumerate(shares) if not sum(f["size"] for f in share)]
    if empty:
        keys = ", ".join(f["key"] for f in shares[empty[0]])
        raise ValueError(f"worker {empty[0]} would get only empty files ({keys})")
    return [sorted(share, key=lambda f: f["key"]) for share in shares]


def first_bytes(s3_client, bucket: str, key: str, count: int) -> bytes:
    """The first ``count`` bytes of ``s3://bucket/key`` (fewer when it is shorter; one ranged GET)."""
    def get():
        return s3_client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{count - 1}")["Body"].read()

    try:
        return s3io.with_retries(get, f"read the start of s3://{bucket}/{key}")
    except s3io.TransferError as exc:
        cause = exc.__cause__
        if isinstance(cause, ClientError) and cause.response.get("Error", {}).get("Code") == "InvalidRange":
            return b""  # an empty object has no byte 0
        raise
