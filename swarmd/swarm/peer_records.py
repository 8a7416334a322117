"""Signed per-peer records in the DHT: who is in the swarm and what each peer is doing.

Every training (or auxiliary) peer stores one record under the run's key `"{run_id}_swarmd_peers_v4"`, subkey =
its owner marker `[owner:<RSA public key>]`. Two hivemind validators guard the key on every node that stores or
reads it:
- `RSASignatureValidator`: a record whose subkey names a public key must be signed with the matching private key,
  so no peer can write, change or delete another peer's record;
- `SchemaValidator(PeerRecordsSchema, prefix=run_id)`: values must match `PeerRecord` exactly (strict types, no
  missing or extra fields), so a malformed record is refused by the nodes asked to store it, and a node that
  answers a reader with one has its whole answer dropped by the reader.
The signing key is hivemind's process-wide key, the one the progress tracker signs with: the DHT keeps the first
RSASignatureValidator it is given and merges the others into it, so it must be the same key. A reader parses each
record again (`parse_records`), so a record from a node without our validators cannot break it either.

The key carries a version: nodes refuse fields they do not know, so changing the fields needs a new key.
What is signed is who wrote a record, not what it claims: `peer_id` and `public_name` are the writer's word.

This module imports hivemind (the daemon and `swarmd status --initial-peers` use it; a local `swarmd status` not).
The swarm's progress as an observer reads it from hivemind's own records is swarm/progress_records.py.
"""

from __future__ import annotations

import math
import socket
from collections import Counter
from typing import Any, Dict, Iterable, Optional

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.utils import get_dht_time
from pydantic.v1 import BaseModel, Extra, StrictBool, ValidationError, confloat, conint, conlist, constr

from swarmd import __version__
from swarmd.swarm.outcomes import FAILED_OUTCOMES
from swarmd.swarm.reachability_states import REACHABILITY_MODES, REACHABILITY_STATES

__all__ = [
    "RECORD_FIELD",
    "PeerRecord",
    "PeerRecordsSchema",
    "PeerRecords",
    "record_from_snapshot",
    "parse_records",
    "entries",
    "owned_entries",
    "common_target_batch_size",
]

RECORD_FIELD = "swarmd_peers_v4"  # v2: the compatibility fields; v3: start_values; v4: reachable, reachability
PEER_ID_PATTERN = r"^[1-9A-HJ-NP-Za-km-z]{16,128}$"  # base58
MAX_EXCLUDING = 16  # excluded peers a record names (the soonest to end first): the pages show "excluded by N peers"


class PeerRecord(BaseModel):
    """What one peer says about itself. Strict types: hivemind's SchemaValidator refuses any conversion."""

    peer_id: constr(strict=True, regex=PEER_ID_PATTERN)
    public_name: constr(strict=True, min_length=1, max_length=64)
    swarmd_version: constr(strict=True, max_length=32)
    task: constr(strict=True, max_length=64)
    device: constr(strict=True, max_length=32)
    state: constr(strict=True, max_length=16)  # the worker's phase: training, assisting, joining, ...
    local_epoch: conint(strict=True, ge=0)
    samples_per_second: confloat(strict=True, ge=0.0, allow_inf_nan=False)
    samples_total: conint(strict=True, ge=0)
    loss: Optional[confloat(strict=True, allow_inf_nan=False)]
    averaging_success: conint(strict=True, ge=0)
    averaging_failed: conint(strict=True, ge=0)
    uptime_seconds: confloat(strict=True, ge=0.0, allow_inf_nan=False)
    client_mode: StrictBool
    auxiliary: StrictBool
    target_batch_size: conint(strict=True, ge=1)
    # what peers must agree on (swarm/compatibility.py); 0 and "" while this peer's model is not built yet
    protocol: conint(strict=True, ge=0)
    parameters: conint(strict=True, ge=0)
    model_fingerprint: constr(strict=True, max_length=64)
    strategy: constr(strict=True, max_length=16)
    inner_steps: conint(strict=True, ge=0)
    # "<epoch>:<hash>" of the parameter values this peer started training from (swarm/initial_state.py); "" before
    start_values: constr(strict=True, max_length=64)
    # can other peers dial it, and how they reach it (swarm/reachability.py; status/snapshot.py REACHABILITY_*)
    reachable: constr(strict=True, regex="^(" + "|".join(REACHABILITY_STATES) + ")$")
    reachability: constr(strict=True, regex="^(" + "|".join(REACHABILITY_MODES) + ")$")
    # the peers this one excludes now on evidence (swarm/exclusion.py), at most MAX_EXCLUDING: its word, shown as
    # such (no peer acts on another's exclusions)
    excluding: conlist(constr(strict=True, regex=PEER_ID_PATTERN), max_items=MAX_EXCLUDING)
    time: confloat(strict=True, allow_inf_nan=False)  # DHT time of publication

    class Config:
        extra = Extra.forbid


class PeerRecordsSchema(BaseModel):
    swarmd_peers_v4: Dict[BytesWithPublicKey, Optional[PeerRecord]]  # None: the peer said goodbye


