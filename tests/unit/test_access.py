"""What the nodes may do in object storage (tfcluster/access.py), and where each rule is enforced (issue 14)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tfc_harness import data, sources, strategies

from tfcluster import access, job, training
from tfcluster.cluster import save_spec
from tfcluster.config import resolve
from tfcluster.errors import ConfigError, TfclusterError
from tfcluster.paths import ClusterState
from tfcluster.providers.aws import AwsProvider
from tfcluster.providers.base import REGISTRY
from tfcluster.terraform import TERRAFORM_BIN, TerraformModule

CLOUD = {"provider": "aws", "storage.bucket": "tfct-runs", "network.allowed_ssh_cidrs": ["203.0.113.0/24"]}


def spec(**overrides):
    return resolve(overrides={"cluster": "exp1", "storage.prefix": "team/runs", **overrides})


def test_the_module_data_set_and_the_cluster_runs():
    got = access.storage_access(spec())
    assert got.module_input() == {"jobs": ["worker", "chief"], "read_write": "team/runs/exp1/",
                                  "read": [{"bucket": "tfcluster", "prefix": "datasets/digits-"}]}
    # the grant covers every version of the module's data set the controller stores, and no other module's
    versions = data.versions_prefix(job.dataset_base(spec()))
    assert versions == "datasets/digits-"
    assert (versions + "0123456789ab/train.npz").startswith(got.read[0].prefix)
    assert not "datasets/digits_v2-0123456789ab/train.npz".startswith(got.read[0].prefix)
    # the runs' layout the nodes get is under the read-write prefix
    settings = training.run_settings(spec(), "20260101-abcd", {})
    assert settings["s3"]["run_prefix"] + "/" == got.read_write + "20260101-abcd/"
    assert settings["s3"]["checkpoint_prefix"].startswith(got.read_write)


@pytest.mark.parametrize("strategy", strategies.names())
def test_jobs_with_storage_never_include_ps(strategy):
    jobs = access.storage_access(spec(strategy=strategy)).jobs
    assert "ps" not in jobs and "chief" in jobs
    assert set(strategies.TRAINING_JOBS[strategy]) <= set(jobs)


def test_data_files_are_granted_by_the_prefix_that_is_listed():
    got = access.storage_access(spec(**{"data.train": "s3://tfct-data/sets/v1/train-*.tfrecord",
                                        "data.test": "s3://tfct-data/sets/"}))
    assert [str(g) for g in got.read] == ["s3://tfct-data/sets/*"]   # the train prefix lies inside the test's
    got = access.storage_access(spec(**{"data.train": "s3://tfct-data/a/train-[0-9]*.csv",
                                        "data.test": "s3://tfct-other/b/test.csv"}))
    assert [(g.bucket, g.prefix) for g in got.read] == [("tfct-data", "a/train-"), ("tfct-other", "b/test.csv")]
    for url in ("s3://tfct-data/a/train-[0-9]*.csv", "s3://tfct-other/b/test.csv"):
        assert sources.listed_prefix(url) in [(g.bucket, g.prefix) for g in got.read]


def test_clouds_refuse_data_keys_a_policy_cannot_name(tmp_path):
    odd = {**CLOUD, "data.train": "s3://tfct-data/a$b/train-*.csv", "data.test": "s3://tfct-data/t/"}
    with pytest.raises(ConfigError) as err:
        AwsProvider(ClusterState("exp1", root=tmp_path)).check(spec(**odd))
    assert err.value.field == "data.train" and "by name" in err.value.allowed
    assert not REGISTRY["local"].limits_storage_access
    assert [name for name, cls in REGISTRY.items() if cls.limits_storage_access] == ["aws", "gcp"]


def test_a_run_may_use_only_what_the_cluster_was_granted():
    up = access.storage_access(spec(**{"data.train": "s3://tfct-data/sets/", "data.test": "s3://tfct-data/eval/"}))
    narrower = spec(**{"data.train": "s3://tfct-data/sets/v2/train-*", "data.test": "s3://tfct-data/eval/x.csv"})
    access.check_granted(up, access.storage_access(narrower), "exp1")
    with pytest.raises(TfclusterError, match=r"this run needs s3://tfct-new/sets/\*: run 'make up'"):
        access.check_granted(up, access.storage_access(spec(**{"data.train": "s3://tfct-new/sets/",
                                                               "data.test": "s3://tfct-data/eval/"})), "exp1")
    with pytest.raises(TfclusterError, match=r"s3://tfcluster/other/exp1/\* \(read-write\)"):
        access.check_granted(up, access.storage_access(spec(**{"storage.prefix": "other",
                                                               "data.train": "s3://tfct-data/sets/",
                                                               "data.test": "s3://tfct-data/eval/"})), "exp1")


def test_train_checks_the_grant_on_clouds_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    for provider, limited in (("aws", True), ("local", False)):
        cloud = CLOUD if provider == "aws" else {}
        up = spec(**{**cloud, "provider": provider, "cluster": f"g-{provider}"})
        state = ClusterState(up.cluster)
        state.dir.mkdir(parents=True)
        save_spec(state, up)
        other = spec(**{**cloud, "provider": provider, "cluster": up.cluster, "data.train": "s3://tfct-data/x/",
                        "data.test": "s3://tfct-data/y/"})
        training._check_can_train(up, state)
        if limited:
            with pytest.raises(TfclusterError, match="s3://tfct-data/x/\\*, s3://tfct-data/y/\\*"):
                training._check_can_train(other, state)
        else:
            training._check_can_train(other, state)


@pytest.mark.skipif(not Path(TERRAFORM_BIN).exists() and not shutil.which(TERRAFORM_BIN), reason="no terraform")
def test_inputs_reach_the_module_literally(tmp_path):
    """Strings in the generated .tf.json are templates to Terraform: a '${' or '%{' in a user's data key
    must arrive as written, not be evaluated."""
    module = tmp_path / "module"
    module.mkdir()
    (module / "main.tf").write_text('variable "storage_access" {\n  type = any\n}\n'
                                    'output "nodes" {\n  value = var.storage_access\n}\n')
    tf = TerraformModule(module, tmp_path / "root")
    odd = {"jobs": ["chief"], "read_write": "runs/x/", "read": [{"bucket": "b", "prefix": "a${b}c%{d}/$${e}"}]}
    tf.write_root({"storage_access": odd})
    root = json.loads((tmp_path / "root" / "main.tf.json").read_text())
    assert root["module"]["cluster"]["storage_access"]["read"][0]["prefix"] == "a$${b}c%%{d}/$$${e}"
    tf.apply()
    assert tf.output("nodes") == odd
