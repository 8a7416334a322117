"""The peer-record announcer: an extension that publishes this peer's signed record and reads the swarm's.

One background task on the event loop: every `interval` seconds it stores this peer's record (see
swarm/peer_records.py) and fetches everyone's; the snapshot's `peers` list is the last fetch. DHT calls go
through hivemind's MPFutures, awaited with a timeout, so the loop never blocks on the DHT process. A failure
is logged and retried at the next interval: the announcer never stops training. On a graceful stop the record is
withdrawn (stored as None), so other peers drop this one at their next fetch instead of after the expiration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from swarmd.extension import DaemonView, Extension

__all__ = ["PeerAnnouncer"]

logger = logging.getLogger("swarmd.peers")

MAX_DIALS = 8  # recorded peers this one dials per announce (swarm/address_records.py)
REDIAL_SECONDS = 60.0  # a peer dialed (connected or not) is not dialed again before this


class PeerAnnouncer(Extension):
    def __init__(self, run_id: str, *, interval: float = 5.0, expiration: float = 30.0, dht_timeout: float = 10.0):
        self.run_id = run_id
        self.interval = interval
        self.expiration = expiration
        self.dht_timeout = dht_timeout
        self.records = None  # swarm.peer_records.PeerRecords, built with the DHT's validators
        self.round_records = None  # swarm.round_records.RoundRecords: the flight recorder's, beside them
        self.address_records = None  # swarm.address_records.AddressRecords: where reachable peers are dialed
        self._dialed: dict[str, float] = {}  # peer id -> time.monotonic() of this peer's last dial of it
        self.swarm_rounds: list[dict[str, Any]] = []  # the peers' published rounds, as the last fetch found them
        self.peers: list[dict[str, Any]] = []
        self.incompatible: list[dict[str, Any]] = []  # records left out: they disagree with this peer (compatibility)
        self._warned_incompatible: set[str] = set()
        self.rejected_total = 0
        self.published_total = 0
        self.fetched_at: Optional[float] = None  # time.time() of the last successful fetch
        self._task: Optional[asyncio.Task] = None
        self._goodbye = None
        self._failures_in_a_row = 0

    def record_validators(self, view: DaemonView) -> list[Any]:
        try:
            from swarmd.swarm.peer_records import PeerRecords

            from swarmd.swarm.round_records import RoundRecords
            from swarmd.swarm.address_records import AddressRecords

            self.records = PeerRecords(self.run_id, expiration=self.expiration)
            self.round_records = RoundRecords(self.run_id, expiration=self.expiration)
            self.address_records = AddressRecords(self.run_id, expiration=self.expiration)
        except Exception:  # noqa: BLE001 - an observer must not stop training
            logger.exception("Peer records are off: their validators could not be built")
            self.records = self.round_records = self.address_records = None
            return []
        return [*self.records.validators, *self.round_records.validators, *self.address_records.validators]

    def ready(self, view: DaemonView) -> None:
        if self.records is not None and view.dht is not None:
            self._task = asyncio.get_running_loop().create_task(self._announce_forever(view), name="peer-announcer")

    def snapshot_fields(self) -> dict[str, Any]:
        age = time.time() - self.fetched_at if self.fetched_at is not None else 0.0
        peers = tuple({**peer, "last_seen_seconds": round(peer["last_seen_seconds"] + age, 3)} for peer in self.peers)
        return {"peers": peers, "peer_records_rejected_total": self.rejected_total,
                "incompatible_peers": tuple(self.incompatible), "swarm_rounds": tuple(self.swarm_rounds)}

    def stopping(self, view: DaemonView) -> None:
        self._cancel()
        if self.records is not None and view.dht is not None and self.published_total:
            try:
                # goodbye; the DHT stops later in the shutdown, and the store is already on its way by then
                self._goodbye = self.records.publish(view.dht, None)
                self.round_records.publish(view.dht, None)
                self.address_records.publish(view.dht, None)
            except Exception as e:  # noqa: BLE001 - best effort
                logger.debug("could not withdraw this peer's record: %r", e)

    async def close(self) -> None:
        self._cancel()

    # --- the loop ------------------------------------------------------------------------------------------

    async def _announce_forever(self, view: DaemonView) -> None:
        while True:
            try:
                await self._announce_once(view)
                self._failures_in_a_row = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - an observer must not stop training
                self._failures_in_a_row += 1
                level = logging.WARNING if self._failures_in_a_row in (1, 10, 100) else logging.DEBUG
                logger.log(level, "Peer records: %s (failure %d in a row; retrying)", _describe(e), self._failures_in_a_row)
            await asyncio.sleep(self.interval)

    async def _announce_once(self, view: DaemonView) -> None:
        from swarmd.swarm.peer_records import record_from_snapshot

        snapshot = view.snapshot()
        record = record_from_snapshot(snapshot)
        stored = await asyncio.wait_for(self.records.publish(view.dht, record), self.dht_timeout)
        self.published_total += 1
        if not stored:
            logger.debug("no DHT node accepted this peer's record this time")
        found = await asyncio.wait_for(self.records.fetch(view.dht), self.dht_timeout)
        peers, rejected = self.records.parse(found)
        if rejected:
            logger.debug("ignored %d malformed peer record(s)", rejected)
        self.peers, self.incompatible = self._leave_out_incompatible(peers, snapshot.compatibility)
        self.fetched_at = time.time()
        self.rejected_total += rejected
        await self._announce_rounds(view, snapshot)
        await self._announce_addresses(view, snapshot)

    async def _announce_rounds(self, view: DaemonView, snapshot) -> None:
        """The flight recorder's record (swarm/round_records.py): this peer's recent rounds out, everyone's in; only
        the rounds of the peers whose records were kept above (compatible, and allowed in a private swarm)."""
        from swarmd.swarm.round_records import parse_round_records, rounds_record_from_snapshot

        record = rounds_record_from_snapshot(snapshot)
        if record is not None:
            await asyncio.wait_for(self.round_records.publish(view.dht, record), self.dht_timeout)
        found = await asyncio.wait_for(self.round_records.fetch(view.dht), self.dht_timeout)
        records, rejected = parse_round_records(found)
        known = {peer["peer_id"] for peer in self.peers}
        self.swarm_rounds = [record for record in records if record["peer_id"] in known]
        self.rejected_total += rejected

    async def _announce_addresses(self, view: DaemonView, snapshot) -> None:
        """Where this peer is dialed (when others can: swarm/address_records.py) out; the kept peers' addresses in,
        and those this peer is not connected to dialed (at most MAX_DIALS per announce, each once per
        REDIAL_SECONDS): p2pd's own routing does not always find them."""
        from functools import partial

        from swarmd.swarm.address_records import address_record, parse_address_records
        from swarmd.swarm.upstream.dialer import DIAL_TIMEOUT, connect_to

        record = address_record(snapshot)
        if record is not None:
            await asyncio.wait_for(self.address_records.publish(view.dht, record), self.dht_timeout)
        found = await asyncio.wait_for(self.address_records.fetch(view.dht), self.dht_timeout)
        addresses, rejected = parse_address_records(found)
        self.rejected_total += rejected
        now = time.monotonic()
        known = [peer["peer_id"] for peer in self.peers if not peer["self"]]
        due = [peer for peer in known
               if peer in addresses and now - self._dialed.get(peer, -REDIAL_SECONDS) >= REDIAL_SECONDS]
        targets = {peer: addresses[peer] for peer in due[:MAX_DIALS]}
        if not targets:
            return
        dialing = view.dht.run_coroutine(partial(connect_to, targets=targets), return_future=True)
        results = await asyncio.wait_for(dialing, DIAL_TIMEOUT + self.dht_timeout)
        for peer, result in results.items():
            if result == "already":
                continue
            self._dialed[peer] = now
            level = logging.INFO if result == "connected" else logging.DEBUG
            logger.log(level, "Dialed peer %s at its recorded address (%s): %s", peer, ", ".join(targets[peer]), result)

    def _leave_out_incompatible(self, peers, ours) -> tuple[list, list]:
        """Peers whose record disagrees with this peer's compatibility (a different model, target batch, strategy)
        are not part of this peer's swarm: their records are not counted; each is logged once."""
        from swarmd.swarm.compatibility import compatibility_of_record, difference

        if not ours:
            return peers, []
        kept, left_out = [], []
        for peer in peers:
            why = "" if peer["self"] else difference(compatibility_of_record(peer), ours)
            why = why.replace("the swarm", "that peer", 1)  # "that peer trains ...", "that peer's target_batch_size ..."
            if not why:
                kept.append(peer)
                continue
            left_out.append({"peer_id": peer["peer_id"], "public_name": peer["public_name"], "difference": why})
            if peer["peer_id"] not in self._warned_incompatible:
                self._warned_incompatible.add(peer["peer_id"])
                logger.warning("Ignoring peer %s (%s): %s", peer["peer_id"], peer["public_name"], why)
        return kept, left_out

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


def _describe(error: BaseException) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return "the DHT did not answer in time"
    return f"{type(error).__name__}: {error}"
