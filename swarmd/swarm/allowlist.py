"""`network.allowed_peers`: which libp2p peer ids may take part in a private swarm, shared with hivemind's processes.

The setting is a list of peer ids or the path of a file of them (one per line, `#` comments). The daemon reads it
at start and again on SIGHUP, and publishes the effective list (the setting plus this peer's own id) as a file in
the state dir, written aside and renamed into place. Every process that must refuse outsiders - the daemon, the
DHT process (record validators, forked) and each averager process (RPC handlers, which carry it as an attribute)
- holds a copy of the same `AllowList`; it re-reads that file when its inode or mtime changes, so a reload reaches
processes that started long before it without any pipe between them.

Refusals are counted in shared memory by where they happened (`WHERE`), so the daemon's status and /metrics see
the counts of every process; each process logs the first refusal of each peer (per place) once.

No torch or hivemind import. Reading and checking the setting itself is config/peer_list.py.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from pathlib import Path
from typing import Iterable, Optional

__all__ = [
    "WHERE",
    "AllowList",
    "SharedPeerFile",
    "install",
    "installed",
]

logger = logging.getLogger("swarmd.private")

# Where a peer can be refused: its DHT records, asking to join a matchmaking group, sending all-reduce parts,
# downloading the state, being downloaded from (its offer of its state, state_stream.py), reachability probes.
# The order is the order of the shared counters.
WHERE = ("dht_records", "join_group", "aggregate_part", "download_state", "state_source", "reachability")
_HINTS = {
    # a record names its writer by the key that signed it: a swarmd peer of a private run signs with its identity
    # key (the id is then its peer id), any other peer with a random key, whose id names no peer anyone knows
    "dht_records": " (the id of the key that signed its record: a peer that runs without network.allowed_peers "
    "signs with a random key, so this id may match no peer id you know)",
    "state_source": " (it offered its state to download; not taken)",
}


class SharedPeerFile:
    """A set of peer ids that the daemon publishes as a file in the state dir (written aside, renamed into place)
    and every process re-reads when the file's inode or mtime changes, with refusals counted in shared memory by
    place (`places`) and the first refusal of each peer per place logged once. The machinery of the allow list
    below and of the exclusions (swarm/exclusion.py); `_parse` turns the file's text into the set."""

    places: tuple = WHERE
    log = logger  # where refusals are logged

    def __init__(self, path: Path):
        self.path = Path(path)
        self._peers: frozenset[str] = frozenset()
        self._seen_file: Optional[tuple] = None
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._counts = None

    def start_counting(self, context=None) -> None:
        """Make the shared counters (before hivemind starts its processes, in the multiprocessing context they
        use: the default one)."""
        self._counts = (context or mp).Array("q", len(self.places))

    def publish_lines(self, lines: Iterable[str]) -> None:
        aside = self.path.with_name(self.path.name + ".tmp")
        aside.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        os.replace(aside, self.path)

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_lock"]  # a process started by spawn/forkserver gets a lock of its own
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def peers(self) -> frozenset[str]:
        self._refresh()
        return self._peers

    def count_refusal(self, peer_id: str, where: str, message: str, *args) -> None:
        """Count a refusal at `where`; log `message` (with `args`) the first time per peer and place."""
        if self._counts is not None:
            with self._counts.get_lock():
                self._counts[self.places.index(where)] += 1
        if (peer_id, where) not in self._logged:
            self._logged.add((peer_id, where))
            self.log.warning(message, *args)

    def refusals(self) -> dict[str, int]:
        """Refusals so far in every process, by place."""
        if self._counts is None:
            return {where: 0 for where in self.places}
        return dict(zip(self.places, self._counts[:]))

    def _parse(self, text: str) -> frozenset:
        return frozenset(line.strip() for line in text.splitlines() if line.strip())

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return  # keep the last set: a missing file must not open a private swarm (or forgive an excluded peer)
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen == self._seen_file:
            return
        with self._lock:
            try:
                text = self.path.read_text(encoding="utf-8")
            except OSError:
                return
            self._peers = self._parse(text)
            self._seen_file = seen


class AllowList(SharedPeerFile):
    """The effective list, shared by the daemon and the hivemind processes forked from it (see the module doc)."""

    def __init__(self, path: Path, own_peer_id: str):
        super().__init__(path)
        self.own_peer_id = own_peer_id

    def start(self, peers: Iterable[str], context=None) -> None:
        """Publish the first list and make the shared counters (before hivemind starts its processes)."""
        self.start_counting(context)
        self.publish(peers)

    def publish(self, peers: Iterable[str]) -> None:
        """Make `peers` (and this peer) the list of every process: written aside, renamed into place."""
        self.publish_lines(sorted(set(peers) | {self.own_peer_id}))

    def allows(self, peer_id: str) -> bool:
        return peer_id in self.peers

    def admit(self, peer_id: str, where: str) -> bool:
        """True if `peer_id` is on the list; otherwise count and (the first time per peer and place) log it."""
        if self.allows(peer_id):
            return True
        self.count_refusal(peer_id, where, "Refused peer %s (%s): it is not in network.allowed_peers%s", peer_id,
                           where.replace("_", " "), _HINTS.get(where, ""))
        return False


# The process's allow list, like hivemind's process-wide key: set by the daemon before hivemind forks its
# processes, read by the record validator and the averagers' RPC handlers. None: an open swarm.
_installed: Optional[AllowList] = None


def install(allow_list: Optional[AllowList]) -> None:
    global _installed
    _installed = allow_list


def installed() -> Optional[AllowList]:
    return _installed
