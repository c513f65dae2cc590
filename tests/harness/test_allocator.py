"""A task's tensors come from TensorFlow's BFC allocator (runner.ALLOCATOR_ENV), which keeps freed memory for
the next step, also where the modules were imported before the task's settings (a fork of the warm
interpreter, which preloads them), with the task's memory as its limit."""

from __future__ import annotations

import ast
import json

from harness_support import REPO, TRAIN_DIR, example_settings, run_probe
from tfc_harness import runner

PROBE = """
import json, os, sys
sys.path.insert(0, {train!r})
for name in {preload!r}:                  # as the warm interpreter a task is forked from does
    __import__(name)
import tensorflow as tf
from tfc_harness import runner, settings
if {prepare!r}:
    runner.prepare_process(settings.validate(json.loads({settings!r})))
x = tf.ones([512, 512]) * 2.0             # the first op makes the CPU allocator
try:
    stats = tf.config.experimental.get_memory_info("CPU:0")
except ValueError as exc:                 # TensorFlow's plain CPU allocator keeps no statistics
    stats = str(exc)
try:                                      # more than the BFC allocator's limit, where a test sets one
    big = tf.zeros([{big_mb} << 18], tf.float32) + 1.0
    fits = bool(big[0] == 1.0)
except tf.errors.ResourceExhaustedError:
    fits = False
print(json.dumps([stats, os.environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB"), fits]))
"""
#: a tensor of this many MiB, against a limit of SMALL_LIMIT_MB: only the BFC allocator enforces the limit
BIG_MB = 192
SMALL_LIMIT_MB = "128"


def warm_preload() -> list[str]:
    """tfc-warm's PRELOAD: what a task's interpreter imported before the harness ran."""
    tree = ast.parse((REPO / "roles" / "tf_node" / "files" / "tfc-warm").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PRELOAD":
            return list(ast.literal_eval(node.value))
    raise AssertionError("tfc-warm has no PRELOAD")


def _probe(tmp_path, prepare: bool, env: dict | None = None):
    source = PROBE.format(train=str(TRAIN_DIR), prepare=prepare, preload=warm_preload(), big_mb=BIG_MB,
                          settings=json.dumps(example_settings(state_dir=str(tmp_path / "state"))))
    return json.loads(run_probe(tmp_path, source, env=env).splitlines()[-1])


def test_a_prepared_task_allocates_its_tensors_from_tensorflows_bfc_allocator(tmp_path):
    stats, limit, fits = _probe(tmp_path, prepare=True)
    assert isinstance(stats, dict) and stats["peak"] >= 512 * 512 * 4, stats
    assert "tensorflow" in warm_preload()
    assert int(limit) == runner.memory_mb() > 0      # the task's memory, not TensorFlow's 64 GiB
    assert fits                                      # BIG_MB is far below it


def test_a_prepared_tasks_allocator_holds_to_its_limit(tmp_path):
    """The limit is the BFC allocator's: a tensor above it fails to allocate. (Statistics alone do not tell
    the allocators apart: where oneDNN's operations are on, as on CPUs with AVX512_VNNI, TensorFlow's default
    CPU allocator keeps them too.)"""
    _, limit, fits = _probe(tmp_path, prepare=True, env={"TF_CPU_BFC_MEM_LIMIT_IN_MB": SMALL_LIMIT_MB})
    assert limit == SMALL_LIMIT_MB and not fits


def test_without_the_task_environment_tensorflow_uses_its_default_allocator(tmp_path):
    """The check above can fail: TensorFlow's default CPU allocator does not hold to the BFC limit."""
    _, limit, fits = _probe(tmp_path, prepare=False, env={"TF_CPU_BFC_MEM_LIMIT_IN_MB": SMALL_LIMIT_MB})
    assert limit == SMALL_LIMIT_MB and fits


def test_an_operator_can_turn_it_off_or_set_its_limit(tmp_path):
    _, limit, fits = _probe(tmp_path, prepare=True, env={"TF_CPU_ALLOCATOR_USE_BFC": "false",
                                                          "TF_CPU_BFC_MEM_LIMIT_IN_MB": SMALL_LIMIT_MB})
    assert limit == SMALL_LIMIT_MB and fits           # off: the limit, kept as the operator set it, binds nothing


def test_the_task_memory_is_the_lowest_of_the_machines_and_its_cgroups(tmp_path, monkeypatch):
    """Its own cgroup's limit, or one above it, read through /proc/self/cgroup: a local node's tasks are in the
    node's cgroup, whose limit the hierarchy's root does not have."""
    meminfo, proc, root = tmp_path / "meminfo", tmp_path / "cgroup", tmp_path / "sys"
    meminfo.write_text("MemTotal:       25165824 kB\nMemFree:         1000 kB\n")
    monkeypatch.setattr(runner, "MEMINFO", str(meminfo))
    monkeypatch.setattr(runner, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(runner, "CGROUP_ROOT", str(root))
    node, cluster = root / "tfcluster" / "c1" / "node-0", root / "tfcluster" / "c1"
    node.mkdir(parents=True)
    proc.write_text("0::/tfcluster/c1/node-0\n")
    assert runner.memory_mb() == 24576                      # no limit file anywhere
    (node / "memory.max").write_text("max\n")
    assert runner.memory_mb() == 24576                      # "max": no limit
    (cluster / "memory.max").write_text(str(5 << 30))
    assert runner.memory_mb() == 5120                       # a limit above the task's cgroup holds too
    (node / "memory.max").write_text(str(3 << 30))
    assert runner.memory_mb() == 3072                       # the task's own, the lowest
    v1 = root / "memory" / "tfcluster" / "c1" / "node-0"     # cgroup v1: the memory controller's hierarchy
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(2 << 30))
    proc.write_text("12:memory:/tfcluster/c1/node-0\n5:cpu,cpuacct:/tfcluster/c1/node-0\n")
    assert runner.memory_mb() == 2048
    proc.unlink()
    assert runner.memory_mb() == 24576                      # nothing of cgroups readable: the machine's
