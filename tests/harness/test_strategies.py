"""The strategy registry and the shape table (importable without TensorFlow or pydantic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_support import TRAIN_DIR, example_settings, run_probe
from tfc_harness import strategies
from tfc_harness.parameter_server import Dispatch
from tfc_harness.settings import validate


def test_every_registered_strategy_resolves_to_its_class():
    for name in strategies.names():
        cls = strategies.get(name)
        assert issubclass(cls, strategies.Strategy) and cls.name == name
        assert cls(validate(example_settings(strategy=name))).shape == strategies.SHAPES[name]


def test_unknown_strategy_names_the_allowed_ones():
    allowed = r"\['parameter_server', 'multi_worker_mirrored'\]"
    with pytest.raises(ValueError, match=rf"unknown strategy 'mirrored'; allowed: {allowed}"):
        strategies.get("mirrored")


@pytest.mark.parametrize("counts, problems", [
    ({"ps": 1, "worker": 1, "chief": 1}, []),
    ({"ps": 3, "worker": 8, "chief": 1}, []),
    ({"ps": 0, "worker": 2, "chief": 1}, ["ps: 0 task(s); parameter_server needs >= 1"]),
    ({"ps": 1, "worker": 2}, ["chief: 0 task(s); parameter_server needs exactly 1"]),
    ({"ps": 1, "worker": 2, "chief": 2}, ["chief: 2 task(s); parameter_server needs exactly 1"]),
    ({"ps": 1, "worker": 1, "chief": 1, "evaluator": 1},
     ["evaluator: 1 task(s); parameter_server has no evaluator job"]),
])
def test_shape_problems_of_parameter_server(counts, problems):
    assert strategies.shape_problems("parameter_server", counts) == problems


@pytest.mark.parametrize("low, high, text", [(1, 1, "exactly 1"), (1, None, ">= 1"), (2, 4, "2 to 4")])
def test_describe_count(low, high, text):
    assert strategies.describe_count(low, high) == text


def test_parameter_server_roles():
    cls = strategies.get("parameter_server")
    for role, loops in (("chief", True), ("ps", False), ("worker", False)):
        raw = example_settings(role=role, index=0)
        raw["tf_config"]["task"] = {"type": role, "index": 0}
        node = cls(validate(raw))
        assert node.runs_loop() is loops
        assert node.writes_published_checkpoints() is node.publishes() is (role == "chief")
        assert node.agree(False, 12, True) == (False, 12, True)     # its own
        assert node.agree(True, 3, False) == (True, 3, False)
        assert node.prefers_local_checkpoints() is True
    chief = cls(validate(example_settings(state_dir="/srv/state")))
    assert str(chief.checkpoint_dir()) == "/srv/state/checkpoints/20261122-0415-ab12"
    # a call keeps each worker busy with one function of the dispatch's current size
    assert chief.settings.num_workers == 2 and chief.steps_per_round() == 2
    chief.dispatch = Dispatch(chief.settings.num_workers)
    chief.dispatch.steps = 12
    assert chief.steps_per_round() == 24


def test_parameter_server_rounds_follow_the_dispatch_its_train_function_tunes(tmp_path):
    """make_train_fn keeps its Dispatch where steps_per_round reads it (the loop's rounds)."""
    out = run_probe(tmp_path, f"""
import json, sys
sys.path.insert(0, {str(TRAIN_DIR)!r})
from tfc_harness import strategies
from tfc_harness.settings import validate
node = strategies.get("parameter_server")(validate(json.loads({json.dumps(example_settings())!r})))
node.tf_strategy = node.coordinator = None      # not reached: the function is not called here
node.make_train_fn(lambda x, y: 0.0, dataset=None)
node.dispatch.steps = 7
print(node.steps_per_round())
""")
    assert out.split() == ["14"]


@pytest.mark.parametrize("counts, problems", [
    ({"worker": 2, "chief": 1}, []),
    ({"ps": 0, "worker": 1, "chief": 1}, []),
    ({"ps": 1, "worker": 2, "chief": 1}, ["ps: 1 task(s); multi_worker_mirrored has no ps job"]),
    ({"worker": 2}, ["chief: 0 task(s); multi_worker_mirrored needs exactly 1"]),
    ({"worker": 0, "chief": 1}, ["worker: 0 task(s); multi_worker_mirrored needs >= 1"]),
])
def test_shape_problems_of_multi_worker_mirrored(counts, problems):
    assert strategies.shape_problems("multi_worker_mirrored", counts) == problems


@pytest.mark.parametrize("strategy, tasks", [
    ("parameter_server", [("worker", 0), ("worker", 1)]),
    ("multi_worker_mirrored", [("chief", 0), ("worker", 0), ("worker", 1)]),
])
def test_training_tasks_are_the_jobs_that_read_data_in_a_fixed_order(strategy, tasks):
    counts = {"ps": 1, "worker": 2, "chief": 1}
    assert strategies.training_tasks(strategy, counts) == tasks
    assert strategies.training_task_count(strategy, counts) == len(tasks)


def test_multi_worker_mirrored_roles():
    cls = strategies.get("multi_worker_mirrored")
    for role, index, share in (("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2)):
        raw = example_settings(strategy="multi_worker_mirrored", role=role, index=index, state_dir="/srv/state")
        raw["tf_config"]["task"] = {"type": role, "index": index}
        settings = validate(raw)
        node = cls(settings)
        assert "ps" not in settings.cluster_spec
        assert node.runs_loop() is True
        assert node.publishes() is node.writes_published_checkpoints() is (role == "chief")
        assert node.prefers_local_checkpoints() is False
        assert settings.training_index == share and settings.num_training_tasks == 3
        assert node.examples_per_step() == 3 * 64
        assert node.steps_per_round() == 1        # every task takes part in every step
        scratch = "20261122-0415-ab12" if role == "chief" else "scratch-20261122-0415-ab12"
        assert str(node.checkpoint_dir()) == f"/srv/state/checkpoints/{scratch}"


def test_shape_table_needs_neither_tensorflow_nor_pydantic():
    """The controller reads the table in its own process: importing it must stay light."""
    code = ("import sys; from tfc_harness import strategies; strategies.shape_problems('parameter_server', {}); "
            "print(sorted(m for m in ('tensorflow', 'pydantic', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={"PYTHONPATH": str(TRAIN_DIR)}).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("gpus, implementation", [([], "RING"), (["/physical_device:GPU:0"], "NCCL")])
def test_all_reduce_uses_nccl_on_gpu_nodes_and_the_ring_on_cpu_nodes(monkeypatch, gpus, implementation):
    """No GPU here can run TensorFlow: the choice is checked with the device list TensorFlow would give."""
    tf = pytest.importorskip("tensorflow")
    from tfc_harness import multi_worker

    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: gpus if kind == "GPU" else [])
    options = multi_worker.communication_options()
    assert options.implementation == getattr(tf.distribute.experimental.CommunicationImplementation, implementation)


AGREE_PROBE = """
import sys
sys.path.insert(0, {train!r})
from tfc_harness import multi_worker
from harness_support import example_settings
from tfc_harness.settings import validate
import tensorflow as tf
node = multi_worker.MultiWorkerMirrored(validate(example_settings(strategy="multi_worker_mirrored")))
node.tf_strategy = tf.distribute.MultiWorkerMirroredStrategy()      # one task, no TF_CONFIG: a local one
for stop, chunk, due in ((False, 37, True), (True, 5, False), (False, 0, False), (False, 1 << 40, True)):
    print(stop, chunk, due, *node.agree(stop, chunk, due))
"""


def test_multi_worker_mirrored_agrees_on_stopping_and_on_the_next_chunk_through_one_reduction(tmp_path):
    """One task's own values come back (a sum over one task); a chunk is at least 1 and at most MAX_CHUNK.
    The agreement between several tasks runs in test_e2e_mwms (3 tasks): calls or checkpoints that differed
    would hang it."""
    from tfc_harness import multi_worker

    out = run_probe(tmp_path, AGREE_PROBE.format(train=str(TRAIN_DIR)), env={"PYTHONPATH": str(Path(__file__).parent)})
    assert out.splitlines()[-4:] == ["False 37 True False 37 True", "True 5 False True 5 False",
                                     "False 0 False False 1 False",
                                     f"False {1 << 40} True False {multi_worker.MAX_CHUNK} True"]
