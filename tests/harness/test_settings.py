"""The settings model: typed fields, unknown keys refused, errors naming the key and echoing the value."""

from __future__ import annotations

import copy
import json

import pytest
from harness_support import example_settings
from tfc_harness.settings import Settings, SettingsError, validate


def test_example_is_valid_and_normalised():
    raw = example_settings()
    raw["s3"]["run_prefix"] = "/runs/demo/x/"
    s = validate(raw)
    assert s.role == "chief" and s.index == 0 and s.num_workers == 2
    assert s.strategy == "parameter_server"          # the default when the key is absent
    assert s.s3.run_prefix == "runs/demo/x"
    assert s.peers() == [("ps/0", "10.0.0.2:2222"), ("worker/0", "10.0.0.3:2222"),
                         ("worker/1", "10.0.0.4:2222")]
    assert json.loads(s.tf_config_json()) == raw["tf_config"]
    assert set(s.to_dict()) == set(raw) | {"strategy", "start_timeout_s", "stall_timeout_s", "data", "hparams",
                                              "threads", "checkpoint_min_interval_s"}
    assert s.data is None and s.hparams == {}      # the module's arrays under s3.dataset_prefix
    assert s.checkpoint_min_interval_s == 0        # optional: a checkpoint at every checkpoint_every boundary
    assert s.start_timeout_s is None   # optional: the chief then waits up to max_runtime_s


def test_a_workers_peers_leave_itself_out():
    raw = example_settings(role="worker", index=1)
    raw["tf_config"]["task"] = {"type": "worker", "index": 1}
    assert [name for name, _ in validate(raw).peers()] == ["ps/0", "worker/0", "chief/0"]


def test_optional_start_timeout():
    raw = example_settings()
    raw["start_timeout_s"] = 30
    assert validate(raw).start_timeout_s == 30
    raw["start_timeout_s"] = 0
    with pytest.raises(SettingsError, match=r"settings\['start_timeout_s'\] must be >= 1 \(got 0\)"):
        validate(raw)


def test_learning_rate_int_accepted_as_float():
    assert validate(example_settings(learning_rate=1)).learning_rate == 1.0


def test_settings_are_frozen():
    s = validate(example_settings())
    with pytest.raises(ValueError):
        s.steps = 5


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.pop("steps"), "settings['steps'] is missing"),
    (lambda d: d.update(batchsize=3), "settings['batchsize'] is not a known key (got 3)"),
    (lambda d: d["s3"].pop("bucket"), "settings['s3.bucket'] is missing"),
    (lambda d: d["s3"].update(secret="x"), "settings['s3.secret'] is not a known key (got 'x')"),
    (lambda d: d.update(role="master"), "settings['role'] must be one of 'ps', 'worker' or 'chief' (got 'master')"),
    (lambda d: d.update(strategy="mirrored"),
     "settings['strategy'] must be one of 'parameter_server' or 'multi_worker_mirrored' (got 'mirrored')"),
    (lambda d: d.update(steps=0), "settings['steps'] must be >= 1 (got 0)"),
    (lambda d: d.update(steps=True), "settings['steps'] must be an integer (got True)"),
    (lambda d: d.update(batch_size="64"), "settings['batch_size'] must be an integer (got '64')"),
    (lambda d: d.update(learning_rate=-0.1), "settings['learning_rate'] must be > 0.0 (got -0.1)"),
    (lambda d: d.update(stall_timeout_s=5), "settings['stall_timeout_s'] must be >= 10 (got 5)"),
    (lambda d: d.update(cluster="  "), "settings['cluster'] must be a non-empty string (got '  ')"),
    (lambda d: d["s3"].update(endpoint="10.0.0.1:5000"),
     "settings['s3.endpoint'] must be an http(s) URL or null (AWS) (got '10.0.0.1:5000')"),
    (lambda d: d["s3"].update(run_prefix="/"), "settings['s3.run_prefix'] must name a prefix, not the bucket root"),
    (lambda d: d.update(tf_config=[1]), "settings['tf_config'] must be a mapping (got [1])"),
    (lambda d: d["tf_config"]["task"].update(index=1), "tf_config.task must match role='chief' index=0"),
    (lambda d: d["tf_config"]["cluster"].update(worker=[]),
     "does not fit strategy parameter_server: worker: 0 task(s); parameter_server needs >= 1"),
    (lambda d: d["tf_config"]["cluster"].update(ps=["10.0.0.2"]),
     "settings['tf_config.cluster.ps'] entries must look like 'host:port' (got '10.0.0.2')"),
    (lambda d: d["tf_config"]["cluster"].update(evaluator=["10.0.0.9:1"]),
     "evaluator: 1 task(s); parameter_server has no evaluator job"),
    (lambda d: d["tf_config"]["cluster"].update(chief=["10.0.0.5:1", "10.0.0.6:1"]),
     "chief: 2 task(s); parameter_server needs exactly 1"),
    (lambda d: d["tf_config"]["cluster"].update(ps=["10.0.0.3:2222"]), "uses an address twice ['10.0.0.3:2222']"),
])
def test_bad_settings_are_rejected_naming_key_and_value(mutate, fragment):
    raw = copy.deepcopy(example_settings())
    mutate(raw)
    with pytest.raises(SettingsError) as err:
        validate(raw)
    assert fragment in str(err.value)


