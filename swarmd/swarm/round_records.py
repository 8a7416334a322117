"""The flight recorder in the DHT: each peer's recent averaging rounds, signed, so a page can draw one round across
the peers that took part (who matched whom, who was late, where the time went).

Every peer that averages stores one record under `"{run_id}_swarmd_rounds_v2"`, subkey = its owner marker, beside
its peer record (swarm/peer_records.py: the same two validators, the same signing key, the same announcer). A
record is the timelines (swarm/averaging_log.py RoundTimeline) of the peer's last ROUNDS rounds that had a group to
look for. Everything in it is a stranger's word: the schema bounds every field on the nodes that store it, and a
reader parses it again (`parse_round_records`), counting and skipping what does not fit. Times are the writer's
clock (unix seconds): peers whose clocks disagree draw their lanes shifted, which the page says.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from hivemind.dht.schema import BytesWithPublicKey
from hivemind.utils import get_dht_time
from pydantic.v1 import BaseModel, Extra, Field, confloat, conint, conlist, constr

from swarmd.swarm.averaging_log import MAX_GROUP_PEERS
from swarmd.swarm.outcomes import KINDS, OUTCOMES
from swarmd.swarm.peer_records import PEER_ID_PATTERN, OwnedRecords, owned_entries

__all__ = [
    "ROUNDS_FIELD", "ROUNDS", "PublishedRound", "RoundsRecord", "RoundRecordsSchema", "RoundRecords",
    "rounds_record_from_snapshot", "parse_round_records",
]

# v2: each round carries its all-reduce's bytes (v1 records and v2 peers would refuse each other's as malformed)
ROUNDS_FIELD = "swarmd_rounds_v2"
ROUNDS = 8  # rounds per record: the last few epochs of a peer; a record stays a few kB
GROUP_PEERS = min(16, MAX_GROUP_PEERS)  # group members a published round names (the page draws that many lanes)

_TIME = confloat(strict=True, ge=0.0, allow_inf_nan=False)
_BYTES = conint(strict=True, ge=0, le=2**50)  # a petabyte: far above any round, and exact in a float


class PublishedRound(BaseModel):
    kind: constr(strict=True, regex="^(" + "|".join(KINDS) + ")$")
    outcome: constr(strict=True, regex="^(" + "|".join(OUTCOMES) + ")$")
    epoch: conint(strict=True, ge=0)
    group_size: conint(strict=True, ge=1, le=100_000)
    asked_at: Optional[_TIME]
    grouped_at: Optional[_TIME]
    reduced_at: Optional[_TIME]
    ended_at: _TIME
    peers: conlist(constr(strict=True, regex=PEER_ID_PATTERN), max_items=GROUP_PEERS)
    # the all-reduce's bytes on this peer (swarm/upstream/round_traffic.py); null where they were not counted.
    # Required, null or not: hivemind's SchemaValidator refuses a record that parses into more than it holds
    sent_bytes: Optional[_BYTES] = Field(...)
    received_bytes: Optional[_BYTES] = Field(...)

    class Config:
        extra = Extra.forbid


class RoundsRecord(BaseModel):
    peer_id: constr(strict=True, regex=PEER_ID_PATTERN)
    rounds: conlist(PublishedRound, max_items=ROUNDS)
    time: confloat(strict=True, allow_inf_nan=False)  # DHT time of publication

    class Config:
        extra = Extra.forbid


class RoundRecordsSchema(BaseModel):
    swarmd_rounds_v2: Dict[BytesWithPublicKey, Optional[RoundsRecord]]  # its name is the key: ROUNDS_FIELD


class RoundRecords(OwnedRecords):
    """A run's round records: the key, the validators, publishing and reading (as swarm/peer_records.py)."""

    def __init__(self, run_id: str, *, expiration: float = 30.0):
        super().__init__(run_id, ROUNDS_FIELD, RoundRecordsSchema, expiration=expiration)


def rounds_record_from_snapshot(snapshot, now: Optional[float] = None) -> Optional[dict[str, Any]]:
    """This peer's record of its last ROUNDS rounds with a timeline; None when it has none to publish yet."""
    rounds = []
    for item in snapshot.recent_averaging:
        timeline = item.timeline
        if timeline is None or item.kind not in KINDS or item.outcome not in OUTCOMES:
            continue
        rounds.append({
            "kind": item.kind, "outcome": item.outcome, "epoch": max(0, int(item.epoch)),
            "group_size": max(1, int(item.group_size)),
            "asked_at": _time(timeline.asked_at), "grouped_at": _time(timeline.grouped_at),
            "reduced_at": _time(timeline.reduced_at), "ended_at": _time(timeline.ended_at) or 0.0,
            "peers": [str(peer) for peer in timeline.peers[:GROUP_PEERS]],
            "sent_bytes": _bytes(timeline.sent_bytes), "received_bytes": _bytes(timeline.received_bytes),
        })
    if not rounds or not snapshot.peer_id:
        return None
    record = {"peer_id": str(snapshot.peer_id), "rounds": rounds[-ROUNDS:],
              "time": float(get_dht_time() if now is None else now)}
    RoundsRecord.parse_obj(record)  # fail here, with the field named, rather than silently in the DHT
    return record


def parse_round_records(found) -> tuple[list[dict[str, Any]], int]:
    """The valid round records of a `dht.get` result, as plain dicts; and how many were rejected. Never raises on
    what peers stored."""
    valid, rejected = owned_entries(found, RoundsRecord)
    records = sorted((record for _, record in valid), key=lambda record: record["peer_id"])
    return records, rejected


def _time(value) -> Optional[float]:
    return None if value is None else max(0.0, float(value))



def _bytes(value) -> Optional[int]:
    return None if value is None else min(max(0, int(value)), 2**50)
