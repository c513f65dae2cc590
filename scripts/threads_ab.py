"""Do sized thread pools help tasks that share this machine's cores?  An A/B side measurement for `make bench`.

Starts N plain training processes of one model at once (as N local nodes' training tasks share the cores),
each with TensorFlow's default pools (A) or with each one's share (B: intra-op cores // N, inter-op at least 2,
as the local provider sets them), alternating A and B ``--rounds`` times so that a drift in the machine's
load hits both alike, and prints the summed examples/s of each round and the medians.  Figures only.

    .venv/bin/python scripts/threads_ab.py --model shapes32 --tasks 2 --steps 40 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys, time
sys.path.insert(0, {train!r})
from tfc_harness import threads
threads.apply({threads!r})
sys.path.insert(0, {scripts!r})
import bench
print(json.dumps(bench.plain_process({model!r}, {steps}, 64, 0.005)))
"""


def round_(model: str, tasks: int, steps: int, threads: dict | None) -> float:
    code = CHILD.format(train=str(REPO / "train"), scripts=str(REPO / "scripts"), threads=threads, model=model,
                        steps=steps)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for _ in range(tasks)]
    rates = [json.loads(p.communicate()[0].strip().splitlines()[-1])["examples_per_sec"] for p in procs]
    return sum(rates)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="shapes32")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    share = max(1, (os.cpu_count() or 1) // args.tasks)
    settings = {"tensorflow": None, "share": {"intra_op": share, "inter_op": max(2, share)}}
    got: dict[str, list[float]] = {k: [] for k in settings}
    for i in range(args.rounds):
        for name, threads in settings.items():
            got[name].append(round_(args.model, args.tasks, args.steps, threads))
            print(f"round {i + 1} {name:<10} {got[name][-1]:8.1f} examples/s (summed over {args.tasks} processes), "
                  f"load {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    for name, values in got.items():
        print(f"median {name:<10} {statistics.median(values):8.1f} examples/s  {settings[name] or 'defaults'}")
    print(f"share / tensorflow: {statistics.median(got['share']) / statistics.median(got['tensorflow']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
