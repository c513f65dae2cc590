"""A training set several times larger than a worker's memory trains without running out of it.

A local cluster (1 ps, 1 worker, 1 chief) whose nodes are capped at LIMIT_MB each (provider option
``node_memory_mb``: a memory cgroup per node, no swap) trains on TFRecord files in the store holding
DATA_BYTES, more than 3 times the cap, each example 64 KiB once decoded. The worker streams them through its
bounded buffer (a few files on disk, none in memory; a shuffle buffer sized in bytes) for more than one
epoch (the files are one file's copies, made by the store); the run must succeed with the worker's cgroup never
OOM-killing anything, and the worker must have read more than the whole data set.
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import numpy as np
import pytest

from tests.conftest import needs_root
from tests.integration.helpers import force_down, leftovers, make
from tfcluster import cgroup

pytestmark = [pytest.mark.e2e, needs_root(),
              pytest.mark.skipif(cgroup.hierarchy() is None, reason=cgroup.NO_CONTROLLER)]

CLUSTER = "tfct-mem"
SUBNET = "10.231.252.0/24"      # outside every auto subnet and the other tests' networks
LIMIT_MB = 640
FILES = 8
RECORDS_PER_FILE = 1024
PAD = 256 << 10                 # bytes of payload per record: 8 files x 1024 x 256 KiB = 2 GiB (a quarter of
                                # the records of 64 KiB ones: the same bytes through S3 and the worker's
                                # buffer, a quarter of the steps to train through them)
DATA_BYTES = FILES * RECORDS_PER_FILE * PAD
BATCH = 64
# just over one epoch through the worker's files: each step past it costs a second epoch's reads (the worker
# keeps a few files ahead of its steps; the local store served it 400-530 MB/s alone on this machine)
STEPS = FILES * RECORDS_PER_FILE // BATCH + 10

MODULE = '''
import keras
import tensorflow as tf

loss = keras.losses.BinaryCrossentropy(from_logits=True)

def metrics():
    return [keras.metrics.AUC(name="auc", from_logits=True)]

SPEC = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64),
        "pad": tf.io.FixedLenFeature([], tf.string)}

def decode(record):          # 64 KiB of features per example: the first 16380 bytes of each record's pad
    # (the shuffle buffer holds ~64 MiB of decoded examples: at 16 KiB, its 4096 examples' records were 1 GiB
    # read before the first step; at 64 KiB 256 MiB, and the worker reads 2.75 GiB in all instead of 3.5)
    row = tf.io.parse_single_example(record, SPEC)
    pad = tf.cast(tf.io.decode_raw(row["pad"], tf.uint8)[:16380], tf.float32) / 255.0 - 0.5
    return tf.concat([row["x"], pad], 0), tf.cast(row["y"], tf.float32)

def build_model():           # logistic regression: the label is linear in x, the pad is a constant input
    return keras.Sequential([keras.Input(shape=(16384,)), keras.layers.Dense(1)])
'''


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("mem") / "state"
    h.mkdir()
    yield h
    force_down(h, CLUSTER)
    assert leftovers(h, CLUSTER) == []


def write_files(directory, count: int, records: int, pad: int, seed: int) -> list:
    """TFRecord files of examples x [4] (normal), y = (sum(x) > 0), and ``pad`` random-looking bytes (the
    same in every record: as features they are constant, as bytes they are read like any others)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    payload = rng.bytes(pad) if pad else b""
    paths = []
    for i in range(count):
        path = directory / f"part-{seed}-{i:03d}.tfrecord"
        x = rng.normal(size=(records, 4)).astype(np.float32)
        with tf.io.TFRecordWriter(str(path)) as writer:
            for row in x:
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                           "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row.sum() > 0)]))}
                if pad:
                    feature["pad"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[payload]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(path)
    return paths


def upload(home, paths, folder: str, copies: int = 1) -> None:
    """Upload each file to ``folder``; with ``copies`` > 1, also as that many more objects copied by the store
    itself (``<stem>-c<n><suffix>``: the same bytes under other keys, without sending them again)."""
    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        from tfc_harness import s3io

        from tfcluster import cluster, config, store

        spec = config.resolve({"cluster": CLUSTER})
        cluster.prepare_storage(spec)
        client = store.client(spec)
        bucket = spec.storage.bucket
        for path in paths:
            key = f"{folder}/{path.name}"
            s3io.upload_file(client, path, bucket, key)
            for n in range(1, copies):
                copy = f"{folder}/{path.stem}-c{n}{path.suffix}"
                client.copy_object(Bucket=bucket, Key=copy, CopySource={"Bucket": bucket, "Key": key})
    finally:
        os.environ.pop("TFCLUSTER_HOME")


def test_a_data_set_larger_than_a_workers_memory_streams_through_it(home, tmp_path):
    assert DATA_BYTES >= 3 * (LIMIT_MB << 20)
    (tmp_path / "big.py").write_text(textwrap.dedent(MODULE))
    # one file written and sent once, stored FILES times: what the worker reads is FILES objects of
    # different keys either way, and writing and uploading 2 GiB took ~30 s of the test's ~70 s
    train = write_files(tmp_path, 1, RECORDS_PER_FILE, PAD, seed=1)
    upload(home, train, "mem/train", copies=FILES)
    train[0].unlink()
    upload(home, write_files(tmp_path, 1, 500, 16380, seed=2), "mem/test")   # test records: a pad just long enough

    cfg = tmp_path / "mem.yml"
    cfg.write_text(textwrap.dedent(f"""\
        cluster: {CLUSTER}
        network: {{subnet: {SUBNET}}}
        provider_options: {{node_memory_mb: {LIMIT_MB}}}
        nodes: {{ps: {{count: 1}}, worker: {{count: 1}}, chief: {{count: 1}}}}
        data: {{train: s3://tfcluster/mem/train/, test: s3://tfcluster/mem/test/, format: tfrecord}}
        training: {{model: big.py, steps: {STEPS}, batch_size: {BATCH}, checkpoint_every: {STEPS}}}
        """))
    up = make("up", home, CONFIG=str(cfg), timeout=600)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr
    worker = f"{CLUSTER}-worker-0"
    directory = cgroup.hierarchy().root / "tfcluster" / CLUSTER / worker
    res = make("train", home, CONFIG=str(cfg), timeout=1800)
    out = res.stdout
    assert res.returncode == 0, out[-5000:] + res.stderr
    assert re.search(r"data from S3 [0-9.]+ MB/s", out), "no S3 throughput in the progress lines"
    auc = re.search(r"^test auc: ([0-9.]+)$", out, re.M)
    assert auc and float(auc.group(1)) >= 0.9, out[-2000:]      # printed rounded: 1.0000 happens

    events = (directory / ("memory.events" if cgroup.hierarchy().version == 2 else "memory.oom_control")).read_text()
    assert re.search(r"^oom_kill 0$", events, re.M), events
    peak_file = directory / ("memory.peak" if cgroup.hierarchy().version == 2 else "memory.max_usage_in_bytes")
    peak = int(peak_file.read_text()) if peak_file.exists() else None
    run = json.loads((home / CLUSTER / "run.json").read_text())
    status = json.loads((home / CLUSTER / "logs" / run["run_id"] / worker / "status.json").read_text())
    read = status["data"]["bytes"]
    print(f"worker read {read / 2**30:.2f} GiB of a {DATA_BYTES / 2**30:.2f} GiB data set at "
          f"{status['data']['mb_per_s']} MB/s (epoch {status['data']['epoch']}); memory cap {LIMIT_MB} MiB, "
          f"peak usage {peak and peak >> 20} MiB (page cache included)")
    assert read >= DATA_BYTES and status["data"]["error"] is None

    down = make("down", home, CONFIG=str(cfg), timeout=600)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr
    assert leftovers(home, CLUSTER) == []
