"""What the nodes may do in object storage: the one statement of it.

A run's tasks write under ``<storage.prefix>/<cluster>/<run-id>/`` (the chief: checkpoints, of which it
deletes those it rotated out, then the model, ``manifest.json``, ``metrics.json`` and ``_SUCCESS``; under
multi_worker_mirrored the workers read the checkpoints and ``_SUCCESS`` there) and read their data: the
model module's ``make_dataset()`` arrays, which the controller stores under ``datasets/<model>-<sha12>/``, or
the files ``data.train`` and ``data.test`` name, in any bucket. No node writes data, and no node lists
it: the controller lists the files and hands each task its keys. :func:`storage_access` states this for
one configuration:

* ``jobs``: the TensorFlow jobs whose nodes use storage (:func:`tfc_harness.strategies.storage_jobs`, ps
  never): only their nodes get the cloud identity (terraform/aws, terraform/gcp) or a site's static keys
  (the tf_node role's env file, written when their tasks start and removed when the run's tasks stop and
  before ``down``);
* ``read_write``: ``<prefix>/<cluster>/`` in the run's bucket: get, put, delete, and list under it;
* ``read``: the data, as (bucket, key prefix) pairs: get only.

The cloud modules grant exactly this (their ``storage_access`` input, validated there); a cluster may
train only on what it was granted at ``up`` (:func:`check_granted`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from tfc_harness import strategies

from . import job
from .config import RunSpec
from .errors import ConfigError, TfclusterError

#: key prefixes a policy can name as they are: letters, digits and S3's other "safe" characters (no
#: wildcard of IAM's, no '$' of its policy variables, no quote or backslash of a CEL string)
_GRANTABLE = re.compile(r"[A-Za-z0-9!_.'()/-]*")


@dataclass(frozen=True, order=True)
class ReadGrant:
    """Objects of ``bucket`` whose keys start with ``prefix`` ('' = every object), read only."""

    bucket: str
    prefix: str

    def covers(self, other: ReadGrant) -> bool:
        return self.bucket == other.bucket and other.prefix.startswith(self.prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}*"


@dataclass(frozen=True)
class StorageAccess:
    jobs: tuple[str, ...]
    bucket: str
    read_write: str
    read: tuple[ReadGrant, ...]

    def module_input(self) -> dict:
        """The ``storage_access`` input of every module under terraform/ (``bucket`` is its own input)."""
        return {"jobs": list(self.jobs), "read_write": self.read_write, "read": [asdict(g) for g in self.read]}


def cluster_prefix(spec: RunSpec) -> str:
    """``<prefix>/<cluster>``: the cluster's runs, and all its nodes may write."""
    return f"{spec.storage.prefix}/{spec.cluster}"


def run_prefix(spec: RunSpec, run_id: str) -> str:
    return f"{cluster_prefix(spec)}/{run_id}"


def _data_grants(spec: RunSpec) -> tuple[ReadGrant, ...]:
    from tfc_harness import data, sources  # they import boto3: not before it is needed (providers stay light)

    if not spec.data.train:
        return (ReadGrant(spec.storage.bucket, data.versions_prefix(job.dataset_base(spec))),)
    grants = sorted({ReadGrant(*sources.listed_prefix(url)) for url in (spec.data.train, spec.data.test)})
    return tuple(g for g in grants if not any(o != g and o.covers(g) for o in grants))


def storage_access(spec: RunSpec) -> StorageAccess:
    return StorageAccess(jobs=strategies.storage_jobs(spec.strategy), bucket=spec.storage.bucket,
                         read_write=cluster_prefix(spec) + "/", read=_data_grants(spec))


def check_grantable(spec: RunSpec, provider: str) -> None:
    """Refuse data whose key prefix a cloud policy cannot name as it is (ConfigError naming the field)."""
    from tfc_harness import sources

    for field, url in (("data.train", spec.data.train), ("data.test", spec.data.test)):
        if url and not _GRANTABLE.fullmatch(sources.listed_prefix(url)[1]):
            raise ConfigError(field, url, f"on {provider}, a key prefix (the part before the first wildcard) of "
                                          "letters, digits and ! _ . ' ( ) / - only: the nodes' identity is "
                                          "granted read access to it by name")


def check_granted(granted: StorageAccess, wanted: StorageAccess, cluster: str) -> None:
    """A run may use only what the cluster's nodes were granted at ``up`` (TfclusterError naming the rest)."""
    missing = [str(g) for g in wanted.read if not any(h.covers(g) for h in granted.read)]
    if (wanted.bucket, wanted.read_write) != (granted.bucket, granted.read_write):
        missing.insert(0, f"s3://{wanted.bucket}/{wanted.read_write}* (read-write)")
    if missing:
        raise TfclusterError(
            f"the nodes of cluster {cluster} were granted s3://{granted.bucket}/{granted.read_write}* and "
            f"{', '.join(map(str, granted.read))} when it came up; this run needs {', '.join(missing)}: run "
            f"'make up' with this configuration first (it updates the nodes' grant)")
