"""Build the effective configuration from its layers and validate it.

Layers, lowest first: built-in defaults (the schema) < for `swarmd export`, the config a checkpoint recorded < the
YAML file (--config) < environment variables SWARMD_<SECTION>__<KEY> < command-line flags and
`--set section.key=value`. Every error names the dotted path of the field and where the bad value came from, in
one line.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from swarmd.config.schema import SwarmdConfig
from swarmd.config.task_resolver import resolve_task_class
from swarmd.errors import ConfigError

__all__ = ["ENV_PREFIX", "load_config", "parse_assignment", "read_yaml_file"]

ENV_PREFIX = "SWARMD_"
# Environment variables with our prefix that are not config keys (SWARMD_REQUIRE_TOOLS: set by .ci/run for tests).
_ENV_NOT_KEYS = {"SWARMD_CONFIG", "SWARMD_REQUIRE_TOOLS"}


def load_config(
    path: str | os.PathLike | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    assignments: Iterable[str] = (),
    recorded: tuple[Mapping[str, Any], str] | None = None,
) -> SwarmdConfig:
    """Merge the layers, validate them, resolve the task's own settings; raise ConfigError on any problem.

    `flags` maps dotted keys to values from named command-line options; `assignments` are `key=value` strings
    from `--set`. `environ` defaults to os.environ; a SWARMD_CONFIG variable names the file when `path` is None.
    `recorded`: (a config as plain data, where it came from), a layer between the defaults and the file: what
    `swarmd export` reads from a checkpoint (SwarmdConfig.run_record). The task comes from the resolver the process
    registered (swarmd.config.task_resolver).
    """
    environ = os.environ if environ is None else environ
    path = path if path is not None else environ.get("SWARMD_CONFIG")
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}

    if recorded is not None:
        _merge(merged, recorded[0], sources, source=recorded[1])
    if path is not None:
        _merge(merged, read_yaml_file(path), sources, source=str(path))
    for name, raw in sorted(environ.items()):
        if name.startswith(ENV_PREFIX) and name not in _ENV_NOT_KEYS:
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            _merge(merged, _nest(key, _parse_value(raw, name)), sources, source=f"environment {name}")
    for key, value in (flags or {}).items():
        _merge(merged, _nest(key, value), sources, source="command line")
    for text in assignments:
        key, value = parse_assignment(text)
        _merge(merged, _nest(key, value), sources, source=f"--set {text}")

    try:
        config = SwarmdConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_describe(e, SwarmdConfig, sources)) from None
    _resolve_task(config, sources)
    return config


def read_yaml_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist; pass an existing YAML file to --config") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {p} is a directory; pass a YAML file to --config") from None
    except (PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {p} cannot be read: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file {p} is not valid YAML{at}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections (run_id:, swarm:, ...), not a {type(data).__name__}")
    return data


def parse_assignment(text: str) -> tuple[str, Any]:
    """`swarm.target_batch_size=4096` -> ("swarm.target_batch_size", 4096); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. --set swarm.target_batch_size=4096")
    return key, _parse_value(raw, f"--set {text}")


def _parse_value(raw: str, source: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"{source}: the value {raw!r} is not valid YAML") from None


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    node: Any = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return node


def _merge(base: dict[str, Any], upper: Mapping[str, Any], sources: dict[str, str], *, source: str, prefix: str = "") -> None:
    """Deep-merge `upper` into `base` in place; lists and scalars replace. Remember who set each leaf."""
    if not prefix and isinstance(upper.get("task"), Mapping) and isinstance(base.get("task"), Mapping):
        new_name, old_name = upper["task"].get("name"), base["task"].get("name")
        if new_name is not None and old_name is not None and new_name != old_name:
            base.pop("task")  # another task: the old task's settings would not validate against the new one
    for key, value in upper.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value, sources, source=source, prefix=dotted + ".")
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
            for known in [k for k in sources if k == dotted or k.startswith(dotted + ".")]:
                del sources[known]
            sources[dotted] = source


def _resolve_task(config: SwarmdConfig, sources: dict[str, str]) -> None:
    task_cls = resolve_task_class(config.task.name)  # the registry the process registered: config imports no task
    try:
        config.task._settings = task_cls.Config.model_validate(config.task.model_extra or {})
    except ValidationError as e:
        raise ConfigError(_describe(e, task_cls.Config, sources, prefix="task.")) from None


def _describe(error: ValidationError, model: type[BaseModel], sources: Mapping[str, str], prefix: str = "") -> str:
    """One line for all errors: `config error: swarm.target_batch_size: must be >= 1 (got 0, from x.yaml)`."""
    parts = []
    for item in error.errors(include_url=False):
        loc = [str(p) for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        dotted = prefix + ".".join(loc)
        origin = next((src for key, src in sources.items() if dotted == key or dotted.startswith(key + ".")), None)
        if item["type"] == "extra_forbidden":
            message = f"unknown key {dotted}" + _suggest(model, loc, prefix)
        else:
            got = item.get("input")
            shown = "" if isinstance(got, (dict, list)) and len(repr(got)) > 60 else f"got {got!r}"
            detail = ", ".join(x for x in (shown, f"from {origin}" if origin else "") if x)
            text = item["msg"].removeprefix("Value error, ")
            message = f"{dotted or '(top level)'}: {text}" + (f" ({detail})" if detail else "")
        parts.append(message)
    return "config error: " + "; ".join(parts)


def _suggest(model: type[BaseModel], loc: list[str], prefix: str = "") -> str:
    """Walk the schema along `loc` and suggest the closest real key name."""
    current: Any = model
    for part in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return ""
        current = field.annotation
    names = list(getattr(current, "model_fields", {}))
    close = difflib.get_close_matches(loc[-1], names, n=1)
    if close:
        return f" (did you mean {prefix}{'.'.join([*loc[:-1], close[0]])}?)"
    return f" (known keys: {', '.join(names)})" if names else ""
