"""Where the swarm's reachable peers can be dialed, in the DHT: so that every peer can open a connection to each of
them, not only to its initial peers.

Why (issue 33, measured in the router lab with benchmarks/home_swarm.py): p2pd finds a peer it is not connected to
through libp2p's Kademlia (`routing: not found` when that fails), and in the lab it did not find the swarm's other
public peers: a home peer (a client) whose only connection was its initial peer could not send its parts to a second
public reducer, and its gradient rounds returned about half of the average. hivemind's own DHT carries peer ids,
no addresses.

Every peer that others can dial (reachability `direct`, swarm/reachability.py) stores the TCP addresses it announces
under `"{run_id}_swarmd_addrs_v1"`, subkey = its owner marker, beside its peer record (swarm/peer_records.py: the
same validators, key and announcer). Each peer then dials the recorded peers it is not connected to
(swarm/upstream/dialer.py). An address is a stranger's word: the schema bounds the record (MAX_ADDRESSES addresses
of TCP over IP or DNS, no loopback, no /p2p/ part) on the nodes that store it, the reader parses it again, and a dial
authenticates the peer id, so an address that leads elsewhere fails its handshake. A peer dials at most MAX_DIALS
peers per announce and each peer at most once per REDIAL_SECONDS.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, Optional

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey
from hivemind.utils import get_dht_time
from pydantic.v1 import BaseModel, Extra, confloat, conlist, constr

from swarmd.swarm.peer_records import PEER_ID_PATTERN, OwnedRecords, owned_entries
from swarmd.swarm.reachability import tcp_endpoint

__all__ = [
    "ADDRESSES_FIELD", "AddressRecord", "AddressRecords", "MAX_ADDRESSES", "address_record", "dialable_addresses",
    "parse_address_records",
]

ADDRESSES_FIELD = "swarmd_addrs_v1"
MAX_ADDRESSES = 8
# /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>: what p2pd dials over TCP; no /p2p/ part (hivemind writes it as a CID
# that p2pd misreads, docs/NAT.md), no relay circuit
ADDRESS_PATTERN = r"^/(ip4|ip6|dns|dns4|dns6)/[A-Za-z0-9.:-]{1,253}/tcp/[0-9]{1,5}$"


class AddressRecord(BaseModel):
    peer_id: constr(strict=True, regex=PEER_ID_PATTERN)
    maddrs: conlist(constr(strict=True, regex=ADDRESS_PATTERN, max_length=300), min_items=1, max_items=MAX_ADDRESSES)
    time: confloat(strict=True, allow_inf_nan=False)  # DHT time of publication

    class Config:
        extra = Extra.forbid


class AddressRecordsSchema(BaseModel):
    swarmd_addrs_v1: Dict[BytesWithPublicKey, Optional[AddressRecord]]  # its name is the key: ADDRESSES_FIELD


class AddressRecords(OwnedRecords):
    """A run's address records: the key, the validators, publishing and reading (as swarm/peer_records.py)."""

    def __init__(self, run_id: str, *, expiration: float = 30.0):
        super().__init__(run_id, ADDRESSES_FIELD, AddressRecordsSchema, expiration=expiration)


def dialable_addresses(maddrs) -> list[str]:
    """The TCP addresses among `maddrs` (strings or Multiaddrs) that another host could dial: without their /p2p/
    part, no loopback or unspecified host, no relay circuit; at most MAX_ADDRESSES, in order, without repeats."""
    found = []
    for maddr in map(str, maddrs):
        address = maddr.split("/p2p/")[0]
        endpoint = tcp_endpoint(address)
        if endpoint is None or _local(address.split("/")[1], endpoint[0]):
            continue
        if address not in found and re.match(ADDRESS_PATTERN, address):
            found.append(address)
    return found[:MAX_ADDRESSES]


def address_record(snapshot, now: Optional[float] = None) -> Optional[dict[str, Any]]:
    """This peer's record, when others can dial it (reachability `direct`) at some address; None otherwise."""
    if snapshot.reachability != "direct" or not snapshot.peer_id:
        return None
    maddrs = dialable_addresses(snapshot.visible_maddrs)
    if not maddrs:
        return None
    record = {"peer_id": str(snapshot.peer_id), "maddrs": maddrs, "time": float(get_dht_time() if now is None else now)}
    AddressRecord.parse_obj(record)
    return record


def parse_address_records(found) -> tuple[dict[str, list[str]], int]:
    """peer id -> addresses of the valid records in a `dht.get` result (at most 2 * MAX_ADDRESSES each); and how
    many were rejected. The records signed by the key of the peer they name come first: in a private swarm the
    signing key is the peer's identity (swarm/upstream/identity.py); in an open one it is a random key, and a record
    may name any peer. Either way a dial authenticates the peer id, so a wrong address costs a failed dial."""
    valid, rejected = owned_entries(found, AddressRecord)
    valid.sort(key=lambda entry: _peer_id_of(entry[0]) != entry[1]["peer_id"])  # the peer's own records first
    addresses: dict[str, list[str]] = {}
    for _, record in valid:
        known = addresses.setdefault(record["peer_id"], [])
        known.extend(m for m in record["maddrs"] if m not in known and len(known) < 2 * MAX_ADDRESSES)
    return addresses, rejected


def _peer_id_of(owner: bytes) -> Optional[str]:
    from swarmd.swarm.upstream.identity import peer_id_of_owner

    markers = RSASignatureValidator._PUBLIC_KEY_RE.findall(owner)
    try:
        return peer_id_of_owner(markers[0]) if len(markers) == 1 else None
    except Exception:  # noqa: BLE001 - not a key we understand
        return None


def _local(protocol: str, host: str) -> bool:
    if protocol not in ("ip4", "ip6"):
        return host == "localhost"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True
    return address.is_loopback or address.is_unspecified or address.is_multicast
