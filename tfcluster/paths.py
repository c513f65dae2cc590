"""Where things live: the repository's folders and a cluster's state under ``.tfcluster/<cluster>/``."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROLES_DIR = REPO / "roles"
PLAYBOOKS_DIR = REPO / "playbooks"
TERRAFORM_DIR = REPO / "terraform"
TRAIN_DIR = REPO / "train"
ANSIBLE_CFG = REPO / "ansible.cfg"


def state_root() -> Path:
    """Root of all run state; ``TFCLUSTER_HOME`` moves it (tests use this)."""
    return Path(os.environ.get("TFCLUSTER_HOME", REPO / ".tfcluster")).resolve()


def artifacts_root() -> Path:
    return Path(os.environ.get("TFCLUSTER_ARTIFACTS", REPO / "artifacts")).resolve()


class ClusterState:
    """The files of one cluster. ``down`` needs nothing but these."""

    def __init__(self, cluster: str, root: Path | None = None):
        self.cluster = cluster
        self.dir = (root or state_root()) / cluster

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def nodes(self) -> Path:
        return self.dir / "nodes.json"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def ssh_dir(self) -> Path:
        return self.dir / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def terraform_dir(self) -> Path:
        return self.dir / "terraform"

    @property
    def node_root(self) -> Path:
        """Local provider: per-node overlay directories."""
        return self.dir / "nodes"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def run(self) -> Path:
        """The current training run's record (run id, phase, published?)."""
        return self.dir / "run.json"

    def exists(self) -> bool:
        return self.dir.is_dir()
