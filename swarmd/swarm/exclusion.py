"""Exclusion on evidence (issue 34 item 4): a peer that robust aggregation keeps clipping, or that keeps claiming
more samples than is plausible, is excluded by this peer for a growing time.

The evidence:
- `clipped`: every swarmd averager's share of an all-reduce (swarm/upstream/robust_aggregation.py) reports, per round, each
  sender and whether it was clipped as an outlier there: rounds of three or more senders, and of two when this peer
  is one of them (its own part the reference, robust_aggregation.py PAIR_OUTLIER_RATIO); another pair reports only
  a non-finite part (nobody can be told apart); a state round judges each member over this peer's whole share
  (parameters differ by how far each peer stepped alone: swarm/upstream/state_averager.py); in a gradient or
  DiLoCo outer round, an update pointing away from the result counts as clipped (robust_aggregation.py
  OPPOSED_COSINE: a sign flip at honest scale, which the clip radius keeps). A sender is excluded
  once it was clipped in at least `rounds` rounds within `window` seconds AND in more than `share` of the rounds it
  sent to this peer's share in that window: a liar is clipped in every round, an honest peer seldom and never in
  most (one clipped part, or a rare bad round in a long run, is no evidence).
- `returned`: the receiver checks the average each reducer returns for its share (swarm/upstream/robust_aggregation.py
  RETURN_RATIO) and refuses an implausible one; a reducer refused in at least `rounds` rounds within `window` is
  excluded (an honest reducer returns a weighted mean of what it was sent: never 100x off).
- `claims`: the progress tracker caps each other peer's claimed samples and samples/s (swarm/claims.py); a peer
  whose samples were capped in at least `rounds` distinct global epochs within `window` is excluded.
- `state`: the worker judges a state it downloaded on its own next batch (swarmd/worker/download_judge.py,
  `swarm.guard_download_loss_ratio`) and refuses one far worse than its own; each donor of a refused state counts
  once, and a donor of `rounds` refused states within `window` is excluded (one is enough to be asked last).
An excluded peer is refused at join_group (it cannot join this peer's group), its all-reduce parts are refused
(aggregate_part), it is not asked to lead this peer's group (matchmaking skips it), it is not downloaded from
(state_source), and its progress records count for nothing; all by this peer alone, nobody else is told. The time
doubles with each exclusion of the same peer: `base_seconds`, 2x, 4x... at most `max_seconds`. When it ends the
evidence starts afresh; the count of exclusions is forgotten `max_seconds` after the last one ended.

Before that, a peer with any evidence against it in the window (clipped once, a refused average, a capped claim) is
a suspect: not refused at join or in groups of three or more, but asked last for the state, and no partner in a
state round of two (swarm/upstream/averager_gate.py). Why: a peer that falls behind downloads from whoever
offers the newest state, and an attacker that is not excluded yet offers one (under DiLoCo, once the others stop
averaging with it, its outer steps are its own, on its attack's pseudo-gradients): an honest DiLoCo peer ended at
loss 6.02 against the clean run's 0.005 in one run of the attack benchmark's x -1e6 cell in four (docs/FAULTS.md).
An honest peer clipped now and then is asked after the others: a slower join from it at worst.

Peer ids come from other peers (untrusted): the table keeps at most `max_peers` peers, and when full forgets the
peer seen longest ago that is not excluded (an excluded one is never forgotten early); each peer's evidence is at
most EVIDENCE_PER_PEER observations.

How it is shared: the daemon owns the table (the `Exclusions` extension, on the loop's thread). The excluded peer
ids reach every process the way the allow list does (swarm/allowlist.py SharedPeerFile: a file in the state dir,
re-read on change; refusals counted per place in shared memory); the evidence comes back from the averagers'
processes and the tracker's thread through one bounded multiprocessing queue, drained at each tick (a full queue
drops evidence, never blocks an averager).

No torch or hivemind import.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from swarmd.extension import DaemonView, Extension
from swarmd.swarm.allowlist import SharedPeerFile

__all__ = [
    "PLACES",
    "REASONS",
    "ExclusionPolicy",
    "ExcludedPeer",
    "ExclusionTable",
    "ExclusionList",
    "Exclusions",
    "install",
    "installed",
    "exclusions",
]

logger = logging.getLogger("swarmd.exclusion")

# where an excluded peer is refused (the order of the shared counters): asking to join this peer's group, sending it
# all-reduce parts, being asked to lead this peer's group (matchmaking), being downloaded from
PLACES = ("join_group", "aggregate_part", "leader", "state_source")
REASONS = ("clipped", "returned", "claims", "state")
EXCLUDED_FILE = "excluded_peers.active"  # in the state dir: the ids every process of this peer refuses
SUSPECT_MARK = "suspect "  # a line of that file naming a suspect (asked last for the state), not an excluded peer
EVIDENCE_PER_PEER = 512  # observations kept per peer (the newest)
# Reports in flight from the averagers to the daemon (more are dropped), and the senders of one round in a report (a
# group larger than that is not hivemind's usual): together under 64 kB, a pipe's buffer, so that the queue's feeder
# thread never waits on a full pipe and a process that exits with reports unread is not held up.
EVIDENCE_QUEUE = 32
SENDERS_PER_REPORT = 16
DRAIN_PER_TICK = 1024


@dataclass(frozen=True)
class ExclusionPolicy:
    """`swarm.exclusion` (config/schema.py ExclusionConfig documents each)."""

    enabled: bool = True
    rounds: int = 3
    share: float = 0.5
    window: float = 600.0
    base_seconds: float = 60.0
    max_seconds: float = 3600.0
    max_peers: int = 1024
    claim_rate_ratio: float = 8.0

    @classmethod
    def from_config(cls, section) -> "ExclusionPolicy":
        return cls(**section.model_dump())


@dataclass(frozen=True)
class ExcludedPeer:
    """One exclusion, as the status shows it (`excluded_peers`)."""

    peer_id: str
    reason: str  # one of REASONS
    since: float  # unix time
    until: float  # unix time it ends
    clipped_rounds: int  # rounds in the window it was clipped in, when excluded
    rounds_seen: int  # rounds in the window it sent to this peer's share, when excluded
    capped_claims: int  # global epochs in the window its claims were capped in, when excluded
    exclusions: int  # times this peer has been excluded (this one included): the time doubles with each
    returned_rounds: int = 0  # rounds in the window whose average it returned this peer refused, when excluded
    refused_states: int = 0  # states it served that this peer refused (worse on its own data), when excluded


@dataclass(frozen=True)
class SuspectedPeer:
    """A peer with evidence against it in the window, not enough to exclude it: asked last for the
    state (swarm/upstream/state_stream.py donor_order). The status shows it (`suspected_peers`)."""

    peer_id: str
    clipped_rounds: int  # rounds in the window it was clipped in
    rounds_seen: int  # rounds in the window it sent to this peer's share
    returned_rounds: int  # rounds in the window whose average it returned this peer refused
    capped_claims: int  # global epochs in the window its claims were capped in
    refused_states: int = 0  # states it served in the window that this peer refused (worse on its own data)


@dataclass
class _Record:
    rounds: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_PER_PEER))  # (time, clipped)
    claims: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_PER_PEER))  # (time, epoch)
    returned: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_PER_PEER))  # (time, 1): refused averages
    states: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_PER_PEER))  # (time, 1): refused states
    last_seen: float = 0.0
    strikes: int = 0  # exclusions so far
    excluded: Optional[ExcludedPeer] = None  # the current or last one


class ExclusionTable:
    """The evidence and the exclusions (on the daemon's loop thread). Times are unix seconds, passed in."""

    def __init__(self, policy: ExclusionPolicy):
        self.policy = policy
        self._records: dict[str, _Record] = {}
        self.totals = {reason: 0 for reason in REASONS}
        self.dropped_total = 0  # observations not recorded because the table was full of excluded peers

    def __len__(self) -> int:
        return len(self._records)

    def observe_round(self, peer_id: str, clipped: bool, now: float) -> Optional[ExcludedPeer]:
        """A round in which `peer_id` sent to this peer's share; returns its exclusion if this made one."""
        return self._observe(peer_id, now, lambda record: record.rounds.append((now, bool(clipped))))

    def observe_returned(self, peer_id: str, now: float) -> Optional[ExcludedPeer]:
        """This peer refused the average `peer_id` returned for its share of a round."""
        return self._observe(peer_id, now, lambda record: record.returned.append((now, 1)))

    def observe_state(self, peer_id: str, now: float) -> Optional[ExcludedPeer]:
        """This peer refused a state `peer_id` served it (or a part of it): worse on this peer's own data."""
        return self._observe(peer_id, now, lambda record: record.states.append((now, 1)))

    def observe_claim(self, peer_id: str, epoch: int, now: float) -> Optional[ExcludedPeer]:
        """The tracker capped what `peer_id` claimed at global epoch `epoch`."""
        return self._observe(peer_id, now, lambda record: record.claims.append((now, int(epoch))))

    def excluded(self, now: float) -> tuple[ExcludedPeer, ...]:
        """The exclusions in force at `now`, soonest to end first."""
        current = [r.excluded for r in self._records.values() if self._is_excluded(r, now)]
        return tuple(sorted(current, key=lambda e: (e.until, e.peer_id)))

    def suspects(self, now: float) -> tuple[str, ...]:
        """Peers not excluded at `now` with any evidence against them in the window, sorted."""
        return tuple(suspect.peer_id for suspect in self.suspected_peers(now))

    def suspected_peers(self, now: float) -> tuple[SuspectedPeer, ...]:
        """The suspects with their evidence in the window, sorted by peer id (the status shows them)."""
        found = []
        for peer_id, record in sorted(self._records.items()):
            if self._is_excluded(record, now):
                continue
            self._age(record, now)
            clipped = sum(flag for _, flag in record.rounds)
            if clipped or record.returned or record.claims or record.states:
                found.append(SuspectedPeer(
                    peer_id=peer_id, clipped_rounds=clipped, rounds_seen=len(record.rounds),
                    returned_rounds=len(record.returned), capped_claims=len({epoch for _, epoch in record.claims}),
                    refused_states=len(record.states),
                ))
        return tuple(found)

    def is_excluded(self, peer_id: str, now: float) -> bool:
        record = self._records.get(peer_id)
        return record is not None and self._is_excluded(record, now)

    def expire(self, now: float) -> None:
        """Forget what has aged out: evidence older than the window, exclusions over (their evidence with them),
        peers with nothing left to remember."""
        for peer_id in list(self._records):
            record = self._records[peer_id]
            self._age(record, now)
            ended = record.excluded is not None and record.excluded.until <= now
            nothing = not record.rounds and not record.claims and not record.returned and not record.states
            if ended and record.excluded.until + self.policy.max_seconds <= now and nothing:
                del self._records[peer_id]
            elif record.excluded is None and nothing:
                del self._records[peer_id]

    # --- inside -----------------------------------------------------------------------------------------------

    def _observe(self, peer_id: str, now: float, add) -> Optional[ExcludedPeer]:
        """`add(record)` the evidence to `peer_id`'s record (none while it is excluded, or when the table is full of
        excluded peers), then judge it: its exclusion if this made one."""
        record = self._record(peer_id, now)
        if record is None or self._is_excluded(record, now):
            return None
        add(record)
        return self._judge(peer_id, record, now)

    @staticmethod
    def _is_excluded(record: _Record, now: float) -> bool:
        return record.excluded is not None and record.excluded.until > now

    def _record(self, peer_id: str, now: float) -> Optional[_Record]:
        record = self._records.get(peer_id)
        if record is None:
            if len(self._records) >= self.policy.max_peers:
                self.expire(now)
            if len(self._records) >= self.policy.max_peers and not self._forget_one(now):
                self.dropped_total += 1
                return None
            record = self._records[peer_id] = _Record()
        record.last_seen = now
        return record

    def _forget_one(self, now: float) -> bool:
        """Make room: forget the peer seen longest ago that is not excluded now."""
        candidates = [(r.last_seen, p) for p, r in self._records.items() if not self._is_excluded(r, now)]
        if not candidates:
            return False
        del self._records[min(candidates)[1]]
        return True

    def _age(self, record: _Record, now: float) -> None:
        horizon = now - self.policy.window
        if record.excluded is not None and record.excluded.until <= now:
            # the evidence that led to an exclusion is spent with it: the next one needs fresh evidence
            horizon = max(horizon, record.excluded.until)
        for evidence in (record.rounds, record.claims, record.returned, record.states):
            while evidence and evidence[0][0] < horizon:
                evidence.popleft()

    def _judge(self, peer_id: str, record: _Record, now: float) -> Optional[ExcludedPeer]:
        self._age(record, now)
        policy = self.policy
        clipped = sum(flag for _, flag in record.rounds)
        epochs = len({epoch for _, epoch in record.claims})
        if clipped >= policy.rounds and clipped > policy.share * len(record.rounds):
            reason = "clipped"
        elif len(record.returned) >= policy.rounds:
            reason = "returned"
        elif epochs >= policy.rounds:
            reason = "claims"
        elif len(record.states) >= policy.rounds:
            reason = "state"
        else:
            return None
        if not policy.enabled:
            return None
        if record.excluded is not None and record.excluded.until + policy.max_seconds <= now:
            record.strikes = 0  # well behaved for max_seconds since the last exclusion ended
        seconds = min(policy.base_seconds * 2 ** record.strikes, policy.max_seconds)
        record.strikes += 1
        record.excluded = ExcludedPeer(
            peer_id=peer_id, reason=reason, since=now, until=now + seconds, clipped_rounds=clipped,
            rounds_seen=len(record.rounds), capped_claims=epochs, exclusions=record.strikes,
            returned_rounds=len(record.returned), refused_states=len(record.states),
        )
        self.totals[reason] += 1
        return record.excluded


class ExclusionList(SharedPeerFile):
    """The excluded peer ids every process of this peer refuses, and the channel the evidence comes back through
    (see the module's docstring). Made and installed by the daemon before hivemind forks its processes."""

    places = PLACES
    log = logger

    def __init__(self, path, policy: ExclusionPolicy = ExclusionPolicy()):
        super().__init__(path)
        self.policy = policy
        self._evidence = None
        self._suspects: frozenset[str] = frozenset()

    def start(self, context=None) -> None:
        context = context or mp
        self.start_counting(context)
        self._evidence = context.Queue(EVIDENCE_QUEUE)
        self.publish(())

    def publish(self, peers: Iterable[str], suspects: Iterable[str] = ()) -> None:
        """The excluded peers, a line each, and the suspects, each on a line of its own after SUSPECT_MARK."""
        self.publish_lines([*sorted(set(peers)), *(f"{SUSPECT_MARK}{peer}" for peer in sorted(set(suspects)))])

    def excludes(self, peer_id: str) -> bool:
        return peer_id in self.peers

    def suspected(self, peer_id: str) -> bool:
        """Evidence against `peer_id` in the window, not enough to exclude it: asked last for the state."""
        self._refresh()
        return peer_id in self._suspects

    def _parse(self, text: str) -> frozenset:
        lines = super()._parse(text)
        self._suspects = frozenset(line[len(SUSPECT_MARK):] for line in lines if line.startswith(SUSPECT_MARK))
        return frozenset(line for line in lines if not line.startswith(SUSPECT_MARK))

    def admit(self, peer_id: str, where: str) -> bool:
        """False (counted, logged once per peer and place) if `peer_id` is excluded."""
        if not self.excludes(peer_id):
            return True
        self.count_refusal(peer_id, where, "Refused peer %s (%s): this peer excluded it on evidence (swarmd status "
                           "shows why and until when)", peer_id, where.replace("_", " "))
        return False

    # --- evidence: any process --------------------------------------------------------------------------------

    def report_round(self, senders: Iterable[tuple[str, bool]]) -> None:
        """One round of this peer's share: (sender's base58 id, whether it was clipped) for each other sender."""
        self._report(("round", time.time(), tuple(senders)[:SENDERS_PER_REPORT]))

    def report_returned(self, peers: Iterable[str]) -> None:
        """Reducers of one round whose returned averages this peer refused (base58 ids)."""
        self._report(("returned", time.time(), tuple(peers)[:SENDERS_PER_REPORT]))

    def report_state(self, peers: Iterable[str]) -> None:
        """The donors of a state this peer refused (base58 ids)."""
        self._report(("state", time.time(), tuple(peers)[:SENDERS_PER_REPORT]))

    def report_claims(self, peers: Iterable[str], epoch: int) -> None:
        """Peers whose progress claims the tracker capped at global epoch `epoch`."""
        self._report(("claims", time.time(), int(epoch), tuple(peers)[:SENDERS_PER_REPORT]))

    def _report(self, item) -> None:
        if self._evidence is None:
            return
        try:
            self._evidence.put_nowait(item)
        except (queue.Full, ValueError, OSError):  # full, or closed at shutdown: the evidence is dropped
            pass

    def drain(self, limit: int = DRAIN_PER_TICK) -> list:
        items = []
        while self._evidence is not None and len(items) < limit:
            try:
                items.append(self._evidence.get_nowait())
            except (queue.Empty, ValueError, OSError):
                break
        return items


def feed(table: ExclusionTable, items: Iterable) -> list[ExcludedPeer]:
    """Reports drained from the queue into the table (malformed ones skipped); the exclusions they made."""
    made = []
    for item in items:
        try:
            if item[0] == "round":
                _, when, senders = item
                found = [table.observe_round(str(peer), bool(clipped), float(when)) for peer, clipped in senders]
            elif item[0] == "returned":
                _, when, peers = item
                found = [table.observe_returned(str(peer), float(when)) for peer in peers]
            elif item[0] == "state":
                _, when, peers = item
                found = [table.observe_state(str(peer), float(when)) for peer in peers]
            elif item[0] == "claims":
                _, when, epoch, peers = item
                found = [table.observe_claim(str(peer), int(epoch), float(when)) for peer in peers]
            else:
                continue
        except (TypeError, ValueError):
            continue
        made.extend(one for one in found if one is not None)
    return made


# The process's exclusion list, like the allow list: set by the daemon before hivemind forks its processes.
_installed: Optional[ExclusionList] = None


def install(exclusion_list: Optional[ExclusionList]) -> None:
    global _installed
    _installed = exclusion_list


def installed() -> Optional[ExclusionList]:
    return _installed


@dataclass(frozen=True)
class ExclusionInfo:
    """What the status shows (the snapshot's `excluded_peers`, `exclusions_total`, `exclusion_refusals`)."""

    excluded_peers: tuple = ()
    suspected_peers: tuple = ()  # SuspectedPeer each
    exclusions_total: dict = field(default_factory=dict)  # {reason: exclusions since start}
    exclusion_refusals: dict = field(default_factory=dict)  # {place: requests of excluded peers refused}


class Exclusions(Extension):
    """The daemon's side: the table, fed from the queue at each tick, published when the excluded set changes."""

    def __init__(self, policy: ExclusionPolicy, clock=time.time):
        self.policy = policy
        self.table = ExclusionTable(policy)
        self.list: Optional[ExclusionList] = None
        self._clock = clock
        self._published: frozenset = frozenset()
        self._published_suspects: frozenset = frozenset()

    async def start(self, view: DaemonView) -> None:
        self.list = ExclusionList(view.config.state_path / EXCLUDED_FILE, self.policy)
        self.list.start()
        install(self.list)

    async def tick(self, view: DaemonView, snapshot: Any) -> None:
        self.update()

    def update(self) -> None:
        if self.list is None:
            return
        now = self._clock()
        for made in feed(self.table, self.list.drain()):
            logger.warning(
                "Excluded peer %s for %.0f s (exclusion %d): %s", made.peer_id, made.until - made.since,
                made.exclusions, _evidence_text(made, self.policy),
            )
        self.table.expire(now)
        current = frozenset(e.peer_id for e in self.table.excluded(now))
        suspects = frozenset(self.table.suspects(now))
        if (current, suspects) != (self._published, self._published_suspects):
            for peer_id in sorted(self._published - current):
                logger.info("Peer %s is no longer excluded (its exclusion ended)", peer_id)
            self.list.publish(current, suspects)
            self._published, self._published_suspects = current, suspects

    def snapshot_fields(self) -> dict[str, Any]:
        info = self.info()
        return {"excluded_peers": info.excluded_peers, "suspected_peers": info.suspected_peers,
                "exclusions_total": info.exclusions_total,
                "exclusion_refusals": info.exclusion_refusals}

    def info(self) -> ExclusionInfo:
        return ExclusionInfo(
            excluded_peers=self.table.excluded(self._clock()),
            suspected_peers=self.table.suspected_peers(self._clock()),
            exclusions_total=dict(self.table.totals),
            exclusion_refusals=self.list.refusals() if self.list is not None else {p: 0 for p in PLACES},
        )

    async def close(self) -> None:
        if installed() is self.list:
            install(None)


def _evidence_text(made: ExcludedPeer, policy: ExclusionPolicy) -> str:
    if made.reason == "clipped":
        return (f"robust aggregation clipped it as an outlier (or found its update pulling against the result, or "
                f"capped the samples it claimed as its weight) in "
                f"{made.clipped_rounds} of the {made.rounds_seen} rounds it sent to this peer's share in the last "
                f"{policy.window:.0f} s")
    if made.reason == "returned":
        return (f"this peer refused the average it returned for its share in {made.returned_rounds} rounds in the "
                f"last {policy.window:.0f} s")
    if made.reason == "state":
        return (f"this peer refused {made.refused_states} states it served in the last {policy.window:.0f} s (far "
                "worse on this peer's own data than this peer's own)")
    return (f"its progress claims (samples, samples/s) were capped as implausible in {made.capped_claims} global "
            f"epochs in the last {policy.window:.0f} s")


def exclusions(swarm_config) -> Optional[Exclusions]:
    """The extension for `swarm.exclusion`: None when it neither excludes nor checks claims."""
    policy = ExclusionPolicy.from_config(swarm_config.exclusion)
    if not policy.enabled and not policy.claim_rate_ratio:
        return None
    return Exclusions(policy)
