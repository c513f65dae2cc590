"""The ``tfcluster`` command.

Exit codes: 0 ok, 1 failure, 2 bad configuration or arguments (nothing created), 3 refused to destroy
something worth keeping, or to stop another tfcluster process's train or sweep of the cluster, 130 interrupted
(Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from . import cluster, config, store
from .errors import EXIT_USAGE, Busy, ConfigError, DataNotReady, GuardError, JobError, TfclusterError
from .paths import ClusterState


def _config_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("configuration (defaults < --config file < these options)")
    g.add_argument("-c", "--config", default=os.environ.get("TFCLUSTER_CONFIG", ""),
                   help="cluster file (YAML); none = built-in defaults (a local run)")
    g.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set training.learning_rate=0.01 (repeatable)")
    g.add_argument("--cluster", help="cluster name (field cluster)")
    g.add_argument("--provider", help="provider: " + ", ".join(config.PROVIDERS))
    g.add_argument("--ps", help="number of parameter servers (nodes.ps.count)")
    g.add_argument("--workers", help="number of workers (nodes.worker.count)")
    g.add_argument("--steps", help="training steps (training.steps)")


def spec_from_args(args: argparse.Namespace) -> config.RunSpec:
    """Resolve the run's configuration from the file and the overrides; precedence: named option last."""
    file_values = config.load_file(args.config)
    overrides: dict = {}
    for item in args.sets:
        key, value = config.parse_set(item)
        if key.startswith("provider_options."):
            options = overrides.setdefault("provider_options", dict(file_values.get("provider_options") or {}))
            options[key.split(".", 1)[1]] = value
        elif key.startswith("training.hparams."):    # one hparam: the file's (or an earlier --set's) others kept
            training = file_values.get("training")
            base = overrides.get("training.hparams", training.get("hparams") if isinstance(training, dict) else None)
            if base is not None and not isinstance(base, dict):
                raise ConfigError("training.hparams", base, "a mapping of names to values")
            hparams = overrides["training.hparams"] = dict(base or {})
            hparams[key.rsplit(".", 1)[1]] = value
        else:
            overrides[key] = value
    for flag, field in config.OVERRIDE_FLAGS.items():
        value = getattr(args, flag, None)
        if value not in (None, ""):
            overrides[field] = value
    return config.resolve(file_values, overrides)


def cluster_name(args: argparse.Namespace) -> str:
    """The cluster a command acts on: --cluster, else the config file's, else the default."""
    return spec_from_args(args).cluster


