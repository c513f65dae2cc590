"""Data URLs, listing files in S3 (moto), their assignment to workers, and the formats' checks of a file's
start (the CSV header, the TFRecord length and checksum)."""

from __future__ import annotations

import pytest
from tfc_harness import s3io, sources
from tfc_harness.formats import csv_files, tfrecord_files


def _put(client, bucket, keys, body=b"x"):
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=body)


@pytest.mark.parametrize("url, expected", [
    ("s3://data/train-*.csv", ("data", "train-*.csv")),
    ("s3://my.bucket-1/a/b/", ("my.bucket-1", "a/b/")),
    ("s3://data/a/part-00001.tfrecord", ("data", "a/part-00001.tfrecord")),
    ("s3://data/", ("data", "")),
])
def test_parse_url(url, expected):
    assert sources.parse_url(url) == expected


@pytest.mark.parametrize("url, problem", [
    ("https://data/x.csv", "not an s3:// URL"),
    ("/local/train.csv", "not an s3:// URL"),
    ("s3://data", "no key pattern or prefix"),
    ("s3:///x.csv", "bad bucket name"),
    ("s3://Data/x.csv", "bad bucket name"),
    ("s3://data//x.csv", "empty path segment"),
])
def test_parse_url_refuses_with_the_url_and_what_is_allowed(url, problem):
    with pytest.raises(ValueError) as err:
        sources.parse_url(url)
    assert repr(url) in str(err.value) and problem in str(err.value)
    assert "s3://<bucket>/<glob>" in str(err.value) and "ending in /" in str(err.value)


def test_literal_prefix_and_segment_matching():
    assert sources.literal_prefix("d/train-*.csv") == "d/train-"
    assert sources.literal_prefix("d/part-[0-9]?.csv") == "d/part-"
    assert sources.literal_prefix("d/x.csv") == "d/x.csv"
    assert sources.matches("d/train-1.csv", "d/train-*.csv")
    assert not sources.matches("d/train-1/x.csv", "d/train-*.csv")   # * does not cross '/'
    assert not sources.matches("d/train-1.csv.bak", "d/train-*.csv")
    assert sources.matches("d/a/x.csv", "d/*/x.csv")
    assert not sources.matches("D/train-1.csv", "d/train-*.csv")     # case-sensitive like S3 keys


def test_list_files_glob(s3_client, bucket):
    _put(s3_client, bucket, ["d/train-2.csv", "d/train-1.csv", "d/train-1/inner.csv", "d/test-1.csv",
                             "d/train-3.txt", "other/train-4.csv"])
    s3_client.put_object(Bucket=bucket, Key="d/train-10.csv", Body=b"abcd")
    files = sources.list_files(s3_client, f"s3://{bucket}/d/train-*.csv")
    assert [f["key"] for f in files] == ["d/train-1.csv", "d/train-10.csv", "d/train-2.csv"]
    big = next(f for f in files if f["key"] == "d/train-10.csv")
    head = s3_client.head_object(Bucket=bucket, Key="d/train-10.csv")
    assert big["size"] == 4 and big["etag"] == head["ETag"].strip('"') and '"' not in big["etag"]


def test_list_files_prefix_takes_everything_under_it_but_folder_markers(s3_client, bucket):
    _put(s3_client, bucket, ["p/a.tfrecord", "p/sub/b.tfrecord", "p/", "p/sub/", "q/c.tfrecord", "pp/d"])
    files = sources.list_files(s3_client, f"s3://{bucket}/p/")
    assert [f["key"] for f in files] == ["p/a.tfrecord", "p/sub/b.tfrecord"]
    assert [f["key"] for f in sources.list_files(s3_client, f"s3://{bucket}/")] == [
        "p/a.tfrecord", "p/sub/b.tfrecord", "pp/d", "q/c.tfrecord"]


def test_list_files_nothing_matches(s3_client, bucket):
    _put(s3_client, bucket, ["d/a.csv"])
    assert sources.list_files(s3_client, f"s3://{bucket}/d/*.tfrecord") == []
    assert sources.list_files(s3_client, f"s3://{bucket}/none/") == []


class _SmallPages:
    """A client whose list_objects_v2 paginator asks for 2 keys a page (counted)."""

    def __init__(self, client):
        self.client, self.pages = client, 0

    def get_paginator(self, name):
        real = self.client.get_paginator(name)
        outer = self

        class Paginator:
            def paginate(self, **kwargs):
                for page in real.paginate(PaginationConfig={"PageSize": 2}, **kwargs):
                    outer.pages += 1
                    yield page

        return Paginator()


def test_list_files_reads_every_page(s3_client, bucket):
    keys = [f"d/part-{i:02d}.csv" for i in range(7)]
    _put(s3_client, bucket, keys)
    client = _SmallPages(s3_client)
    assert [f["key"] for f in sources.list_files(client, f"s3://{bucket}/d/part-*.csv")] == keys
    assert client.pages == 4


