"""Changing a running run's settings: `swarmd run update` on the founder's side, and what a peer does with a newer
manifest version (swarm/manifest_publisher.py follows the DHT record and calls `decide`).

The founder signs a new version of the manifest with the run's key (`sign_update`): the stored manifest's config
with the assigned run-wide keys replaced by their validated values. The assignments are also kept, cumulated, in
`run-keys/<run_id>.updates` (JSON, dotted key -> value), so that a founder started again from its original config
file signs the updated settings rather than reverting them (`founder_updates`).

A peer applies a newer version at its next epoch boundary. `LIVE_KEYS` change while it trains; any other changed
key needs a restart of the peer, which it reports (status `manifest.restart_needed`, a log line, the metric
`swarmd_manifest_restart_needed`) and keeps training with the settings it started with.

No torch or hivemind import.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from swarmd import __version__
from swarmd.errors import ConfigError
from swarmd.swarm.manifest import (
    KEY_DIR, BadManifest, Manifest, _write_private, decode, load_run_key, manifest_config, pin_run_key, run_key_path,
    sign, stored_manifest_path, version_allows,
)

__all__ = [
    "LIVE_KEYS",
    "ManifestInfo",
    "Decision",
    "updates_path",
    "read_updates",
    "founder_updates",
    "founder_manifest",
    "founder_assignments",
    "sign_update",
    "checked_update",
    "decide",
    "leaves",
]

# What a running peer applies at its next epoch boundary, without a restart:
# - network.allowed_peers: a private run's allow-list, list to list (every process re-reads it, swarm/allowlist.py);
#   turning a run private or open needs a restart (the gates are set up before the DHT starts);
# - swarm.averaging_timeout, swarm.load_state_timeout: read by the optimizer at each use (and the worker's
#   watchdog budgets derived from them are recomputed).
# Not live: swarm.matchmaking_time (each averager process holds its own copy from start), everything else.
# checkpoint.every_epochs is each peer's own setting, not in the manifest.
LIVE_KEYS = ("network.allowed_peers", "swarm.averaging_timeout", "swarm.load_state_timeout")
UPDATES_SUFFIX = ".updates"


@dataclass(frozen=True)
class ManifestInfo:
    """What the status shows of the run's manifest (the snapshot's `manifest`; None without one)."""

    version: int  # the version this peer follows (applied, or noted as needing a restart)
    key_fingerprint: str  # sha256 of the run's public key (what `--run-key` takes)
    started_version: int  # the version this peer started with
    restart_needed: tuple = ()  # dotted keys the run changed since this peer started that apply only at a restart
    pending_version: Optional[int] = None  # a newer version found, to apply at the next epoch boundary
    ignored_total: int = 0  # manifest entries ignored: malformed, forged, signed by another key


@dataclass(frozen=True)
class Decision:
    """What a peer does with a newer manifest: the live keys to apply (dotted key -> new value) and the keys that
    differ from what it started with and need a restart."""

    live: dict
    restart: tuple


def updates_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / KEY_DIR / f"{run_id}{UPDATES_SUFFIX}"


def read_updates(state_dir: Path, run_id: str) -> dict[str, Any]:
    """The founder's updates so far (dotted key -> value as the manifest carries it); {} without any."""
    path = updates_path(state_dir, run_id)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"the run's updates {path} cannot be read ({e}); fix or delete it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the run's updates {path} is not a mapping of dotted keys; fix or delete it")
    return data


def founder_updates(run_wide: dict[str, Any], state_dir: Path, run_id: str) -> dict[str, Any]:
    """`run_wide` (the run-wide part of the founder's config) with its `swarmd run update`s applied."""
    data = copy.deepcopy(run_wide)
    for dotted, value in read_updates(state_dir, run_id).items():
        _set(data, dotted, copy.deepcopy(value))
    return data


def founder_manifest(config) -> Manifest:
    """The founder's manifest for `config`: the stored one while the run-wide settings (with the founder's
    `swarmd run update`s on top) are unchanged, else the next version, signed and stored
    (the run's key and the stored manifest live in the state dir)."""
    state_dir, run_id = config.state_path, config.run_id
    key = load_run_key(run_key_path(state_dir, run_id))
    wanted = founder_updates(manifest_config(config), state_dir, run_id)  # `swarmd run update`s outlive a restart
    stored_path = stored_manifest_path(state_dir, run_id)
    previous = None
    if stored_path.exists():
        try:
            previous = decode(stored_path.read_bytes(), run_id=run_id)
        except (OSError, BadManifest):
            previous = None  # damaged: sign anew, one version above nothing we can read
    public_key = key.get_public_key().to_bytes().decode("ascii")
    if previous is not None and previous.config == wanted and previous.public_key == public_key \
            and version_allows(previous.swarmd_versions, __version__):
        return previous
    manifest = sign(key, run_id=run_id, version=(previous.version + 1 if previous else 1), config=wanted)
    _write_private(stored_path, manifest.envelope)
    pin_run_key(state_dir, run_id, manifest.fingerprint)
    return manifest


def founder_assignments(state_dir: Path, run_id: str) -> list[str]:
    """The founder's updates as `--set` assignments (JSON values), for `swarmd join --config` to run with the
    settings its manifest carries; [] on a peer that holds no key of the run."""
    if not run_key_path(state_dir, run_id).exists():
        return []
    return [f"{key}={json.dumps(value)}" for key, value in sorted(read_updates(state_dir, run_id).items())]


