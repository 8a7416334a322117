"""Signed peer records: what a DHT node accepts, what a reader shows, and the swarm progress an observer computes.

Validation is run exactly as a hivemind node runs it on a store or on an answer (CompositeValidator over signed
DHTRecords); the end-to-end version with real peers and a rogue node is tests/swarm/test_observe.py.
"""

import time

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import ValueWithExpiration
from hivemind.utils.crypto import RSAPrivateKey

from swarmd.status.snapshot import Snapshot
from swarmd.swarm.peer_records import PeerRecords, parse_records, record_from_snapshot
from swarmd.swarm.progress_records import swarm_progress

PEER_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def snapshot(**changes):
    base = {
        "run_id": "unit-run", "peer_id": PEER_ID, "public_name": "alpha", "swarmd_version": "0.1.0", "task": "swin",
        "device": "cpu", "state": "training", "phase": "training", "local_epoch": 5, "samples_per_second": 80,
        "samples_total": 1000, "loss": 2.25,
        "averaging": {"gradients": {"success": 4, "failed": 1, "skipped": 2}, "state": {"success": 3}},
        "uptime_seconds": 61.5, "client_mode": False, "auxiliary": False, "target_batch_size": 256,
        "start_values": "0:" + "c" * 40,
    }
    return Snapshot(**{**base, **changes})


class Node:
    """Validation as one DHT node does it, with the validators swarmd registers for a run."""

    def __init__(self, run_id="unit-run"):
        self.records = PeerRecords(run_id)
        self.validator = CompositeValidator(self.records.validators)
        self.key = DHTID.generate(source=self.records.key).to_bytes()

    def signed(self, subkey: bytes, value, signer) -> DHTRecord:
        record = DHTRecord(self.key, DHTProtocol.serializer.dumps(subkey), DHTProtocol.serializer.dumps(value),
                           time.time() + 30)
        return DHTRecord(record.key, record.subkey, signer.sign_value(record), record.expiration_time)

    def accepts(self, subkey: bytes, value, signer) -> bool:
        return self.validator.validate(self.signed(subkey, value, signer))


class SignsAnything(RSASignatureValidator):
    """A malicious node's signer: signs whatever it is given with its own key."""

    def sign_value(self, record):
        return record.value + self.SIGNATURE_FORMAT.replace(b"_value_", self._private_key.sign(self._serialize_record(record)))


def test_a_peer_record_from_its_snapshot_is_accepted_when_signed_by_its_owner():
    node = Node()
    record = record_from_snapshot(snapshot(reachable="no", reachability="client"))
    assert record["averaging_success"] == 7 and record["averaging_failed"] == 1
    assert (record["reachable"], record["reachability"]) == ("no", "client")
    assert record_from_snapshot(snapshot(reachability="sideways"))["reachability"] == "unknown"
    assert record["samples_per_second"] == 80.0 and isinstance(record["samples_per_second"], float)
    assert record["target_batch_size"] == 256 and record["state"] == "training"
    assert record["start_values"] == "0:" + "c" * 40
    assert record["excluding"] == []
    assert node.accepts(node.records.owner, record, node.records.signature)
    assert node.accepts(node.records.owner, None, node.records.signature)  # the goodbye


def test_a_record_names_at_most_16_of_the_peers_its_writer_excludes():
    from swarmd.swarm.exclusion import ExcludedPeer

    ids = [f"QmLiar{'a' * 38}{digit}" for digit in "123456789ABCDEFGHJKL"]  # base58: no 0
    excluded = tuple(ExcludedPeer(peer_id, "clipped", 0.0, 60.0, 3, 3, 0, 1) for peer_id in ids)
    record = record_from_snapshot(snapshot(excluded_peers=excluded))
    assert record["excluding"] == ids[:16]
    node = Node()
    assert node.accepts(node.records.owner, record, node.records.signature)


def test_nobody_can_write_under_another_peers_key():
    node = Node()
    intruder = SignsAnything(RSAPrivateKey())
    forged = record_from_snapshot(snapshot(public_name="forged", local_epoch=10**6))
    assert not node.accepts(node.records.owner, forged, intruder)  # a signature by the wrong key
    unsigned = RSASignatureValidator(RSAPrivateKey())  # signs only under its own key: leaves this one unsigned
    assert not node.accepts(node.records.owner, forged, unsigned)
    assert not node.accepts(node.records.owner, None, intruder)  # nor delete it
    assert node.accepts(intruder.local_public_key, forged, intruder)  # its own record, yes (it is signed)


