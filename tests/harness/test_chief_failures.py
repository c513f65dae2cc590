"""The chief's guards: waiting for peers, the max_runtime_s watchdog, a clear error when peers are away."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import textwrap
import urllib.error

import pytest
from harness_support import TRAIN_DIR, example_settings, free_port, node_env, render_entry
from tfc_harness import data, peers, watchdogs
from tfc_harness.errors import FINAL_EXIT_CODE, FinalError, HarnessError, ModelModuleError, bad_labels, is_final


def test_wait_for_peers_returns_when_all_listen():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        peers.wait_for_peers([("ps/0", f"127.0.0.1:{server.getsockname()[1]}")], timeout_s=5)


def test_wait_for_peers_names_the_missing_ones():
    port = free_port()
    with pytest.raises(HarnessError, match=rf"not reachable after 0s: worker/1 \(127.0.0.1:{port}\)"):
        peers.wait_for_peers([("worker/1", f"127.0.0.1:{port}")], timeout_s=0.3, poll_s=0.1)


def test_watchdog_fails_the_chief_after_max_runtime(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(TRAIN_DIR)!r})
        from tfc_harness import status, watchdogs
        state = status.ChiefState({str(tmp_path)!r}, 300)
        state.phase, state.step = "training", 120
        watchdogs.start_runtime_watchdog(state, 1, 300)
        time.sleep(30)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == watchdogs.TIMEOUT_EXIT_CODE == 3
    assert "max_runtime_s=1 exceeded during phase 'training' at step 120/300" in proc.stderr
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["phase"] == "failed" and "max_runtime_s=1 exceeded" in status["error"]


def run_chief_alone(tmp_path, moto_endpoint, bucket, run, dataset_prefix, max_runtime_s, **settings_values):
    """A chief's process whose ps and worker never start (free ports): its result and the cluster it had."""
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"],
               "chief": [f"127.0.0.1:{free_port()}"]}
    settings = example_settings(
        state_dir=str(tmp_path / "chief"), max_runtime_s=max_runtime_s, **settings_values,
        tf_config={"cluster": cluster, "task": {"type": "chief", "index": 0}},
        s3={"endpoint": moto_endpoint, "region": "us-east-1", "bucket": bucket, "run_prefix": f"runs/{run}/1",
            "checkpoint_prefix": f"runs/{run}/ckpt", "dataset_prefix": dataset_prefix})
    script = tmp_path / "entry.py"
    script.write_text(render_entry(TRAIN_DIR, settings))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90,
                          env=node_env(), cwd=tmp_path)
    return proc, cluster


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")
def test_chief_without_peers_exits_with_a_clear_error(s3_client, moto_endpoint, tmp_path):
    s3_client.create_bucket(Bucket="lonely")
    dataset = data.ensure_dataset(s3_client, "lonely", "datasets/digits", "digits")["prefix"]
    # the start timeout bounds the wait (a run's training.start_timeout_seconds); the runtime cap leaves room for
    # the chief's start: 15 s of it was once all gone before the wait began (TensorFlow's import and the data's
    # download beside another test file, the machine at its slow phase), and the runtime watchdog ended the chief
    proc, cluster = run_chief_alone(tmp_path, moto_endpoint, "lonely", "l", dataset, max_runtime_s=120,
                                    start_timeout_s=5)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ERROR: chief failed in phase 'starting': HarnessError: peers not reachable after 5s" in proc.stderr
    assert f"ps/0 ({cluster['ps'][0]})" in proc.stderr and f"worker/0 ({cluster['worker'][0]})" in proc.stderr
    assert "testing" not in proc.stdout + proc.stderr        # credentials never printed
    status = json.loads((tmp_path / "chief" / "status.json").read_text())
    assert status["phase"] == "failed" and "peers not reachable" in status["error"]


class Unavailable(Exception):
    """Stands in for TensorFlow's UnavailableError, judged by the module it comes from."""


Unavailable.__module__ = "tensorflow.python.framework.errors_impl"


def test_a_failure_a_restart_would_repeat_is_final_unless_the_user_s_code_read_a_file_or_the_network():
    def raised(inner):
        try:
            try:
                raise inner
            except Exception as exc:
                raise ModelModuleError(f"model module m.py: build_model() raised {exc!r}") from exc
        except ModelModuleError as exc:
            return exc

    assert is_final(raised(ValueError("bad shape")))
    assert not is_final(raised(ConnectionError("connection refused")))
    assert not is_final(raised(urllib.error.URLError("no route")))      # an OSError
    assert not is_final(raised(Unavailable("ps/0 lost")))               # a peer lost while variables were made

    def raised_while_handling(inner):     # keras.utils.get_file: a plain Exception raised in `except URLError:`
        try:
            raise inner
        except Exception:
            return raised(Exception("URL fetch failure on https://example.com/weights.h5"))

    assert not is_final(raised_while_handling(urllib.error.URLError("no route")))
    assert is_final(raised_while_handling(KeyError("weights")))
    assert is_final(FinalError("s3://b/runs/1/_SUCCESS exists"))
    assert not is_final(HarnessError("peers not reachable after 120s: ps/0"))
    assert not is_final(RuntimeError("InvalidArgumentError"))


class InvalidArgument(Exception):
    """Stands in for TensorFlow's InvalidArgumentError, judged by the module it comes from."""


InvalidArgument.__module__ = "tensorflow.python.framework.errors_impl"


def test_a_label_outside_the_classes_fails_a_restarted_task_the_same_way():
    """Its message lists the batch's labels, which differ between tries: judged by its words instead."""
    assert bad_labels(InvalidArgument("Received a label value of 4 which is outside the valid range of [0, 4).  "
                                      "Label values: 4 2 4 2 1 3"))
    assert not bad_labels(InvalidArgument("Incompatible shapes: [32] vs. [16]"))
    assert not bad_labels(ValueError("Received a label value of 4"))      # not TensorFlow's


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")
def test_a_chief_refusing_a_published_run_exits_with_the_code_its_supervisor_does_not_restart(
        s3_client, moto_endpoint, tmp_path):
    s3_client.create_bucket(Bucket="done")
    s3_client.put_object(Bucket="done", Key="runs/d/1/_SUCCESS", Body=b"")
    proc, _ = run_chief_alone(tmp_path, moto_endpoint, "done", "d", "datasets/none", max_runtime_s=60)
    assert proc.returncode == FINAL_EXIT_CODE == 6, proc.stdout + proc.stderr
    assert "ERROR: chief failed in phase 'starting': FinalError: s3://done/runs/d/1/_SUCCESS exists" in proc.stderr
    status = json.loads((tmp_path / "chief" / "status.json").read_text())
    assert status["phase"] == "failed" and "already published" in status["error"]
