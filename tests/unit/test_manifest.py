"""The run's manifest: which keys are run-wide, signing and checking, size bounds, forgeries, pinning a run's key."""

import json
import os
import stat

import pytest
from pydantic import BaseModel

from daemons import REPO, run_cli
from swarmd.config import load_config
from swarmd.config.schema import RUN_WIDE_KEYS, SwarmdConfig, run_wide_part, scope_of
from swarmd.errors import ConfigError
from swarmd.swarm import manifest as mf
from swarmd.swarm import manifest_update as mu

ALBERT = REPO / "configs" / "albert-micro.yaml"


@pytest.fixture(scope="module")
def run_key():
    return mf._crypto().RSAPrivateKey()


@pytest.fixture(scope="module")
def other_key():
    return mf._crypto().RSAPrivateKey()


def _dotted_keys(model, prefix=""):
    for name, field in model.model_fields.items():
        yield prefix + name
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _dotted_keys(field.annotation, prefix + name + ".")


def test_every_key_of_the_schema_is_run_wide_or_local_by_the_one_table():
    for key in _dotted_keys(SwarmdConfig):
        assert scope_of(key) in (True, False), key  # KeyError: a key the table does not cover
    assert not [entry for entry in RUN_WIDE_KEYS if entry.split(".")[0] not in SwarmdConfig.model_fields]


def test_the_run_wide_part_holds_the_runs_settings_and_none_of_this_machines():
    config = load_config(ALBERT, flags={"state_dir": "/somewhere", "training.device": "cpu"},
                         assignments=["training.threads=2", "network.allowed_peers=[]"])
    part = run_wide_part(config.to_dict())
    assert part["run_id"] == "albert-micro" and part["task"]["name"] == "albert"
    assert part["task"]["model"]["hidden_size"] == 64 and "path" not in part["task"]["data"]
    assert part["swarm"]["target_batch_size"] == 256 and part["swarm"]["strategy"] == "sync"
    assert "auxiliary" not in part["swarm"]
    assert part["training"] == {"precision": "fp32", "batch_size": 32, "seed": None, "max_epochs": 0}
    assert part["network"] == {"allowed_peers": []}
    for local in ("state_dir", "checkpoint", "daemon", "metrics", "logging", "tracking"):
        assert local not in part


def _signed(key, version=1, run_id="albert-micro", config=None):
    config = config if config is not None else mf.manifest_config(load_config(ALBERT))
    return mf.sign(key, run_id=run_id, version=version, config=config)


def test_a_signed_manifest_decodes_to_what_was_signed(run_key):
    manifest = _signed(run_key)
    again = mf.decode(manifest.envelope, run_id="albert-micro")
    assert again.config == manifest.config and again.version == 1
    assert again.fingerprint == mf.fingerprint_of(run_key.get_public_key().to_bytes().decode())
    assert len(manifest.envelope) < mf.MAX_MANIFEST_BYTES
    assert "albert" in mf.summary(manifest) and manifest.fingerprint[:16] in mf.summary(manifest)


def _tampered(envelope: bytes, change) -> bytes:
    outer = json.loads(envelope)
    body = json.loads(outer["manifest"])
    change(body, outer)
    outer["manifest"] = json.dumps(body) if not isinstance(outer["manifest"], bytes) else outer["manifest"]
    return json.dumps(outer).encode()


def test_forged_changed_oversized_and_malformed_manifests_are_refused(run_key, other_key):
    manifest = _signed(run_key)
    other_public = other_key.get_public_key().to_bytes().decode()

    def bigger_batch(body, outer):
        body["config"]["swarm"]["target_batch_size"] = 1

    def another_key(body, outer):  # a forger's key in place of the run's: the signature no longer verifies
        body["public_key"] = other_public

    bad = {
        "a changed setting": _tampered(manifest.envelope, bigger_batch),
        "another key": _tampered(manifest.envelope, another_key),
        "oversized": manifest.envelope + b" " * mf.MAX_MANIFEST_BYTES,
        "not json": b"\xff{",
        "not an envelope": json.dumps({"manifest": 1}).encode(),
        "not bytes": "text",
    }
    for what, envelope in bad.items():
        with pytest.raises(mf.BadManifest):
            mf.decode(envelope, run_id="albert-micro")
            pytest.fail(what)
    with pytest.raises(mf.BadManifest, match="run"):
        mf.decode(manifest.envelope, run_id="another-run")
    with pytest.raises(ConfigError, match="more than"):
        _signed(run_key, config={"run_id": "albert-micro", "blob": "x" * mf.MAX_MANIFEST_BYTES})


