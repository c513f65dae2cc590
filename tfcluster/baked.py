"""Baked node images: what ``playbooks/site.yml`` installs that is not per node, installed once.

The roles common, gpu_driver and tensorflow (apt packages, the TensorFlow venv from the wheelhouse, ...) do
the same on every node, and so does tf_node's standing part (the task user, its directories, the supervisor);
the rest of tf_node (the harness bundle, keys, the firewall) comes with each run's start. An image holds
the result of those, applied by the same roles (``playbooks/image.yml``) to a *builder* node:

- local: the builder is a one-node local cluster on the base image (:mod:`tfcluster.image`); its overlay
  upper directory after the roles ran, scrubbed of per-node state (:data:`PER_NODE`), becomes a read-only
  layer under ``<cache>/_images/<name>-<key>/layer`` that local nodes mount between their own upper
  directory and the base image (``lowerdir=<layer>:<base>``);
- aws: the builder is an instance of the base AMI; the image is ``CreateImage`` of it, tagged with the key
  (:mod:`tfcluster.providers.aws_image`).

One function drives both (:func:`bake`): start the builder, apply the roles over SSH, capture, stop.

An image is named by a content key (:class:`Inputs`): the base image, every file of the three roles but the
lock files, the lock file of the image's TensorFlow package, the playbook, and the values those roles read
from the configuration (TensorFlow version, package, GPUs, where the wheels come from, CPU architecture). A
change to any of them makes a new image; an image is never altered once built (a new key, a new
directory). The image records its key (:data:`KEY_FILE`); configure (``playbooks/site.yml``) skips the image
roles on a node whose key is the one this configuration would bake (the provider's ``image_keys``), and
:mod:`tfcluster.configured` skips the playbook when every node is such a node. On any other node (a bare
image, an older image) the roles run; on an image they only check (changed=0).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from . import ansible_run, image, remote, tfsupport, wheelhouse
from .config import RunSpec
from .errors import TfclusterError
from .paths import REPO, ROLES_DIR, ClusterState, made_once
from .providers.base import Node

#: the roles an image holds (site.yml applies tf_node after them, per node)
IMAGE_ROLES = ("common", "gpu_driver", "tensorflow")
#: and the files of tf_node's standing part that it holds too (the task user, its directories, the supervisor:
#: the same on every node and in every run), relative to roles/
IMAGE_ROLE_PARTS = ("tf_node/tasks/host.yml", "tf_node/files/tfc-supervise", "tf_node/files/tfc-warm",
                    "tf_node/defaults/main.yml")
PLAYBOOK = "image.yml"
#: nodes.<role>.image on local: the bare base image (configure installs everything, as on a fresh cloud VM)
BASE = "base"
KIND = "tfcluster-node-image"
#: bump when what :func:`bake` does to a builder changes what the image holds
REVISION = 2
#: where an image records its content key (playbooks/image.yml writes it; site.yml reads it on each node)
KEY_FILE = "/etc/tfcluster-image-key"

#: per-node state removed from a baked layer (paths relative to its root; globs allowed); the node's own
#: upper directory supplies its own host key, sshd config, hostname, hosts, login key and apt proxy
PER_NODE = (
    "etc/ssh/ssh_host_*", "etc/ssh/tfcluster_host_ed25519_key*", "etc/ssh/tfcluster_sshd_config",
    "root/.ssh", "home/*/.ssh", "etc/hostname", "etc/hosts", "etc/machine-id", "var/lib/dbus/machine-id",
    "etc/apt/apt.conf.d/01tfcluster-proxy", "var/lib/tfcluster/configured", "var/lib/tfcluster/task/*",
    "opt/tfcluster/run/*", "opt/tfcluster/harness.tar.gz", "opt/tfcluster/harness/.bundle-*", "etc/tfcluster/*",
    "etc/tfcluster-deadline", "tmp/*", "var/tmp/*",
    "root/.ansible", "home/*/.ansible", "root/.cache", "home/*/.cache", "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin", "var/log/*",
)


@dataclass(frozen=True)
class Inputs:
    """What an image holds, as far as it can differ: its hash is the image's key."""

    base: str               # the base image's key (local) or AMI id (aws)
    roles: str              # digest of the image roles' files (locks aside) and the playbook
    lock: str               # sha256 of the lock file of the image's TensorFlow package
    tensorflow_version: str
    package: str
    gpus: int
    source: str             # wheelhouse | index
    arch: str
    revision: int = REVISION

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"tf-{self.tensorflow_version}-{'gpu' if self.gpus else 'cpu'}"

    @property
    def full_name(self) -> str:
        return f"{self.name}-{self.key}"


