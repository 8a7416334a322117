"""Configuration: the schema (defaults, ranges, docs) and the layered loader."""

from swarmd.config.loader import load_config, parse_assignment
from swarmd.config.schema import DEFAULT_PORT, StrictModel, SwarmdConfig

__all__ = ["DEFAULT_PORT", "StrictModel", "SwarmdConfig", "load_config", "parse_assignment"]
