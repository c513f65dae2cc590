"""The harness tests start a node's tasks as the node's supervisor does: each a fork of the warm interpreter
(tfc-warm), which imported TensorFlow once, with the packages the nodes lack unimportable."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from harness_support import WARM, node_env

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")

PROBE = """import sys
print("tensorflow loaded:", "tensorflow" in sys.modules, "sklearn loaded:", "sklearn" in sys.modules, flush=True)
import sklearn
"""


@pytest.mark.parametrize("warm, loaded", [(True, True), (False, False)])
def test_a_task_started_warm_finds_tensorflow_imported_and_sklearn_unimportable(processes, tmp_path, warm, loaded):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = node_env({"PYTHONPATH": str(WARM.blockers())})
    proc = processes.start("probe", [sys.executable, str(script)], env=env, cwd=str(tmp_path), warm=warm)
    assert (type(proc).__name__ == "WarmChild") is warm
    assert processes.wait("probe", 120) == 1, processes.log("probe")        # the sklearn import fails
    log = processes.log("probe")
    assert log.startswith(f"tensorflow loaded: {loaded} sklearn loaded: False\n"), log
    assert "ImportError: sklearn is not on nodes" in log, log
