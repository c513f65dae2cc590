"""`make bench`: for each strategy, the phase times of one local run and its training throughput against one
plain TensorFlow process training the same model, all from one invocation.

Prints figures only (nothing here asserts a speed) and writes the same figures to a JSON file it names.
Each strategy gets its own cluster (default names tfc-bench-ps and tfc-bench-mwms; the strategies need
different nodes), torn down after its run, also when a phase fails.  The model, steps, batch size and
learning rate are the same for every strategy and for the plain process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "train"))

#: strategy -> (short name for its cluster, its nodes)
SHAPES = {
    "parameter_server": ("ps", {"ps": 1, "worker": 2}),
    "multi_worker_mirrored": ("mwms", {"ps": 0, "worker": 2}),
}


def run_phase(name: str, args: list[str], times: dict) -> str:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "tfcluster", *args], cwd=REPO, capture_output=True, text=True)
    times[name] = round(time.monotonic() - start, 1)
    if res.returncode != 0:
        raise SystemExit(f"bench: phase {name} failed:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
    return res.stdout


def single_process_examples_per_sec(steps: int, batch_size: int, learning_rate: float) -> float:
    """The same model and batch size in one plain TensorFlow process on this machine, with TensorFlow's
    default kernels (the strongest baseline; only the logs are quieted)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from models import digits

    x, y = digits.make_dataset()["train"]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(batch_size).prefetch(2)
    model = digits.build_model()
    opt = keras.optimizers.Adam(learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                strict=True))
        return loss

    it = iter(ds)
    for _ in range(20):  # warm-up: tracing
        step(*next(it))
    start = time.monotonic()
    for _ in range(steps):
        loss = step(*next(it))
    float(loss)
    return steps * batch_size / (time.monotonic() - start)


def bench_strategy(strategy: str, cluster: str, steps: int) -> dict:
    """up, configure, train, down on a cluster of the strategy's shape; the phase times and the run's figures."""
    nodes = SHAPES[strategy][1]
    base = ["--cluster", cluster, "--steps", str(steps), "--set", f"strategy={strategy}",
            "--ps", str(nodes["ps"]), "--workers", str(nodes["worker"])]
    times: dict[str, float] = {}
    try:
        run_phase("up", ["up", *base], times)
        run_phase("configure", ["configure", *base], times)
        out = run_phase("train", ["train", "--skip-configure", *base], times)
    finally:
        run_phase("down", ["down", "--force", *base], times)
    home = Path(os.environ.get("TFCLUSTER_HOME", REPO / ".tfcluster"))
    run = json.loads((home / cluster / "run.json").read_text())
    metrics = run.get("metrics", {})
    tasks = re.search(r"==> training: done in ([0-9.]+)s", out)
    verify = re.search(r"==> verify the model .*: done in ([0-9.]+)s", out)
    acc = re.search(r"^test accuracy: ([0-9.]+)$", out, re.M)
    return {
        "strategy": strategy, "cluster": cluster, "nodes": dict(nodes, chief=1),
        "training_tasks": metrics.get("workers"), "steps": steps,
        "phases_s": dict(times, tasks_started_to_chief_exit=float(tasks.group(1)) if tasks else None,
                         training_loop=metrics.get("train_seconds"), publish=run.get("publish_seconds"),
                         verify=float(verify.group(1)) if verify else None),
        "examples_per_sec": float(metrics.get("examples_per_sec", 0.0)),
        "test_accuracy": float(acc.group(1)) if acc else None,
    }


def print_report(results: list[dict], single: float, settings: dict) -> None:
    print(f"model digits, {settings['steps']} steps, batch {settings['batch_size']} per training task, "
          f"learning rate {settings['learning_rate']}")
    names = [r["strategy"] for r in results]
    print(f"  {'':<34} " + " ".join(f"{n:>22}" for n in names))

    def row(label: str, values: list, fmt: str = "{:22.1f}") -> None:
        print(f"  {label:<34} " + " ".join(fmt.format(v) if v is not None else f"{'-':>22}" for v in values))

    row("nodes (ps + workers + chief)", [f"{r['nodes']['ps']} + {r['nodes']['worker']} + 1" for r in results],
        "{:>22}")
    for phase, label in (("up", "up (s)"), ("configure", "configure (s)"), ("train", "train, all of it (s)"),
                         ("tasks_started_to_chief_exit", "  tasks started to chief exit (s)"),
                         ("training_loop", "  training loop (s)"), ("publish", "  publish to S3 (s)"),
                         ("verify", "  verify from S3 (s)"), ("down", "down (s)")):
        row(label, [r["phases_s"].get(phase) for r in results])
    row("test accuracy", [r["test_accuracy"] for r in results], "{:22.4f}")
    row("examples/s on the cluster", [r["examples_per_sec"] for r in results])
    row("examples/s, one plain process", [single for _ in results])
    row("ratio cluster / plain process", [r["examples_per_sec"] / single if single else None for r in results],
        "{:22.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", default="tfc-bench", help="prefix of the clusters' names")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--strategies", default=",".join(SHAPES),
                   help=f"comma-separated, of: {', '.join(SHAPES)} (default: all)")
    p.add_argument("--json", default=str(REPO / "artifacts" / "bench.json"), help="where to write the figures")
    args = p.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in SHAPES]
    if unknown or not strategies:
        print(f"bench: --strategies {','.join(unknown) or '(empty)'}: not a strategy; allowed are "
              f"{', '.join(SHAPES)}", file=sys.stderr)
        return 2
    results = [bench_strategy(s, f"{args.cluster}-{SHAPES[s][0]}", args.steps) for s in strategies]
    from tfcluster.config import resolve

    spec = resolve(overrides={"training.steps": args.steps})
    settings = {"steps": args.steps, "batch_size": spec.training.batch_size,
                "learning_rate": spec.training.learning_rate}
    single = single_process_examples_per_sec(args.steps, settings["batch_size"], settings["learning_rate"])
    print_report(results, single, settings)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": "digits", **settings,
                               "single_process_examples_per_sec": round(single, 1), "runs": results}, indent=2)
                   + "\n")
    print(f"figures written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
