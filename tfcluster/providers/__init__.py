"""Providers turn a RunSpec into nodes. Each is a small class registered by name."""

from __future__ import annotations

from .base import REGISTRY, Node, Provider, TerraformProvider, get_provider, register

# Importing a provider module registers it; cloud SDKs are imported lazily inside them.
from . import local  # noqa: E402,F401  isort: skip
from . import aws  # noqa: E402,F401  isort: skip
from . import im  # noqa: E402,F401  isort: skip
from . import gcp  # noqa: E402,F401  isort: skip
from . import openstack  # noqa: E402,F401  isort: skip

__all__ = ["REGISTRY", "Node", "Provider", "TerraformProvider", "get_provider", "register"]
