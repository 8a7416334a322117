"""`swarmd run init|show|update`, and what `swarmd join` does with no --config: take the run's settings from its signed
manifest in the swarm (swarm/manifest.py, swarm/manifest_records.py)."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from typing import Any, Iterator, Optional

import typer

from swarmd.errors import ConfigError

__all__ = ["app", "join_by_manifest"]

app = typer.Typer(help="The run's signed manifest: found a run, show what a run is, change it while it runs.",
                  no_args_is_help=True)

# Seconds a joiner waits for a run's manifest by default (`swarmd join --manifest-wait`): the founder publishes it
# once its first peer trains, seconds after its `To join:` line.
MANIFEST_WAIT = 30.0
_READ_TIMEOUT = 5.0


@app.command("init")
def init(
    config: Optional[str] = typer.Option(
        None, "--config", "-c", help="The run's YAML config (its run-wide keys go into the manifest); default: the "
        "embedded default run, as `swarmd join` without --config."),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="The founder's state dir (the run's key goes there)."),
    assignments: list[str] = typer.Option(None, "--set", help="Any config key, as for `swarmd join`."),
) -> None:
    """Found a run: make its key (state dir, mode 0600), sign its manifest, print the line that joins it."""
    from swarmd.config import load_config
    from swarmd.swarm.manifest import create_run_key, run_key_path, summary
    from swarmd.swarm.manifest_update import founder_manifest

    cfg = load_config(config, flags={"state_dir": state_dir} if state_dir else {}, assignments=assignments or [])
    key_path = run_key_path(cfg.state_path, cfg.run_id)
    create_run_key(key_path)
    manifest = founder_manifest(cfg)
    where = f" --state-dir {state_dir}" if state_dir else ""
    print(f"The run's key: {key_path} (mode 0600; it signs the run's settings: keep it, keep it private)")
    print(f"Manifest: {summary(manifest)}")
    print(f"Key fingerprint: {manifest.fingerprint}")
    print(f"Start the run: swarmd join{f' --config {config}' if config else ''}{where}")
    print(f"Then anyone joins with: swarmd join --initial-peers <an address the run's first peer prints> "
          f"--run-key {manifest.fingerprint}")


@app.command("show")
def show(
    initial_peers: list[str] = typer.Option(..., "--initial-peers", help="Multiaddr of a peer of the run (repeatable)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="The run (needed when the peers serve several)."),
    run_key: Optional[str] = typer.Option(None, "--run-key", help="Only a manifest signed by this key (fingerprint)."),
    as_json: bool = typer.Option(False, "--json", help="The whole manifest as JSON."),
    wait: float = typer.Option(10.0, "--wait", min=0, help="Seconds to wait for the manifest."),
) -> None:
    """Print a run's manifest as the swarm serves it: task, model, strategy, version, key fingerprint."""
    from swarmd.config.multiaddr import check_multiaddr
    from swarmd.swarm.manifest import check_run_key_flag, summary
    from swarmd.swarm.manifest_records import as_dict, describe_ignored

    try:
        peers = [check_multiaddr(addr, require_peer_id=True) for addr in initial_peers]
    except ValueError as e:
        raise ConfigError(f"--initial-peers: {e}") from None
    pinned = check_run_key_flag(run_key)
    with _observer(peers, run_id) as dht:
        found_run = run_id or _the_run(dht, wait)
        choice = _poll_manifest(dht, found_run, pinned, wait, fallback=None)
    if choice is None or choice.manifest is None:
        raise ConfigError(_none_found(found_run, wait, choice, pinned=pinned))
    manifest = choice.manifest
    if as_json:
        print(json.dumps(as_dict(manifest), indent=2, sort_keys=True))
        return
    print(summary(manifest))
    print(f"key fingerprint: {manifest.fingerprint}")
    print(f"swarmd versions: {manifest.swarmd_versions} (protocol {manifest.protocol})")
    ignored = describe_ignored(choice)
    if ignored:
        print(f"ignored: {ignored}")