def test_a_reader_follows_the_newest_version_under_the_trusted_key_and_counts_the_rest(run_key, other_key):
    v1, v2 = _signed(run_key, 1), _signed(run_key, 2)
    forged = _signed(other_key, 5)  # valid, but by another key
    entries = [("a", v1.envelope), ("b", v2.envelope), ("c", forged.envelope), ("d", b"garbage")]
    choice = mf.choose(entries, "albert-micro", pinned=v1.fingerprint)
    assert choice.manifest.version == 2 and choice.manifest.fingerprint == v1.fingerprint
    assert (choice.malformed, choice.other_key, choice.older) == (1, 1, 1)
    unpinned = mf.choose(entries, "albert-micro", pinned=None)
    assert unpinned.manifest is None and len(unpinned.keys) == 2  # two keys and no trust yet: the operator picks
    assert mf.choose([("x", v1.envelope)] * 100, "albert-micro", None, limit=10).malformed == 90


def test_the_first_key_seen_is_pinned_and_another_is_refused(tmp_path, run_key, other_key):
    ours, theirs = _signed(run_key).fingerprint, _signed(other_key).fingerprint
    assert mf.pin_run_key(tmp_path, "albert-micro", ours) is True
    pin = mf.pin_path(tmp_path, "albert-micro")
    assert stat.S_IMODE(os.stat(pin).st_mode) == 0o600 and mf.read_pin(tmp_path, "albert-micro") == ours
    assert mf.pin_run_key(tmp_path, "albert-micro", ours) is False
    with pytest.raises(ConfigError, match="refusing it"):
        mf.pin_run_key(tmp_path, "albert-micro", theirs)
    with pytest.raises(ConfigError, match="differs from the key pinned"):
        mf.pin_run_key(tmp_path, "albert-micro", theirs, given=theirs)
    with pytest.raises(ConfigError, match="refusing it"):  # --run-key up front, before any manifest was seen
        mf.pin_run_key(tmp_path / "fresh", "albert-micro", theirs, given=ours)
    with pytest.raises(ConfigError, match="64 hex"):
        mf.check_run_key_flag("abc")


def test_the_founder_signs_a_new_version_only_when_a_run_wide_key_changes(tmp_path):
    def config(*assignments):
        return load_config(ALBERT, flags={"state_dir": str(tmp_path)}, assignments=list(assignments))

    key_path = mf.run_key_path(tmp_path, "albert-micro")
    mf.create_run_key(key_path)
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    with pytest.raises(ConfigError, match="already exists"):
        mf.create_run_key(key_path)
    first = mu.founder_manifest(config())
    assert first.version == 1
    assert mu.founder_manifest(config("training.threads=1", "metrics.enabled=false")).version == 1  # local keys
    second = mu.founder_manifest(config("swarm.target_batch_size=512"))
    assert second.version == 2 and second.config["swarm"]["target_batch_size"] == 512
    assert mf.read_pin(tmp_path, "albert-micro") == first.fingerprint == second.fingerprint


def test_a_private_runs_allow_list_file_travels_as_the_peer_ids(tmp_path):
    peer = "QmbTrBXMQbDNvXFWxjBnrbVWWxMpu4Ems9N5yCTmAybVUG"
    listing = tmp_path / "peers.txt"
    listing.write_text(f"# insiders\n{peer}\n")
    config = load_config(ALBERT, assignments=[f"network.allowed_peers={listing}"])
    assert mf.manifest_config(config)["network"]["allowed_peers"] == [peer]


def test_conflicts_name_each_run_wide_key_this_peer_set_otherwise():
    theirs = {"swarm": {"target_batch_size": 256, "strategy": "sync"}, "run_id": "r"}
    ours = {"swarm": {"target_batch_size": 512, "strategy": "sync"}, "run_id": "r"}
    assert mf.conflicts(theirs, ours) == [("swarm.target_batch_size", 256, 512)]


def test_swarmd_version_rules():
    assert mf.version_allows(">=0.1.0", "0.1.0") and mf.version_allows(">=0.1,<0.3", "0.2.5")
    assert not mf.version_allows(">=0.2", "0.1.9") and not mf.version_allows("~=0.1", "0.1.0")


def test_the_dht_validator_stores_only_the_runs_manifests_under_their_own_subkey(run_key, other_key):
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    from swarmd.swarm.manifest_records import ManifestValidator, manifest_key, subkey_of

    manifest, forged = _signed(run_key), _signed(other_key)

    def record(subkey, value, key=manifest_key("albert-micro")):
        return DHTRecord(key=DHTID.generate(source=key).to_bytes(), subkey=MSGPackSerializer.dumps(subkey),
                         value=MSGPackSerializer.dumps(value), expiration_time=0.0)

    pinned = ManifestValidator("albert-micro", manifest.fingerprint)
    assert pinned.validate(record(subkey_of(manifest), manifest.envelope))
    assert not pinned.validate(record(subkey_of(forged), forged.envelope))  # another key than the pinned one
    assert not pinned.validate(record(subkey_of(forged), manifest.envelope))  # a subkey that lies
    assert not pinned.validate(record(subkey_of(manifest), b"junk"))
    assert ManifestValidator("albert-micro", None).validate(record(subkey_of(forged), forged.envelope))
    assert pinned.validate(record("x", b"anything", key="another_key"))  # not ours to judge
    assert pinned.rejected == 3


