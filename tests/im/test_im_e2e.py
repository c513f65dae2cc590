"""End to end with PROVIDER=im: ``make up train down`` through a real IM server adopting local nodes.

IM (its own venv, SQLite, 127.0.0.1) receives the rendered RADL with ``contextualize ()`` and DeployedNode
systems for local-provider nodes; tfcluster then configures and trains with its own playbooks, the model
lands in S3 and is verified, and ``down`` leaves nothing in IM nor on this machine.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import needs_root
from tests.integration.helpers import force_down, leftovers, make
from tfcluster import store
from tfcluster.paths import ClusterState
from tfcluster.providers.im import ImClient, ImProvider

pytestmark = [pytest.mark.e2e, pytest.mark.integration, needs_root()]
CLUSTER = "tfct-im"


@pytest.fixture(scope="module")
def run(tmp_path_factory, im_server, auth_file):
    base = tmp_path_factory.mktemp("im-e2e")
    home, artifacts = base / "state", base / "artifacts"
    home.mkdir()
    cfg = base / "cluster.yml"
    cfg.write_text(
        f"cluster: {CLUSTER}\n"
        "provider: im\n"
        f"provider_options: {{im_url: '{im_server['url']}', auth_file: '{auth_file}', adopt_local: 'true'}}\n"
        "nodes: {ps: {count: 1}, worker: {count: 1}, chief: {count: 1}}\n"
        # the adopted nodes are local ones: they reach the local store (the tests' own, see tests/conftest.py)
        f"storage: {{endpoint: '{store.local_endpoint()}'}}\n")
    env = {"TFCLUSTER_ARTIFACTS": str(artifacts)}
    yield {"home": home, "cfg": cfg, "env": env, "client": ImClient(im_server["url"], auth_file)}
    make("down", home, CONFIG=str(cfg), FORCE="1", env=env, timeout=300)
    state = ClusterState(CLUSTER, root=home)
    ImProvider(state).force_cleanup()
    force_down(home, CLUSTER)


def test_make_up_train_down_with_im(run):
    home, cfg, env, client = run["home"], run["cfg"], run["env"], run["client"]
    up = make("up", home, CONFIG=str(cfg), env=env, timeout=600)
    print(up.stdout)
    assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-3000:]
    assert re.search(r"IM infrastructure \S+: configured; VMs: 3 configured", up.stdout), up.stdout
    assert "all 3 nodes answer over SSH" in up.stdout
    record = json.loads((home / CLUSTER / "im.json").read_text())
    assert record["inf_id"] in client.list_ids()
    nodes = json.loads((home / CLUSTER / "nodes.json").read_text())
    assert sorted(n["name"] for n in nodes) == [f"{CLUSTER}-chief-0", f"{CLUSTER}-ps-0", f"{CLUSTER}-worker-0"]

    train = make("train", home, CONFIG=str(cfg), env=env, timeout=1800)
    print(train.stdout[-2500:])
    assert train.returncode == 0, train.stdout[-6000:] + train.stderr[-3000:]
    acc = float(re.search(r"^test accuracy: ([0-9.]+)$", train.stdout, re.M).group(1))
    assert acc >= 0.90, train.stdout[-3000:]
    # IM's nodes are VMs of their own (not the controller's cores): verification's evaluator was started
    # while the run trained (training._AheadEvaluator), and it is what verified the model
    assert "in a fresh process (started before the chief's exit) and match the chief's" in train.stdout, \
        train.stdout[-3000:]
    run_rec = json.loads((home / CLUSTER / "run.json").read_text())
    assert run_rec["state"] == "verified"
    bucket, prefix = re.match(r"s3://([^/]+)/(.+)/$", run_rec["s3_prefix"]).groups()
    s3 = s3_client(home, cfg)
    s3.head_object(Bucket=bucket, Key=f"{prefix}/_SUCCESS")  # raises when the marker is missing

    down = make("down", home, CONFIG=str(cfg), env=env, timeout=600)
    print(down.stdout)
    assert down.returncode == 0, down.stdout[-4000:] + down.stderr[-3000:]
    assert f"IM infrastructure {record['inf_id']}: destroyed" in down.stdout
    assert client.list_ids() == []
    assert leftovers(home, CLUSTER) == []
    assert not (home / CLUSTER / "im.json").exists()
    again = make("down", home, CONFIG=str(cfg), env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr


def s3_client(home, cfg):
    import os

    from tfcluster import config

    saved = os.environ.get("TFCLUSTER_HOME")
    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        return store.client(config.resolve(config.load_file(cfg)))
    finally:
        if saved is None:
            os.environ.pop("TFCLUSTER_HOME")
        else:
            os.environ["TFCLUSTER_HOME"] = saved
