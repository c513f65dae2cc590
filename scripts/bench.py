"""`make bench`: for each model and strategy, the cluster's training throughput against one plain TensorFlow
process training the same model on this machine, the per-step coordination cost, each task's peak memory and
the phase times of the runs, all from one invocation; optionally (``--scale``) the configure time of a
4-node and a 12-node cluster, each configured twice, and of a 4-node cluster on the bare base image (the first
configure installs everything, the second finds nothing to change).

Prints figures only (nothing here asserts a speed) and writes the same figures to a JSON file it names.
Each strategy gets its own local cluster (``<prefix>-ps``, ``<prefix>-mwms``: the strategies need different
nodes): up, configure, one ``train`` per model (and per thread setting with ``--threads compare``), down;
torn down also when a phase fails.  The steps, batch size and learning rate of a model are the same for
every strategy and for the plain process.

Figures (README, "Benchmark", says the same):
- cluster examples/s: the chief's ``examples_per_sec`` (examples of every training task over the training
  loop's wall time, first tracing and checkpoint saves included: the loop as a user gets it).
- plain examples/s: the same model module, batch size and optimizer in one fresh Python process with
  TensorFlow's defaults and no environment variable set, a plain ``tf.function`` step, timed after
  :data:`WARMUP_STEPS` warm-up steps, the fastest of :data:`PLAIN_REPEATS` timings of the model's steps.
- ratio: cluster / plain.  Local nodes share this machine's cores, so the plain process's rate is what the
  same cores do without distribution: ratio 1 means distribution costs nothing.
- after the first call: the same three figures from the chief's ``examples_per_sec_after_first_call`` (the
  loop less its first ``train(n)`` call, which traces the step function as the plain process's warm-up
  steps do; checkpoint saves still included): like for like with the plain process, which is timed after
  its warm-up.  The report sets both beside the targets.
- coordination ms per step: ``1000 * (batch / cluster - batch / plain)``, the extra wall time the machine
  spends on each step of ``batch`` examples compared with the plain process (all that distribution adds:
  RPCs, dispatch, variable transfers, all-reduce, checkpoints, sharing the cores between tasks).
- peak memory: each task's peak resident set (VmHWM, ``ru_maxrss``) as its last status.json reports it
  (fetched with the logs; a serving task refreshes it every 5 s).
- everything but the training loop: up + configure + the first train's wall time less its training loop +
  down, on each strategy's cluster (what ``make up train down`` spends outside the loop).

The end of the report sets each figure beside the issue's target (:data:`TARGETS`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO / "train" / "models"

#: strategy -> (short name for its cluster, its nodes)
SHAPES = {
    "parameter_server": ("ps", {"ps": 1, "worker": 2}),
    "multi_worker_mirrored": ("mwms", {"ps": 0, "worker": 2}),
}
#: model -> training steps: enough for a steady rate (the heavier model's steps take ~40x longer). At 600 digits
#: steps (~2 s under parameter_server) the loop was mostly its start: the first call's tracing and the
#: parameter-server loop raising its steps per scheduled function from 3 to 36 (2026-12-02, one run each, 5 min
#: apart: ratio 0.50 at 600 steps, 0.67 at 3000; after the first call 0.62 and 0.72; cluster examples/s +54 %
#: while a plain step went from 1.65 to 1.45 ms, -12 %)
MODELS = {"digits": 3000, "shapes32": 150}
#: --threads: share = the local provider's default (each node's share of the cores); tensorflow = its defaults
#: (provider_options.task_threads=0); compare = both, one train each
THREADS = ("share", "tensorflow", "compare")
THREAD_SETS = {"share": [], "tensorflow": ["--set", "provider_options.task_threads=0"]}
#: --scale: node counts whose configure is timed (ps 1, chief 1, the rest workers)
SCALE_NODES = (4, 12)
#: --scale: the nodes of the cluster on the bare base image (every role's ``image: base``), configured twice
BARE_NODES = 4
BARE_SETS = [f"nodes.{role}.image=base" for role in ("ps", "worker", "chief")]
WARMUP_STEPS = 20
#: the plain process times its steps this many times over and keeps the fastest: the strongest baseline (one
#: timing right after the clusters' teardown gave 2.72 ms a step of digits, against 1.52-1.99 ms on a quiet machine)
PLAIN_REPEATS = 3
#: the targets the report sets each figure beside (README, "Benchmark")
TARGETS = {"ratio": {"shapes32": 0.9, "digits": 0.6}, "coordination_ms_per_step": 1.0, "outside_loop_s": 30.0,
           "configure_large_over_small": 1.3, "second_configure_pct": 10.0}


class BenchArgsError(ValueError):
    """A bad command line: the message names the option and what is allowed."""


def _names(value: str, allowed, option: str, what: str) -> list[str]:
    names = [n for n in value.split(",") if n]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise BenchArgsError(f"{option} {','.join(unknown) or '(empty)'}: not a {what}; allowed are "
                             f"{', '.join(allowed)}")
    return list(dict.fromkeys(names))


def available_models() -> list[str]:
    """The bench's models, then any other module in train/models/."""
    others = sorted(p.stem for p in MODELS_DIR.glob("*.py") if p.stem not in MODELS and not p.stem.startswith("_"))
    return [*MODELS, *others]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; raises :class:`BenchArgsError` for a bad value (exit 2 in :func:`main`)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", default="tfc-bench", help="prefix of the clusters' names")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps for every model (default: " +
                        ", ".join(f"{m} {s}" for m, s in MODELS.items()) + ")")
    p.add_argument("--strategies", default=",".join(SHAPES),
                   help=f"comma-separated, of: {', '.join(SHAPES)} (default: all)")
    p.add_argument("--models", default=",".join(MODELS),
                   help="comma-separated model modules of train/models/ (default: " + ",".join(MODELS) + ")")
    p.add_argument("--threads", default="share", choices=THREADS,
                   help="each task's TensorFlow thread pools: share (the local nodes' default: their share of "
                        "the cores), tensorflow (its defaults), compare (train each model with both)")
    p.add_argument("--scale", action="store_true",
                   help=f"also time configure (twice) on clusters of {' and '.join(map(str, SCALE_NODES))} nodes, "
                        f"and on {BARE_NODES} nodes of the bare base image")
    p.add_argument("--no-train", action="store_true", help="skip the model x strategy runs (with --scale)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to every tfcluster command (e.g. network.subnet=10.231.234.0/24)")
    p.add_argument("--json", default=str(REPO / "artifacts" / "bench.json"), help="where to write the figures")
    p.add_argument("--plain-process", metavar="MODEL", help=argparse.SUPPRESS)   # internal: one plain run
    p.add_argument("--batch-size", type=int, default=64, help=argparse.SUPPRESS)
    p.add_argument("--learning-rate", type=float, default=0.005, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plain_process:
        return args
    args.strategies = _names(args.strategies, list(SHAPES), "--strategies", "strategy")
    args.models = _names(args.models, available_models(), "--models", "model module of train/models/")
    if args.steps is not None and args.steps < 1:
        raise BenchArgsError(f"--steps {args.steps}: must be at least 1")
    if args.no_train and not args.scale:
        raise BenchArgsError("--no-train leaves nothing to measure without --scale")
    for item in args.sets:
        if "=" not in item:
            raise BenchArgsError(f"--set {item}: KEY=VALUE")
    return args


def steps_for(model: str, steps: int | None) -> int:
    return steps if steps is not None else MODELS.get(model, 300)


def thread_modes(threads: str) -> list[str]:
    return ["share", "tensorflow"] if threads == "compare" else [threads]


def compare(cluster_eps: float | None, plain_eps: float | None, batch_size: int) -> dict:
    """The ratio and the coordination cost per step (module docstring) of a cluster rate against the plain one."""
    if not cluster_eps or not plain_eps:
        return {"ratio": None, "coordination_ms_per_step": None}
    return {"ratio": round(cluster_eps / plain_eps, 3),
            "coordination_ms_per_step": round(1000.0 * (batch_size / cluster_eps - batch_size / plain_eps), 2)}


def scale_figures(configure_s: dict[int, list[float]]) -> dict:
    """From ``{nodes: [first configure s, second configure s]}``: the ratio of the largest to the smallest
    cluster's first configure, and each second configure as % of its first."""
    small, large = min(configure_s), max(configure_s)
    out = {"configure_s": {str(n): t for n, t in configure_s.items()},
           f"configure_{large}_over_{small}": round(configure_s[large][0] / configure_s[small][0], 2)
           if configure_s[small][0] else None}
    for n, (first, second) in configure_s.items():
        out[f"second_configure_pct_{n}"] = round(100.0 * second / first, 1) if first else None
    return out


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# -- one plain process --------------------------------------------------------------------------------------
def plain_process(model_name: str, steps: int, batch_size: int, learning_rate: float) -> dict:
    """Run in a fresh process (``--plain-process``): the module's model, loss and optimizer in a plain loop."""
    sys.path.insert(0, str(REPO / "train"))
    import tensorflow as tf
    from tfc_harness import status, usermodel

    module = usermodel.load(model_name)
    x, y = module.make_dataset()["train"]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(batch_size).prefetch(2)
    model = usermodel.build_model(module, x.shape[1:])
    optimizer = usermodel.make_optimizer(module, learning_rate)
    loss_fn = usermodel.loss_fn(module)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                      strict=True))
        return loss

    it = iter(ds)
    for _ in range(WARMUP_STEPS):  # tracing
        step(*next(it))
    times = []
    for _ in range(PLAIN_REPEATS):
        start = time.monotonic()
        for _ in range(steps):
            loss = step(*next(it))
        float(loss)
        times.append(time.monotonic() - start)
    seconds = min(times)
    return {"model": model_name, "steps": steps, "batch_size": batch_size, "seconds": round(seconds, 3),
            "repeats_s": [round(t, 3) for t in times], "examples_per_sec": round(steps * batch_size / seconds, 1),
            "step_ms": round(1000.0 * seconds / steps, 2), "peak_rss_mb": status.peak_rss_mb(),
            "threads": "TensorFlow's defaults", "cores": os.cpu_count(), "load": load()}