@app.command("update")
def update(
    assignments: list[str] = typer.Option(
        None, "--set", help="A run-wide key: --set network.allowed_peers=[Qm...,Qm...] (repeatable)."),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="The founder's state dir (holds the run's key)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="The run (needed when the state dir founded several)."),
    initial_peers: list[str] = typer.Option(None, "--initial-peers", help="Also publish it through this peer of the "
                                            "run now (repeatable); else the founder's running peer publishes it."),
) -> None:
    """Change a running run's settings (the founder only): sign the next manifest version with the run's key.
    Peers apply network.allowed_peers, swarm.averaging_timeout and swarm.load_state_timeout at their next epoch
    boundary; other changed keys take effect when each peer restarts. Exit 2: an unknown key, a key that is not
    run-wide, a value that fails validation, no run key in the state dir."""
    from swarmd.config.paths import default_state_dir
    from swarmd.swarm.manifest import summary
    from swarmd.swarm.manifest_update import LIVE_KEYS, sign_update

    manifest, changes = sign_update(state_dir or default_state_dir(), run_id, assignments or [])
    if not changes:
        print(f"Unchanged: the run's manifest v{manifest.version} already has these settings")
        return
    live = [key for key in changes if any(key == k or key.startswith(k + ".") for k in LIVE_KEYS)]
    restart = [key for key in changes if key not in live]
    print(f"Manifest: {summary(manifest)}")
    if live:
        print(f"Live at each peer's next epoch boundary: {', '.join(live)}")
    if restart:
        print(f"Restart needed (each peer reports it in its status): {', '.join(restart)}")
    if initial_peers:
        _publish_through(initial_peers, manifest)
        print(f"Published through {initial_peers[0]}")
    else:
        print("The founder's running peer (this state dir) publishes it within seconds; peers poll for it")


def _publish_through(initial_peers: list[str], manifest) -> None:
    from swarmd.config.multiaddr import check_multiaddr
    from swarmd.swarm.manifest_records import publish

    try:
        peers = [check_multiaddr(addr, require_peer_id=True) for addr in initial_peers]
    except ValueError as e:
        raise ConfigError(f"--initial-peers: {e}") from None
    with _observer(peers, manifest.run_id) as dht:
        try:
            for future in publish(dht, manifest, expiration=300.0):
                future.result(timeout=_READ_TIMEOUT * 2)
        except Exception as e:  # noqa: BLE001 - the signed version is stored; the founder's peer serves it too
            raise ConfigError(f"the new version is signed and stored, but publishing it through --initial-peers "
                              f"failed ({e!r}); the founder's running peer publishes it") from None


def join_by_manifest(cfg, *, flags: dict[str, Any], assignments: list[str], run_id_given: bool,
                     run_key: Optional[str], wait: float = MANIFEST_WAIT):
    """(the config to join with, the manifest's envelope) for `swarmd join` without --config: the run's settings
    from its manifest, this command's local ones on top. No manifest for a run named with --run-id whose peers
    publish none: (cfg, None), today's way (the command's own settings). Raises ConfigError (exit 2)."""
    from swarmd.swarm.manifest import check_run_key_flag, read_pin

    given = check_run_key_flag(run_key)
    with _observer(cfg.network.initial_peers, cfg.run_id if run_id_given else None) as dht:
        run_id = cfg.run_id if run_id_given else _the_run(dht, wait)
        pinned = given or read_pin(cfg.state_path, run_id)
        choice = _poll_manifest(dht, run_id, pinned, wait, fallback=cfg.run_id if run_id_given else None)
    if choice is None:
        print(f"swarmd: run {run_id} publishes no manifest: joining with this command's own settings",
              file=sys.stderr)
        return cfg, None
    if choice.manifest is None:
        raise ConfigError(_none_found(run_id, wait, choice, pinned=pinned))
    return _merge(choice.manifest, flags, assignments, given), choice.manifest.envelope


def _merge(manifest, flags: dict[str, Any], assignments: list[str], given: Optional[str]):
    from swarmd import __version__
    from swarmd.config import load_config
    from swarmd.config.schema import run_wide_part
    from swarmd.swarm.compatibility import PROTOCOL_VERSION
    from swarmd.swarm.manifest import conflicts, pin_run_key, summary, version_allows

    if manifest.protocol != PROTOCOL_VERSION or not version_allows(manifest.swarmd_versions, __version__):
        raise ConfigError(f"run {manifest.run_id} needs swarmd {manifest.swarmd_versions} (protocol "
                          f"{manifest.protocol}); this is swarmd {__version__} (protocol {PROTOCOL_VERSION}): install "
                          "the version the run uses")
    source = f"the run's manifest v{manifest.version}"
    # a copy: the loader merges the upper layers into the dicts of the lowest, and the conflicts are read against it
    cfg = load_config(None, flags={**flags, "run_id": manifest.run_id}, assignments=assignments,
                      recorded=(copy.deepcopy(manifest.config), source))
    differences = conflicts(manifest.config, run_wide_part(cfg.to_dict()))
    if differences:
        key, theirs, ours = differences[0]
        raise ConfigError(f"config error: {key} is run-wide: {source} says {_clip(theirs)}, this peer's "
                          f"settings say {_clip(ours)}; drop the local setting (the run's founder sets it)")
    newly = pin_run_key(cfg.state_path, manifest.run_id, manifest.fingerprint, given=given)
    pinned = f"; its key is now pinned in {cfg.state_path}" if newly else ""
    print(f"swarmd: joining {summary(manifest)}{pinned}", file=sys.stderr)
    return cfg