def _files(sizes):
    return [{"key": f"k{i:02d}", "size": size, "etag": "e"} for i, size in enumerate(sizes)]


def test_assign_largest_first_to_least_loaded():
    shares = sources.assign(_files([10, 70, 20, 30, 40, 50]), 2)
    assert [[f["key"] for f in share] for share in shares] == [["k00", "k01", "k03"], ["k02", "k04", "k05"]]
    assert [sum(f["size"] for f in share) for share in shares] == [110, 110]


def test_assign_is_disjoint_complete_balanced_and_deterministic():
    files = _files([(i * 7919) % 1000 + 1 for i in range(50)])
    shares = sources.assign(files, 4)
    keys = [f["key"] for share in shares for f in share]
    assert sorted(keys) == [f["key"] for f in files] and len(set(keys)) == len(keys)
    loads = [sum(f["size"] for f in share) for share in shares]
    assert max(loads) - min(loads) <= max(f["size"] for f in files)
    assert sources.assign(list(reversed(files)), 4) == shares
    assert all(share == sorted(share, key=lambda f: f["key"]) for share in shares)


def test_assign_ties_by_key_and_refuses_a_share_of_empty_files():
    shares = sources.assign(_files([5, 5, 5, 5]), 2)
    assert [[f["key"] for f in share] for share in shares] == [["k00", "k02"], ["k01", "k03"]]
    with pytest.raises(ValueError, match="worker 1 would get only empty files"):
        sources.assign(_files([1000, 0]), 2)


def test_list_files_leaves_out_empty_markers(s3_client, bucket):
    """A Spark or Hadoop output prefix holds _SUCCESS (0 bytes): it must not become a worker's only file."""
    s3_client.put_object(Bucket=bucket, Key="spark/part-0.tfrecord", Body=b"x" * 1000)
    s3_client.put_object(Bucket=bucket, Key="spark/_SUCCESS", Body=b"")
    assert [f["key"] for f in sources.list_files(s3_client, f"s3://{bucket}/spark/")] == ["spark/part-0.tfrecord"]


def test_assign_refuses_a_worker_without_data():
    with pytest.raises(ValueError, match="3 files for 4 workers: worker 3 would have no data"):
        sources.assign(_files([1, 2, 3]), 4)
    with pytest.raises(ValueError, match="0 files for 1 worker:"):
        sources.assign([], 1)
    with pytest.raises(ValueError, match="at least one worker"):
        sources.assign(_files([1]), 0)


def test_csv_header(s3_client, bucket):
    s3_client.put_object(Bucket=bucket, Key="h.csv", Body=b"\xef\xbb\xbf a , b,\"c,d\",target\r\n1,2,3,4\r\n")
    assert csv_files.read_start(s3_client, bucket, "h.csv").columns == ["a", "b", "c,d", "target"]
    s3_client.put_object(Bucket=bucket, Key="only.csv", Body=b"x,y")
    assert csv_files.read_start(s3_client, bucket, "only.csv").columns == ["x", "y"]


def test_csv_start_holds_the_header_and_the_first_row(s3_client, bucket):
    def start(body: bytes) -> csv_files.CsvStart:
        s3_client.put_object(Bucket=bucket, Key="s.csv", Body=body)
        return csv_files.FORMAT.start(s3_client, bucket, "s.csv")

    assert start(b"a,b\r\n1,2\r\n3,4\r\n") == (["a", "b"], b"a,b\r\n1,2\r\n")
    assert start(b"a,b\n1,2") == (["a", "b"], b"a,b\n1,2\n")            # the file's last line, no newline
    assert start(b"a,b\n").head is None and start(b"a,b").head is None    # no row
    assert start(b"a,b\n\n1,2\n").head is None                            # a blank line first: the nodes' part
    assert start(b'a,b\n1,"2\n",3\n').head is None                         # a quoted cell may hold the newline
    assert start(b'a,b\n1,"2"\n').head == b'a,b\n1,"2"\n'
    longer = b"a,b\n" + b"1," * csv_files.HEADER_BYTES          # a first row past the GET: not held
    assert start(longer).head is None and start(longer).columns == ["a", "b"]
    assert csv_files.FORMAT.first_record_file(s3_client, bucket, "s.csv", start(b"a,b\n1,2\n")) == b"a,b\n1,2\n"


def test_csv_header_reads_only_the_first_bytes(s3_client, bucket):
    body = b"a,b\n" + b"1,2\n" * 100_000
    s3_client.put_object(Bucket=bucket, Key="big.csv", Body=body)
    seen = []
    s3_client.meta.events.register("after-call.s3.GetObject",
                                   lambda parsed, **kw: seen.append(parsed["ContentLength"]))
    assert csv_files.read_start(s3_client, bucket, "big.csv").columns == ["a", "b"]
    assert seen and seen[0] <= csv_files.HEADER_BYTES < len(body)


