"""A cluster's groups of nodes: where a sweep's trials run side by side.

A cluster brought up for a sweep with ``parallel: N`` has N groups, each with every role its strategy
needs. Group 0 is the cluster itself (so a sweep with ``parallel: 1`` runs on a plain ``make up``); group
k ≥ 1 is a cluster of its own named ``<cluster>-g<k>``, with its own nodes, private network, keys and
(on a cloud) its own storage grant, so a trial's TensorFlow tasks can only ever reach its own group's.
Every group is an ordinary cluster to the rest of tfcluster (``up``, ``train``, ``status``, ``down`` and
the down guard work on it as on any cluster); ``.tfcluster/<cluster>/groups.json`` lists the extra
groups, so ``make down`` and ``make status`` of the cluster cover them.
"""

from __future__ import annotations

import ipaddress
import json

from .config import RunSpec, resolve
from .errors import ConfigError
from .paths import ClusterState

#: `<cluster>-g<k>` must still be a valid cluster name (at most 20 characters)
MAX_CLUSTER_NAME = 16
MAX_GROUPS = 9


def name(cluster: str, k: int) -> str:
    """Group k's cluster name: the cluster itself for group 0."""
    return cluster if k == 0 else f"{cluster}-g{k}"


def check_parallel(cluster: str, parallel: int, field: str) -> None:
    if not 1 <= parallel <= MAX_GROUPS:
        raise ConfigError(field, parallel, f"an integer from 1 to {MAX_GROUPS} (groups of nodes)")
    if parallel > 1 and len(cluster) > MAX_CLUSTER_NAME:
        raise ConfigError("cluster", cluster, f"at most {MAX_CLUSTER_NAME} characters when {field} is "
                                              f"{parallel} (its groups are named {cluster}-g1 ...)")


def spec_for(spec: RunSpec, k: int) -> RunSpec:
    """Group k's configuration: the cluster's, with the group's name and (when the cluster's local subnet
    is given, not ``auto``) the k-th next subnet of the same size."""
    if k == 0:
        return spec
    values = spec.to_dict()
    values["cluster"] = name(spec.cluster, k)
    subnet = values.get("network", {}).get("subnet", "auto")
    if subnet != "auto":
        net = ipaddress.ip_network(subnet)
        shifted = ipaddress.ip_network((int(net.network_address) + k * net.num_addresses, net.prefixlen))
        values["network"] = dict(values["network"], subnet=str(shifted))
    return resolve(values)


def _record(cluster: str):
    return ClusterState(cluster).dir / "groups.json"


def extra(cluster: str) -> list[str]:
    """The cluster names of groups 1.. of ``cluster`` that were brought up (and not yet taken down)."""
    try:
        return list(json.loads(_record(cluster).read_text())["groups"])
    except (OSError, ValueError, KeyError):
        return []


def remember(cluster: str, group: str) -> None:
    names = extra(cluster)
    if group not in names:
        path = _record(cluster)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"groups": sorted(names + [group])}, indent=2) + "\n")


def forget(cluster: str, group: str) -> None:
    names = [g for g in extra(cluster) if g != group]
    path = _record(cluster)
    if names:
        path.write_text(json.dumps({"groups": names}, indent=2) + "\n")
    else:
        path.unlink(missing_ok=True)
