"""The strategy registry and the shape table (importable without TensorFlow or pydantic)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness_support import TRAIN_DIR, example_settings
from tfc_harness import strategies
from tfc_harness.settings import validate


def test_every_registered_strategy_resolves_to_its_class():
    for name in strategies.names():
        cls = strategies.get(name)
        assert issubclass(cls, strategies.Strategy) and cls.name == name
        assert cls(validate(example_settings(strategy=name))).shape == strategies.SHAPES[name]


def test_unknown_strategy_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown strategy 'mirrored'; allowed: \['parameter_server'\]"):
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
        assert node.writes_published_checkpoints() is (role == "chief")
    chief = cls(validate(example_settings(state_dir="/srv/state")))
    assert str(chief.checkpoint_dir()) == "/srv/state/checkpoints/20261122-0415-ab12"


def test_shape_table_needs_neither_tensorflow_nor_pydantic():
    """The controller reads the table in its own process: importing it must stay light."""
    code = ("import sys; from tfc_harness import strategies; strategies.shape_problems('parameter_server', {}); "
            "print(sorted(m for m in ('tensorflow', 'pydantic', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={"PYTHONPATH": str(TRAIN_DIR)}).stdout
    assert out.strip() == "[]"
