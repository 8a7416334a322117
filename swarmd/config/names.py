"""Name rules shared by the config schema and the CLI. Standard library only: `swarmd status` imports it."""

from __future__ import annotations

import re

__all__ = ["RUN_ID_PATTERN", "is_run_id"]

# Letters, digits, '.', '_', '-'; starts with a letter or digit; at most 128 characters (it is part of DHT keys).
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)


def is_run_id(text: str) -> bool:
    return bool(_RUN_ID.match(text))
