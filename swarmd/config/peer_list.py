"""`network.allowed_peers`: peer ids, given as a list or as a file of them; read and checked here.

Used by the config's validation (a bad id or an unreadable file is a config error naming the key) and by the
private swarm's reload on SIGHUP (swarm/private.py). No torch or hivemind import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

__all__ = ["AllowListError", "check_peer_id", "parse_peer_list", "read_allowed_peers"]

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class AllowListError(ValueError):
    """The setting cannot be used: a malformed peer id, or a file that cannot be read."""


def check_peer_id(text: str) -> str:
    """A libp2p peer id in base58 (a multihash: `Qm...` for RSA keys, `12D3KooW...` for ed25519); raises ValueError."""
    if not text or any(char not in _B58 for char in text):
        raise ValueError(f"{text!r} is not a peer id (base58, like the /p2p/... part of a peer's address)")
    number = 0
    for char in text:
        number = number * 58 + _B58.index(char)
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    raw = b"\0" * (len(text) - len(text.lstrip("1"))) + raw  # base58 writes leading zero bytes as '1'
    # a multihash: <hash code> <digest length> <digest>
    if len(raw) < 3 or raw[1] != len(raw) - 2:
        raise ValueError(f"{text!r} is not a peer id (not a multihash; copy it from the peer's /p2p/... address)")
    return text


def parse_peer_list(text: str, source: str) -> frozenset[str]:
    """The peer ids of a list file: one per line; blank lines and `#` comments are ignored."""
    peers = set()
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            peers.add(check_peer_id(entry))
        except ValueError as e:
            raise AllowListError(f"{source}, line {number}: {e}") from None
    return frozenset(peers)


def read_allowed_peers(setting: Union[list[str], str]) -> frozenset[str]:
    """The peer ids `network.allowed_peers` names: the list itself, or the file it names. Raises AllowListError."""
    if isinstance(setting, str):
        path = Path(setting).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AllowListError(f"the peer list file {path} cannot be read ({e.strerror or e})") from None
        return parse_peer_list(text, str(path))
    peers = set()
    for entry in setting:
        try:
            peers.add(check_peer_id(entry.strip()))
        except ValueError as e:
            raise AllowListError(str(e)) from None
    return frozenset(peers)
