"""``make plan``: everything ``up`` would do, shown without creating anything.

The same checks as ``up`` first (:func:`tfcluster.cluster.preflight`: bad input exits 2), then the provider's
own plan (:meth:`tfcluster.providers.base.Provider.plan`: Terraform's plan of its module, or the RADL for IM)
in a temporary state directory that is removed afterwards, so no namespace, no Terraform state in the
cluster's directory and no IM infrastructure comes of it. Printed: the provider, each node, what the
network exposes to whom, the run's deadline and how long the nodes can run, where the model is written,
and what up would create.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from . import groups, runrecord, store, training
from .cluster import ensure_ssh_key, preflight
from .config import RunSpec
from .paths import ClusterState, artifacts_root
from .providers.base import CONFIGURE_ALLOWANCE_MINUTES, VM_HALT_MARGIN_MINUTES, PlannedNode, Provider, ProviderPlan
from .sweepfile import Sweep, params_text


def show(spec: RunSpec, sweep: Sweep | None = None) -> None:
    """Check the configuration as ``up`` does, then print the plan (stdout); raises what ``up`` would raise.
    ``sweep``: the sweep file ``up`` and ``sweep`` would run (already read and checked): its trials and groups."""
    provider, checked = preflight(spec)
    if sweep is not None:   # every group as up would check it (this one just was)
        from . import sweep as sweeps

        sweeps.check_groups(spec, sweep.parallel, checked_already=spec.cluster)
    planned = provider_plan(provider, spec)
    state = ClusterState(spec.cluster)
    print(f"plan for cluster {spec.cluster} on provider {spec.provider} ({spec.strategy}: "
          f"{training.roles_text(spec)}); "
          "nothing has been created")
    if state.nodes.exists():
        print(f"cluster {spec.cluster} is up already ({state.nodes}): up would converge it to this plan")
    section("nodes", node_lines(planned.nodes))
    section("network", provider.exposure(spec))
    section("time limits", time_lines(spec, provider, time.time()))
    section("model and data", model_lines(spec, state, checked))
    section("what up would create", planned.creates)
    if sweep is not None:
        section("sweep", sweep_lines(spec, sweep))


#: a sweep's trials listed by plan, the rest counted
TRIALS_SHOWN = 12


def sweep_lines(spec: RunSpec, sweep: Sweep) -> list[str]:
    """The sweep's ranking, its groups of nodes (each one of the plan above) and its trials."""
    names = [groups.spec_for(spec, k).cluster for k in range(sweep.parallel)]
    up = [n for n in names if ClusterState(n).nodes.exists()]
    lines = [f"{sweep.name} ({sweep.path}): {len(sweep.trials)} trials ({sweep.method}), {sweep.goal}",
             f"{sweep.parallel} at once, on groups {', '.join(names)}: each a cluster of its own (its own subnet and "
             f"addresses) with the nodes above"
             + (f" ({', '.join(up)} up already)" if up else "")]
    lines += [f"{t['id']}: {params_text(t['params'])}" for t in sweep.trials[:TRIALS_SHOWN]]
    if len(sweep.trials) > TRIALS_SHOWN:
        lines.append(f"... and {len(sweep.trials) - TRIALS_SHOWN} more")
    return lines


def provider_plan(provider: Provider, spec: RunSpec) -> ProviderPlan:
    """The provider's plan, made in a temporary state directory (an SSH key pair of its own, the cluster's
    public key when it has one) that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="tfcluster-plan-") as tmp:
        scratch = ClusterState(spec.cluster, root=Path(tmp))
        ensure_ssh_key(scratch)
        live_key = ClusterState(spec.cluster).ssh_key.with_suffix(".pub")
        if live_key.exists():  # plan against the cluster's own key, as up would use it
            scratch.ssh_key.with_suffix(".pub").write_text(live_key.read_text())
        return provider.plan(spec, scratch)


def section(title: str, lines: list[str]) -> None:
    print(f"\n{title}:")
    for line in lines:
        print(f"  {line}")


def node_lines(nodes: list[PlannedNode]) -> list[str]:
    rows = [("NODE", "ROLE", "INSTANCE TYPE", "IMAGE", "GPUS", "ADDRESS")]
    rows += [(n.name, n.role, n.instance_type, n.image, str(n.gpus), n.address or "(known after up)")
             for n in nodes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
            for row in rows]


def clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(t))


def time_lines(spec: RunSpec, provider: Provider, now: float) -> list[str]:
    """The run's deadline and the latest the nodes can run (times as if up and train started now)."""
    minutes = spec.max_runtime_minutes
    lines = [f"deadline: each task ends {minutes} min after training starts (max_runtime_minutes); if training "
             f"started now: {clock(now + minutes * 60)}"]
    boot, halt = provider.boot_halt_minutes(spec), provider.vm_halt_minutes(spec)
    if not (boot or halt):
        return [*lines, "the nodes never halt themselves: they run until 'make down' (at the deadline each node's "
                        "supervisor ends its task)"]
    if boot:
        lines.append(f"until training starts each node halts {boot} min after it boots (max_runtime_minutes + "
                     f"{CONFIGURE_ALLOWANCE_MINUTES} for configuration): {clock(now + boot * 60)} if up started now")
    else:
        lines.append("until training starts nothing halts the nodes: 'make down' removes them")
    lines.append(f"once training starts each node halts {halt} min later (the deadline + {VM_HALT_MARGIN_MINUTES}, "
                 f"the chief's last checkpoint first): {clock(now + halt * 60)} if training started now")
    lines.append(f"a halt: {provider.halt_effect}")
    return lines


def data_source(spec: RunSpec, s3: dict, found: str | None) -> str:
    data = spec.data
    if data.train:
        when = f"{found} now, listed again when train starts" if found else "listed when train starts"
        return f"{data.format} files {data.train} (training) and {data.test} (test): {when}"
    return (f"the module's make_dataset(), stored by content under s3://{s3['bucket']}/{s3['dataset_prefix']}-<sha12>/ "
            "when train starts")


def model_lines(spec: RunSpec, state: ClusterState, checked: dict) -> list[str]:
    """Where train writes the model, its checkpoints and data, and where the verified copy goes."""
    s3 = training.run_settings(spec, "<run-id>", {})["s3"]
    where = s3["endpoint"] or "AWS S3"
    bucket = f"s3://{s3['bucket']}"
    lines = [f"model: {bucket}/{s3['run_prefix']}/ at {where} (the SavedModel, its manifest and metrics, then "
             "_SUCCESS)", f"checkpoints: {bucket}/{s3['checkpoint_prefix']}/",
             f"verified copy: {artifacts_root() / spec.cluster / '<run-id>'}/",
             f"model module {checked['module']}: loss {checked['loss']}, metrics "
             f"{', '.join(checked['metrics']) or '(none: the loss)'}",
             f"data: {data_source(spec, s3, checked.get('files'))}"]
    run = runrecord.read(state)
    if run.get("state") in runrecord.RESUMABLE:
        lines.append(f"<run-id>: {run['run_id']} (train resumes that run if model, batch size, learning rate, "
                     "hparams and data are unchanged; otherwise a new id)")
    else:
        lines.append("<run-id>: a new id when train starts (UTC time and 4 hex digits, e.g. "
                     f"{runrecord.new_id()})")
    if store.is_local_store(spec):
        running = "running" if store.is_running() else "not running: up starts it"
        lines.append(f"the local S3 store at {where}: {running}")
    lines.append(f"up creates bucket {s3['bucket']} (region {spec.storage.region}) if it does not exist")
    return lines
