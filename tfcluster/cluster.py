"""Cluster lifecycle: up, down, status. Each step prints what it does and how long it took."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import inventory, job, poll, remote, runrecord, store
from .config import ROLES, RunSpec, resolve
from .errors import Busy, ClusterMismatch, ProvisionError, TfclusterError
from .paths import ClusterState, held_alone, lock_holder
from .providers import get_provider
from .providers.base import Node, Provider, read_nodes, write_nodes


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


@contextmanager
def phase(name: str):
    start = time.monotonic()
    say(f"{name} ...")
    yield
    say(f"{name}: done in {time.monotonic() - start:.1f}s")


def save_spec(state: ClusterState, spec: RunSpec) -> None:
    state.spec.write_text(json.dumps(spec.to_dict(), indent=2) + "\n")


#: settings a cluster's saved spec may hold from an earlier release that this one no longer has: dropped when
#: the spec is read back, so a cluster brought up before can still be trained on and taken down
#: (provider_options.harness_bundle: IM's contextualization copied the harness bundle until 9dd10e6)
RETIRED_SETTINGS = (("provider_options", "harness_bundle"),)


def load_spec(state: ClusterState) -> RunSpec | None:
    """The spec the cluster was brought up with (re-validated, less :data:`RETIRED_SETTINGS`), or None."""
    if not state.spec.exists():
        return None
    saved = json.loads(state.spec.read_text())
    for section, key in RETIRED_SETTINGS:
        if isinstance(saved.get(section), dict):
            saved[section].pop(key, None)
    return resolve(saved, check_files=False)


def ensure_ssh_key(state: ClusterState) -> str:
    """The run's ed25519 client key (0600), created on first use; returns the public key."""
    state.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state.ssh_dir, 0o700)
    if not state.ssh_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"tfcluster-{state.cluster}",
                        "-f", str(state.ssh_key)], check=True, capture_output=True)
    os.chmod(state.ssh_key, 0o600)
    state.known_hosts.touch(mode=0o600)
    return state.ssh_key.with_suffix(".pub").read_text().strip()


