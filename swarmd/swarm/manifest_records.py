"""The run's manifest in the DHT: where it is stored, the validator that guards it, and reading it back.

Key `"{run_id}_swarmd_manifest_v1"`, subkey `"<key fingerprint>:<version>"`, value the signed envelope
(swarm/manifest.py). One subkey per key and version, so that a peer still serving an older version never
overwrites a newer one: a reader takes the newest version under the key it trusts. Every peer of the run stores
it again every minute (expiring after five), so the manifest lives as long as the run has peers.
Key `"swarmd_runs_v1"`, subkey a run id, value its key's fingerprint: which runs the swarm's peers serve, for a
joiner that names none.

The validator refuses to store (and drops from answers) a manifest entry that does not decode, is not signed by
the key its subkey names, is for another run, or, once this peer trusts a key, is signed by another. Nodes of
other runs and plain hivemind peers store whatever they are given, so a reader checks everything again
(`choose`).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarmd.config.names import is_run_id
from swarmd.swarm.manifest import Choice, Manifest, choose, decode
from swarmd.swarm.peer_records import entries

__all__ = ["MANIFEST_FIELD", "RUNS_KEY", "manifest_key", "ManifestValidator", "publish", "read_choice", "read_runs"]

logger = logging.getLogger("swarmd.manifest")

MANIFEST_FIELD = "swarmd_manifest_v1"
RUNS_KEY = "swarmd_runs_v1"
MAX_RUNS = 32  # run ids read from one answer; the rest are not listed


def manifest_key(run_id: str) -> str:
    return f"{run_id}_{MANIFEST_FIELD}"


def subkey_of(manifest: Manifest) -> str:
    return f"{manifest.fingerprint}:{manifest.version}"


class ManifestValidator(RecordValidatorBase):
    def __init__(self, run_id: str, pinned: Optional[str]):
        self.run_id = run_id
        self.pinned = pinned
        self.rejected = 0  # counted in the process that validates (the DHT's)
        self._manifest_key = DHTID.generate(source=manifest_key(run_id)).to_bytes()
        self._runs_key = DHTID.generate(source=RUNS_KEY).to_bytes()

    def validate(self, record: DHTRecord) -> bool:
        if record.key == self._manifest_key:
            ok = self._valid_manifest(record)
        elif record.key == self._runs_key:
            ok = self._valid_run_entry(record)
        else:
            return True
        self.rejected += not ok
        return ok

    def _valid_manifest(self, record: DHTRecord) -> bool:
        try:
            subkey, value = MSGPackSerializer.loads(record.subkey), MSGPackSerializer.loads(record.value)
            manifest = decode(value, run_id=self.run_id)
        except Exception:  # noqa: BLE001 - whatever a peer sent (BadManifest, msgpack errors): not the manifest
            return False
        return subkey == subkey_of(manifest) and (self.pinned is None or manifest.fingerprint == self.pinned)

    @staticmethod
    def _valid_run_entry(record: DHTRecord) -> bool:
        try:
            subkey, value = MSGPackSerializer.loads(record.subkey), MSGPackSerializer.loads(record.value)
        except Exception:  # noqa: BLE001
            return False
        return isinstance(subkey, str) and is_run_id(subkey) and isinstance(value, str) and len(value) == 64

    def sign_value(self, record: DHTRecord) -> bytes:
        return record.value

    def strip_value(self, record: DHTRecord) -> bytes:
        return record.value

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.run_id})"


def publish(dht, manifest: Manifest, *, expiration: float) -> list:
    """Store the manifest and the run's entry in the list of runs; awaitable MPFutures (never blocks)."""
    until = get_dht_time() + expiration
    return [
        dht.store(manifest_key(manifest.run_id), manifest.envelope, until, subkey=subkey_of(manifest),
                  return_future=True),
        dht.store(RUNS_KEY, manifest.fingerprint, until, subkey=manifest.run_id, return_future=True),
    ]


def read_choice(dht, run_id: str, pinned: Optional[str], timeout: float) -> Choice:
    """The run's manifests as the DHT has them now, chosen (swarm/manifest.py `choose`); blocks up to `timeout`."""
    found = dht.get(manifest_key(run_id), latest=True, return_future=True).result(timeout=timeout)
    return choose(entries(found), run_id, pinned)


def read_runs(dht, timeout: float) -> list[str]:
    """The run ids peers say they serve a manifest for (bounded, checked, sorted)."""
    found = dht.get(RUNS_KEY, latest=True, return_future=True).result(timeout=timeout)
    runs = {subkey for subkey, value in entries(found)[:MAX_RUNS]
            if isinstance(subkey, str) and is_run_id(subkey) and isinstance(value, str)}
    return sorted(runs)


def describe_ignored(choice: Choice) -> str:
    parts = [(choice.malformed, "malformed or forged"), (choice.other_key, "signed by another key"),
             (choice.older, "older")]
    return ", ".join(f"{count} {what}" for count, what in parts if count)


def as_dict(manifest: Manifest) -> dict[str, Any]:
    """What `swarmd run show --json` prints."""
    return {"run_id": manifest.run_id, "version": manifest.version, "created": manifest.created,
            "protocol": manifest.protocol, "swarmd_versions": manifest.swarmd_versions,
            "key_fingerprint": manifest.fingerprint, "config": manifest.config}
