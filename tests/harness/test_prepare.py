"""The controller's checks of a job's data before any node trains (tfc_harness.prepare, against moto):
each bad case is one error naming the module or the data file and what is wrong."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from harness_support import S3_CREDENTIALS, node_env
from tfc_harness import prepare
from tfc_harness.errors import HarnessError, ModelModuleError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")

BUCKET = "prep"
CSV_MODEL = """
    import keras
    loss = "mse"
    def build_model():
        return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
"""
TFRECORD_MODEL = """
    import keras
    import tensorflow as tf
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    SPEC = {"x": tf.io.FixedLenFeature([3], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
    def decode(record):
        row = tf.io.parse_single_example(record, SPEC)
        return row["x"], tf.cast(row["y"], tf.float32)
    def build_model():
        return keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(OUTPUTS)])
    OUTPUTS = 1
"""


@pytest.fixture(autouse=True)
def own_tmp(tmp_path, monkeypatch):
    """The prepare processes a test starts write AutoGraph's files (a CSV or TFRecord parser's) and their
    bytecode in the test's own directory, not in /tmp (as tfcluster.job gives its own a directory)."""
    directory = tmp_path / "tmpdir"
    directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(directory))


@pytest.fixture(scope="module")
def store(moto_endpoint, tmp_path_factory):
    """A bucket with good and bad files, written once for the module."""
    import boto3
    import tensorflow as tf

    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=BUCKET)

    def put(key: str, body: bytes) -> None:
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    for i in range(3):
        put(f"csv/good/train-{i}.csv", b"a,b,target\n" + b"".join(b"%d,%d,%d.5\n" % (j, -j, j) for j in range(5)))
    put("csv/good/test-0.csv", b"a,b,target\n1,2,3\n4,5,6\n")
    put("csv/nolabel/train-0.csv", b"a,b,c\n1,2,3\n")
    put("csv/nolabel/train-1.csv", b"a,b,c\n1,2,3\n")
    put("csv/nolabel/test-0.csv", b"a,b,c\n1,2,3\n")
    put("csv/text/train-0.csv", b"a,b,target\n1,2,3\n")
    put("csv/text/train-1.csv", b"a,b,target\n1,2,3\n")
    put("csv/text/test-0.csv", b"a,b,target\n1,high,3\n")
    # files past the first ones: a first row with a cell that is not a number (CRLF lines), one with a cell
    # fewer than the header; a file with a header and no row, and one whose first row is left to the nodes (a
    # quote left open on its line), beside good ones, pass
    put("csv/rows/train-0.csv", b"a,b,target\n1,2,3\n")
    put("csv/rows/train-1.csv", b"a,b,target\r\n1,n/a,3\r\n4,5,6\r\n")
    put("csv/fields/train-0.csv", b"a,b,target\n1,2,3\n")
    put("csv/fields/train-1.csv", b"a,b,target\n1,2\n")
    put("csv/sparse/train-0.csv", b"a,b,target\n1,2,3\n")
    put("csv/sparse/train-1.csv", b"a,b,target\n")
    put("csv/sparse/train-2.csv", b'a,b,target\n1,"2\n",3\n')
    buf = io.BytesIO()
    path = str(tmp_path_factory.mktemp("records") / "test.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for row in np.arange(12, dtype=np.float32).reshape(4, 3):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row[0]) % 2]))})).SerializeToString())
    buf.write(open(path, "rb").read())
    for i in range(2):
        put(f"rec/good/train-{i}.tfrecord", buf.getvalue())
    put("rec/good/test-0.tfrecord", buf.getvalue())
    put("rec/mixed/part-0.tfrecord", buf.getvalue())
    put("rec/mixed/part-1.tfrecord", buf.getvalue())
    put("rec/mixed/part-9.csv", b"a,b,target\n1,2,3\n")      # a glob that also takes a CSV file
    # a TFRecord file's first length and checksum, then bytes that are no record: found by decode's reading
    put("rec/corrupt/train-0.tfrecord", buf.getvalue()[:12] + b"\xff" * 200)
    put("rec/corrupt/train-1.tfrecord", buf.getvalue())
    put("rec/garbage/train-0.tfrecord", b"this is not a tfrecord file at all" * 10)
    put("rec/garbage/train-1.tfrecord", b"this is not a tfrecord file at all" * 10)
    put("rec/garbage/test-0.tfrecord", b"this is not a tfrecord file at all" * 10)
    put("other/x.csv", b"a,b,target\n1,2,3\n")
    # files past the first ones: one in another schema (x of 2000 values: a first record longer than the first
    # GET), one whose first record is cut short, one whose x has 2 values (a decode that takes any length)
    put("rec/schema/train-0.tfrecord", buf.getvalue())
    put("rec/schema/train-1.tfrecord", tfrecord(tmp_path_factory, [np.arange(2000, dtype=np.float32)]))
    put("rec/cut/train-0.tfrecord", buf.getvalue())
    put("rec/cut/train-1.tfrecord", buf.getvalue()[:30])
    put("rec/short/train-0.tfrecord", buf.getvalue())
    put("rec/short/train-1.tfrecord", tfrecord(tmp_path_factory, [np.zeros(2, np.float32)]))
    return moto_endpoint


def tfrecord(tmp_path_factory, rows) -> bytes:
    """A TFRecord file of one Example per row: ``x`` the row, ``y`` 1."""
    import tensorflow as tf

    path = tmp_path_factory.mktemp("records") / "rows.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in rows:
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))})).SerializeToString())
    return path.read_bytes()


