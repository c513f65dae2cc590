"""roles/tf_node's variables for tests: its defaults and vars files, and an expression of them evaluated the
way Ansible would (its ``bool`` filter), for the tests that hold tfcluster's own commands equal to the role's."""

from __future__ import annotations

import jinja2
import yaml

from tests.conftest import REPO

TF_NODE = REPO / "roles" / "tf_node"


def load(name: str) -> dict:
    """``defaults`` or ``vars`` of roles/tf_node."""
    return yaml.safe_load((TF_NODE / name / "main.yml").read_text())


def _ansible_bool(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "on", "1")


ENV = jinja2.Environment()
ENV.filters["bool"] = _ansible_bool


def evaluate(template: str, values: dict):
    """The value of a variable written as one ``{{ expression }}``, for ``values``."""
    return ENV.compile_expression(template.strip().removeprefix("{{").removesuffix("}}"))(values)


def render(template: str, values: dict) -> str:
    """A template as text (what Ansible renders a string variable to)."""
    return ENV.from_string(str(template)).render(values)