@contextmanager
def ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (what must not be cut short: a teardown, the stop of a run's tasks), in the
    main thread (signal handlers can only be set there; a sweep's trials are processes of their own, each
    calling train in its main thread); the handler before it back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def prepare_storage(spec: RunSpec) -> None:
    """Start the local store when the run uses it, and make sure the bucket exists."""
    if store.is_local_store(spec):
        store.ensure_running(log=say)
    make_bucket(spec)


def make_bucket(spec: RunSpec) -> None:
    """Make sure the run's bucket exists (its store answering)."""
    s3 = store.client(spec)
    store.ensure_bucket(s3, spec.storage.bucket, spec.storage.region)
    say(f"storage: s3://{spec.storage.bucket}/ at {store.endpoint_for(spec) or 'AWS S3'}")


def wait_for_ssh(state: ClusterState, nodes: list[Node], timeout: int) -> None:
    """Until every node runs the Python Ansible uses there (``inventory.NODE_PYTHON``) over SSH, with root's
    rights as Ansible takes them (``sudo -n`` for a non-root login: the inventory's ``ansible_become``), or fail
    naming the nodes that never did and what ssh said. The first contact with new nodes: their host keys go
    into the cluster's known_hosts (accept-new: mitogen, which checks host keys strictly, comes later), and each
    connection stays open for ControlPersist as a control master that Ansible (its own strategy and mitogen's)
    and tfcluster's node commands reuse (one set of options and control sockets, :mod:`tfcluster.remote`).
    One ssh a node at once rather than ``ansible all -m ping``: 0.5 s against 2.3-2.6 s on 4 local nodes
    (Ansible's start, then its module's on every node)."""
    probe = f"{inventory.NODE_PYTHON} -c ''"
    why: dict[str, str] = {n.name: "" for n in nodes}

    def reach(node: Node) -> str:
        """'' once the node ran the probe; otherwise ssh's last word on it."""
        try:
            res = remote.call(state, node, probe, timeout=remote.CONNECT_TIMEOUT + 10)
        except subprocess.TimeoutExpired:
            return f"no answer within {remote.CONNECT_TIMEOUT + 10}s"
        said = (res.stderr or res.stdout).strip().splitlines()
        return "" if res.returncode == 0 else (said[-1] if said else f"exit status {res.returncode}")

    def all_answer() -> bool:
        for name, said in remote.on_each([n for n in nodes if n.name in why], reach).items():
            if said:
                why[name] = said
            else:
                del why[name]
        return not why

    if poll.wait_until(all_answer, timeout, 2):
        say(f"all {len(nodes)} nodes answer over SSH")
        return
    detail = "\n".join(f"{name}: {said}" for name, said in why.items())
    raise ProvisionError(f"nodes not reachable over SSH after {timeout}s: {', '.join(why)}\n{detail}")


def preflight(spec: RunSpec) -> tuple[Provider, dict]:
    """Every check ``up`` makes before it creates anything (``plan`` makes them too): the provider's, the
    model module's (its interface, as :func:`tfcluster.job.check` reports it, is returned), the data files'
    listing on the local store (:func:`tfcluster.job.check_files`, returned as the interface's ``files``) and
    their check with the model (:func:`tfcluster.job.check_with_data`: one TensorFlow import for both), and
    that the cluster is not up on another provider. Bad input raises ConfigError or JobError (exit status 2);
    a module's error comes before the data's."""
    state = ClusterState(spec.cluster)
    check_fits_the_cluster_up(spec, state)      # first: the slower checks below would not change this answer
    provider = get_provider(spec.provider, state)
    provider.check(spec)
    try:
        found = job.check_files(spec)       # no TensorFlow: the listing and each file's start
    except TfclusterError:
        with phase("check the model module"):
            job.check(spec)                 # a module's own error first, as where the job names no file
        raise
    if found:
        say(f"data: {found}")
    with phase("check the model module" + (" and the data with it" if found else "")):
        checked = job.check_with_data(spec, found)
    return provider, dict(checked, files=found)


def check_fits_the_cluster_up(spec: RunSpec, state: ClusterState) -> RunSpec | None:
    """A cluster that is up keeps the provider, strategy and node counts it was made with (``up`` converging
    it to others would break it: the local nodes' addresses and links follow their order); another needs
    ``make down`` first. ClusterMismatch (exit status 2) naming each difference. Returns the spec the cluster
    was brought up with (None when it is not up)."""
    up = load_spec(state)
    if up is None:
        return None
    differs = [f"{what} {was} (this configuration's: {now})" for what, was, now in
               (("provider", up.provider, spec.provider), ("strategy", up.strategy, spec.strategy)) if was != now]
    differs += [f"{up.count(role)} {role} node(s) (nodes.{role}.count here: {spec.count(role)})" for role in ROLES
                if up.count(role) != spec.count(role)]
    if differs:
        raise ClusterMismatch(f"cluster {spec.cluster} is up with another shape: {'; '.join(differs)}; "
                              f"'make down CLUSTER={spec.cluster}' and 'make up' with the new settings, or keep "
                              "the cluster's")
    return up


@contextmanager
def used_alone(cluster: str, now: str, by_sweep: bool = False) -> Iterator[None]:
    """Hold the cluster's train lock for the block: what changes its nodes or runs on them (``up``,
    ``configure``, ``train``) runs only while no other tfcluster process does, and not while a sweep runs on
    the cluster (``by_sweep``: the block is that sweep's own). Otherwise :class:`Busy` at once, naming the
    other process; ``now`` says what the block would do to it (``'up' now would change the nodes it trains
    on``)."""
    state = ClusterState(cluster)
    sweeping = None if by_sweep else lock_holder(state.sweep_lock)
    if sweeping:    # its trials take the cluster between them: a train of its own would take a trial's place
        raise Busy(f"cluster {cluster} runs a sweep ({sweeping}): {now}; wait for the sweep, or stop it (Ctrl-C "
                   f"in its terminal) first")

    def busy(holder: str) -> Busy:
        return Busy(f"cluster {cluster} is in use by another tfcluster process ({holder}): {now}; wait for it "
                    f"('make status CLUSTER={cluster}' shows a train's progress), or stop it (Ctrl-C in its "
                    f"terminal) first")

    with held_alone(state.trainer_lock, busy):
        yield


def up_alone(spec: RunSpec) -> list[Node]:
    """:func:`up` of a cluster no other tfcluster process uses (:func:`used_alone`): re-running ``up`` of a
    cluster a train runs on would re-apply its nodes and rewrite its inventory under it, and a second ``up``,
    a ``train`` or a ``down`` of a cluster being brought up would find half of it. Its checks run first: an
    ``up`` refusing bad input makes no lock file either, and leaves nothing behind."""
    provider, _ = preflight(spec)
    with used_alone(spec.cluster, "'up' now would change the nodes it trains on"):
        return up(spec, provider)


def up(spec: RunSpec, provider: Provider | None = None) -> list[Node]:
    """Create the cluster's nodes and wait until each runs its Python over SSH (:func:`wait_for_ssh`).
    ``provider``: the one :func:`preflight` returned for this spec, when the caller ran it already (a sweep
    checks every group before it creates any); without it the checks run here first, before anything is
    created."""
    state = ClusterState(spec.cluster)
    if provider is None:
        provider, _ = preflight(spec)
    state.dir.mkdir(parents=True, exist_ok=True)
    save_spec(state, spec)
    public_key = ensure_ssh_key(state)
    # The bucket is made (or found) before any node exists, but where the local store is not running yet: it
    # starts while Terraform provisions (moto's import beside its work: 0.7 s less on 4 local nodes), and its
    # bucket is made after. A store that fails to start then fails `up` once the nodes exist, naming 'make
    # down' as a failed provisioning does (`make all` runs it)
    starting = store.start(log=say) if store.is_local_store(spec) else None
    if starting is None:
        with phase("storage"):
            make_bucket(spec)
    with phase(f"provision {spec.node_total} nodes on provider {spec.provider}"):
        try:
            nodes = provider.up(spec, public_key)
        except TfclusterError as exc:
            raise ProvisionError(f"{exc}\nprovisioning failed; 'make down CLUSTER={spec.cluster}' removes "
                                 f"whatever was created") from None
    write_nodes(state.nodes, nodes)
    inventory.write(state, nodes, spec.network.tf_port, spec.strategy)
    if starting is not None:
        with phase("storage"):
            try:
                starting()
                make_bucket(spec)
            except TfclusterError as exc:
                raise ProvisionError(f"{exc}\nthe nodes are up; 'make down CLUSTER={spec.cluster}' removes them") \
                    from None
    with phase("wait for SSH on every node"):
        wait_for_ssh(state, nodes, spec.ssh.timeout_seconds)
    print_nodes(nodes)
    return nodes


def print_nodes(nodes: list[Node], extra: dict[str, str] | None = None) -> None:
    header = f"{'NODE':<28} {'ROLE':<7} {'INDEX':>5} {'PRIVATE IP':<15} {'SSH':<22}"
    print(header + ("  STATE" if extra else ""))
    for n in nodes:
        line = f"{n.name:<28} {n.role:<7} {n.index:>5} {n.private_ip:<15} " \
               f"{n.ssh_user + '@' + n.public_ip + ':' + str(n.ssh_port):<22}"
        print(line + (f"  {extra.get(n.name, '')}" if extra else ""))


def ssh_answers(node: Node, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((node.public_ip, node.ssh_port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH")
    except OSError:
        return False


def status(cluster: str, task_states=None) -> int:
    """Print the nodes, whether each answers SSH and (task_states) what its task is doing."""
    state = ClusterState(cluster)
    nodes = read_nodes(state.nodes)
    if not nodes:
        print(f"cluster {cluster}: not up (no {state.nodes})")
        _print_run(state)      # kept after down: how its last run ended
        return 1
    spec = load_spec(state)
    print(f"cluster {cluster}: provider {spec.provider if spec else '?'}, {len(nodes)} nodes")
    answers = {n.name: ("ssh ok" if ssh_answers(n) else "ssh DOWN") for n in nodes}
    tasks = task_states(state, [n for n in nodes if answers[n.name] == "ssh ok"]) if task_states else {}
    print_nodes(nodes, {k: v + (f", task: {tasks[k]}" if k in tasks else "") for k, v in answers.items()})
    _print_run(state, up=True)
    return 0 if all(v == "ssh ok" for v in answers.values()) else 1


def _print_run(state: ClusterState, up: bool = False) -> None:
    """The cluster's latest run, from its record: state, headline metric, time left (``up``), where it is."""
    cluster = state.cluster
    rec = runrecord.read(state)
    if rec:
        key = rec.get("headline", "test_accuracy")
        acc = f", test {key.removeprefix('test_')} {rec[key]:.4f}" if key in rec else ""
        left = ""
        if up and rec.get("state") == runrecord.RunState.STARTED and rec.get("deadline"):
            left = f", {max(0, rec['deadline'] - time.time()) / 60:.1f} min left before the nodes stop it"
            if lock_holder(state.trainer_lock) is None:
                left += (f"; no train of it is running: 'make train CLUSTER={cluster}' with the settings it "
                         f"started with (CONFIG=, WORKERS=, SET=...) resumes it")
        print(f"run {rec.get('run_id')}: {rec.get('state')}{acc}{left} ({rec.get('s3_prefix', '')})")


#: what :func:`down` leaves of a cluster's state directory: the fetched node logs, the last run's record and the
#: records of its sweeps
DOWN_KEEPS = frozenset({"logs", "run.json", "sweeps"})


def has_more_than_down_keeps(state: ClusterState) -> bool:
    """Whether the cluster's state holds anything :func:`down` would remove (nodes, Terraform's or IM's state,
    keys, the spec): a cluster never brought up, or down already, holds at most :data:`DOWN_KEEPS`."""
    return state.exists() and any(p.name not in DOWN_KEEPS for p in state.dir.iterdir())


def down(cluster: str, provider_name: str | None = None) -> None:
    """Destroy the cluster from its state alone, then prove nothing of it remains."""
    state = ClusterState(cluster)
    spec = load_spec(state) if state.spec.exists() else None
    name = spec.provider if spec else (provider_name or "local")
    provider = get_provider(name, state)
    if not state.exists():
        say(f"cluster {cluster}: no state under {state.dir}; checking for leftovers")
    with phase(f"destroy cluster {cluster} ({name})"):
        try:
            provider.down()
        except TfclusterError as exc:
            say(f"terraform destroy reported: {str(exc).splitlines()[0]}; cleaning up directly")
        provider.force_cleanup()
    left = provider.leftovers()
    if left:
        raise ProvisionError(f"cluster {cluster}: still present after down:\n  " + "\n  ".join(left))
    remote.close_masters(state)
    for path in (state.ssh_dir, state.terraform_dir, state.control_dir, state.dir / "ansible-tmp",
                 state.dir / "vars"):
        shutil.rmtree(path, ignore_errors=True)
    for path in (state.nodes, state.inventory, state.spec):
        path.unlink(missing_ok=True)
    kept = sorted(p.name for p in state.dir.iterdir()) if state.exists() else []
    if state.exists() and not kept:
        state.dir.rmdir()
    say(f"cluster {cluster} is down: {provider.gone}"
        + (f" (kept: {', '.join(kept)} in {state.dir})" if kept else ""))
