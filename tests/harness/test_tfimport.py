"""TensorFlow's lean import (tfc_harness.tfimport): Keras without scikit-learn, which the controller's venv has and
the nodes do not. The job check imports it that way ahead of a model module that imports TensorFlow or Keras
when it loads (tfc_harness.prepare.load), but not ahead of a module whose own import fails first; runner.main
calls it too, for a task started without a warm interpreter (its place in the source is checked)."""

from __future__ import annotations

import ast
import json

from harness_support import TRAIN_DIR, run_probe

PROBE = """
import json, sys
sys.path.insert(0, {train!r})
from tfc_harness import prepare
from tfc_harness.errors import ModelModuleError
seen = {{}}
for name, text in {modules!r}:
    path = {tmp!r} + "/" + name + ".py"
    with open(path, "w") as f:
        f.write(text)
    try:
        prepare.load(path)
        outcome = "loaded"
    except ModelModuleError as exc:
        outcome = str(exc)
    seen[name] = [outcome, "tensorflow" in sys.modules, "sklearn" in sys.modules]
import sklearn                            # imports as usual once TensorFlow has
seen["sklearn afterwards"] = "sklearn" in sys.modules
print(json.dumps(seen))
"""
BUILD = "def build_model():\n    return None\n"
#: in this order: each before the first that imports TensorFlow leaves it unimported
MODULES = [
    ("syntax", "import keras\ndef build_model(:\n"),
    ("missing", "import no_such_package_here\nimport keras\n" + BUILD),
    ("relative", "from . import helper\nimport keras\n" + BUILD),     # no package around it: fails
    ("plain", "import json\n" + BUILD),
    ("in_a_function", "def build_model():\n    import keras\n    return keras.Sequential()\n"),
    ("keras_at_top", "import os\nimport keras\n" + BUILD),
]


def test_a_module_importing_keras_when_it_loads_gets_tensorflow_without_scikit_learn(tmp_path):
    seen = json.loads(run_probe(tmp_path, PROBE.format(train=str(TRAIN_DIR), tmp=str(tmp_path),
                                                       modules=MODULES)).splitlines()[-1])
    assert seen["syntax"][0].startswith("model module syntax.py: importing it raised SyntaxError"), seen
    assert seen["missing"][0] == ("model module missing.py: importing it raised ModuleNotFoundError: No module "
                                  "named 'no_such_package_here'"), seen
    assert seen["relative"][0].startswith("model module relative.py: importing it raised ImportError"), seen
    assert seen["plain"][0] == seen["in_a_function"][0] == seen["keras_at_top"][0] == "loaded", seen
    # the errors and the modules without a load-time import of it come without TensorFlow's import
    assert [seen[name][1] for name in ("syntax", "missing", "relative", "plain", "in_a_function")] == [False] * 5
    assert seen["keras_at_top"][1:] == [True, False], seen      # TensorFlow and Keras, no scikit-learn
    assert seen["sklearn afterwards"] is True
    # the control: Keras's plain import does import scikit-learn here (else the check above proves nothing)
    plain = run_probe(tmp_path, "import sys\nimport keras\nprint('sklearn' in sys.modules)\n")
    assert plain.splitlines()[-1] == "True"


def test_a_task_imports_tensorflow_the_lean_way_before_its_first_use():
    """runner.main calls tfimport before threads.apply, the first code that uses TensorFlow (read from its source:
    the call's line, not what a task imports; the probe above covers tfimport itself)."""
    tree = ast.parse((TRAIN_DIR / "tfc_harness" / "runner.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    lines = {ast.unparse(n.func): n.lineno for n in ast.walk(main) if isinstance(n, ast.Call)}
    assert lines["tfimport.import_tensorflow"] < lines["threads.apply"], lines
