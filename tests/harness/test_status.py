"""status.json writing and the chief's progress lines."""

from __future__ import annotations

import json

import pytest
from tfc_harness import status


def test_write_status_is_atomic_and_has_the_keys(tmp_path):
    status.write_status(tmp_path, role="chief", phase="training", step=120, total=600, loss=0.42131,
                        examples_per_sec=3150.24)
    doc = json.loads((tmp_path / "status.json").read_text())
    assert set(doc) == {"role", "phase", "step", "total", "loss", "examples_per_sec", "updated", "peak_rss_mb"}
    assert doc["step"] == 120 and doc["loss"] == 0.42131 and doc["examples_per_sec"] == 3150.2
    status.write_status(tmp_path, role="chief", phase="done", step=600, total=600, accuracy=0.97)
    assert status.read_status(tmp_path)["accuracy"] == 0.97
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]   # no temp files left


def test_unknown_phase_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown phase"):
        status.write_status(tmp_path, role="ps", phase="running")
    assert status.read_status(tmp_path) is None


def test_progress_line_format():
    assert status.format_progress(120, 600, 0.42131, 3150.24, 4.4) == \
        "step 120/600 loss 0.4213 examples/s 3150.2 eta 4s"


def test_progress_rates_and_cadence():
    now = [100.0]
    progress = status.Progress(total=600, batch_size=64, start_step=100, clock=lambda: now[0])
    now[0] += 0.5
    assert not progress.due()
    now[0] += 0.6
    assert progress.due() and not progress.due()
    now[0] = 102.0                                   # 2 s for 100 steps after the restore point
    assert progress.examples_per_sec(200) == pytest.approx(3200.0)
    assert progress.eta_s(200) == pytest.approx(8.0)
    assert progress.line(200, 0.5) == "step 200/600 loss 0.5000 examples/s 3200.0 eta 8s"


def test_a_loop_running_task_reading_its_own_files_reports_its_stream(tmp_path):
    """Under multi_worker_mirrored every task streams its files: its status carries the stream's figures."""
    class Feed:
        def stats(self):
            return {"mb_per_s": 12.5, "epoch": 1, "bytes": 4_000_000}

    state = status.ChiefState(tmp_path, 100, role="worker")
    state.report("training")
    assert "data" not in json.loads((tmp_path / "status.json").read_text())
    state.feed = Feed()
    state.step = 20
    state.report()
    written = json.loads((tmp_path / "status.json").read_text())
    assert written["data"] == Feed().stats() and written["step"] == 20 and written["role"] == "worker"


def test_a_loop_running_tasks_notes_for_the_user_are_in_every_report_once_made(tmp_path):
    state = status.ChiefState(tmp_path, 100)
    state.report("training")
    assert "notes" not in json.loads((tmp_path / "status.json").read_text())
    state.notes.append("make_optimizer's keras.optimizers.Adam runs as tfc_harness.optimizers.LockedAdam ...")
    state.report()
    state.report("failed", error="x")
    written = json.loads((tmp_path / "status.json").read_text())
    assert written["notes"] == state.notes and written["phase"] == "failed"


def test_a_loop_running_tasks_reports_name_its_run(tmp_path):
    """The controller tells this run's status.json from one an earlier run left (a Ctrl-C before the new start)."""
    status.ChiefState(tmp_path, 100, run_id="20261202-010000-ab12").report("training")
    assert json.loads((tmp_path / "status.json").read_text())["run_id"] == "20261202-010000-ab12"
    status.ChiefState(tmp_path, 100).report("training")
    assert "run_id" not in json.loads((tmp_path / "status.json").read_text())