def test_every_bad_key_is_reported_at_once():
    with pytest.raises(SettingsError) as err:
        validate(example_settings(steps=0, batch_size=0))
    assert "settings['steps'] must be >= 1 (got 0)" in str(err.value)
    assert "settings['batch_size'] must be >= 1 (got 0)" in str(err.value)


def test_index_out_of_range_for_role():
    raw = example_settings(role="worker", index=2)
    raw["tf_config"]["task"] = {"type": "worker", "index": 2}
    with pytest.raises(SettingsError, match=r"index is out of range for 2 worker task\(s\) \(got 2\)"):
        validate(raw)


def test_null_endpoint_means_aws():
    raw = example_settings()
    raw["s3"]["endpoint"] = None
    assert validate(raw).s3.endpoint is None


def test_not_a_dict():
    with pytest.raises(SettingsError, match="must be a dict"):
        validate(["role", "chief"])


def test_every_field_is_described():
    missing = [name for name, field in Settings.model_fields.items() if not field.description]
    assert missing == []
    assert Settings.model_json_schema()["additionalProperties"] is False


def _files_data(shares: int) -> dict:
    return {"source": "files", "format": "tfrecord", "bucket": "b",
            "train": [[{"key": f"train-{i}", "size": 1, "etag": "e"}] for i in range(shares)],
            "test": [{"key": "test-0", "size": 1, "etag": "e"}]}


def test_multi_worker_mirrored_has_no_ps_and_every_task_trains_on_its_share():
    raw = example_settings(strategy="multi_worker_mirrored", data=_files_data(3))
    s = validate(raw)
    assert s.training_tasks == [("chief", 0), ("worker", 0), ("worker", 1)] and s.training_index == 0
    with pytest.raises(SettingsError, match=r"ps: 1 task\(s\); multi_worker_mirrored has no ps job"):
        validate(dict(raw, tf_config=example_settings()["tf_config"]))


@pytest.mark.parametrize("strategy, shares", [("parameter_server", 3), ("multi_worker_mirrored", 2)])
def test_data_train_has_one_list_per_training_task(strategy, shares):
    tasks, jobs = (2, "worker") if strategy == "parameter_server" else (3, r"chief\+worker")
    with pytest.raises(SettingsError, match=rf"each of the {tasks} training tasks \({jobs}\) at least one file"):
        validate(example_settings(strategy=strategy, data=_files_data(shares)))


def test_threads_are_optional_and_checked():
    raw = example_settings()
    assert validate(raw).threads is None                                # TensorFlow's defaults
    raw["threads"] = {"intra_op": 1, "inter_op": 2}
    assert validate(raw).threads.model_dump() == {"intra_op": 1, "inter_op": 2}
    raw["threads"] = {"intra_op": 0, "inter_op": 1}
    with pytest.raises(SettingsError, match=r"settings\['threads.intra_op'\] must be >= 1 \(got 0\)"):
        validate(raw)
