"""`make bench`'s own input: an unknown strategy is refused before any cluster is made."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON, REPO


def test_unknown_strategy_exits_2_naming_the_allowed_ones(tmp_path):
    res = subprocess.run([PYTHON, "scripts/bench.py", "--strategies", "parameter_server,allreduce", "--cluster",
                          "tfct-nobench"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "TFCLUSTER_HOME": str(tmp_path)})
    assert res.returncode == 2, res.stdout + res.stderr
    allowed = "parameter_server, multi_worker_mirrored"
    assert f"--strategies allreduce: not a strategy; allowed are {allowed}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tfc_bench_script", REPO / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_are_every_model_and_strategy_with_each_nodes_share_of_the_cores():
    bench = _bench()
    args = bench.parse_args([])
    assert args.models == ["digits", "shapes32"]
    assert args.strategies == ["parameter_server", "multi_worker_mirrored"]
    assert bench.thread_modes(args.threads) == ["share"] and not args.scale
    assert bench.steps_for("digits", args.steps) == 600 and bench.steps_for("shapes32", args.steps) == 150
    assert bench.steps_for("shapes32", 40) == 40                       # --steps: the same for every model


def test_knobs_are_checked():
    bench = _bench()
    args = bench.parse_args(["--models", "shapes32,shapes32", "--strategies", "multi_worker_mirrored",
                             "--threads", "compare", "--scale", "--set", "network.subnet=10.231.234.0/24"])
    assert args.models == ["shapes32"] and args.strategies == ["multi_worker_mirrored"]
    assert bench.thread_modes(args.threads) == ["share", "tensorflow"]
    assert args.sets == ["network.subnet=10.231.234.0/24"] and args.scale
    for argv, message in ((["--models", "digits,resnet"], "--models resnet: not a model module of train/models/"),
                          (["--models", ","], "--models (empty)"),
                          (["--steps", "0"], "--steps 0: must be at least 1"),
                          (["--no-train"], "--no-train leaves nothing to measure without --scale"),
                          (["--set", "strategy"], "--set strategy: KEY=VALUE")):
        with pytest.raises(bench.BenchArgsError, match=message.replace("(", r"\(").replace(")", r"\)")):
            bench.parse_args(argv)


def test_ratio_and_coordination_cost():
    bench = _bench()
    # batch 64: plain 6400 ex/s is 10 ms a step; the cluster at 3200 ex/s spends 20 ms: 10 ms more per step
    assert bench.compare(3200.0, 6400.0, 64) == {"ratio": 0.5, "coordination_ms_per_step": 10.0}
    assert bench.compare(6400.0, 6400.0, 64) == {"ratio": 1.0, "coordination_ms_per_step": 0.0}
    assert bench.compare(0.0, 6400.0, 64) == {"ratio": None, "coordination_ms_per_step": None}   # no rate


def test_scale_figures():
    bench = _bench()
    got = bench.scale_figures({4: [80.0, 20.0], 12: [200.0, 60.0]})
    assert got["configure_12_over_4"] == 2.5
    assert got["second_configure_pct_4"] == 25.0 and got["second_configure_pct_12"] == 30.0
    assert got["configure_s"] == {"4": [80.0, 20.0], "12": [200.0, 60.0]}


def test_rows_put_the_plain_process_beside_each_run():
    bench = _bench()
    train = {"model": "digits", "threads": "share", "examples_per_sec": 3200.0, "load_before": "1.00 1.00 1.00",
             "phases_s": {"training_loop": 12.0, "train": 30.0},
             "tasks": {"c-chief-0": {"peak_rss_mb": 700.0, "threads": "intra-op 1, inter-op 1"}}}
    report = {"batch_size": 64, "runs": [{"strategy": "parameter_server", "cluster": "c", "trains": [train]}],
              "plain": {"digits": {"examples_per_sec": 6400.0, "step_ms": 10.0}}}
    (row,) = bench.rows(report)
    assert row["ratio"] == 0.5 and row["coordination_ms_per_step"] == 10.0 and row["plain_step_ms"] == 10.0
    assert row["peak_rss_mb"] == {"c-chief-0": 700.0} and row["strategy"] == "parameter_server"
