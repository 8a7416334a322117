"""Address records (swarmd/swarm/address_records.py): what a reachable peer publishes of where it is dialed, the
bounds every DHT node checks, and a reader that takes a record only from the peer it names."""

import time

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import ValueWithExpiration
from hivemind.utils.crypto import RSAPrivateKey

from swarmd.status.snapshot import Snapshot
from swarmd.swarm.address_records import (
    MAX_ADDRESSES, AddressRecords, address_record, dialable_addresses, parse_address_records,
)
from swarmd.swarm.upstream.identity import peer_id_of_owner

PUBLIC = "/ip4/198.18.0.2/tcp/31337"


def signer_and_id():
    signer = RSASignatureValidator(RSAPrivateKey())
    marker = RSASignatureValidator._PUBLIC_KEY_RE.findall(signer.local_public_key)[0]
    return signer, peer_id_of_owner(marker)


def test_only_tcp_addresses_another_host_can_dial_are_published_without_their_p2p_part():
    peer = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    maddrs = [f"/ip4/127.0.0.1/tcp/31337/p2p/{peer}", f"{PUBLIC}/p2p/{peer}", f"{PUBLIC}/p2p/{peer}",
              "/ip4/0.0.0.0/tcp/1", "/ip6/::1/tcp/2", "/ip4/198.18.0.2/udp/3/quic", f"{PUBLIC}/p2p/{peer}/p2p-circuit",
              "/dns4/seed.example.org/tcp/31337", "/ip4/not-an-ip/tcp/4"]
    assert dialable_addresses(maddrs) == [PUBLIC, "/dns4/seed.example.org/tcp/31337"]
    many = [f"/ip4/198.18.0.{i}/tcp/31337" for i in range(2, 20)]
    assert dialable_addresses(many) == many[:MAX_ADDRESSES]


def test_a_peer_publishes_where_it_is_dialed_only_when_others_can_dial_it():
    base = dict(run_id="unit-run", peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",
                visible_maddrs=("/ip4/127.0.0.1/tcp/31337", PUBLIC))
    assert address_record(Snapshot(**base, reachability="direct"))["maddrs"] == [PUBLIC]
    for mode in ("client", "unreachable", "unknown", "relay"):
        assert address_record(Snapshot(**base, reachability=mode)) is None, mode
    assert address_record(Snapshot(**{**base, "visible_maddrs": ("/ip4/127.0.0.1/tcp/1",)}, reachability="direct")) is None


@pytest.mark.parametrize("maddrs", [[], ["/ip4/198.18.0.2/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"],
                                    ["/unix/tmp/x"], [PUBLIC] * (MAX_ADDRESSES + 1), ["/ip4/" + "1" * 300 + "/tcp/1"],
                                    [7]])
def test_every_dht_node_refuses_a_record_out_of_bounds(maddrs):
    records = AddressRecords("unit-run")
    validator = CompositeValidator(records.validators)
    signer, peer_id = signer_and_id()
    key = DHTID.generate(source=records.key).to_bytes()

    def accepts(value) -> bool:
        record = DHTRecord(key, DHTProtocol.serializer.dumps(signer.local_public_key),
                           DHTProtocol.serializer.dumps(value), time.time() + 30)
        return validator.validate(DHTRecord(record.key, record.subkey, signer.sign_value(record), record.expiration_time))

    assert accepts({"peer_id": peer_id, "maddrs": [PUBLIC], "time": 1.0})
    assert not accepts({"peer_id": peer_id, "maddrs": maddrs, "time": 1.0})


def test_a_reader_puts_the_named_peers_own_record_first_and_bounds_what_others_add():
    honest, honest_id = signer_and_id()
    liars = [signer_and_id()[0] for _ in range(3)]
    expiration = time.time() + 30
    entries = {
        liar.local_public_key: {"peer_id": honest_id, "maddrs": [f"/ip4/198.18.1.{i}/tcp/{j}" for j in range(8)],
                                "time": 2.0}
        for i, liar in enumerate(liars)
    }
    entries[honest.local_public_key] = {"peer_id": honest_id, "maddrs": [PUBLIC], "time": 1.0}
    entries[b"not an owner"] = {"peer_id": honest_id, "maddrs": [PUBLIC], "time": 1.0}
    entries[liars[0].local_public_key + b"x"] = {"peer_id": "not a peer id", "maddrs": [PUBLIC], "time": 1.0}
    found = ValueWithExpiration({k: ValueWithExpiration(v, expiration) for k, v in entries.items()}, expiration)
    addresses, rejected = parse_address_records(found)
    assert rejected == 2 and list(addresses) == [honest_id]
    assert addresses[honest_id][0] == PUBLIC and len(addresses[honest_id]) == 2 * MAX_ADDRESSES
    assert parse_address_records(None) == ({}, 0)