def job(tmp_path, endpoint, module: str, train: str, test: str, fmt: str, workers: int = 2, label="target"):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(module))
    return {"module": str(path), "hparams": {}, "workers": workers, "bucket": BUCKET, "endpoint": endpoint,
            "region": "us-east-1", "dataset_base": "datasets/job",
            "data": {"train": f"s3://{BUCKET}/{train}", "test": f"s3://{BUCKET}/{test}", "format": fmt,
                     "label": label}}


@pytest.fixture
def creds(monkeypatch):
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)


def test_good_csv_and_tfrecord_jobs(store, tmp_path, creds):
    csv = prepare.run(job(tmp_path, store, CSV_MODEL, "csv/good/train-*", "csv/good/test-*", "csv", workers=3))
    assert csv["data"]["columns"] == ["a", "b", "target"] and [len(w) for w in csv["data"]["train"]] == [1, 1, 1]
    rec = prepare.run(job(tmp_path, store, TFRECORD_MODEL, "rec/good/train-*", "rec/good/test-*", "tfrecord"))
    assert rec["data"]["label"] is None and rec["describe"]["test"][0]["key"] == "rec/good/test-0.tfrecord"
    # the module's interface as `check` gives it: the controller runs no check of its own beside this one
    assert rec["interface"] == prepare.check(job(tmp_path, store, TFRECORD_MODEL, "rec/good/train-*", "rec/good/test-*",
                                                 "tfrecord"))


