"""Whether a cluster's nodes are configured with exactly what a configure would apply now.

Configure (``playbooks/site.yml``) applies the image roles and tf_node's standing part; on each node it
applied them to, it leaves :data:`STAMP`, holding the digest of everything that decides what it does
(:func:`digest`): every file of the roles and of the playbooks it runs, ``ansible.cfg``, the variables
tfcluster passes (TensorFlow version, where the wheels come from, the image keys) and the inventory (the
nodes, their addresses and roles, the cluster spec). A node whose image holds those roles as this
configuration has them (its image key, :data:`tfcluster.baked.KEY_FILE`, is its role's in the provider's
``image_keys``) gets none of them, and no stamp: its image key says as much, from its first boot.

When every node answers with that digest or with that image key, configure would change nothing and is
skipped: one SSH read per node, in parallel, instead of the playbook. Any other node (new on a bare or an
older image, replaced, a failed or interrupted configure, anything above changed) gets the playbook. Nothing
of a run is in it (the harness bundle with the user's model, the firewall, the credentials): those come with
the run's start (``playbooks/train.yml``), so a new model never makes a node configure again.
"""

from __future__ import annotations

import hashlib
import json

from . import baked, remote
from .paths import ANSIBLE_CFG, PLAYBOOKS_DIR, REPO, ROLES_DIR, ClusterState
from .providers.base import Node

#: on each node: the digest of its last successful configure (root's, 0644; per node, never in an image)
STAMP = "/var/lib/tfcluster/configured"
#: variables that do not change what configure does (the wheelhouse's address is chosen per configure)
VOLATILE = ("tensorflow_wheelhouse_url",)


def digest(state: ClusterState, variables: dict) -> str:
    """The digest of what a configure of ``state``'s nodes with ``variables`` applies."""
    files = [p for p in [*ROLES_DIR.rglob("*"), *PLAYBOOKS_DIR.glob("*.yml"), ANSIBLE_CFG] if p.is_file()]
    h = hashlib.sha256(baked.digest_files(files, REPO).encode())
    h.update(json.dumps({k: v for k, v in variables.items() if k not in VOLATILE}, sort_keys=True).encode())
    h.update(state.inventory.read_bytes())
    return h.hexdigest()[:16]


def read_stamps(state: ClusterState, nodes: list[Node]) -> dict[str, tuple[str, str] | None]:
    """Each node's (stamp, image key), '' for a file it lacks; None where the node does not answer. Read in
    parallel, one SSH command per node (both files are 0644: no sudo)."""
    command = f"printf '%s\\n%s\\n' \"$(cat {STAMP} 2>/dev/null)\" \"$(cat {baked.KEY_FILE} 2>/dev/null)\""

    def one(node: Node) -> tuple[str, str] | None:
        res = remote.run(state, node, command, timeout=20, root=False)
        if res is None or res.returncode != 0:
            return None
        stamp, key = (res.stdout.split("\n") + ["", ""])[:2]
        return stamp.strip(), key.strip()

    return remote.on_each(nodes, one)


def up_to_date(state: ClusterState, nodes: list[Node], wanted: str, image_keys: dict[str, str]) -> bool:
    """True when every node answers and either holds the stamp ``wanted`` or runs an image whose key is its
    role's in ``image_keys`` (site.yml would only check on it: the image holds everything it applies)."""
    def current(node: Node, got: tuple[str, str] | None) -> bool:
        if got is None:
            return False
        stamp, key = got
        return stamp == wanted or bool(image_keys.get(node.role)) and key == image_keys[node.role]

    got = read_stamps(state, nodes)
    return bool(nodes) and all(current(n, got[n.name]) for n in nodes)
