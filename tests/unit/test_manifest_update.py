"""`swarmd run update` and what a running peer does with a newer manifest: the update's validation (one line and exit
2 for an unknown key, a key that is not run-wide, a bad value, no run key), the founder's updates outliving its
restart, and the live-apply decision (which keys change at the next epoch boundary, which need a restart)."""

import asyncio
import copy
import json
import types

import pytest

from daemons import REPO, run_cli
from swarmd.config import load_config
from swarmd.errors import ConfigError
from swarmd.swarm import manifest as mf
from swarmd.swarm import manifest_update as mu
from swarmd.swarm.manifest_publisher import ManifestPublisher

ALBERT = REPO / "configs" / "albert-micro.yaml"
ALICE = "QmbTrBXMQbDNvXFWxjBnrbVWWxMpu4Ems9N5yCTmAybVUG"
BOB = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
CAROL = "QmPChd2hVbrJ6bfo3WBcTW4iZnpHm8TEzWkLHmLpXhF68A"


def _founded(tmp_path, *assignments):
    """A founder's state dir: the run's key and its first manifest (a private run of ALICE and BOB)."""
    config = load_config(ALBERT, flags={"state_dir": str(tmp_path)},
                         assignments=[f"network.allowed_peers=[{ALICE},{BOB}]", *assignments])
    mf.create_run_key(mf.run_key_path(tmp_path, "albert-micro"))
    return config, mu.founder_manifest(config)


def test_an_update_signs_the_next_version_with_the_assigned_run_wide_keys(tmp_path):
    config, first = _founded(tmp_path)
    manifest, changes = mu.sign_update(tmp_path, None, [f"network.allowed_peers=[{ALICE},{CAROL}]",
                                                         "swarm.averaging_timeout=45"])
    assert manifest.version == 2 and manifest.fingerprint == first.fingerprint
    assert changes == {"network.allowed_peers": sorted([ALICE, CAROL]), "swarm.averaging_timeout": 45.0}
    assert manifest.config["network"]["allowed_peers"] == sorted([ALICE, CAROL])
    assert manifest.config["swarm"]["averaging_timeout"] == 45.0
    untouched = {**manifest.config, "network": first.config["network"],
                 "swarm": {**manifest.config["swarm"], "averaging_timeout": first.config["swarm"]["averaging_timeout"]}}
    assert untouched == first.config  # nothing else changed
    stored = mf.decode(mf.stored_manifest_path(tmp_path, "albert-micro").read_bytes(), run_id="albert-micro")
    assert stored.version == 2  # what the founder's running peer picks up and publishes
    assert mu.sign_update(tmp_path, "albert-micro", ["swarm.averaging_timeout=45"]) == (stored, {})  # no change


def test_the_founders_updates_outlive_a_restart_from_its_original_config(tmp_path):
    config, _ = _founded(tmp_path)
    mu.sign_update(tmp_path, None, [f"network.allowed_peers=[{ALICE},{CAROL}]"])
    again = mu.founder_manifest(config)  # the founder's peer starts again with its original config file
    assert again.version == 2 and again.config["network"]["allowed_peers"] == sorted([ALICE, CAROL])
    updates = mu.founder_assignments(tmp_path, "albert-micro")
    assert updates == [f'network.allowed_peers={json.dumps(sorted([ALICE, CAROL]))}']
    restarted = load_config(ALBERT, flags={"state_dir": str(tmp_path)},
                            assignments=[f"network.allowed_peers=[{ALICE},{BOB}]", *updates])
    assert restarted.network.allowed_peers == sorted([ALICE, CAROL])  # it runs with what its manifest says
    assert mu.founder_assignments(tmp_path / "elsewhere", "albert-micro") == []  # no key: not the founder


def test_an_allow_list_file_is_signed_as_its_peer_ids(tmp_path):
    _founded(tmp_path)
    listing = tmp_path / "insiders.txt"
    listing.write_text(f"{ALICE}\n{CAROL}  # carol\n")
    manifest, _ = mu.sign_update(tmp_path, None, [f"network.allowed_peers={listing}"])
    assert manifest.config["network"]["allowed_peers"] == sorted([ALICE, CAROL])


@pytest.mark.parametrize("assignment, message", [
    ("swarm.matchmakng_time=3", "unknown key swarm.matchmakng_time (did you mean swarm.matchmaking_time?)"),
    ("nonsense.key=1", "unknown key nonsense"),
    ("training.threads=2", "training.threads is each peer's own setting, not run-wide"),
    ("checkpoint.every_epochs=5", "checkpoint.every_epochs is each peer's own setting, not run-wide"),
    ("swarm.averaging_timeout=-1", "swarm.averaging_timeout: Input should be greater than 0"),
    ("network.allowed_peers=[not-a-peer]", "network.allowed_peers"),
    ("run_id=another", "a run's id cannot change"),
    ("swarm.averaging_timeout", "expected KEY=VALUE"),
])
def test_a_bad_update_is_one_config_error(tmp_path, assignment, message):
    _founded(tmp_path)
    with pytest.raises(ConfigError) as error:
        mu.sign_update(tmp_path, None, [assignment])
    assert message in str(error.value), str(error.value)
    assert mf.decode(mf.stored_manifest_path(tmp_path, "albert-micro").read_bytes()).version == 1  # nothing signed