@pytest.mark.parametrize("module, train, test, fmt, workers, error, fragment", [
    (CSV_MODEL, "csv/nothing-*.csv", "csv/good/test-*", "csv", 2, prepare.DataError,
     f"data.train: s3://{BUCKET}/csv/nothing-*.csv matches no object in s3://{BUCKET}/"),
    (CSV_MODEL, "csv/good/train-*", "csv/good/nothing/", "csv", 2, prepare.DataError,
     f"data.test: s3://{BUCKET}/csv/good/nothing/ matches no object"),
    # a mistyped folder: the deepest folder above it that holds something, and what
    (CSV_MODEL, "csv/god/train-*", "csv/good/test-*", "csv", 2, prepare.DataError,
     f"data.train: s3://{BUCKET}/csv/god/train-* matches no object in s3://{BUCKET}/ (s3://{BUCKET}/csv/ holds "
     "csv/fields/, csv/good/, csv/nolabel/, csv/rows/, csv/sparse/, csv/text/)"),
    (CSV_MODEL, "csv/good/train-*", "csv/good/tset-*", "csv", 2, prepare.DataError,
     f"data.test: s3://{BUCKET}/csv/good/tset-* matches no object in s3://{BUCKET}/ (s3://{BUCKET}/csv/good/ holds "
     "csv/good/test-0.csv, csv/good/train-0.csv, csv/good/train-1.csv, csv/good/train-2.csv)"),
    (CSV_MODEL, "nowhere/train-*", "csv/good/test-*", "csv", 2, prepare.DataError,
     f"data.train: s3://{BUCKET}/nowhere/train-* matches no object in s3://{BUCKET}/ (s3://{BUCKET}/ holds csv/, "
     "other/, rec/)"),
    # a folder named without its '/': the hint says what it holds
    (CSV_MODEL, "csv/nolabel", "csv/good/test-*", "csv", 2, prepare.DataError,
     f"data.train: s3://{BUCKET}/csv/nolabel matches no object in s3://{BUCKET}/ (but s3://{BUCKET}/csv/nolabel/ "
     "holds 3 file(s): a folder's URL ends with '/')"),
    (CSV_MODEL, "csv/good/train-*", "csv/good/test-*", "csv", 4, prepare.DataError,
     "data.train: 3 files for 4 workers: worker 3 would have no data"),
    (CSV_MODEL, "csv/nolabel/train-*", "csv/nolabel/test-*", "csv", 2, prepare.DataError,
     "s3://prep/csv/nolabel/train-0.csv: label column 'target' (data.label) is not in the header (a, b, c)"),
    # good training files, a test file without the label: that is what is said, not that its header differs
    (CSV_MODEL, "csv/good/train-*", "csv/nolabel/test-*", "csv", 2, prepare.DataError,
     "s3://prep/csv/nolabel/test-0.csv: label column 'target' (data.label) is not in the header (a, b, c)"),
    (CSV_MODEL, "csv/text/train-*", "csv/text/test-*", "csv", 2, prepare.DataError,
     "s3://prep/csv/text/test-0.csv: line 2, column b holds high, not a number (every CSV column must hold numbers)"),
    # a file past the first training file: its first row, read as the workers will, names it
    (CSV_MODEL, "csv/rows/train-*", "csv/good/test-*", "csv", 2, prepare.DataError,
     "s3://prep/csv/rows/train-1.csv: line 2, column b holds n/a, not a number (every CSV column must hold "
     "numbers)"),
    (CSV_MODEL, "csv/fields/train-*", "csv/good/test-*", "csv", 2, prepare.DataError,
     "s3://prep/csv/fields/train-1.csv: reading its first row with CSV parsing failed: InvalidArgumentError: Expect "
     "3 fields but have 2 in record"),
    (CSV_MODEL, "csv/good/train-*", "csv/good/*", "csv", 2, prepare.DataError,
     "data.train and data.test both match s3://prep/csv/good/train-0.csv"),
    (TFRECORD_MODEL, "rec/garbage/train-*", "rec/garbage/test-*", "tfrecord", 2, prepare.DataError,
     "s3://prep/rec/garbage/train-0.tfrecord: not a TFRecord file (its first 12 bytes are no record's length "
     "and checksum); data.format is tfrecord"),
    (TFRECORD_MODEL, "rec/corrupt/train-*", "rec/good/test-*", "tfrecord", 2, prepare.DataError,
     "s3://prep/rec/corrupt/train-0.tfrecord: reading its first records with decode() failed"),
    # a file past the first training file: its first record, read as the workers will, names it
    (TFRECORD_MODEL, "rec/schema/train-*", "rec/good/test-*", "tfrecord", 2, prepare.DataError,
     "s3://prep/rec/schema/train-1.tfrecord: reading its first record with decode() failed: InvalidArgumentError: "),
    # ... and what that record holds, to hold decode()'s feature spec against
    (TFRECORD_MODEL, "rec/schema/train-*", "rec/good/test-*", "tfrecord", 2, prepare.DataError,
     "(its first record is a tf.train.Example of x (float, 2000 values), y (int64, 1 value))"),
    (TFRECORD_MODEL, "rec/cut/train-*", "rec/good/test-*", "tfrecord", 2, prepare.DataError,
     "s3://prep/rec/cut/train-1.tfrecord: reading its first record with decode() failed: DataLossError: "),
    (TFRECORD_MODEL.replace("tf.io.FixedLenFeature([3], tf.float32)", "tf.io.VarLenFeature(tf.float32)")
     .replace('return row["x"]', 'return tf.sparse.to_dense(row["x"])'),
     "rec/short/train-*", "rec/good/test-*", "tfrecord", 2, prepare.DataError,
     "s3://prep/rec/short/train-1.tfrecord: its first record gives features of shape (2,) and a label of shape (), "
     "where s3://prep/rec/good/test-0.tfrecord's give (3,) and (): every example must have the same shapes"),
    (TFRECORD_MODEL, "rec/mixed/part-*", "rec/good/test-*", "tfrecord", 2, prepare.DataError,
     "s3://prep/rec/mixed/part-9.csv: not a TFRecord file"),
    (CSV_MODEL, "rec/good/train-*", "rec/good/test-*", "csv", 2, prepare.DataError,
     "s3://prep/rec/good/train-0.tfrecord: its first line is not text (binary bytes: not a CSV file; a TFRecord "
     "file? data.format is csv)"),
    (TFRECORD_MODEL.replace("return row[\"x\"], tf.cast(row[\"y\"], tf.float32)", "return row[\"x\"]"),
     "rec/good/train-*", "rec/good/test-*", "tfrecord", 2, ModelModuleError,
     "decode() returns the wrong structure: decode(record) must return (features, label)"),
    (TFRECORD_MODEL.replace("OUTPUTS = 1", "OUTPUTS = 3"), "rec/good/train-*", "rec/good/test-*", "tfrecord", 2,
     ModelModuleError, "labels of shape () per example do not fit the model's outputs of shape (3,) under loss "
                       "BinaryCrossentropy: Keras would broadcast them"),
])
def test_bad_data_is_named_before_training(store, tmp_path, creds, module, train, test, fmt, workers, error,
                                           fragment):
    with pytest.raises(error) as err:
        prepare.run(job(tmp_path, store, module, train, test, fmt, workers))
    assert fragment in str(err.value), str(err.value)