def _clip(value: Any, limit: int = 80) -> str:
    """A value of the founder's as JSON (control characters escaped), clipped to fit one line."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextlib.contextmanager
def _observer(initial_peers: list[str], run_id: Optional[str]) -> Iterator[Any]:
    """A light-client DHT on the initial peers, stopped on the way out. Its signature validator gets a key of its
    own: hivemind's process-wide key must stay unset for the daemon that follows (swarm/upstream/identity.py)."""
    import warnings

    with warnings.catch_warnings():  # torch's deprecation notices on import are not the operator's news
        warnings.simplefilter("ignore")
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.dht.schema import SchemaValidator
        from hivemind.utils.crypto import RSAPrivateKey

    from swarmd.logs import route_hivemind_logs
    from swarmd.swarm.children import tie_children_to_this_process
    from swarmd.swarm.dht import start_observer_dht, stop_dht
    from swarmd.swarm.manifest_records import ManifestValidator
    from swarmd.swarm.peer_records import PeerRecordsSchema

    route_hivemind_logs("error")
    tie_children_to_this_process()
    validators = [RSASignatureValidator(RSAPrivateKey())]
    if run_id is not None:
        validators = [SchemaValidator(PeerRecordsSchema, prefix=run_id), *validators, ManifestValidator(run_id, None)]
    dht = start_observer_dht(initial_peers, record_validators=validators)
    try:
        yield dht
    finally:
        stop_dht(dht)


def _the_run(dht, wait: float) -> str:
    """The one run the initial peers serve a manifest for; ConfigError when they serve none or several."""
    from swarmd.swarm.manifest_records import read_runs

    deadline = time.monotonic() + wait
    while True:
        runs = _read(lambda: read_runs(dht, _READ_TIMEOUT), [])
        if len(runs) == 1:
            return runs[0]
        if len(runs) > 1:
            raise ConfigError(f"the initial peers serve {len(runs)} runs: {', '.join(runs)}; pick one with --run-id")
        if time.monotonic() >= deadline:
            raise ConfigError(_none_found(None, wait, None))
        time.sleep(1.0)


def _poll_manifest(dht, run_id: str, pinned: Optional[str], wait: float, *, fallback: Optional[str]):
    """The run's manifests, chosen, once one is under the trusted key or `wait` has passed. With `fallback` (a run
    named on the command line): None as soon as the run's peers are seen publishing records but no manifest."""
    from swarmd.swarm.manifest import Choice
    from swarmd.swarm.manifest_records import read_choice

    deadline = time.monotonic() + wait
    seen_without = 0
    while True:
        choice = _read(lambda: read_choice(dht, run_id, pinned, _READ_TIMEOUT), None) or Choice()
        if choice.manifest is not None or len(choice.keys) > 1:
            return choice
        refused = bool(choice.other_key)  # a manifest under another key than the trusted one: never a fallback
        if refused or (fallback is not None and _has_peers(dht, fallback)):
            seen_without += 1
            if seen_without >= 3:  # the founder stores its manifest as it starts announcing: give it 2 s more
                return choice if refused else None
        if time.monotonic() >= deadline:
            return None if fallback is not None and not refused else choice
        time.sleep(1.0)


def _has_peers(dht, run_id: str) -> bool:
    from swarmd.swarm.peer_records import RECORD_FIELD, entries

    found = _read(lambda: dht.get(f"{run_id}_{RECORD_FIELD}", latest=True, return_future=True).result(
        timeout=_READ_TIMEOUT), None)
    return bool(entries(found))


def _read(call, default):
    try:
        return call()
    except Exception:  # noqa: BLE001 - an unanswered read: try again until the bound
        return default


def _none_found(run_id: Optional[str], wait: float, choice, *, pinned: Optional[str] = None) -> str:
    if choice is not None and len(choice.keys) > 1:
        keys = ", ".join(key[:16] + "..." for key in choice.keys)
        return (f"run {run_id} has manifests signed by {len(choice.keys)} keys ({keys}): pass --run-key with the "
                "fingerprint the run's founder gives")
    if choice is not None and choice.other_key and pinned:
        return (f"the manifest of run {run_id} is signed by another key than the run's key this peer trusts "
                f"({pinned[:16]}...); refusing it. If the run was founded anew, pass --run-key with its new key "
                "(or delete the pin file in the state dir's run-keys/)")
    what = f"run {run_id}'s manifest" if run_id else "a run's manifest"
    return (f"no peer at --initial-peers served {what} within {wait:.0f} s: pass --config with the run's YAML "
            "file, or wait until the run's founder (swarmd run init, then swarmd join --config) is training")


def register(app_root: typer.Typer) -> None:
    app_root.add_typer(app, name="run")

