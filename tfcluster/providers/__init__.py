"""Providers turn a RunSpec into nodes. Each is a small class registered by name."""

from __future__ import annotations

from .base import REGISTRY, Node, Provider, TerraformProvider, get_provider, register

# Importing a provider module registers it; cloud SDKs are imported lazily inside them.
from . import local  # noqa: E402,F401  isort: skip
from . import aws  # noqa: E402,F401  isort: skip
from . import im  # noqa: E402,F401  isort: skip
from . import gcp  # noqa: E402,F401  isort: skip
from . import openstack  # noqa: E402,F401  isort: skip

__all__ = ["REGISTRY", "Node", "Provider", "TerraformProvider", "cluster_file_schema", "get_provider", "register"]


def cluster_file_schema() -> dict:
    """The cluster file's JSON Schema with each provider's ``provider_options`` keys (the provider's own
    options model): an editor completes them and flags unknown ones. Values stay plain text, numbers or
    booleans there, as the configuration accepts them; tfcluster checks each value itself."""
    from ..config import json_schema

    schema = json_schema()
    rules = []
    for name, cls in sorted(REGISTRY.items()):
        options = {"type": "object", "additionalProperties": False,
                   "properties": {key: {"description": text, "type": ["string", "number", "boolean"]}
                                  for key, text in cls.options_model.descriptions().items()}}
        chosen = {"required": ["provider"], "properties": {"provider": {"const": name}}}
        if name == "local":  # the default provider: also when the file names none
            chosen = {"anyOf": [chosen, {"not": {"required": ["provider"]}}]}
        rules.append({"if": chosen, "then": {"properties": {"provider_options": options}}})
    schema["allOf"] = rules
    return schema
