"""The controller's side of a node's log archive (tfcluster/collected.py): what the supervisor's archive
holds lands in the node's directory of the run's logs, and nothing an archive names outside it does."""

from __future__ import annotations

import io
import tarfile

from tests.unit.supervise import supervise_module
from tfcluster import collected


def _archive(path, members):
    """A tar at ``path`` of ``members``: (name, bytes) for a file, (name, "->target") for a symbolic link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data[2:]
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_each_node_s_archive_is_unpacked_beside_it_and_removed(tmp_path):
    for node in ("c-chief-0", "c-ps-0"):
        _archive(tmp_path / node / "collected.tar.gz",
                 [("node.log", f"{node} log\n".encode()), ("status.json", b'{"step": 3}')])
    (tmp_path / "c-ps-0" / "node.log").write_text("an older copy\n")    # a fetch before: replaced
    assert collected.unpack(tmp_path) == []
    for node in ("c-chief-0", "c-ps-0"):
        assert sorted(p.name for p in (tmp_path / node).iterdir()) == ["node.log", "status.json"]
        assert (tmp_path / node / "node.log").read_text() == f"{node} log\n"


def test_an_archive_s_other_members_are_not_written_anywhere(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    logs = tmp_path / "logs"
    _archive(logs / "n" / "collected.tar.gz",
             [("../../outside/escaped", b"x"), (f"{outside}/absolute", b"x"), ("sub/node.log", b"x"),
              ("supervisor.json", "->/etc/passwd"), ("other.txt", b"x"), ("node.log", b"the log\n")])
    assert collected.unpack(logs) == []
    assert [p.name for p in (logs / "n").iterdir()] == ["node.log"] and list(outside.iterdir()) == []
    assert (logs / "n" / "node.log").read_text() == "the log\n"


def test_an_archive_that_cannot_be_read_is_kept_and_named(tmp_path):
    bad = tmp_path / "n" / "collected.tar.gz"
    bad.parent.mkdir()
    bad.write_bytes(b"not a tar at all" * 100)
    problems = collected.unpack(tmp_path)
    assert len(problems) == 1 and str(bad) in problems[0] and "kept" in problems[0]
    assert bad.exists()


def test_a_member_larger_than_the_supervisor_writes_is_not_written_out(tmp_path):
    """A node's archive is bounded by what tfc-supervise puts in it: a larger member (a sparse one compresses
    to almost nothing) is refused, the archive kept and named."""
    archive = tmp_path / "n" / "collected.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("status.json")
        info.size = (1 << 20) + 1
        tar.addfile(info, io.BytesIO(b"{" + b" " * (1 << 20)))
    problems = collected.unpack(tmp_path)
    assert len(problems) == 1 and "status.json holds 1048577 bytes" in problems[0], problems
    assert not (tmp_path / "n" / "status.json").exists() and archive.exists()


def test_the_controller_takes_what_the_supervisor_archives():
    module = supervise_module()
    assert set(module.COLLECTED) == set(collected.NAMES)
    for name, limit in module.COLLECTED.items():    # the log's first line says what stayed on the node
        assert limit <= collected.NAMES[name] <= limit + 4096, name


def test_each_name_is_taken_once(tmp_path):
    """An archive repeating a name (each copy within the size limit) is written out once, not once a copy."""
    _archive(tmp_path / "n" / "collected.tar.gz", [("node.log", b"first\n")] + [("node.log", b"again\n")] * 40)
    assert collected.unpack(tmp_path) == []
    assert (tmp_path / "n" / "node.log").read_text() == "first\n"
