"""pytest plugin for measuring: the cluster tests' clusters get names of this helper's own (tfcimg-*)."""
import sys

NAMES = {"tests.e2e.test_train": "tfcimg-e2e", "tests.integration.test_base_image": "tfcimg-bare"}


def pytest_collection_modifyitems(config, items):
    for module, name in NAMES.items():
        mod = sys.modules.get(module)
        if mod is not None:
            mod.CLUSTER = name