@pytest.mark.parametrize(
    "change",
    [
        {"local_epoch": "5"}, {"local_epoch": 5.0}, {"local_epoch": -1}, {"samples_per_second": 80},
        {"loss": float("nan")}, {"peer_id": "not a peer id!"}, {"public_name": ""}, {"public_name": "x" * 65},
        {"client_mode": 1}, {"target_batch_size": 0}, {"unknown_field": 1}, {"start_values": "0:" + "f" * 63},
        {"reachable": "<b>yes</b>"}, {"reachability": "teleport"},
        {"excluding": ["<script>"]}, {"excluding": ["Qm" + "a" * 44] * 17}, {"excluding": "QmLiar"},
    ],
)
def test_malformed_records_are_refused(change):
    node = Node()
    owner = SignsAnything(RSAPrivateKey())
    record = {**record_from_snapshot(snapshot()), **change}
    assert not node.accepts(owner.local_public_key, record, owner)


def test_missing_fields_and_non_dict_values_are_refused():
    node = Node()
    owner = SignsAnything(RSAPrivateKey())
    record = record_from_snapshot(snapshot())
    del record["loss"]
    assert not node.accepts(owner.local_public_key, record, owner)
    assert not node.accepts(owner.local_public_key, ["a", "list"], owner)
    assert not node.accepts(owner.local_public_key, "garbage", owner)


def found(entries: dict) -> ValueWithExpiration:
    expiration = time.time() + 30
    return ValueWithExpiration({k: ValueWithExpiration(v, expiration) for k, v in entries.items()}, expiration)


def test_a_reader_skips_what_is_not_a_record_without_raising():
    mine = RSASignatureValidator(RSAPrivateKey()).local_public_key
    theirs = RSASignatureValidator(RSAPrivateKey()).local_public_key
    now = time.time()
    good = record_from_snapshot(snapshot(), now=now - 3)
    peers, rejected = parse_records(
        found({
            mine: good,
            theirs: {**good, "peer_id": "QmcNFS8LmrN8bPVKQSBqWDaiy5RMnBUaqmvpQKjuDjiXwV", "public_name": "beta"},
            b"[owner:not-a-key]x": "garbage",
            b"no owner marker": good,
            "a str subkey": good,
            RSASignatureValidator(RSAPrivateKey()).local_public_key: {**good, "local_epoch": "five"},
            RSASignatureValidator(RSAPrivateKey()).local_public_key: None,  # said goodbye: not shown, not an error
        }),
        own_subkey=mine,
        now=now,
    )
    assert [p["public_name"] for p in peers] == ["alpha", "beta"]
    assert [p["self"] for p in peers] == [True, False]
    assert peers[0]["last_seen_seconds"] == pytest.approx(3, abs=0.01)
    assert rejected == 4
    for nothing in (None, ValueWithExpiration("a regular value", now + 30), ValueWithExpiration([1, 2], now + 30)):
        assert parse_records(nothing, now=now) == ([], 0)


def progress_entry(epoch, samples, rate, at, client_mode=False):
    return {"peer_id": b"x", "epoch": epoch, "samples_accumulated": samples, "samples_per_second": rate,
            "time": at, "client_mode": client_mode}


def test_swarm_progress_as_an_observer_sees_it():
    now = 1000.0
    keys = [RSASignatureValidator(RSAPrivateKey()).local_public_key for _ in range(4)]
    progress = swarm_progress(
        found({
            keys[0]: progress_entry(7, 40, 10.0, now),
            keys[1]: progress_entry(7, 20, 10.0, now - 2),  # +20 samples since it reported
            keys[2]: progress_entry(6, 90, 5.0, now, client_mode=True),  # behind: not counted towards epoch 7
            keys[3]: None,
        }),
        target_batch_size=128,
        now=now,
    )
    assert progress["global_epoch"] == 7 and progress["samples_accumulated"] == 60
    assert progress["num_peers"] == 3 and progress["num_clients"] == 1
    assert progress["samples_per_second"] == 25.0
    assert progress["eta_seconds"] == pytest.approx((128 - 80) / 25.0)
    empty = swarm_progress(None, target_batch_size=None, now=now)
    assert empty["global_epoch"] is None and empty["num_peers"] == 0
