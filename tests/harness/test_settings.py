"""Settings validation and the values derived from it."""

from __future__ import annotations

import copy
import json

import pytest
from harness_support import example_settings
from tfc_harness.settings import SETTINGS_KEYS, SettingsError, validate


def test_example_is_valid_and_normalised():
    raw = example_settings()
    raw["s3"]["run_prefix"] = "/runs/demo/x/"
    s = validate(raw)
    assert s.role == "chief" and s.index == 0 and s.num_workers == 2
    assert s.s3.run_prefix == "runs/demo/x"
    assert s.peers() == [("ps/0", "10.0.0.2:2222"), ("worker/0", "10.0.0.3:2222"),
                         ("worker/1", "10.0.0.4:2222")]
    assert json.loads(s.tf_config_json()) == raw["tf_config"]
    assert set(s.to_dict()) == SETTINGS_KEYS | {"start_timeout_s", "stall_timeout_s"}
    assert s.start_timeout_s == 0   # optional: the chief then waits up to max_runtime_s


def test_optional_start_timeout():
    raw = example_settings()
    raw["start_timeout_s"] = 30
    assert validate(raw).start_timeout_s == 30
    raw["start_timeout_s"] = 0
    with pytest.raises(SettingsError, match="start_timeout_s"):
        validate(raw)


def test_learning_rate_int_accepted_as_float():
    assert validate(example_settings(learning_rate=1)).learning_rate == 1.0


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.pop("steps"), "missing keys ['steps']"),
    (lambda d: d.update(batchsize=3), "unknown keys ['batchsize']"),
    (lambda d: d["s3"].pop("bucket"), "settings['s3']: missing keys ['bucket']"),
    (lambda d: d.update(role="master"), "settings['role'] must be one of"),
    (lambda d: d.update(steps=0), "settings['steps'] must be >= 1 (got 0)"),
    (lambda d: d.update(steps=True), "settings['steps'] must be an integer"),
    (lambda d: d.update(batch_size="64"), "settings['batch_size'] must be an integer (got '64')"),
    (lambda d: d.update(learning_rate=-0.1), "settings['learning_rate'] must be a positive number"),
    (lambda d: d["s3"].update(endpoint="10.0.0.1:5000"), "settings['s3.endpoint'] must be an http(s) URL"),
    (lambda d: d["s3"].update(run_prefix="/"), "settings['s3.run_prefix'] must name a prefix"),
    (lambda d: d["tf_config"]["task"].update(index=1), "settings['tf_config.task'] must match role"),
    (lambda d: d["tf_config"]["cluster"].update(worker=[]), "tf_config.cluster.worker'] must be a non-empty"),
    (lambda d: d["tf_config"]["cluster"].update(ps=["10.0.0.2"]), "entries must look like 'host:port'"),
    (lambda d: d["tf_config"]["cluster"].update(evaluator=["10.0.0.9:1"]), "unknown jobs ['evaluator']"),
    (lambda d: d["tf_config"]["cluster"].update(chief=["10.0.0.5:1", "10.0.0.6:1"]), "exactly one address"),
    (lambda d: d["tf_config"]["cluster"].update(ps=["10.0.0.3:2222"]), "uses an address twice"),
])
def test_bad_settings_are_rejected_with_the_value(mutate, fragment):
    raw = copy.deepcopy(example_settings())
    mutate(raw)
    with pytest.raises(SettingsError) as err:
        validate(raw)
    assert fragment in str(err.value)


def test_index_out_of_range_for_role():
    raw = example_settings(role="worker", index=2)
    raw["tf_config"]["task"] = {"type": "worker", "index": 2}
    with pytest.raises(SettingsError, match="out of range for 2 worker"):
        validate(raw)


def test_null_endpoint_means_aws():
    raw = example_settings()
    raw["s3"]["endpoint"] = None
    assert validate(raw).s3.endpoint is None


def test_not_a_dict():
    with pytest.raises(SettingsError, match="must be a dict"):
        validate(["role", "chief"])
