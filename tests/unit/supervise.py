"""The node supervisor script (roles/tf_node/files/tfc-supervise) for tests: its path, and its code as a
module (it has no .py name to import it by)."""

from __future__ import annotations

import importlib.machinery
import importlib.util

from tests.conftest import REPO

SUPERVISE = REPO / "roles" / "tf_node" / "files" / "tfc-supervise"


def supervise_module():
    loader = importlib.machinery.SourceFileLoader("tfc_supervise", str(SUPERVISE))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module