def test_run_key_with_a_config_file_is_a_usage_error(tmp_path):
    result = run_cli("join", "--config", str(ALBERT), "--state-dir", str(tmp_path), "--run-key", "0" * 64)
    assert result.returncode == 2 and "--run-key is for joining" in result.stderr, result.stderr


def test_run_init_makes_the_key_and_prints_the_fingerprint_and_the_join_line(tmp_path):
    result = run_cli("run", "init", "--config", str(ALBERT), "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    fingerprint = mf.read_pin(tmp_path, "albert-micro")
    assert f"Key fingerprint: {fingerprint}" in result.stdout
    assert f"swarmd join --initial-peers <an address the run's first peer prints> --run-key {fingerprint}" in result.stdout
    again = run_cli("run", "init", "--config", str(ALBERT), "--state-dir", str(tmp_path))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_run_init_without_a_config_founds_the_embedded_default_run(tmp_path):
    """The README's quick start: `swarmd run init` with no --config founds the run `swarmd join` trains by default,
    and the founder's `swarmd run update`s apply to its `swarmd join` without --config too."""
    result = run_cli("run", "init", "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    fingerprint = mf.read_pin(tmp_path, "swin-micro")
    assert fingerprint and f"Key fingerprint: {fingerprint}" in result.stdout
    assert f"Start the run: swarmd join --state-dir {tmp_path}\n" in result.stdout
    assert mu.founder_assignments(tmp_path, "swin-micro") == []
    updated = run_cli("run", "update", "--state-dir", str(tmp_path), "--set", "swarm.averaging_timeout=45")
    assert updated.returncode == 0, updated.stderr
    assert mu.founder_assignments(tmp_path, "swin-micro") == ["swarm.averaging_timeout=45.0"]


def test_a_joiner_takes_the_manifests_settings_under_its_local_ones_and_names_a_contradiction(tmp_path, run_key):
    from swarmd.cli.run import _merge

    manifest = _signed(run_key)
    flags = {"state_dir": str(tmp_path), "training.device": "cpu"}
    config = _merge(manifest, flags, ["training.threads=1", "task.data.path=/data"], None)
    assert config.run_id == "albert-micro" and config.task.name == "albert" and config.swarm.target_batch_size == 256
    assert config.training.threads == 1 and config.training.device == "cpu" and config.task.settings.data.path == "/data"
    assert mf.read_pin(tmp_path, "albert-micro") == manifest.fingerprint
    with pytest.raises(ConfigError) as refused:
        _merge(manifest, {"state_dir": str(tmp_path / "other")}, ["swarm.target_batch_size=512"], None)
    assert "swarm.target_batch_size is run-wide: the run's manifest v1 says 256, this peer's settings say 512" in str(
        refused.value)
    assert mf.read_pin(tmp_path / "other", "albert-micro") is None  # nothing pinned for a join that did not happen


def test_peers_serving_several_runs_are_listed_and_bad_run_ids_left_out():
    from types import SimpleNamespace

    from swarmd.cli.run import _the_run

    class Swarm:
        def __init__(self, runs):
            self.runs = runs

        def get(self, key, latest, return_future):
            value = {run: SimpleNamespace(value="0" * 64) for run in self.runs}
            return SimpleNamespace(result=lambda timeout: SimpleNamespace(value=value))

    assert _the_run(Swarm(["albert-micro", "bad id\n\x1b[31m"]), wait=0) == "albert-micro"
    with pytest.raises(ConfigError, match="serve 2 runs: albert-micro, swin-micro; pick one with --run-id"):
        _the_run(Swarm(["swin-micro", "albert-micro"]), wait=0)
    with pytest.raises(ConfigError, match="pass --config"):
        _the_run(Swarm([]), wait=0)


def test_the_summary_shows_a_founders_strings_escaped_and_clipped(run_key):
    config = mf.manifest_config(load_config(ALBERT))
    config["task"]["model"]["name"] = "\x1b[2Jevil\n" + "x" * 200
    line = mf.summary(_signed(run_key, config=config))
    assert "\x1b" not in line and "\n" not in line and "\\x1b[2Jevil\\n" in line and len(line) < 400


def test_a_run_that_names_its_data_carries_the_prepare_command_and_the_identity(run_key):
    """task.data.prepare and task.data.identity are run-wide (task.data.path stays each machine's): the manifest
    carries them and its summary names them, so `swarmd run show` tells a joiner how to prepare the run's data."""
    command = "swarmd prepare albert --input wikitext --tokenizer albert-large-v2 --dataset-config wikitext-103-raw-v1 --output DIR"
    config = load_config(ALBERT, assignments=["task.data.source=prepared", "task.data.path=/mnt/data",
                                              f"task.data.prepare={command}", "task.data.identity=" + "ab" * 32])
    run_wide = mf.manifest_config(config)
    assert run_wide["task"]["data"]["prepare"] == command and run_wide["task"]["data"]["identity"] == "ab" * 32
    assert "path" not in run_wide["task"]["data"]
    assert f"data abababababababab (prepare: {command})" in mf.summary(_signed(run_key, config=run_wide))
