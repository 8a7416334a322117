"""A DHT record validator that ignores what peers outside `network.allowed_peers` write about the run.

hivemind's DHT runs every validator on each record a node is asked to store and on each record it receives in an
answer; a record that fails is neither stored nor returned. This one judges the run's keys where a peer speaks for
itself, by the subkey that names the writer:
- `{run_id}_progress` and swarmd's peer, round and address records: the subkey is a signed `[owner:<public key>]`
  marker; the signature validator has proved the writer holds that key, and since every swarmd peer signs with its
  identity key (swarm/upstream/identity.py), the key gives the peer id. An outsider's progress is not counted, its
  record not shown, its addresses not dialed;
- each averager's matchmaking keys `{prefix}.0b{group bits}` (who may lead a group; DiLoCo's outer rounds carry the
  outer step in 8 group bits, the others none), `{prefix}.all_averagers` and `{prefix}.client_donors` (who may be
  asked for the state, directly or through a forwarder: swarm/upstream/state_forward.py): the subkey is the
  averager's peer id, so this peer never asks an outsider to lead it or to send it the state. Every averager's keys
  come from swarm/averager_keys.py.
Other keys pass untouched. The validator sees keys only as their hashes (DHTID), so it hashes the names it guards.
"""

from __future__ import annotations

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import PeerID
from hivemind.utils import MSGPackSerializer

from swarmd.swarm.allowlist import AllowList
from swarmd.swarm.averager_keys import ALL_SUFFIXES, peer_keyed_names
from swarmd.swarm.upstream.identity import peer_id_of_owner
from swarmd.swarm.peer_records import RECORD_FIELD
from swarmd.swarm.round_records import ROUNDS_FIELD
from swarmd.swarm.address_records import ADDRESSES_FIELD

__all__ = ["AllowListValidator", "guarded_keys"]


def guarded_keys(run_id: str) -> tuple[dict[bytes, str], dict[bytes, str]]:
    """(keys whose subkeys are owner markers, keys whose subkeys are peer ids), as hashed key -> name."""
    owners = [f"{run_id}_{name}" for name in ("progress", RECORD_FIELD, ROUNDS_FIELD, ADDRESSES_FIELD)]
    peers = [name for suffix in ALL_SUFFIXES for name in peer_keyed_names(run_id, suffix)]
    hashed = lambda names: {DHTID.generate(source=name).to_bytes(): name for name in names}  # noqa: E731
    return hashed(owners), hashed(peers)


class AllowListValidator(RecordValidatorBase):
    def __init__(self, run_id: str, allow_list: AllowList):
        self.allow_list = allow_list
        self._owner_keys, self._peer_keys = guarded_keys(run_id)

    def validate(self, record: DHTRecord) -> bool:
        if record.key in self._owner_keys:
            writer = self._owner_of(record.subkey)
        elif record.key in self._peer_keys:
            writer = self._peer_of(record.subkey)
        else:
            return True
        return writer is not None and self.allow_list.admit(writer, "dht_records")

    def sign_value(self, record: DHTRecord) -> bytes:
        return record.value

    def strip_value(self, record: DHTRecord) -> bytes:
        return record.value

    @staticmethod
    def _owner_of(subkey: bytes):
        try:
            markers = RSASignatureValidator._PUBLIC_KEY_RE.findall(MSGPackSerializer.loads(subkey))
            return peer_id_of_owner(markers[0]) if len(markers) == 1 else None
        except Exception:  # noqa: BLE001 - not a key we understand: not an allowed writer
            return None

    @staticmethod
    def _peer_of(subkey: bytes):
        try:
            return PeerID(MSGPackSerializer.loads(subkey)).to_base58()
        except Exception:  # noqa: BLE001
            return None

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._owner_keys) + len(self._peer_keys)} keys)"