def test_csv_files_without_a_row_the_check_can_read_pass(store, tmp_path, creds):
    """A header-only file, and one whose first row has a quote open at its line's end, are not read by the
    first-rows check (the nodes read them)."""
    got = prepare.run(job(tmp_path, store, CSV_MODEL, "csv/sparse/train-*", "csv/good/test-*", "csv", workers=1))
    assert [f["key"] for f in got["data"]["train"][0]] == [f"csv/sparse/train-{i}.csv" for i in range(3)]


def test_first_records_read_a_few_files_at_a_time_still_name_the_file(store, tmp_path, creds, monkeypatch):
    monkeypatch.setattr(prepare, "FIRST_RECORDS_AT_ONCE", 1)     # the bad file's record in a dataset of its own
    with pytest.raises(prepare.DataError, match="^s3://prep/rec/schema/train-1.tfrecord: reading its first record "
                                                "with decode[(][)] failed: InvalidArgumentError: Key: x"):
        prepare.run(job(tmp_path, store, TFRECORD_MODEL, "rec/schema/train-*", "rec/good/test-*", "tfrecord"))


def test_a_bucket_the_store_does_not_have_is_named_with_its_field(store, tmp_path, creds):
    args = job(tmp_path, store, CSV_MODEL, "csv/good/train-*", "csv/good/test-*", "csv")
    args["data"]["train"] = "s3://no-such-bucket-tfc/set/train-*.csv"
    with pytest.raises(prepare.DataError) as err:
        prepare.run(args)
    assert str(err.value) == ("data.train: s3://no-such-bucket-tfc/set/train-*.csv: the bucket "
                              "s3://no-such-bucket-tfc/ does not exist in the object store (a typo, or data not "
                              "uploaded yet)")


