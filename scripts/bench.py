"""`make bench`: phase times of one local run, and cluster vs. single-process training throughput.

Prints figures only; nothing here asserts a speed. Uses its own cluster name (default tfc-bench) and
tears it down at the end, also when a phase fails.
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


def run_phase(name: str, args: list[str], times: dict) -> str:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "tfcluster", *args], cwd=REPO, capture_output=True, text=True)
    times[name] = time.monotonic() - start
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", default="tfc-bench")
    p.add_argument("--steps", type=int, default=600)
    args = p.parse_args()
    base = ["--cluster", args.cluster, "--steps", str(args.steps)]
    times: dict[str, float] = {}
    try:
        run_phase("up", ["up", *base], times)
        run_phase("configure", ["configure", *base], times)
        out = run_phase("train+publish+verify", ["train", "--skip-configure", *base], times)
    finally:
        run_phase("down", ["down", "--force", *base], times)
    m = re.search(r"==> training: done in ([0-9.]+)s", out)
    v = re.search(r"==> verify the model .*: done in ([0-9.]+)s", out)
    acc = re.search(r"^test accuracy: ([0-9.]+)$", out, re.M)
    home = Path(os.environ.get("TFCLUSTER_HOME", REPO / ".tfcluster"))
    run = json.loads((home / args.cluster / "run.json").read_text())
    metrics = run.get("metrics", {})
    cluster_eps = float(metrics.get("examples_per_sec", 0.0))
    from tfcluster.config import resolve

    spec = resolve(overrides={"training.steps": args.steps})
    single = single_process_examples_per_sec(args.steps, spec.training.batch_size,
                                             spec.training.learning_rate)
    print("phase times (s):")
    print(f"  {'up':<34} {times['up']:8.1f}")
    print(f"  {'configure':<34} {times['configure']:8.1f}")
    print(f"  {'train (make train, all of it)':<34} {times['train+publish+verify']:8.1f}")
    if m:
        print(f"  {'  tasks started to chief exit':<34} {float(m.group(1)):8.1f}")
    print(f"  {'  training loop (chief)':<34} {float(metrics.get('train_seconds', 0)):8.1f}")
    if run.get("publish_seconds") is not None:
        print(f"  {'  publish to S3 (chief)':<34} {float(run['publish_seconds']):8.1f}")
    if v:
        print(f"  {'  verify from S3 (controller)':<34} {float(v.group(1)):8.1f}")
    print(f"  {'down':<34} {times['down']:8.1f}")
    print(f"training: {metrics.get('workers', '?')} workers, {args.steps} steps, test accuracy "
          f"{acc.group(1) if acc else '?'}")
    print(f"examples/s on the cluster:       {cluster_eps:10.1f}")
    print(f"examples/s in one plain process: {single:10.1f}")
    if single:
        print(f"ratio cluster / single process:  {cluster_eps / single:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