def test_only_the_founder_can_update(tmp_path):
    with pytest.raises(ConfigError, match="only the run's founder"):
        mu.sign_update(tmp_path, None, ["swarm.averaging_timeout=45"])
    with pytest.raises(ConfigError, match="only the run's founder"):
        mu.sign_update(tmp_path, "albert-micro", ["swarm.averaging_timeout=45"])


def test_run_update_on_the_command_line_prints_what_is_live_and_exits_2_on_errors(tmp_path):
    founded = run_cli("run", "init", "--config", str(ALBERT), "--state-dir", str(tmp_path),
                      "--set", f"network.allowed_peers=[{ALICE},{BOB}]")
    assert founded.returncode == 0, founded.stderr
    done = run_cli("run", "update", "--state-dir", str(tmp_path), "--set", f"network.allowed_peers=[{ALICE}]",
                   "--set", "swarm.target_batch_size=512")
    assert done.returncode == 0, done.stderr
    assert "manifest v2" in done.stdout
    assert "Live at each peer's next epoch boundary: network.allowed_peers" in done.stdout
    assert "Restart needed (each peer reports it in its status): swarm.target_batch_size" in done.stdout
    refused = run_cli("run", "update", "--state-dir", str(tmp_path), "--set", "daemon.tick_interval=2")
    lines = refused.stderr.strip().splitlines()  # the other refusals: test_a_bad_update_is_one_config_error
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "daemon.tick_interval is each peer's own setting" in lines[0], refused.stderr
    missing = run_cli("run", "update", "--state-dir", str(tmp_path / "not-the-founder"), "--set",
                      "swarm.averaging_timeout=45")
    assert missing.returncode == 2 and "only the run's founder" in missing.stderr, missing.stderr


# --- the live-apply decision -----------------------------------------------------------------------------------

BASE = {"run_id": "r", "network": {"allowed_peers": [ALICE, BOB]},
        "swarm": {"averaging_timeout": 30.0, "load_state_timeout": 120.0, "matchmaking_time": 5.0,
                  "target_batch_size": 256}, "training": {"batch_size": 32}}


def _changed(**sections):
    data = copy.deepcopy(BASE)
    for section, values in sections.items():
        data[section].update(values)
    return data


def test_the_allow_list_and_the_averaging_timeouts_change_live():
    newer = _changed(network={"allowed_peers": [ALICE, CAROL]}, swarm={"averaging_timeout": 60.0,
                                                                       "load_state_timeout": 300.0})
    decision = mu.decide(BASE, BASE, newer)
    assert decision.live == {"network.allowed_peers": [ALICE, CAROL], "swarm.averaging_timeout": 60.0,
                             "swarm.load_state_timeout": 300.0}
    assert decision.restart == ()


def test_other_keys_need_a_restart_until_the_run_changes_them_back():
    newer = _changed(swarm={"matchmaking_time": 2.0, "target_batch_size": 512}, training={"batch_size": 16})
    decision = mu.decide(BASE, BASE, newer)
    assert decision.live == {}
    assert decision.restart == ("swarm.matchmaking_time", "swarm.target_batch_size", "training.batch_size")
    assert mu.decide(BASE, BASE, _changed(swarm={"target_batch_size": 256})).restart == ()  # back as it started


def test_a_run_turned_private_or_open_needs_a_restart():
    opened = copy.deepcopy(BASE)
    opened["network"]["allowed_peers"] = None
    assert mu.decide(BASE, BASE, opened) == mu.Decision(live={}, restart=("network.allowed_peers",))
    assert mu.decide(opened, opened, BASE) == mu.Decision(live={}, restart=("network.allowed_peers",))


def test_a_live_key_already_applied_is_not_applied_again():
    applied = _changed(swarm={"averaging_timeout": 60.0})
    decision = mu.decide(BASE, applied, _changed(swarm={"averaging_timeout": 60.0, "target_batch_size": 512}))
    assert decision.live == {} and decision.restart == ("swarm.target_batch_size",)


class _View:
    def __init__(self, config, epoch=3):
        self.config, self.retuned, self.epoch = config, [], epoch

    def snapshot(self):
        return types.SimpleNamespace(local_epoch=self.epoch)

    def retune(self, changes):
        self.retuned.append(changes)


class _AllowList:
    own_peer_id = ALICE

    def __init__(self, peers):
        self.peers = frozenset(peers) | {ALICE}

    def publish(self, peers):
        self.peers = frozenset(peers) | {ALICE}


def test_a_peer_applies_a_newer_version_at_its_next_epoch_boundary(tmp_path, monkeypatch):
    asyncio.run(_applies_at_the_epoch_boundary(tmp_path, monkeypatch))