class OwnedRecords:
    """A run's dictionary key of signed records, one per peer under its owner marker: the key, the validators,
    publishing and reading. The peer records here, the round and address records (swarm/round_records.py,
    swarm/address_records.py) beside them."""

    def __init__(self, run_id: str, field: str, schema, *, expiration: float = 30.0):
        self.run_id = run_id
        self.key = f"{run_id}_{field}"
        self.expiration = expiration
        # hivemind's process-wide key: the same one the progress tracker signs with (see the module docstring)
        self.signature = RSASignatureValidator()
        self.validators = [SchemaValidator(schema, prefix=run_id), self.signature]

    @property
    def owner(self) -> bytes:
        """This process's subkey: `[owner:<public key>]`; the DHT signs what is stored under it."""
        return self.signature.local_public_key

    def publish(self, dht, record: Optional[dict[str, Any]]):
        """Store (or, with None, withdraw) this peer's record. Returns an awaitable MPFuture (never blocks)."""
        return dht.store(
            key=self.key,
            subkey=self.owner,
            value=record,
            expiration_time=get_dht_time() + self.expiration,
            return_future=True,
        )

    def fetch(self, dht):
        """An MPFuture of the raw DHT value (None, or a ValueWithExpiration of {subkey: ValueWithExpiration})."""
        return dht.get(self.key, latest=True, return_future=True)


class PeerRecords(OwnedRecords):
    """This process's view of a run's records: the key, the validators, publishing and reading."""

    def __init__(self, run_id: str, *, expiration: float = 30.0):
        super().__init__(run_id, RECORD_FIELD, PeerRecordsSchema, expiration=expiration)

    def parse(self, found, now: Optional[float] = None) -> tuple[list[dict[str, Any]], int]:
        return parse_records(found, own_subkey=self.owner, now=now)


def record_from_snapshot(snapshot, now: Optional[float] = None) -> dict[str, Any]:
    """This peer's record, from its status snapshot (status/snapshot.py Snapshot): every field present, with the
    exact types the schema wants. `averaging_failed` counts every round whose average was not used although one
    was due (swarm/outcomes.py FAILED_OUTCOMES: failed, rejected, ...); skipped rounds (alone) count in neither."""
    s = snapshot
    compatibility = s.compatibility or {}
    record = {
        "peer_id": str(s.peer_id),
        "public_name": _clip(s.public_name or socket.gethostname() or "peer", 64),
        "swarmd_version": _clip(s.swarmd_version or __version__, 32),
        "task": _clip(str(s.task or ""), 64),
        "device": _clip(str(s.device or ""), 32),
        "state": _clip(str(s.phase or s.state or ""), 16),
        "local_epoch": int(s.local_epoch or 0),
        "samples_per_second": _finite(s.samples_per_second, 0.0),
        "samples_total": int(s.samples_total or 0),
        "loss": _finite(s.loss, None) if s.loss is not None else None,
        "averaging_success": s.averaging_total({"success"}),
        "averaging_failed": s.averaging_total(FAILED_OUTCOMES),
        "uptime_seconds": _finite(s.uptime_seconds, 0.0),
        "client_mode": bool(s.client_mode),
        "auxiliary": bool(s.auxiliary),
        "target_batch_size": max(1, int(s.target_batch_size or 1)),
        "protocol": int(compatibility.get("protocol", 0)),
        "parameters": int(compatibility.get("parameters", 0)),
        "model_fingerprint": str(compatibility.get("model_fingerprint", "")),
        "strategy": str(compatibility.get("strategy", "")),
        "inner_steps": int(compatibility.get("inner_steps", 0)),
        "start_values": _clip(str(s.start_values or ""), 64),
        "reachable": s.reachable if s.reachable in REACHABILITY_STATES else "unknown",
        "reachability": s.reachability if s.reachability in REACHABILITY_MODES else "unknown",
        "excluding": [str(excluded.peer_id) for excluded in s.excluded_peers][:MAX_EXCLUDING],
        "time": float(get_dht_time() if now is None else now),
    }
    PeerRecord.parse_obj(record)  # fail here, with the field named, rather than silently in the DHT
    return record


def parse_records(found, *, own_subkey: Optional[bytes] = None, now: Optional[float] = None) -> tuple[list[dict], int]:
    """The valid records in a `dht.get` result, as plain dicts sorted by name; and how many were rejected.

    Never raises on what peers stored: anything that is not a well-formed record is counted and skipped.
    """
    now = get_dht_time() if now is None else now
    valid, rejected = owned_entries(found, PeerRecord)
    peers = []
    for subkey, record in valid:
        record["last_seen_seconds"] = round(max(0.0, now - record["time"]), 3)
        record["self"] = own_subkey is not None and subkey == own_subkey
        peers.append(record)
    peers.sort(key=lambda p: (p["public_name"], p["peer_id"]))
    return peers, rejected


def owned_entries(found, schema) -> tuple[list[tuple[bytes, dict]], int]:
    """(subkey, the value as a plain dict) for each entry of a `dht.get` result whose subkey is an owner marker and
    whose value parses as `schema` (a pydantic model); and how many were rejected. Goodbyes (None) are neither.
    The records of the run's dictionary keys (peer records, swarm/round_records.py) are read through this."""
    valid, rejected = [], 0
    for subkey, value in entries(found):
        if value is None:
            continue  # a goodbye
        try:
            if not isinstance(subkey, bytes) or not RSASignatureValidator._PUBLIC_KEY_RE.search(subkey):
                raise ValueError("the subkey is not an owner marker")
            valid.append((subkey, schema.parse_obj(value).dict()))
        except (ValidationError, ValueError, TypeError):
            rejected += 1
    return valid, rejected


def entries(found) -> list[tuple[Any, Any]]:
    """(subkey, value) pairs of a `dht.get` result of a dictionary key."""
    value = getattr(found, "value", None)
    if not isinstance(value, dict):
        return []
    return [(subkey, getattr(item, "value", None)) for subkey, item in value.items()]


def common_target_batch_size(peers: Iterable[dict[str, Any]]) -> Optional[int]:
    """The target batch size most records agree on (peers of one run should all have the same)."""
    counts = Counter(peer["target_batch_size"] for peer in peers)
    return counts.most_common(1)[0][0] if counts else None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _finite(value, default):
    if value is None:
        return default
    value = float(value)
    return value if math.isfinite(value) else default

