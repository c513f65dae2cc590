"""Whether a cluster's nodes are configured with exactly what a configure would apply now.

A configure that succeeds on every node leaves :data:`STAMP` on each (``playbooks/site.yml``, last), holding
the digest of everything that decides what it does (:func:`digest`): every file of the roles and of the
playbooks it runs, ``ansible.cfg``, the variables tfcluster passes (TensorFlow version, the harness bundle
with the user's model, the image keys, ...) and the inventory (the nodes, their addresses and roles, the
cluster spec). When every node answers with that digest, nothing would change and configure is skipped:
one SSH read per node, in parallel, instead of the playbook. A node without the stamp (new, replaced, a
failed or interrupted configure) or with another digest (anything above changed) gets the playbook.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

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


def read_stamps(state: ClusterState, nodes: list[Node]) -> dict[str, str | None]:
    """Each node's stamp (None: no stamp, or the node does not answer), read in parallel."""
    def one(node: Node) -> str | None:
        res = remote.run(state, node, f"cat {STAMP}", timeout=20, root=False)   # 0644: no sudo needed
        return res.stdout.strip() if res is not None and res.returncode == 0 else None

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(nodes)))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))


def up_to_date(state: ClusterState, nodes: list[Node], wanted: str) -> bool:
    """True when every node's stamp is ``wanted``."""
    return bool(nodes) and all(v == wanted for v in read_stamps(state, nodes).values())
