"""The reliability report: `make reliability` prints each scenario with its outcome and time."""

from __future__ import annotations

import os

import pytest

_RESULTS: list[tuple[str, str, float]] = []


def pytest_collection_modifyitems(items):
    for item in items:
        doc = getattr(item.function, "__doc__", None)
        if "tests/reliability/" in item.nodeid and doc:
            item.user_properties.append(("scenario", doc.strip().splitlines()[0]))


def pytest_runtest_logreport(report):
    if "tests/reliability/" not in report.nodeid:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        scenario = dict(report.user_properties).get("scenario", report.nodeid.split("::")[-1])
        _RESULTS.append((scenario, report.outcome, report.duration))


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    terminalreporter.section("reliability report")
    for scenario, outcome, seconds in _RESULTS:
        terminalreporter.write_line(f"{outcome.upper():<8} {seconds:7.1f}s  {scenario}")


@pytest.fixture(scope="module")
def env(home, tmp_path_factory):
    """The environment of `tfcluster` in a scenario module: the module's own state root (its ``home``
    fixture) and artifacts directory."""
    return dict(os.environ, TFCLUSTER_HOME=str(home), PYTHONUNBUFFERED="1",
                TFCLUSTER_ARTIFACTS=str(tmp_path_factory.mktemp("artifacts")))