def digest_files(paths: list[Path], root: Path) -> str:
    """One digest of files: each one's path below ``root``, executable bits and content."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        digest.update(f"{rel}\0{os.stat(path).st_mode & 0o111:o}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def roles_digest(roles_dir: Path = ROLES_DIR, playbook: Path = REPO / "playbooks" / PLAYBOOK) -> str:
    """Every file of the image roles (tasks, defaults, vars, templates, files, handlers, meta), those of
    tf_node's standing part (:data:`IMAGE_ROLE_PARTS`) and the playbook; the lock files are hashed one by one
    (:func:`inputs_for`): only the image's own counts."""
    files = [p for role in IMAGE_ROLES for p in (roles_dir / role).rglob("*")
             if p.is_file() and "locks" not in p.relative_to(roles_dir / role).parts]
    files += [roles_dir / part for part in IMAGE_ROLE_PARTS if (roles_dir / part).is_file()]
    files.append(playbook)
    return digest_files(files, roles_dir.parent)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def inputs_for(spec: RunSpec, gpus: int, base: str, source: str = "wheelhouse", arch: str | None = None,
               roles_dir: Path = ROLES_DIR, playbook: Path = REPO / "playbooks" / PLAYBOOK) -> Inputs:
    """The image inputs of a node with ``gpus`` GPUs, of the configuration ``spec``, on ``base``."""
    arch = arch or platform.machine()
    package = tfsupport.package_for(gpus, arch)
    version = spec.tensorflow.version
    lock = roles_dir / "tensorflow" / "files" / "locks" / tfsupport.lock_file(package, version).name
    if not lock.is_file():
        raise TfclusterError(f"no lock file {lock} for TensorFlow {version}: `make lock` writes it")
    return Inputs(base=base, roles=roles_digest(roles_dir, playbook), lock=_sha256(lock),
                  tensorflow_version=version, package=package, gpus=gpus, source=source, arch=arch)


def local_inputs(spec: RunSpec, gpus: int = 0) -> Inputs:
    return inputs_for(spec, gpus, image.default_recipe().key)


# -- local images on disk ------------------------------------------------------------------------------
def images_dir() -> Path:
    return image.images_dir()


def built() -> list[dict]:
    """Every baked image on this machine (image.json of each, with its directory), newest first."""
    found = []
    for meta in images_dir().glob("*/image.json"):
        try:
            data = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if data.get("kind") == KIND:
            found.append(dict(data, dir=str(meta.parent)))
    return sorted(found, key=lambda d: d.get("built", 0), reverse=True)


def find(key: str) -> dict | None:
    """The newest built image with this content key, or None."""
    return next((d for d in built() if d.get("key") == key), None)


def by_name(name: str) -> dict | None:
    return next((d for d in built() if Path(d["dir"]).name == name), None)


def layer(entry: dict) -> str:
    return str(Path(entry["dir"]) / "layer")


def scrub(root: Path) -> list[str]:
    """Remove per-node state (:data:`PER_NODE`) from a baked layer; returns what was removed."""
    removed = []
    for pattern in PER_NODE:
        for path in sorted(root.glob(pattern)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path.relative_to(root).as_posix())
    return removed


# -- baking --------------------------------------------------------------------------------------------
class Builder(Protocol):
    """A node the image roles are applied to, and how its result becomes an image."""

    inputs: Inputs

    def start(self) -> tuple[ClusterState, list[Node], str | None]:
        """Make the builder node; return its state (inventory written, SSH answering), its node and the
        address the wheelhouse is served on (None: the node reads a package index)."""

    def capture(self) -> dict:
        """Turn the configured node into an image; return its record (``image.json``'s content)."""

    def stop(self) -> None:
        """Remove the builder node and everything it made (also after a failure)."""


def role_variables(spec: RunSpec, offline: bool, wheels: Path | None) -> dict:
    """The variables the image roles read (the same ``configure`` passes them)."""
    return {"tensorflow_version": spec.tensorflow.version,
            "tensorflow_source": "wheelhouse" if offline else "index",
            "tensorflow_wheelhouse_src": str(wheels or "")}


def apply_roles(spec: RunSpec, state: ClusterState, nodes: list[Node], host: str | None,
                log: Callable[[str], None], key: str = "") -> dict[str, dict[str, int]]:
    """Apply the image roles (``playbooks/image.yml``) to ``nodes``: the recap per node. ``key``: the image's
    content key, written to the node (:data:`KEY_FILE`) for configure to find."""
    wheels = wheelhouse.ensure(spec.tensorflow.version, wheelhouse.packages_for([n.gpus for n in nodes]),
                               log=log) if host else None
    variables = dict(role_variables(spec, host is not None, wheels), tfcluster_image_key=key)
    state.logs.mkdir(parents=True, exist_ok=True)
    with (wheelhouse.serve(wheels, host) if host else nullcontext()) as url:
        if url:
            variables["tensorflow_wheelhouse_url"] = url
        (state.dir / "vars").mkdir(exist_ok=True)
        extra = state.dir / "vars" / "image-vars.json"
        extra.write_text(json.dumps(variables, indent=2) + "\n")
        recap = ansible_run.playbook(state, PLAYBOOK, extra, forks=max(len(nodes), 1),
                                     log_file=state.logs / "image.log", limit=[n.name for n in nodes])
    ansible_run.check_reported(recap, [n.name for n in nodes], "image roles")
    return recap