def test_csv_header_problems(s3_client, bucket):
    s3_client.put_object(Bucket=bucket, Key="empty.csv", Body=b"")
    with pytest.raises(ValueError, match="empty.csv: the first line .* is empty"):
        csv_files.read_start(s3_client, bucket, "empty.csv")
    s3_client.put_object(Bucket=bucket, Key="long.csv", Body=b"a" * (csv_files.HEADER_BYTES + 10))
    with pytest.raises(ValueError, match="no end of the header line"):
        csv_files.read_start(s3_client, bucket, "long.csv")
    with pytest.raises(s3io.TransferError, match="missing.csv"):
        csv_files.read_start(s3_client, bucket, "missing.csv")
    s3_client.put_object(Bucket=bucket, Key="latin1.csv", Body="Größe,y\n1,2\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.csv: its header is not UTF-8 text \(re-save the file as UTF-8\)"):
        csv_files.read_start(s3_client, bucket, "latin1.csv")
    s3_client.put_object(Bucket=bucket, Key="utf8.csv", Body="\ufeffGröße,y\n1,2\n".encode("utf-8"))
    assert csv_files.read_start(s3_client, bucket, "utf8.csv").columns == ["Größe", "y"]
    s3_client.put_object(Bucket=bucket, Key="binary.csv", Body=b"\x5a\x00\x00\x00\x00\x00\x00\x00abcd\n")
    with pytest.raises(ValueError, match="binary.csv: its first line is not text"):
        csv_files.read_start(s3_client, bucket, "binary.csv")


def test_an_empty_csv_header_is_refused_once_named_by_the_check_of_the_listing(s3_client, bucket):
    from tfc_harness import prepare

    for key, body in (("hd/train-0.csv", b"\n1,2\n"), ("hd/test-0.csv", b"a,y\n1,2\n")):
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    job = {"data": {"train": f"s3://{bucket}/hd/train-*.csv", "test": f"s3://{bucket}/hd/test-*.csv",
                    "format": "csv", "label": "y"}, "workers": 1}
    with pytest.raises(prepare.DataError) as err:
        prepare.check_listing(s3_client, job)
    assert str(err.value) == f"s3://{bucket}/hd/train-0.csv: the first line (the CSV header) is empty"


def test_tfrecord_checksum_is_crc32c_masked():
    """CRC-32C's check value (of b"123456789", 0xE3069283), masked as TFRecord masks it."""
    crc = 0xE3069283
    assert tfrecord_files.masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_tfrecord_start(s3_client, bucket):
    length = (17).to_bytes(8, "little")
    good = length + tfrecord_files.masked_crc32c(length).to_bytes(4, "little") + b"r" * 17 + b"\0" * 4
    s3_client.put_object(Bucket=bucket, Key="ok.tfrecord", Body=good)
    fmt = tfrecord_files.FORMAT

    def first_record(key: str, body: bytes) -> bytes | None:
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
        return fmt.first_record_file(s3_client, bucket, key, fmt.start(s3_client, bucket, key))

    # the first record as framed in the file: a TFRecord file of that record alone
    assert fmt.start(s3_client, bucket, "ok.tfrecord") == good
    assert first_record("two.tfrecord", good + b"more records") == good
    # longer than the first GET: a second one reads the rest of the record
    size = tfrecord_files.START_BYTES + 100
    length = size.to_bytes(8, "little")
    long = length + tfrecord_files.masked_crc32c(length).to_bytes(4, "little") + b"L" * size + b"\0" * 4
    assert first_record("long.tfrecord", long + good) == long
    assert fmt.start(s3_client, bucket, "long.tfrecord") == long[:tfrecord_files.HEADER_BYTES]   # kept: the header
    # a file that ends inside its first record: what there is (reading it names the file's truncated record)
    assert first_record("cut.tfrecord", long[:5000]) == long[:5000]
    assert first_record("cut-early.tfrecord", long[:100]) == long[:100]
    # a first record longer than the check reads: none, the file's records are first read on the nodes
    length = (tfrecord_files.MAX_FIRST_RECORD + 1).to_bytes(8, "little")
    assert first_record("huge.tfrecord", length + tfrecord_files.masked_crc32c(length).to_bytes(4, "little")
                        + b"h" * 100) is None
    for key, body in (("csv.tfrecord", b"a,b\n1,2\n3,4\n"), ("short.tfrecord", good[:11]),
                      ("empty.tfrecord", b"")):
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
        with pytest.raises(ValueError, match=rf"s3://{bucket}/{key}: not a TFRecord file .*data.format is tfrecord"):
            tfrecord_files.FORMAT.start(s3_client, bucket, key)
