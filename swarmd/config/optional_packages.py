"""The optional packages a setting needs, looked up without importing them (for validation at config load).

`missing_package` is what the config schema calls for `tracking.backends` (so `swarmd join` with a backend that
is not installed stops at once with exit 2, not at the first log). swarmd/tracking/backends.py, which builds the
backends, re-exports both names; they live here so that the config schema imports nothing above swarmd.config.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

__all__ = ["BACKENDS", "missing_package"]

BACKENDS = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""Tracking backend name -> the Python package it needs (installed by the extra `swarmd[<name>]`)."""


def missing_package(backend: str) -> Optional[str]:
    """None if `backend` can run here, else the one-line fix."""
    package = BACKENDS[backend]
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken install, or a module stubbed out as None in sys.modules
        found = False
    return None if found else f"{backend} needs the {package} package: pip install 'swarmd[{backend}]'"