async def _applies_at_the_epoch_boundary(tmp_path, monkeypatch):
    from swarmd.swarm import allowlist

    config, first = _founded(tmp_path)
    key = mf.load_run_key(mf.run_key_path(tmp_path, "albert-micro"))
    member = ManifestPublisher(first.envelope)
    view = _View(config)
    await member.start(view)
    assert member.snapshot_fields()["manifest"] == mu.ManifestInfo(version=1, key_fingerprint=first.fingerprint,
                                                                   started_version=1)
    installed = _AllowList([ALICE, BOB])
    monkeypatch.setattr(allowlist, "_installed", installed)
    newer_config = copy.deepcopy(first.config)
    newer_config["network"]["allowed_peers"] = [ALICE, CAROL]
    newer_config["swarm"]["averaging_timeout"] = 50.0
    newer_config["swarm"]["target_batch_size"] = 512
    newer = mf.sign(key, run_id="albert-micro", version=2, config=newer_config)
    member._found(newer, view, "in the swarm")
    await member.tick(view, view.snapshot())  # the same epoch: it waits for the boundary
    assert member.snapshot_fields()["manifest"].pending_version == 2 and installed.peers == {ALICE, BOB}
    view.epoch = 4
    await member.tick(view, view.snapshot())
    info = member.snapshot_fields()["manifest"]
    assert (info.version, info.pending_version, info.restart_needed) == (2, None, ("swarm.target_batch_size",))
    assert installed.peers == {ALICE, CAROL}  # a removed peer is out, an added one in, without a restart
    assert view.retuned == [{"averaging_timeout": 50.0}]
    forged = mf.sign(mf._crypto().RSAPrivateKey(), run_id="albert-micro", version=3, config=newer_config)
    member._found(forged, view, "in the swarm")  # another key: never followed
    member._found(first, view, "in the swarm")  # an older version: never followed
    assert member.pending is None and member.manifest.version == 2


def test_retune_sets_the_optimizers_timeouts_and_the_workers_budgets():
    from swarmd.daemon.retune import retune
    from swarmd.worker.trainer import WorkerSettings

    config = load_config(ALBERT)
    worker = types.SimpleNamespace(settings=WorkerSettings.from_config(config))
    runtime = types.SimpleNamespace(optimizer=types.SimpleNamespace(averaging_timeout=30.0), worker=worker)
    updated = retune(runtime, config, {"averaging_timeout": 90.0})
    assert runtime.optimizer.averaging_timeout == 90.0 and updated.swarm.averaging_timeout == 90.0
    assert worker.settings == WorkerSettings.from_config(updated) != WorkerSettings.from_config(config)
    assert config.swarm.averaging_timeout != 90.0  # the config it started with is left as it was
    with pytest.raises(ValueError, match="matchmaking_time cannot change"):
        retune(runtime, config, {"matchmaking_time": 1.0})


# --- what the status, the pages and the metrics show -----------------------------------------------------------

MANIFEST = {"version": 3, "key_fingerprint": "ab" * 32, "started_version": 2,
            "restart_needed": ("swarm.target_batch_size",), "pending_version": None, "ignored_total": 1}


def test_swarmd_status_shows_the_manifest_in_one_line():
    import time

    from rich.console import Console

    from samples import sample_snapshot
    from swarmd.status.render import build_view

    console = Console(record=True, width=160, file=open("/dev/null", "w"))
    console.print(build_view({**sample_snapshot(time.time()), "manifest": MANIFEST}))
    [line] = [text for text in console.export_text().splitlines() if "│ manifest " in text]
    assert f"v3  ·  run key {'ab' * 8}  ·  restart needed for swarm.target_batch_size  ·  1 ignored" in line


def test_the_peer_page_and_the_monitor_show_the_version_and_the_key():
    from swarmd.web.views import monitor_items, run_items

    shown = {"run_id": "r", "manifest": MANIFEST}
    for items in (run_items(shown), monitor_items(shown)):
        [item] = [item for item in items if item.label == "manifest"]
        assert item.value == "v3" and item.note.startswith(f"run key {'ab' * 8}"), item
    assert not [item for item in run_items({"run_id": "r"}) if item.label == "manifest"]


def test_the_metrics_export_the_version_and_a_restart_needed():
    from prometheus_client import CollectorRegistry, generate_latest

    from swarmd.metrics.collector import DaemonCollector
    from swarmd.status.snapshot import Snapshot

    snapshot = Snapshot(run_id="r", manifest=mu.ManifestInfo(3, "ab" * 32, 2, restart_needed=("swarm.x",),
                                                            ignored_total=1))
    registry = CollectorRegistry()
    registry.register(DaemonCollector(lambda: snapshot))
    text = generate_latest(registry).decode()
    assert "swarmd_manifest_version 3.0" in text and "swarmd_manifest_restart_needed 1.0" in text
    assert "swarmd_manifest_ignored_total 1.0" in text