def cmd_validate(args) -> int:
    from . import job
    from .providers import get_provider

    spec = spec_from_args(args)
    get_provider(spec.provider, ClusterState(spec.cluster)).check(spec)  # what `up` would refuse
    try:        # the configuration is valid without its data, which may be uploaded after it: `up` refuses
        found = job.check_files(spec)
    except TfclusterError as exc:
        checked = job.check(spec)       # the module's own error first, as `up` gives it
        if isinstance(exc, JobError) and not isinstance(exc, DataNotReady):
            raise                       # files that are there but do not fit (format, header, count): as `up`
        found = f"not ready ('up' refuses until it is): {exc}"
    else:       # the files are there: a decode or model that does not fit them is the module's error
        checked = job.check_with_data(spec, found)
    print(json.dumps(spec.to_dict(), indent=2))
    print(f"model module {checked['module']}: data from {checked['data']}, loss {checked['loss']}, metrics "
          f"{', '.join(checked['metrics']) or '(none: the loss)'}", file=sys.stderr)
    if found:
        print(f"data: {found}", file=sys.stderr)
    print(f"configuration is valid: cluster {spec.cluster}, provider {spec.provider}, "
          f"{spec.count('ps')} ps + {spec.count('worker')} workers + {spec.count('chief')} chief",
          file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    from . import plan

    spec = spec_from_args(args)
    plan.show(spec, _sweep_of(args, spec))  # bad input stops here as it stops up: exit status 2
    return 0


def _sweep_of(args, spec: config.RunSpec):
    """The ``--sweep`` file, read and checked once (bad input stops here, before anything exists), or None."""
    if not getattr(args, "sweep", ""):
        return None
    from . import sweep

    return sweep.load(args.sweep, spec)


def _up_step(loaded):
    """``up``, or with a sweep every group of nodes it runs on."""
    if loaded is None:
        return cluster.up_alone
    from . import sweep

    return lambda spec: sweep.bring_up(spec, loaded)


def _train_step(args, loaded):
    """``train``, or with a sweep its trials."""
    from . import training

    if loaded is not None:
        from . import sweep

        return lambda spec: sweep.run(spec, loaded)
    return lambda spec: training.train(spec, configure_first=not getattr(args, "skip_configure", False),
                                       trial=getattr(args, "trial", ""))


def cmd_up(args) -> int:
    spec = spec_from_args(args)  # bad input stops here, before anything exists
    step = _up_step(_sweep_of(args, spec))
    if args.down_on_failure:  # `make up train down`: a failed up must not leave half a cluster
        return run_then_teardown(spec, args.force, [step], always=False)
    step(spec)
    return 0


def cmd_down(args) -> int:
    from . import teardown

    teardown.teardown(spec_from_args(args), args.force)
    return 0


def run_then_teardown(spec: config.RunSpec, force: bool, steps, always: bool) -> int:
    """Run the steps; then tear the cluster down (``always``, or only when a step failed or was
    interrupted). A second Ctrl-C during the teardown is ignored. Returns the exit status (the first
    failure's)."""
    from . import teardown

    status = 0
    try:
        for step in steps:
            step(spec)
    except Busy as exc:     # the cluster is another process's now: tearing it down would stop its work
        print(f"tfcluster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tfcluster: interrupted; tearing the cluster down", file=sys.stderr)
        status = 130
    except TfclusterError as exc:
        print(f"tfcluster: error: {exc}", file=sys.stderr)
        status = exc.exit_code
    except Exception as exc:  # an unexpected failure must not skip the teardown below
        print(f"tfcluster: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
    if not always and status == 0:
        return 0
    if status == EXIT_USAGE and not cluster.has_more_than_down_keeps(ClusterState(spec.cluster)):
        return status   # refused before anything was created, and nothing was up before: nothing to tear down
    with cluster.ctrl_c_ignored():
        cluster.say("tearing down (Ctrl-C is ignored until this is done)")
        try:
            teardown.teardown(spec, force)
        except TfclusterError as exc:
            print(f"tfcluster: error: {exc}", file=sys.stderr)
            status = status or exc.exit_code
    return status


def cmd_all(args) -> int:
    """up, train, down: down runs after success, failure and Ctrl-C (a second Ctrl-C is ignored)."""
    spec = spec_from_args(args)  # bad input stops here, before anything exists
    loaded = _sweep_of(args, spec)
    return run_then_teardown(spec, args.force, [_up_step(loaded), _train_step(args, loaded)], always=True)


def cmd_configure(args) -> int:
    from . import training

    spec = spec_from_args(args)
    up = ClusterState(spec.cluster).nodes.exists()      # else configure refuses, and nothing needs a lock
    with cluster.used_alone(spec.cluster, "'configure' now would replace the harness and settings its tasks run "
                            "with") if up else contextlib.nullcontext():
        training.configure(spec, full=args.full)
    return 0


def cmd_train(args) -> int:
    spec = spec_from_args(args)
    train = _train_step(args, None)
    if args.down_on_failure:  # `make up train down`: a failed train must not leave the cluster up
        return run_then_teardown(spec, args.force, [train], always=False)
    train(spec)
    return 0


def cmd_sweep(args) -> int:
    spec = spec_from_args(args)
    step = _train_step(args, _sweep_of(args, spec))
    if args.down_on_failure:  # `make up sweep down`: a failed sweep must not leave the groups up
        return run_then_teardown(spec, args.force, [step], always=False)
    return step(spec)


def cmd_status(args) -> int:
    from . import groups, status

    name = cluster_name(args)
    codes = [cluster.status(c, task_states=status.task_states) for c in (name, *groups.extra(name))]
    return max(codes)


def cmd_logs(args) -> int:
    from . import status

    return status.show_log(cluster_name(args), args.node, lines=args.lines)


def cmd_store(args) -> int:
    if args.action == "start":
        print(store.ensure_running())
        store.credentials()     # its keys (0600), for the uploads README shows: made now unless this checkout has them
        print(f"its keys: {store.credentials_path()}", file=sys.stderr)
    elif args.action == "stop":
        from .paths import state_root

        up = sorted(p.parent.name for p in state_root().glob("*/nodes.json"))
        if up and not args.force:
            raise GuardError(f"clusters still up: {', '.join(up)}; the store holds their data in memory. "
                             f"'make down' them first, or 'make clean FORCE=1'")
        store.stop()
    else:
        running = store.is_running()
        print(f"local S3 store at {store.local_endpoint()}: {'running' if running else 'stopped'}")
        return 0 if running else 1
    return 0


def cmd_example_data(args) -> int:
    from . import examples

    examples.write_for(spec_from_args(args))
    return 0


def cmd_tensorboard(args) -> int:
    from . import tensorboard

    return tensorboard.show(spec_from_args(args), run=args.run, port=args.port, sweep=args.sweep or None)


def cmd_image(args) -> int:
    from . import baked
    from .cluster import say

    if args.list:
        for d in baked.built():
            print(f"{d['name']}  key {d['key']}  {d.get('bytes', 0) / 2**20:.0f} MiB  {d['dir']}")
        return 0
    spec = spec_from_args(args)  # bad input stops here, before anything exists
    if spec.provider != "local":
        raise ConfigError("provider", spec.provider, "local for 'tfcluster image' (on aws, see README: baked AMIs)")
    record = baked.ensure_local(spec, log=say)
    print(f"image {record['name']} (key {record['key']}): {record['dir']}")
    return 0


def cmd_reference(args) -> int:
    print(config.reference())
    return 0


def cmd_schema(args) -> int:
    from .providers import cluster_file_schema

    print(json.dumps(cluster_file_schema(), indent=2))
    return 0


def _port(value: str) -> int:
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"got {value!r}; allowed: a TCP port from 0 (a free one) to 65535")
    return int(value)


def _sweep_arg(p: argparse.ArgumentParser, help_text: str, required: bool = False) -> None:
    p.add_argument("--sweep", default="", required=required, metavar="FILE", help=help_text)


def _down_on_failure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--down-on-failure", action="store_true",
                   help="tear the cluster down when this step fails or is interrupted (make passes it when "
                        "'down' is among its goals, as in 'make up train down')")
    p.add_argument("--force", action="store_true", help="with --down-on-failure: even if a model not yet verified "
                                                        "would be lost")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfcluster", description=__doc__.split(". ")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, fn, help_text):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(fn=fn)
        return p

    _config_args(add("validate", cmd_validate, "check the configuration and print it with defaults filled"))
    p = add("plan", cmd_plan, "show what up would create (nodes, Terraform plan or RADL, network, time limits, "
                              "model location), creating nothing")
    _config_args(p)
    _sweep_arg(p, "also show the sweep's trials and the groups of nodes they run on")
    p = add("up", cmd_up, "provision the cluster's nodes and wait until each runs its Python over SSH "
                          "(through sudo for a non-root login)")
    _config_args(p)
    _sweep_arg(p, "also bring up every group of nodes the sweep runs its trials on")
    _down_on_failure_args(p)
    p = add("all", cmd_all, "up, train, down; down runs even when train fails or is interrupted")
    _config_args(p)
    _sweep_arg(p, "run the sweep's trials instead of one training run")
    p.add_argument("--force", action="store_true", help="tear down even if a model not yet verified would be lost")
    p = add("configure", cmd_configure, "configure every node (playbooks/site.yml; idempotent; skipped when every "
            "node is configured with this content already)")
    _config_args(p)
    p.add_argument("--full", action="store_true", help="run playbooks/site.yml even when every node is configured "
                   "with this content already")
    p = add("train", cmd_train, "configure, train, publish the model to S3 and verify it")
    _config_args(p)
    p.add_argument("--skip-configure", action="store_true", help="nodes are configured already")
    p.add_argument("--trial", default="", help=argparse.SUPPRESS)   # a sweep's trial (tfcluster.sweep)
    _down_on_failure_args(p)
    p = add("sweep", cmd_sweep, "run (or resume) a sweep: many trials of the model, up to 'parallel' at once, "
                                "each on its own group of nodes; prints a table sorted by the metric")
    _config_args(p)
    _sweep_arg(p, "the sweep file (YAML): parameters, metric, direction, parallel", required=True)
    _down_on_failure_args(p)
    p = add("down", cmd_down, "destroy the cluster and prove nothing of it remains")
    _config_args(p)
    p.add_argument("--force", action="store_true", help="destroy even if a model not yet verified would be lost")
    _config_args(add("status", cmd_status, "nodes, roles, addresses, SSH and each node's task"))
    p = add("logs", cmd_logs, "show a node's task log (fetched copy when the node is gone)")
    _config_args(p)
    p.add_argument("node", nargs="?", help="node name, e.g. tfc-chief-0 ('make status' lists them; without it, "
                                           "the error does)")
    p.add_argument("-n", "--lines", type=int, default=200)
    p = add("tensorboard", cmd_tensorboard, "fetch the TensorBoard events of the cluster's runs from S3 and serve "
                                            "them on 127.0.0.1 until Ctrl-C")
    _config_args(p)
    p.add_argument("--run", help="only this run (a run id; default: every run of the cluster in S3)")
    _sweep_arg(p, "the trials of this sweep (its file), named by trial and values")
    p.add_argument("--port", type=_port, default=0, help="TCP port on 127.0.0.1 (default 0: a free one)")
    p = add("store", cmd_store, "the local S3-compatible store (outlives clusters)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--force", action="store_true", help="stop: even while clusters are up")
    _config_args(add("example-data", cmd_example_data, "write the data of examples/ (diabetes CSV, cancer TFRecord "
                                                       "shards) to the configured store's bucket; idempotent"))
    p = add("image", cmd_image, "bake the node image of the configuration (roles common, gpu_driver, tensorflow on "
                                "one builder node), once per content key; up uses it")
    _config_args(p)
    p.add_argument("--list", action="store_true", help="list the baked images on this machine, newest first")
    add("config-reference", cmd_reference, "print the configuration fields as a Markdown table")
    add("schema", cmd_schema, "print the JSON Schema of the cluster file (for editors' YAML support)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as exc:
        print(f"tfcluster: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TfclusterError as exc:
        print(f"tfcluster: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tfcluster: interrupted; whatever was created stays until 'make down' removes it", file=sys.stderr)
        return 130