def bake(spec: RunSpec, builder: Builder, log: Callable[[str], None] = print) -> dict:
    """Start the builder, apply the image roles to it, capture the image, stop the builder (always)."""
    started = time.monotonic()
    try:
        state, nodes, host = builder.start()
        apply_roles(spec, state, nodes, host, log, key=builder.inputs.key)
        record = builder.capture()
    finally:
        builder.stop()
    log(f"image {record.get('name')} baked in {time.monotonic() - started:.0f}s")
    return record


# -- the local builder ---------------------------------------------------------------------------------
def builder_name(cluster: str) -> str:
    """The builder's cluster name, from the cluster it bakes for (a valid cluster name, <= 20 chars)."""
    return f"{cluster[:15]}-bake"


class LocalBuilder:
    """A one-node local cluster on the base image (the real terraform/local module), on the subnet of the
    cluster it bakes for (free: baking happens before that cluster's nodes exist)."""

    def __init__(self, spec: RunSpec, inputs: Inputs, log: Callable[[str], None] = print):
        from .config import resolve
        from .providers.local import subnet_for

        self.inputs, self.log = inputs, log
        name = builder_name(spec.cluster)
        self.spec = resolve(spec.to_dict(), {"cluster": name, "network.subnet": subnet_for(spec)},
                            check_files=False)
        self.state = ClusterState(name, root=images_dir() / ".builders")
        self.final = images_dir() / inputs.full_name
        self.nodes: list[Node] = []

    def _provider(self):
        from .providers.local import LocalProvider

        return LocalProvider(self.state)

    def start(self) -> tuple[ClusterState, list[Node], str | None]:
        from . import inventory
        from .cluster import ensure_ssh_key, wait_for_ssh
        from .providers.base import write_nodes

        provider = self._provider()
        provider.check(self.spec)
        self.state.dir.mkdir(parents=True, exist_ok=True)
        public_key = ensure_ssh_key(self.state)
        image.ensure(log=self.log)
        inputs = provider.inputs(self.spec, public_key)
        # one node, on the bare base image: the roles' shape checks (boilerplate.yml) are not in image.yml
        inputs.update(ps_count=0, worker_count=0, chief_count=1, images={})
        self.log(f"baking image {self.inputs.full_name} on a builder node ({self.spec.cluster}, "
                 f"{provider.provider_options(self.spec)['subnet']})")
        tf = provider.module()
        tf.write_root(inputs)
        tf.apply()
        self.nodes = [Node.from_dict(d) for d in tf.output("nodes")]
        write_nodes(self.state.nodes, self.nodes)
        inventory.write(self.state, self.nodes, self.spec.network.tf_port, self.spec.strategy)
        wait_for_ssh(self.state, self.nodes, min(self.spec.ssh.timeout_seconds, 120))
        return self.state, self.nodes, provider.wheelhouse_host(self.spec)

    def capture(self) -> dict:
        from . import localnode

        node = self.nodes[0]
        # its processes gone, the node's mount namespace (and the overlay on its upper directory) is gone
        localnode.kill_netns_processes(localnode.netns_prefix(self.spec.cluster) + node.name)
        upper = self.state.node_root / node.name / "upper"
        work = images_dir() / f".build-{self.final.name}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        os.rename(upper, work / "layer")  # same file system: the builders' state is under the images dir
        removed = scrub(work / "layer")
        size = sum(p.lstat().st_size for p in (work / "layer").rglob("*"))
        record = {"kind": KIND, "name": self.final.name, "key": self.inputs.key, "inputs": asdict(self.inputs),
                  "base": str(image.rootfs(image.default_recipe())), "built": time.time(),
                  "bytes": size, "removed_per_node_state": removed,
                  "roles": list(IMAGE_ROLES), "python": sys.version.split()[0]}
        (work / "image.json").write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(self.final, ignore_errors=True)  # a half-written one from an interrupted build
        work.rename(self.final)
        return dict(record, dir=str(self.final))

    def stop(self) -> None:
        provider = self._provider()
        try:
            provider.down()
        except TfclusterError as exc:
            self.log(f"builder teardown: {str(exc).splitlines()[0]}; cleaning up directly")
        provider.force_cleanup()
        left = provider.leftovers()
        remote.close_masters(self.state)      # its nodes are gone: nothing else ends their SSH masters sooner
        for path in (self.state.dir, self.state.control_dir):   # (its SSH sockets' directory is in the temp dir)
            shutil.rmtree(path, ignore_errors=True)
        if left:
            raise TfclusterError(f"the image builder {self.spec.cluster} left: {', '.join(left)}")


def ensure_local(spec: RunSpec, log: Callable[[str], None] = print, gpus: int = 0) -> dict:
    """The local image matching ``spec`` (its record), baked first if there is none (once: concurrent
    callers wait on a lock and then find it)."""
    inputs = local_inputs(spec, gpus)
    return made_once(images_dir() / ".bake.lock", lambda: find(inputs.key),
                     lambda: bake(spec, LocalBuilder(spec, inputs, log), log))
