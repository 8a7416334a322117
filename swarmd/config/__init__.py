"""Configuration: the schema (defaults, ranges, docs) and the layered loader.

The names below load lazily, so that importing a light submodule (`swarmd.config.paths`, `swarmd.config.names`,
which `swarmd status` uses) does not import pydantic or yaml.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DEFAULT_PORT", "StrictModel", "SwarmdConfig", "load_config", "parse_assignment"]

_SOURCES = {
    "load_config": "swarmd.config.loader",
    "parse_assignment": "swarmd.config.loader",
    "DEFAULT_PORT": "swarmd.config.schema",
    "StrictModel": "swarmd.config.schema",
    "SwarmdConfig": "swarmd.config.schema",
}


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'swarmd.config' has no attribute {name!r}")
    return getattr(importlib.import_module(_SOURCES[name]), name)
