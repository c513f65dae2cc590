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
    assert bench.steps_for("digits", args.steps) == 3000 and bench.steps_for("shapes32", args.steps) == 150
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
    assert row["ratio_after_first_call"] is None           # a run that published no such figure
    train["examples_per_sec_after_first_call"] = 4800.0
    (row,) = bench.rows(report)
    assert row["cluster_eps_after_first_call"] == 4800.0 and row["ratio_after_first_call"] == 0.75
    assert row["coordination_ms_per_step_after_first_call"] == 3.33
    assert row["peak_rss_mb"] == {"c-chief-0": 700.0} and row["strategy"] == "parameter_server"


def test_outside_the_loop_is_up_configure_the_first_train_less_its_loop_and_down():
    bench = _bench()
    trains = [{"phases_s": {"train": 40.0, "training_loop": 15.0}}, {"phases_s": {"train": 99.0, "training_loop": 1.0}}]
    assert bench.outside_loop({"up": 3.0, "configure": 10.0, "down": 2.0}, trains) == 40.0
    assert bench.outside_loop({"up": 3.0, "configure": 10.0}, trains) is None          # down failed: no figure
    assert bench.outside_loop({"up": 3.0, "configure": 10.0, "down": 2.0}, []) is None


def test_the_report_ends_with_each_figure_beside_its_target(capsys):
    bench = _bench()
    train = {"model": "shapes32", "threads": "share", "examples_per_sec": 900.0, "load_before": "1.00 1.00 1.00",
             "examples_per_sec_after_first_call": 950.0,
             "phases_s": {"training_loop": 12.0, "train": 30.0, "tasks_started_to_chief_exit": 20.0,
                          "publish": 1.0, "verify": 3.0},
             "tasks": {"c-chief-0": {"peak_rss_mb": 700.0, "threads": "intra-op 1, inter-op 2"}}}
    report = {"cores": 2, "batch_size": 64, "learning_rate": 0.005, "load_start": "1", "load_end": "1",
              "image": "image tf-x", "plain": {"shapes32": {"examples_per_sec": 1000.0, "step_ms": 64.0, "steps": 150,
                                                            "repeats_s": [9.9, 9.6, 9.7],
                                                            "peak_rss_mb": 700.0, "load": "1"}},
              "runs": [{"strategy": "multi_worker_mirrored", "cluster": "c",
                        "nodes": {"ps": 0, "worker": 2, "chief": 1},
                        "phases_s": {"up": 2.0, "configure": 9.0, "down": 3.0}, "trains": [train],
                        "outside_loop_s": 32.0}],
              "scale": dict(bench.scale_figures({4: [20.0, 1.5], 12: [24.0, 3.0]}),
                            first_configure_ran_playbook={"4": True, "12": False},
                            bare={"nodes": 4, "configure_s": [70.0, 0.4], "second_configure_pct": 0.6})}
    report["rows"] = bench.rows(report)
    got = {name: (value, target, met) for name, value, target, met in bench.target_rows(report)}
    assert got["ratio shapes32 multi_worker_mirrored"] == (0.9, ">= 0.9", True)
    assert got["coordination ms/step shapes32 multi_worker_mirrored"] == (7.11, "<= 1", False)
    assert got["  after the first call: ratio shapes32 multi_worker_mirrored"] == (0.95, ">= 0.9", True)
    assert got["  after the first call: coordination ms/step shapes32 multi_worker_mirrored"] == (3.37, "<= 1", False)
    assert got["all but the training loop, 3 nodes, multi_worker_mirrored (s)"] == (32.0, "<= 30", False)
    assert got["configure 12 nodes / 4 nodes"] == (1.2, "<= 1.3", True)
    assert got["second configure, % of the first, 4 nodes"] == (7.5, "<= 10", True)
    # a first configure that ran no playbook (every node's image current) is said so beside the figure
    assert got["second configure, % of the first, 12 nodes (the first ran no playbook either)"] == (
        12.5, "<= 10", False)
    # and the bare base image's pair, where the first configure installs everything
    assert got["second configure, % of the first, 4 nodes on the bare base image"] == (0.6, "<= 10", True)
    bench.print_report(report)
    out = capsys.readouterr().out
    assert "nodes mount image tf-x" in out and "targets (README, Benchmark)" in out
    assert "configure 12 nodes / 4 nodes" in out and out.rstrip().endswith("yes")
    assert "bare base image, 4 nodes: first configure 70.0 s (installs everything), second 0.4 s (0.6% of" in out
    assert "the fastest of 3 timings [9.9, 9.6, 9.7] s: 64.00 ms/step" in out


def test_a_failed_bare_image_run_keeps_the_other_scale_figures(monkeypatch, capsys):
    """The bare base image's configure fails (say apt): the 4- and 12-node figures stay in the report, and the
    bare row says it was not measured."""
    bench = _bench()
    done = []

    def configure_twice(cluster, nodes, sets):
        if "nodes.ps.image=base" in sets:
            raise SystemExit("bench: phase configure failed:\nE: apt-get failed")
        done.append(nodes)
        return [0.3, 0.3], {"up": 1.0, "configure": [0.3, 0.3], "down": 1.0}, False

    monkeypatch.setattr(bench, "configure_twice", configure_twice)
    scale = bench.bench_scale("tfc-bench", [])
    assert done == [4, 12] and scale["configure_s"] == {"4": [0.3, 0.3], "12": [0.3, 0.3]}
    bare = scale["bare"]
    assert bare["error"].startswith("bench: phase configure failed") and bare["second_configure_pct"] is None
    report = {"scale": scale}
    got = {name: (value, met) for name, value, _, met in bench.target_rows(report)}
    assert got["second configure, % of the first, 4 nodes on the bare base image"] == (None, None)
    assert got["configure 12 nodes / 4 nodes"] == (1.0, True)
