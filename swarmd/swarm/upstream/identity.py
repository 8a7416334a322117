"""One key per peer: the libp2p identity (its peer id) also signs its DHT records, so a record names its peer.

hivemind signs protected DHT records (`[owner:<RSA public key>]` subkeys: progress, swarmd peer records) with a
process-wide RSA key that it generates at random, unrelated to the p2pd identity: a record then proves only that
its writer holds some key, not which peer wrote it. A private swarm must know who wrote a record, so the daemon
makes the identity key (state dir `identity.key`, an RSA key as p2pd reads it) hivemind's process-wide key before
any signature validator exists; `peer_id_of_owner` then turns a record's owner marker back into a peer id, the
way libp2p derives a peer id from a public key.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from hivemind.p2p import P2P, PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from swarmd.swarm.upstream.process_patches import sign_records_with

__all__ = ["load_or_create_identity", "created_here", "peer_id_of_owner"]

_created: set[str] = set()


def load_or_create_identity(path: Path) -> str:
    """Make `path`'s key (created as hivemind would, if missing) this process's signing key; its peer id."""
    path = Path(path)
    if not path.exists():
        P2P.generate_identity(str(path))
        _created.add(str(path))
    data = path.read_bytes()
    key_data = crypto_pb2.PrivateKey.FromString(data).data
    key = RSAPrivateKey.__new__(RSAPrivateKey)  # RSAPrivateKey() would generate a fresh key
    key._private_key = serialization.load_der_private_key(key_data, password=None)
    sign_records_with(key)
    return PeerID.from_identity(data).to_base58()


def created_here(path: Path) -> bool:
    """True if this process created the identity: nobody else can be using it (hivemind's check can be skipped)."""
    return str(Path(path)) in _created


@lru_cache(maxsize=4096)
def peer_id_of_owner(public_key: bytes) -> str:
    """The peer id of an RSA public key as an owner marker carries it (OpenSSH format); raises ValueError."""
    key = RSAPublicKey.from_bytes(public_key)._public_key
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return PeerID(b"\x12\x20" + hashlib.sha256(encoded).digest()).to_base58()  # multihash: sha2-256, 32 bytes