def checked_update(current: dict[str, Any], assignments: list[str], run_id: str) -> tuple[dict[str, Any], dict]:
    """(the manifest config with `assignments` applied, {dotted key: new value}); ConfigError (exit 2) for a key that
    does not exist, one that is not run-wide, run_id, or a value that fails the config's validation."""
    from swarmd.config import load_config
    from swarmd.config.loader import parse_assignment
    from swarmd.config.schema import scope_of

    if not assignments:
        raise ConfigError("nothing to update: pass --set KEY=VALUE (a run-wide key, e.g. "
                          "--set network.allowed_peers=[Qm...,Qm...])")
    keys = []
    for text in assignments:
        key, _value = parse_assignment(text)
        try:
            run_wide = scope_of(key)
        except KeyError:
            load_config(None, environ={}, assignments=[text])  # names the key and suggests one ("did you mean")
            raise ConfigError(f"--set {text}: unknown key {key}") from None
        if key == "run_id":
            raise ConfigError(f"--set {text}: a run's id cannot change; found a new run (swarmd run init)")
        if not run_wide:
            raise ConfigError(f"--set {text}: {key} is each peer's own setting, not run-wide: the manifest does not "
                              "carry it (set it in that peer's config)")
        keys.append(key)
    source = "the run's current manifest"
    cfg = load_config(None, environ={}, flags={"run_id": run_id}, assignments=assignments,
                      recorded=(copy.deepcopy(current), source))
    validated = manifest_config(cfg)  # a file named for network.allowed_peers becomes its peer ids
    updated = copy.deepcopy(current)
    changes = {}
    for key in keys:
        found, value = _get(validated, key)
        if not found:
            raise ConfigError(f"--set: {key} is not a key of the run's settings")
        _set(updated, key, value)
        changes[key] = value
    return updated, changes


def sign_update(state_dir: Path, run_id: Optional[str], assignments: list[str]):
    """The founder's `swarmd run update`: (the new manifest, signed and stored, {dotted key: new value}).
    ConfigError for a missing key file, no stored manifest, or a bad assignment."""
    state_dir = Path(state_dir).expanduser()
    run_id = run_id or _the_founded_run(state_dir / KEY_DIR)
    key_path = run_key_path(state_dir, run_id)
    if not key_path.exists():
        raise ConfigError(f"no key of run {run_id} in {key_path.parent}: only the run's founder (whose state dir "
                          "holds the key `swarmd run init` made) can update its manifest; pass its --state-dir")
    key = load_run_key(key_path)
    stored = stored_manifest_path(state_dir, run_id)
    try:
        current = decode(stored.read_bytes(), run_id=run_id)
    except (OSError, BadManifest) as e:
        raise ConfigError(f"the run's manifest {stored} cannot be read ({e}): start the founder's peer once "
                          "(swarmd join --config ...), which signs it") from None
    updated, changes = checked_update(current.config, assignments, run_id)
    if updated == current.config:
        return current, {}
    manifest = sign(key, run_id=run_id, version=current.version + 1, config=updated)
    recorded = read_updates(state_dir, run_id)
    recorded.update(changes)
    _write_private(updates_path(state_dir, run_id), json.dumps(recorded, indent=1, sort_keys=True).encode("utf-8"))
    _write_private(stored, manifest.envelope)
    return manifest, changes


def _the_founded_run(key_dir: Path) -> str:
    runs = sorted(path.stem for path in key_dir.glob("*.key")) if key_dir.is_dir() else []
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ConfigError(f"no run's key in {key_dir}: only the run's founder (whose state dir holds the key "
                          "`swarmd run init` made) can update its manifest; pass its --state-dir")
    raise ConfigError(f"{key_dir} holds the keys of {len(runs)} runs ({', '.join(runs)}): pick one with --run-id")


def decide(started: dict[str, Any], applied: dict[str, Any], newer: dict[str, Any]) -> Decision:
    """A newer manifest's config against what this peer started with (`started`) and has applied live so far
    (`applied`): the live keys that change now, and every key that still differs from the start and is not live."""
    old, new, first = leaves(applied), leaves(newer), leaves(started)
    live, restart = {}, []
    for key in sorted(new):  # a key the manifest does not carry (an older founder's) is not a change
        if _is_live(key, first.get(key), new.get(key)):
            if old.get(key) != new.get(key):
                live[_live_key(key)] = _get(newer, _live_key(key))[1]
        elif first.get(key) != new.get(key):
            restart.append(key)
    return Decision(live=live, restart=tuple(restart))


def _is_live(key: str, before: Any, after: Any) -> bool:
    live_key = _live_key(key)
    if live_key is None:
        return False
    if live_key == "network.allowed_peers":  # private stays private: list to list
        return isinstance(before, list) and isinstance(after, list)
    return True


def _live_key(key: str) -> Optional[str]:
    return next((live for live in LIVE_KEYS if key == live or key.startswith(live + ".")), None)


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every leaf (a list is a leaf)."""
    found = {}
    for key, value in data.items():
        dotted = prefix + key
        if isinstance(value, dict) and value:
            found.update(leaves(value, dotted + "."))
        else:
            found[dotted] = value
    return found


def _get(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