def run_plain(model: str, steps: int, batch_size: int, learning_rate: float) -> dict:
    """:func:`plain_process` in a child with this environment as it is (no TensorFlow variable added), but
    for a temporary directory of its own: AutoGraph's file of the step and its bytecode stay out of /tmp."""
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-", ignore_cleanup_errors=True) as tmp:
        res = subprocess.run([sys.executable, __file__, "--plain-process", model, "--steps", str(steps),
                              "--batch-size", str(batch_size), "--learning-rate", str(learning_rate)],
                             cwd=REPO, capture_output=True, text=True, env=dict(os.environ, TMPDIR=tmp))
    if res.returncode != 0:
        raise SystemExit(f"bench: the plain process for {model} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# -- clusters ------------------------------------------------------------------------------------------------
def run_phase(name: str, args: list[str], times: dict) -> str:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "tfcluster", *args], cwd=REPO, capture_output=True, text=True)
    times[name] = round(time.monotonic() - start, 2)
    if res.returncode != 0:
        raise SystemExit(f"bench: phase {name} failed:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
    return res.stdout


def home() -> Path:
    return Path(os.environ.get("TFCLUSTER_HOME", REPO / ".tfcluster"))


def task_figures(cluster: str, run_id: str) -> dict:
    """Per node, from the logs fetched after the run: peak memory (status.json) and the thread line."""
    out = {}
    for node_dir in sorted((home() / cluster / "logs" / run_id).glob("*/")):
        try:
            doc = json.loads((node_dir / "status.json").read_text())
        except (OSError, ValueError):
            doc = {}
        try:
            threads = re.search(r"^threads: (.*)$", (node_dir / "node.log").read_text(), re.M)
        except OSError:
            threads = None
        out[node_dir.name] = {"peak_rss_mb": doc.get("peak_rss_mb"), "threads": threads and threads.group(1)}
    return out


def train_model(base: list[str], cluster: str, model: str, steps: int, threads: str) -> dict:
    times: dict[str, float] = {}
    load_before = load()
    out = run_phase("train", ["train", "--skip-configure", *base, "--steps", str(steps),
                              "--set", f"training.model={model}", "--set", "training.max_restarts=0",
                              *THREAD_SETS[threads]], times)
    run = json.loads((home() / cluster / "run.json").read_text())
    metrics = run.get("metrics", {})
    tasks = re.search(r"==> training: done in ([0-9.]+)s", out)
    verify = re.search(r"==> verify the model .*: done in ([0-9.]+)s", out)
    acc = re.search(r"^test accuracy: ([0-9.]+)$", out, re.M)
    return {
        "model": model, "threads": threads, "steps": steps, "run_id": run.get("run_id"),
        "training_tasks": metrics.get("workers"), "load_before": load_before, "load_after": load(),
        "phases_s": dict(times, tasks_started_to_chief_exit=float(tasks.group(1)) if tasks else None,
                         training_loop=metrics.get("train_seconds"), publish=run.get("publish_seconds"),
                         verify=float(verify.group(1)) if verify else None),
        "examples_per_sec": float(metrics.get("examples_per_sec", 0.0)),
        "examples_per_sec_after_first_call": metrics.get("examples_per_sec_after_first_call"),
        "test_accuracy": float(acc.group(1)) if acc else None,
        # the job check's stamp was there (tfcluster.job.prepare): its TensorFlow import skipped, ~2.8 s less
        "job_check_cached": "the model's check on it passed before" in out,
        "tasks": task_figures(cluster, run.get("run_id", "")),
    }


def bench_strategy(strategy: str, cluster: str, models: list[str], steps: int | None, threads: list[str],
                   sets: list[str]) -> dict:
    """up, configure, a train per model (and thread setting), down, on a cluster of the strategy's shape."""
    nodes = SHAPES[strategy][1]
    base = ["--cluster", cluster, "--set", f"strategy={strategy}", "--ps", str(nodes["ps"]),
            "--workers", str(nodes["worker"]), *(a for s in sets for a in ("--set", s))]
    times: dict[str, float] = {}
    trains = []
    try:
        run_phase("up", ["up", *base], times)
        run_phase("configure", ["configure", *base], times)
        for model in models:
            for mode in threads:
                trains.append(train_model(base, cluster, model, steps_for(model, steps), mode))
    finally:
        run_phase("down", ["down", "--force", *base], times)
    return {"strategy": strategy, "cluster": cluster, "nodes": dict(nodes, chief=1), "phases_s": times,
            "trains": trains, "outside_loop_s": outside_loop(times, trains)}


def outside_loop(times: dict, trains: list[dict]) -> float | None:
    """up + configure + the first train less its training loop + down: all but the loop of a first run."""
    if not trains or trains[0]["phases_s"].get("training_loop") is None or "down" not in times:
        return None
    first = trains[0]["phases_s"]
    return round(times["up"] + times["configure"] + first["train"] - first["training_loop"] + times["down"], 1)


def configure_twice(cluster: str, nodes: int, sets: list[str]) -> tuple[list[float], dict, bool]:
    """up, configure twice, down (also when a phase fails) a parameter_server cluster of ``nodes`` nodes:
    ([first configure s, second configure s], the phases, whether the first configure ran a playbook)."""
    base = ["--cluster", cluster, "--ps", "1", "--workers", str(nodes - 2), *(a for s in sets for a in ("--set", s))]
    times: dict[str, float] = {}
    configure, playbook = [], False
    try:
        run_phase("up", ["up", *base], times)
        out = run_phase("configure", ["configure", *base], times)
        configure.append(times["configure"])
        playbook = "PLAY RECAP" in out
        run_phase("configure", ["configure", *base], times)
        configure.append(times["configure"])
    finally:
        run_phase("down", ["down", "--force", *base], times)
    return configure, {"up": times["up"], "configure": configure, "down": times["down"]}, playbook


def bench_scale(prefix: str, sets: list[str]) -> dict:
    """configure twice on a parameter_server cluster of each size in SCALE_NODES (the second: nothing to do),
    then on BARE_NODES nodes of the bare base image (the first installs what the image would hold)."""
    configure: dict[int, list[float]] = {}
    phases, playbook = {}, {}
    for n in SCALE_NODES:
        configure[n], phases[str(n)], playbook[str(n)] = configure_twice(f"{prefix}-s{n}", n, sets)
    # on nodes of a current image the first configure is the same SSH check as the second (no playbook)
    out = dict(scale_figures(configure), phases_s=phases, first_configure_ran_playbook=playbook)
    try:
        times, bare_phases, bare_playbook = configure_twice(f"{prefix}-b{BARE_NODES}", BARE_NODES,
                                                            [*sets, *BARE_SETS])
    except SystemExit as exc:    # a failed phase (run_phase says which): the figures above are kept
        out["bare"] = {"nodes": BARE_NODES, "error": str(exc), "second_configure_pct": None}
        return out
    out["bare"] = {"nodes": BARE_NODES, "configure_s": times, "phases_s": bare_phases,
                   "first_configure_ran_playbook": bare_playbook,
                   "second_configure_pct": round(100.0 * times[1] / times[0], 1) if times[0] else None}
    return out


def image_state() -> str:
    """The baked node image the clusters mount (``nodes.<role>.image`` left at '': the newest matching one)."""
    from tfcluster import baked
    from tfcluster.config import resolve

    found = baked.find(baked.local_inputs(resolve(overrides={})).key)
    return f"image {Path(found['dir']).name}" if found else "no baked image (up bakes one)"


# -- the report ----------------------------------------------------------------------------------------------
def rows(report: dict) -> list[dict]:
    """One row per model x strategy x thread setting, with the plain process's figures beside the cluster's."""
    out = []
    for run in report["runs"]:
        for t in run["trains"]:
            plain = report["plain"][t["model"]]
            peaks = {node: v["peak_rss_mb"] for node, v in t["tasks"].items()}
            warm = t.get("examples_per_sec_after_first_call")
            out.append({"model": t["model"], "strategy": run["strategy"], "threads": t["threads"],
                        "cluster_eps": t["examples_per_sec"], "plain_eps": plain["examples_per_sec"],
                        "plain_step_ms": plain["step_ms"],
                        **compare(t["examples_per_sec"], plain["examples_per_sec"], report["batch_size"]),
                        "cluster_eps_after_first_call": warm,
                        **{f"{k}_after_first_call": v
                           for k, v in compare(warm, plain["examples_per_sec"], report["batch_size"]).items()},
                        "loop_s": t["phases_s"]["training_loop"], "train_s": t["phases_s"]["train"],
                        "peak_rss_mb": peaks, "load": t["load_before"]})
    return out


def _short(node: str, cluster: str) -> str:
    return node.removeprefix(cluster + "-").replace("worker-", "w").replace("chief-", "c").replace("ps-", "ps")


def print_report(report: dict) -> None:
    print(f"bench on {report['cores']} cores, batch {report['batch_size']} per training task, learning rate "
          f"{report['learning_rate']}; load (1/5/15 min) at the start {report['load_start']}, "
          f"at the end {report['load_end']}; nodes mount {report['image']}")
    if report["runs"]:
        print(f"\n{'model':<9} {'strategy':<22} {'threads':<10} {'cluster ex/s':>12} {'plain ex/s':>10} "
              f"{'ratio':>6} {'coord ms/step':>13} {'after 1st call: ex/s':>20} {'ratio':>6} {'coord':>6} "
              f"{'plain ms/step':>13} {'loop s':>7} {'train s':>7}  "
              f"peak MB per task{'':<20} load before")
        for r in report["rows"]:
            cluster = next(x["cluster"] for x in report["runs"] if x["strategy"] == r["strategy"])
            peaks = " ".join(f"{_short(n, cluster)} {v:.0f}" if v else f"{_short(n, cluster)} -"
                             for n, v in r["peak_rss_mb"].items())
            fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
            print(f"{r['model']:<9} {r['strategy']:<22} {r['threads']:<10} {r['cluster_eps']:>12.0f} "
                  f"{r['plain_eps']:>10.0f} {fmt(r['ratio'], '>6.2f'):>6} "
                  f"{fmt(r['coordination_ms_per_step'], '>13.2f'):>13} "
                  f"{fmt(r['cluster_eps_after_first_call'], '>20.0f'):>20} "
                  f"{fmt(r['ratio_after_first_call'], '>6.2f'):>6} "
                  f"{fmt(r['coordination_ms_per_step_after_first_call'], '>6.2f'):>6} {r['plain_step_ms']:>13.2f} "
                  f"{fmt(r['loop_s'], '>7.1f'):>7} {fmt(r['train_s'], '>7.1f'):>7}  {peaks:<36} {r['load']}")
        for model, plain in report["plain"].items():
            print(f"plain process {model}: {plain['steps']} steps after {WARMUP_STEPS} warm-up, the fastest of "
                  f"{len(plain['repeats_s'])} timings {plain['repeats_s']} s: "
                  f"{plain['step_ms']:.2f} ms/step, peak {plain['peak_rss_mb']:.0f} MB, load before "
                  f"{plain['load']}")
        print(f"\n{'phases (s)':<22} {'up':>6} {'configure':>10} {'down':>6} {'not loop':>8}   per train: "
              "train (tasks started to chief exit, loop, publish, verify)")
        for run in report["runs"]:
            p = run["phases_s"]
            trains = "; ".join(
                f"{t['model']}/{t['threads']} {t['phases_s']['train']} ({t['phases_s']['tasks_started_to_chief_exit']}"
                f", {t['phases_s']['training_loop']}, {t['phases_s']['publish']}, {t['phases_s']['verify']})"
                for t in run["trains"])
            print(f"{run['strategy']:<22} {p.get('up', '-'):>6} {p.get('configure', '-'):>10} "
                  f"{p.get('down', '-'):>6} {run.get('outside_loop_s') or '-':>8}   {trains}")
        threads = {f"{t['threads']}": next(iter(t["tasks"].values()), {}).get("threads")
                   for run in report["runs"] for t in run["trains"]}
        print("thread pools the tasks logged: " + "; ".join(f"{k}: {v}" for k, v in threads.items()))
    if report.get("scale"):
        s = report["scale"]
        small, large = min(SCALE_NODES), max(SCALE_NODES)
        print(f"\nscale: configure {small} nodes {s['configure_s'][str(small)][0]} s, "
              f"{large} nodes {s['configure_s'][str(large)][0]} s, ratio {s[f'configure_{large}_over_{small}']}; "
              f"second configure {s['configure_s'][str(small)][1]} s ({s[f'second_configure_pct_{small}']}% of "
              f"the first) on {small}, {s['configure_s'][str(large)][1]} s "
              f"({s[f'second_configure_pct_{large}']}%) on {large}")
        b = s.get("bare")
        if b and b.get("error"):
            print(f"bare base image, {b['nodes']} nodes: failed: {b['error']}")
        elif b:
            print(f"bare base image, {b['nodes']} nodes: first configure {b['configure_s'][0]} s (installs "
                  f"everything), second {b['configure_s'][1]} s ({b['second_configure_pct']}% of the first)")
    print("\ntargets (README, Benchmark): figure, value, target, met")
    for name, value, target, met in target_rows(report):
        print(f"  {name:<78} {value if value is not None else '-':>8} {target:>10}  "
              f"{'-' if met is None else 'yes' if met else 'no'}")


def target_rows(report: dict) -> list[tuple[str, float | None, str, bool | None]]:
    """Each figure the issue sets a target for: (name, value, target, met or None when not measured)."""
    out = []

    def add(name, value, op, target):
        met = None if value is None else (value >= target if op == ">=" else value <= target)
        out.append((name, value, f"{op} {target:g}", met))

    for r in report.get("rows", []):
        if r["model"] in TARGETS["ratio"] and r["threads"] == "share":
            add(f"ratio {r['model']} {r['strategy']}", r["ratio"], ">=", TARGETS["ratio"][r["model"]])
            add(f"coordination ms/step {r['model']} {r['strategy']}", r["coordination_ms_per_step"], "<=",
                TARGETS["coordination_ms_per_step"])
            add(f"  after the first call: ratio {r['model']} {r['strategy']}", r.get("ratio_after_first_call"), ">=",
                TARGETS["ratio"][r["model"]])
            add(f"  after the first call: coordination ms/step {r['model']} {r['strategy']}",
                r.get("coordination_ms_per_step_after_first_call"), "<=", TARGETS["coordination_ms_per_step"])
    for run in report.get("runs", []):
        nodes = sum(run["nodes"].values())
        add(f"all but the training loop, {nodes} nodes, {run['strategy']} (s)", run.get("outside_loop_s"), "<=",
            TARGETS["outside_loop_s"])
    if report.get("scale"):
        s = report["scale"]
        small, large = min(SCALE_NODES), max(SCALE_NODES)
        add(f"configure {large} nodes / {small} nodes", s[f"configure_{large}_over_{small}"], "<=",
            TARGETS["configure_large_over_small"])
        for n in (small, large):
            either = "" if s.get("first_configure_ran_playbook", {}).get(str(n), True) else \
                " (the first ran no playbook either)"
            add(f"second configure, % of the first, {n} nodes{either}", s[f"second_configure_pct_{n}"], "<=",
                TARGETS["second_configure_pct"])
        if s.get("bare"):
            add(f"second configure, % of the first, {s['bare']['nodes']} nodes on the bare base image",
                s["bare"]["second_configure_pct"], "<=", TARGETS["second_configure_pct"])
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except BenchArgsError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if args.plain_process:
        print(json.dumps(plain_process(args.plain_process, args.steps or MODELS.get(args.plain_process, 300),
                                       args.batch_size, args.learning_rate)))
        return 0
    sys.path.insert(0, str(REPO / "train"))
    sys.path.insert(0, str(REPO))
    from tfcluster.config import resolve

    spec = resolve(overrides={})
    report = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "load_start": load(),
              "batch_size": spec.training.batch_size, "learning_rate": spec.training.learning_rate,
              "models": args.models, "threads_modes": thread_modes(args.threads), "runs": [], "plain": {}}
    if not args.no_train:
        report["runs"] = [bench_strategy(s, f"{args.cluster}-{SHAPES[s][0]}", args.models, args.steps,
                                         thread_modes(args.threads), args.sets) for s in args.strategies]
        # the plain processes run with no cluster up: the machine is theirs as the cluster's was
        report["plain"] = {m: run_plain(m, steps_for(m, args.steps), report["batch_size"], report["learning_rate"])
                           for m in args.models}
        report["rows"] = rows(report)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.scale:
        out.write_text(json.dumps(report, indent=2) + "\n")   # the figures so far, should the scale phase fail
        report["scale"] = bench_scale(args.cluster, args.sets)
    report["load_end"] = load()
    report["image"] = image_state()
    print_report(report)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"figures written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