def test_the_command_exits_2_with_one_error_line(store, tmp_path):
    args = job(tmp_path, store, CSV_MODEL, "csv/nolabel/train-*", "csv/nolabel/test-*", "csv")
    proc = subprocess.run([sys.executable, "-m", "tfc_harness.prepare", "run", json.dumps(args)], capture_output=True,
                          text=True, env=node_env(dict(S3_CREDENTIALS)), timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "label column 'target'" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_harness_error_is_what_the_controller_reports(store, tmp_path, creds):
    assert issubclass(prepare.DataError, HarnessError)


def test_an_empty_csv_is_named_not_a_traceback(store, tmp_path, creds):
    import boto3

    s3 = boto3.client("s3", endpoint_url=store, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    s3.put_object(Bucket=BUCKET, Key="csv/empty/train-0.csv", Body=b"\n")
    s3.put_object(Bucket=BUCKET, Key="csv/empty/test-0.csv", Body=b"a,b,target\n1,2,3\n")
    with pytest.raises(prepare.DataError, match=r"^s3://prep/csv/empty/train-0.csv: "):
        prepare.run(job(tmp_path, store, CSV_MODEL, "csv/empty/train-*", "csv/empty/test-*", "csv", workers=1))


def test_module_arrays_are_stored_only_after_the_model_works_on_them(store, tmp_path, creds):
    import boto3

    module = textwrap.dedent("""
        import numpy as np
        import keras
        def make_dataset():
            x = np.zeros((6, 2), dtype=np.float32)
            return {"train": (x, np.arange(6) % 5), "test": (x[:2], np.array([0, 4]))}
        def build_model():      # 3 classes, but the labels go up to 4
            return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(3)])
    """)
    args = job(tmp_path, store, module, "", "", "csv")
    args["data"] = None
    with pytest.raises(ModelModuleError, match="the data hold the label 4, outside the model's 3 classes"):
        prepare.run(args)
    s3 = boto3.client("s3", endpoint_url=store, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="datasets/")   # nothing half-stored


def test_a_binary_label_past_the_probe_examples_is_refused(store, tmp_path, creds):
    """Binary cross-entropy raises nothing on a label of 2 (the loss goes negative): make_dataset()'s labels
    are checked whole (its training split here), not only the few test examples the model is tried on."""
    module = textwrap.dedent("""
        import numpy as np
        import keras
        loss = keras.losses.BinaryCrossentropy(from_logits=True)
        def make_dataset():
            x = np.zeros((300, 2), dtype=np.float32)
            y = np.arange(300) % 2
            y[250] = 2              # the classes once numbered 1 and 2
            return {"train": (x, y), "test": (x[:20], y[:20])}
        def build_model():
            return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    """)
    args = job(tmp_path, store, module, "", "", "csv")
    args["data"] = None
    with pytest.raises(ModelModuleError, match=r"make_dataset\(\)'s labels hold the label 2, outside 0 to 1: "
                                               r"BinaryCrossentropy takes 0 or 1 for a class"):
        prepare.run(args)


def test_tensorflow_noise_is_taken_out_of_messages():
    from tfc_harness.errors import cause

    noisy = ValueError("{{function_node __wrapped__IteratorGetNext}} Expect 3 fields but have 1 in record "
                       "[Op:IteratorGetNext] name: ")
    assert cause(str(noisy)) == "Expect 3 fields but have 1 in record"
    mapped = ValueError("{{function_node __wrapped__IteratorGetNext_output_types_2_device_/job:localhost/replica:0/"
                        "task:0/device:CPU:0}} Error in user-defined function passed to ParallelMapDatasetV2:16 "
                        "transformation with iterator: Iterator::Root::ParallelMapV2: Key: x.  Can't parse serialized "
                        "Example.")
    assert cause(str(mapped)) == "Key: x.  Can't parse serialized Example."
    traced = ValueError("in user code:\n\n  File \"job.py\", line 7, in decode\n\n"
                        "AttributeError: 'SymbolicTensor' object has no attribute 'numpy'")
    assert cause(str(traced)) == "AttributeError: 'SymbolicTensor' object has no attribute 'numpy'"


ARRAYS_MODEL = """
    import os
    import numpy as np
    CLASSES = 3
    def make_dataset():     # the test labels from the environment: other examples, the same module file
        x = np.linspace(0, 1, 24, dtype=np.float32).reshape(12, 2)
        test_labels = [int(v) for v in os.environ.get("TEST_LABELS", "0,1,2,0").split(",")]
        return {"train": (x, np.arange(12) % 3), "test": (x[:4], np.array(test_labels))}
    def build_model():
        import keras
        return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(CLASSES)])
"""
RUN_AND_SAY_IF_TENSORFLOW = ("import sys; from tfc_harness import prepare; rc = prepare.main(['run', sys.argv[1]]); "
                             "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(rc)")


def _run_job(args: dict, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN_AND_SAY_IF_TENSORFLOW, json.dumps(args)], capture_output=True,
                          text=True, env=node_env(dict(S3_CREDENTIALS, **env)), timeout=120)


def _run_twice(args: dict) -> list[tuple[dict, str]]:
    """Each run's result and whether it imported TensorFlow."""
    outcomes = []
    for _ in range(2):
        proc = _run_job(args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        result, imported = proc.stdout.splitlines()[-2:]
        outcomes.append((json.loads(result), imported))
    return outcomes


def test_a_passed_check_of_module_arrays_is_not_run_again(store, tmp_path):
    args = dict(job(tmp_path, store, ARRAYS_MODEL, "", "", "csv"), data=None, probe_cache=str(tmp_path / "probes"))
    (first, first_imported), (second, second_imported) = _run_twice(args)
    assert first["probe"] == "checked" and first_imported == "tensorflow imported: True"
    assert second["probe"] == "cached" and second_imported == "tensorflow imported: False"   # not the second time
    assert second["dataset_prefix"] == first["dataset_prefix"] and len(list((tmp_path / "probes").iterdir())) == 1

    # other examples, the module file unchanged, are checked again: a label of 3 fails a 3-class loss
    proc = _run_job(args, TEST_LABELS="0,1,3,0")
    assert proc.returncode == 2 and "the label 3, outside the model's 3 classes" in proc.stderr, proc.stderr[-2000:]
    assert len(list((tmp_path / "probes").iterdir())) == 1                      # a failed check leaves no stamp
    proc = _run_job(args, TEST_LABELS="2,1,0,0")
    assert proc.returncode == 0 and json.loads(proc.stdout.splitlines()[-2])["probe"] == "checked", proc.stderr

    # another model in the same file is checked again: 2 classes while the labels go up to 2 fails the loss
    (tmp_path / "job.py").write_text(textwrap.dedent(ARRAYS_MODEL.replace("CLASSES = 3", "CLASSES = 2")))
    proc = _run_job(args)
    assert proc.returncode == 2 and "the label 2, outside the model's 2 classes" in proc.stderr, proc.stderr[-2000:]
    assert len(list((tmp_path / "probes").iterdir())) == 2


def test_a_stamp_that_cannot_be_written_only_means_checking_again(tmp_path, capsys):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    prepare._write_stamp(blocked / "key.passed")
    assert "warning: could not record the passed check" in capsys.readouterr().err


def test_a_passed_check_of_files_is_not_run_again_until_a_file_changes(store, tmp_path):
    """The stamp of a files job holds the whole result: the second run lists the files and imports neither
    the module (which imports keras) nor TensorFlow. A file written again (another ETag) is checked again,
    and a check that fails there leaves no stamp."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=store, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    for i in range(2):
        s3.put_object(Bucket=BUCKET, Key=f"csv/stamp/train-{i}.csv", Body=b"a,b,target\n1,2,3\n4,5,6\n")
    s3.put_object(Bucket=BUCKET, Key="csv/stamp/test-0.csv", Body=b"a,b,target\n1,2,3\n")
    args = dict(job(tmp_path, store, CSV_MODEL, "csv/stamp/train-*", "csv/stamp/test-*", "csv"),
                probe_cache=str(tmp_path / "probes"))
    (first, first_imported), (second, second_imported) = _run_twice(args)
    assert first["probe"] == "checked" and first_imported == "tensorflow imported: True"
    assert second["probe"] == "cached" and second_imported == "tensorflow imported: False"
    assert dict(second, probe="checked") == first and first["data"]["columns"] == ["a", "b", "target"]

    # the same job on 1 training task: its own assignment, checked again
    proc = _run_job(dict(args, workers=1))
    assert proc.returncode == 0 and json.loads(proc.stdout.splitlines()[-2])["probe"] == "checked", proc.stderr
    assert [len(w) for w in json.loads(proc.stdout.splitlines()[-2])["data"]["train"]] == [2]

    # the result stands for the module's check too: other nodes' packages, or a trial's check that did not ask
    # for every hparam to be read, check again
    for other in ({"node_packages": {"packages": ["keras", "tensorflow-cpu"]}}, {"every_hparam_read": False}):
        proc = _run_job(dict(args, **other))
        assert proc.returncode == 0 and json.loads(proc.stdout.splitlines()[-2])["probe"] == "checked", proc.stderr

    # a test file written again with a text value: checked again, and refused
    s3.put_object(Bucket=BUCKET, Key="csv/stamp/test-0.csv", Body=b"a,b,target\n1,high,3\n")
    stamps = len(list((tmp_path / "probes").iterdir()))
    proc = _run_job(args)
    assert proc.returncode == 2 and "test-0.csv: line 2, column b holds high, not a number" in proc.stderr, proc.stderr
    assert len(list((tmp_path / "probes").iterdir())) == stamps
