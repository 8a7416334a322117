"""Every change swarmd makes to hivemind's process-wide state, in one place (tests/unit/test_hivemind_contract.py
fences the names they write).

- The signing key: hivemind signs protected DHT records with one process-wide RSA key that it generates at random;
  a private swarm makes the peer's identity key that key, so a record names its writer (swarm/upstream/identity.py).
- The 8-bit codecs: hivemind encodes and decodes each compression type through one module-level table; swarmd's
  codecs replace hivemind's 8-bit ones there, which fail to decode under NumPy 2 (swarm/upstream/quantization.py).
Both happen before hivemind forks its DHT and averager processes, which inherit them.
"""

from __future__ import annotations

from typing import Mapping

from hivemind.compression import serialization
from hivemind.utils.crypto import RSAPrivateKey

__all__ = ["register_codecs", "sign_records_with"]


def sign_records_with(key: RSAPrivateKey) -> None:
    """Make `key` the key hivemind signs this process's DHT records with; RuntimeError if another key already
    signs (a validator made before the identity was loaded: its records would not name this peer)."""
    current = RSAPrivateKey._process_wide_key
    if current is not None and current.to_bytes() != key.to_bytes():
        raise RuntimeError("hivemind's process-wide key was created before the identity was loaded")
    RSAPrivateKey._process_wide_key = key


def register_codecs(codecs: Mapping[str, object]) -> None:
    """Make hivemind encode and decode the compression types named (runtime_pb2.CompressionType names) with these
    codecs, in this process and its forks."""
    for name, codec in codecs.items():
        serialization._BASE_COMPRESSION_TYPES[name] = codec
