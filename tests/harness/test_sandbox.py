"""The verifier's sandbox, tried from inside: what a hostile SavedModel could do there (no network, nothing
writable but a private /tmp, uid nobody without capabilities, its inputs read-only, nothing else of this
machine's processes)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import textwrap
from pathlib import Path

import pytest
from tfc_harness import sandbox

pytestmark = pytest.mark.skipif(sandbox.available() is not None, reason=f"no sandbox here: {sandbox.available()}")

PROBE = textwrap.dedent("""
    import json, os, socket, sys

    def attempt(fn):
        try:
            return fn() or "ok"
        except OSError as exc:
            return type(exc).__name__

    def write(path):
        with open(path, "w") as f:
            f.write("x")

    port, outside, given = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    status = open("/proc/self/status").read()
    print(json.dumps({
        "uid": os.getuid(), "euid": os.geteuid(),
        "cap_eff": status.split("CapEff:")[1].split()[0], "cap_bnd": status.split("CapBnd:")[1].split()[0],
        "connect": attempt(lambda: socket.create_connection(("127.0.0.1", port), timeout=3).close()),
        "write_outside": attempt(lambda: write(os.path.join(outside, "from-the-sandbox"))),
        "write_input": attempt(lambda: write(os.path.join(os.path.dirname(given), "planted"))),
        "read_input": attempt(lambda: open(given).read()),
        "write_tmp": attempt(lambda: write("/tmp/scratch")),
        "shadow": attempt(lambda: open("/etc/shadow").read() and None),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }))
""")


def test_inside_the_sandbox_nothing_leaves_and_nothing_is_written(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sbxprobe.py").write_text(PROBE)
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "test.npz").write_text("the test data")
    outside = Path(tempfile.mkdtemp(prefix="tfct-sbx-", dir="/var/tmp"))
    outside.chmod(0o777)            # writable by anyone on this machine: the sandbox must still not write it
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        proc = sandbox.run("sbxprobe", [str(listener.getsockname()[1]), str(outside), "{data}/test.npz"],
                           {"probe": tmp_path / "probe", "data": tmp_path / "input"}, python_path=["{probe}"],
                           timeout_s=60)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        listener.close()
        found = sorted(p.name for p in outside.iterdir())
        shutil.rmtree(outside)
    assert (seen["uid"], seen["euid"]) == (65534, 65534)
    assert int(seen["cap_eff"], 16) == 0 and int(seen["cap_bnd"], 16) == 0, seen
    assert seen["connect"] in ("OSError", "ConnectionRefusedError"), seen   # no route: its own netns
    assert seen["write_outside"] == "OSError" and found == [], (seen, found)      # a read-only view (EROFS)
    assert seen["write_input"] in ("OSError", "PermissionError") and seen["read_input"] == "the test data"
    assert not (tmp_path / "input" / "planted").exists()
    assert seen["write_tmp"] == "ok" and seen["shadow"] == "PermissionError", seen
    assert len(seen["pids"]) <= 3, seen                                        # its own PID namespace
    assert os.getuid() == 0                                                      # (the caller stays root)
