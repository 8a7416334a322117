"""hivemind's averagers, asking their DHT process for less while they wait, and starting a round when it is due
(issue 16).

In a pinned sync pair (micro Swin, epochs of ~3.5 s, matchmaking 2 s) the DHT process of each peer answered about
60 requests a second from the gradient averager alone and used 0.12 of the core the training needs
(docs/PERFORMANCE.md section 11). Each request is a pickled MPFuture whose reply pipe the DHT process fetches from
the caller's process, and most are also a request to the other peer's DHT. Two loops of hivemind 1.1.12 made them:

- Matchmaking. While a peer looks for a group and knows no better leader than itself (the leader of a pair always
  does), `PotentialLeaders.pop_next_leader` asks for a new read of the group key as soon as the last one is in,
  so `_update_queue_periodically` reads the DHT back to back: 44 reads a second. `PacedPotentialLeaders` starts a
  read no sooner than `matchmaking_poll_interval` after the last one (default: a tenth of the matchmaking time,
  0.2 s for 2 s), so a follower still finds its leader early in the leader's matchmaking window.
- Declarations. `_declare_for_download_periodically` stores the "download my state" record each time
  `_state_updated` is set, and an all-reduce sets it after every tensor it averages: 16 stores a second here, from a
  gradient averager whose state nobody downloads. Here a wake-up waits `declare_interval` (1 s) first, so one
  round's wake-ups make one store of the newest values. The record's value (the priority) and its expiration
  are upstream's.

And one wait: a pre-scheduled round's group is assembled when the leader's declaration expires, at the end of the
epoch as estimated when the round was scheduled, ~2 s earlier. The estimate was often late: half the gradient
rounds were triggered (the epoch had ended) 0.2-1.4 s before their group formed, and the worker waited that long
in `opt.step`. With `assemble_when_triggered`, a leader whose round is triggered and who has a follower assembles
its group at once (upstream's own path for an expired declaration), though not before the search has run half
the matchmaking time. Peers that have not joined by then average in the next round, as those that come after the
expiration do upstream. A round that was not pre-scheduled (due within a tenth of the matchmaking time of its
search's start) keeps upstream's whole matchmaking time. Only the gradient averager turns it on
(swarm/upstream/optimizer.py): all its peers are triggered by one event, the swarm's epoch end. A DiLoCo outer round is
triggered by each peer's own H-th step, and a fast leader that assembled at its own would leave the slower
members' parts to time out in the all-reduce; those rounds keep the scheduled time.

`PacedAverager` sits just above DecentralizedAverager in every swarmd averager (via swarm/upstream/averager_gate.py). The
three settings are averager arguments (`swarm.averager_opts`); 0 / false gives upstream's behaviour, for
side-by-side benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Optional

from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.matchmaking import PotentialLeaders
from hivemind.utils import get_dht_time
from hivemind.utils.asyncio import cancel_and_wait

__all__ = ["PacedAverager", "PacedPotentialLeaders", "DECLARE_INTERVAL", "poll_interval"]

POLLS_PER_MATCHMAKING = 10  # the default poll interval is the matchmaking time over this
DECLARE_INTERVAL = 1.0  # seconds a wake-up of the declaration loop waits for more changes before it stores


def poll_interval(setting: Optional[float], min_matchmaking_time: float) -> float:
    """Seconds between matchmaking reads: the setting, or by default a tenth of the matchmaking time."""
    interval = min_matchmaking_time / POLLS_PER_MATCHMAKING if setting is None else setting
    if interval < 0:
        raise ValueError(f"matchmaking_poll_interval must be >= 0 seconds, not {interval}")
    return interval


class _PacedReads:
    """A GroupKeyManager whose `get_averagers` starts no sooner than `interval` after its previous call began, and
    leaves out the peers this peer excluded on evidence (`exclusions`, swarm/exclusion.py; None: off): matchmaking
    never asks one of them to lead its group."""

    def __init__(self, key_manager, interval: float, exclusions=None):
        self._key_manager, self._interval, self._exclusions = key_manager, interval, exclusions
        self._last_read = -float("inf")

    def __getattr__(self, name):
        return getattr(self._key_manager, name)

    async def get_averagers(self, *args, **kwargs):
        wait = self._last_read + self._interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._last_read = time.monotonic()
        found = await self._key_manager.get_averagers(*args, **kwargs)
        if self._exclusions is None:
            return found
        return [(peer, expiration) for peer, expiration in found
                if self._exclusions.admit(peer.to_base58(), "leader")]


class PacedPotentialLeaders(PotentialLeaders):
    def __init__(self, *args, poll_interval: float, assemble_when_triggered: bool = False, exclusions=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.poll_interval = poll_interval
        self.exclusions = exclusions
        self.assemble_when_triggered = assemble_when_triggered
        self.matchmaking = None  # the Matchmaking these leaders belong to (its followers), set by PacedAverager
        self._step, self._search_began = None, 0.0

    async def _update_queue_periodically(self, key_manager) -> None:
        await super()._update_queue_periodically(_PacedReads(key_manager, self.poll_interval, self.exclusions))

    @contextlib.asynccontextmanager
    async def begin_search(self, step, key_manager, declare: bool = True):
        self._step, self._search_began = step, time.monotonic()
        try:
            async with super().begin_search(step, key_manager, declare) as search:
                yield search
        finally:
            self._step = None

    async def pop_next_leader(self):
        # Upstream returns the next leader to ask, or raises TimeoutError when this peer's own declaration expires;
        # its caller then assembles the group this peer leads. Here that also happens once this peer's round is
        # triggered (the epoch ended) and someone follows it: see the module's docstring.
        popping = asyncio.ensure_future(super().pop_next_leader())
        if not self.assemble_when_triggered or self._step is None or self.matchmaking is None:
            return await popping
        due = asyncio.ensure_future(self._round_due())
        try:
            await asyncio.wait({popping, due}, return_when=asyncio.FIRST_COMPLETED)
            if due.done() and not due.cancelled() and due.exception() is None and due.result():
                while not popping.done():
                    if self._leads_a_group():
                        raise asyncio.TimeoutError("this peer's round is due: it assembles the group it leads")
                    await asyncio.wait({popping}, timeout=self.poll_interval or 0.1)  # a follower may still come
            return await popping
        finally:
            for task in (popping, due):
                if not task.done():
                    await cancel_and_wait(task)
                elif not task.cancelled():
                    # marked retrieved: when this search is cancelled (a shutdown) just as upstream's pop raised its
                    # "re-declared" TimeoutError, asyncio would log that as an error with a traceback at exit
                    task.exception()

    async def _round_due(self) -> bool:
        """Once this peer's round is triggered: whether it may assemble early (then not before the search has run
        half the matchmaking time). A round already due as its search began (within a tenth of the matchmaking
        time, the trainer's trigger follows the start at once) was not pre-scheduled: its peers start looking when
        their own epochs end, and they need the whole matchmaking time. A cancelled step raises here."""
        await self._step.wait_for_trigger()
        waited = time.monotonic() - self._search_began
        if waited < self.min_matchmaking_time / POLLS_PER_MATCHMAKING:
            return False
        await asyncio.sleep(max(0.0, self.min_matchmaking_time / 2 - waited))
        return True

    def _leads_a_group(self) -> bool:
        matchmaking = self.matchmaking
        return len(matchmaking.current_followers) + 1 >= matchmaking.min_group_size


class PacedAverager(DecentralizedAverager):
    def __init__(
        self, *args, matchmaking_poll_interval: Optional[float] = None, declare_interval: float = DECLARE_INTERVAL,
        assemble_when_triggered: bool = False, **kwargs,
    ):
        # set before upstream's __init__, which starts the averager's process (fork copies these); 5.0 is
        # upstream's default matchmaking time
        self.matchmaking_poll_interval = poll_interval(matchmaking_poll_interval, kwargs.get("min_matchmaking_time", 5.0))
        if declare_interval < 0:
            raise ValueError(f"declare_interval must be >= 0 seconds, not {declare_interval}")
        self.declare_interval = declare_interval
        self.assemble_when_triggered = assemble_when_triggered
        super().__init__(*args, **kwargs)

    @property
    def _matchmaking(self):
        try:
            return self.__dict__["_matchmaking"]
        except KeyError:
            raise AttributeError("_matchmaking") from None

    @_matchmaking.setter
    def _matchmaking(self, matchmaking) -> None:
        # upstream builds its Matchmaking inside the averager's process (averager.py l.289); its leaders are swapped
        # for paced ones before any search begins
        # (and with exclusions on, swarm/exclusion.py, so that an excluded peer is never asked to lead)
        exclusions = getattr(self, "_exclusions", None)  # set by swarm/upstream/averager_gate.py's subclass
        if self.matchmaking_poll_interval > 0 or self.assemble_when_triggered or exclusions is not None:
            leaders = matchmaking.potential_leaders
            matchmaking.potential_leaders = PacedPotentialLeaders(
                leaders.peer_id, leaders.min_matchmaking_time, leaders.target_group_size,
                poll_interval=self.matchmaking_poll_interval, assemble_when_triggered=self.assemble_when_triggered,
                exclusions=exclusions,
            )
            matchmaking.potential_leaders.matchmaking = matchmaking
        self.__dict__["_matchmaking"] = matchmaking

    async def _declare_for_download_periodically(self):
        # Upstream's loop (averager.py l.600-626) with one change: a wake-up by `_state_updated` waits
        # `declare_interval` before the next store, so the wake-ups of one round coalesce.
        if self.declare_interval <= 0:
            return await super()._declare_for_download_periodically()
        download_key = f"{self._matchmaking.group_key_manager.prefix}.all_averagers"
        sharing_was_allowed = self.allow_state_sharing
        while True:
            expiration_time = get_dht_time() + self.declare_state_period
            if self.allow_state_sharing or sharing_was_allowed:
                # notify either if sharing is allowed or if it was just switched off (to overwrite the previous record)
                asyncio.create_task(
                    asyncio.wait_for(
                        self.dht.store(
                            download_key,
                            subkey=self.peer_id.to_bytes(),
                            value=self.state_sharing_priority if self.allow_state_sharing else None,
                            expiration_time=expiration_time,
                            return_future=True,
                        ),
                        timeout=expiration_time - get_dht_time(),
                    )
                )
                sharing_was_allowed = self.allow_state_sharing
            self._state_updated.clear()
            try:
                await asyncio.wait_for(self._state_updated.wait(), timeout=max(0.0, expiration_time - get_dht_time()))
            except asyncio.TimeoutError:
                continue  # the record is about to expire: store it again now
            await asyncio.sleep(self.declare_interval)
