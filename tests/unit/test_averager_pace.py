"""swarm/upstream/averager_pace.py: matchmaking reads the DHT at a pace, and one all-reduce's wake-ups make one declaration.

Each test runs hivemind's own loop (`PotentialLeaders.pop_next_leader` and `_update_queue_periodically`, the
averager's declaration loop) against a fake DHT that counts requests, upstream's way and swarmd's side by side."""

import asyncio
import inspect
import time
from types import SimpleNamespace

import pytest
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.matchmaking import PotentialLeaders
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from swarmd.swarm.upstream.averager_pace import PacedAverager, PacedPotentialLeaders, poll_interval

OWN, OTHER = PeerID(b"own-peer-id-bytes"), PeerID(b"other-peer-bytes")


class _GroupKey:
    """A GroupKeyManager that answers `get_averagers` at once from `peers` and counts the reads."""

    current_key = "run_grad_averager.0b"

    def __init__(self):
        self.reads, self.peers = 0, []

    async def get_averagers(self, key, only_active):
        self.reads += 1
        return list(self.peers)


async def _search(leaders: PotentialLeaders, key_manager: _GroupKey, seconds: float, leader_after: float = None):
    """Look for a leader for up to `seconds`, as Matchmaking does, with another peer declaring itself after
    `leader_after` seconds; returns (the leader found or None, seconds it took)."""
    step = SimpleNamespace(deadline=get_dht_time() + seconds + 5)

    async def other_peer_declares():
        await asyncio.sleep(leader_after)
        key_manager.peers.append((OTHER, get_dht_time() + 2.0))

    started = time.monotonic()
    async with leaders.begin_search(step, key_manager, declare=False):
        if leader_after is not None:
            asyncio.create_task(other_peer_declares())
        try:
            leader = await asyncio.wait_for(leaders.pop_next_leader(), seconds)
        except asyncio.TimeoutError:
            leader = None
    return leader, time.monotonic() - started


def test_upstream_reads_the_group_key_back_to_back_while_no_leader_is_known():
    # what the subclass is for: if a hivemind upgrade paces these reads itself, it can go
    key_manager = _GroupKey()
    leader, _ = asyncio.run(_search(PotentialLeaders(OWN, 2.0, None), key_manager, seconds=1.0))
    assert leader is None
    assert key_manager.reads > 100


def test_paced_leaders_read_once_per_interval():
    key_manager = _GroupKey()
    leaders = PacedPotentialLeaders(OWN, 2.0, None, poll_interval=0.2)
    leader, _ = asyncio.run(_search(leaders, key_manager, seconds=1.0))
    assert leader is None
    assert 4 <= key_manager.reads <= 6  # at 0, 0.2, ..., 1.0 s


def test_a_paced_follower_finds_its_leader_within_one_interval():
    key_manager = _GroupKey()
    leaders = PacedPotentialLeaders(OWN, 2.0, None, poll_interval=0.2)
    leader, seconds = asyncio.run(_search(leaders, key_manager, seconds=3.0, leader_after=0.5))
    assert leader == OTHER
    assert 0.5 <= seconds <= 0.5 + 0.2 + 0.15


# --- a leader assembles its group when its own round is due ---------------------------------------------------


def _lead(*, assemble_when_triggered=True, trigger_after=0.3, follower_after=0.0, cancel=False, seconds=1.5,
          min_matchmaking_time=0.4):
    """This peer leads (nobody better declared itself; its own declaration never expires here): its round is triggered
    after `trigger_after` s (or cancelled), a follower joins it after `follower_after` s (None: nobody). Returns
    (what pop_next_leader did: "assemble" for the TimeoutError upstream's caller assembles on, "waiting" if it still
    waited after `seconds`), seconds it took."""

    async def scenario():
        trigger = asyncio.get_running_loop().create_future()

        async def wait_for_trigger():
            await trigger

        matchmaking = SimpleNamespace(current_followers={}, min_group_size=2)
        leaders = PacedPotentialLeaders(OWN, min_matchmaking_time, None, poll_interval=0.05,
                                        assemble_when_triggered=assemble_when_triggered)
        leaders.matchmaking = matchmaking
        step = SimpleNamespace(deadline=get_dht_time() + 30, wait_for_trigger=wait_for_trigger)
        loop = asyncio.get_running_loop()
        loop.call_later(trigger_after, trigger.cancel if cancel else lambda: trigger.set_result(None))
        if follower_after is not None:
            loop.call_later(follower_after, matchmaking.current_followers.__setitem__, OTHER, "join request")
        started = time.monotonic()
        async with leaders.begin_search(step, _GroupKey(), declare=False):
            try:
                await asyncio.wait_for(leaders.pop_next_leader(), seconds)
            except asyncio.TimeoutError as e:
                return ("assemble" if "round is due" in str(e) else "waiting"), time.monotonic() - started
        return "returned a leader", time.monotonic() - started

    return asyncio.run(scenario())


def test_upstream_leader_waits_for_its_declaration_to_expire_after_its_round_is_due():
    outcome, _ = _lead(assemble_when_triggered=False)
    assert outcome == "waiting"


def test_a_triggered_leader_with_a_follower_assembles_at_once():
    outcome, seconds = _lead(trigger_after=0.3)
    assert outcome == "assemble"
    assert 0.3 <= seconds <= 0.3 + 0.15


def test_a_leader_triggered_early_in_the_search_gives_followers_half_the_matchmaking_time():
    outcome, seconds = _lead(trigger_after=0.2, min_matchmaking_time=1.0)
    assert outcome == "assemble"
    assert 0.5 <= seconds <= 0.5 + 0.15


def test_a_round_due_when_its_search_began_keeps_the_whole_matchmaking_time():
    # not pre-scheduled: every peer only starts looking when its own epoch ends
    outcome, _ = _lead(trigger_after=0.01, min_matchmaking_time=1.0)
    assert outcome == "waiting"


def test_a_triggered_leader_without_followers_waits_for_one():
    outcome, seconds = _lead(trigger_after=0.2, follower_after=0.6)
    assert outcome == "assemble"
    assert 0.6 <= seconds <= 0.6 + 0.05 + 0.15
    outcome, _ = _lead(trigger_after=0.2, follower_after=None)
    assert outcome == "waiting"


def test_a_cancelled_round_assembles_nothing():
    outcome, _ = _lead(trigger_after=0.2, cancel=True)
    assert outcome == "waiting"


# --- declarations --------------------------------------------------------------------------------------------


class _Declaring(PacedAverager):
    """What `_declare_for_download_periodically` reads of an averager, with a DHT that records each store (no
    process: upstream's __init__ is not called, and its properties are plain attributes here)."""

    allow_state_sharing, state_sharing_priority, peer_id = True, 0.0, OWN
    _parent_pid = None  # what upstream's __del__ reads: not this process's averager

    def __init__(self, declare_interval: float):
        self.declare_interval, self.declare_state_period = declare_interval, 30.0
        self.matchmaking_poll_interval, self.assemble_when_triggered = 0.0, False
        self._matchmaking = SimpleNamespace(group_key_manager=SimpleNamespace(prefix="run_state_averager"))
        self._state_updated = asyncio.Event()
        self.stores = []
        self.dht = SimpleNamespace(store=self._store)

    def _store(self, key, subkey, value, expiration_time, return_future):
        self.stores.append((key, value))
        future = asyncio.get_running_loop().create_future()
        future.set_result(True)
        return future


def _declarations(loop_method, declare_interval: float) -> list:
    """Runs the declaration loop while an all-reduce averages 50 tensors over 0.5 s and the epoch (the priority)
    changes at its end; returns the stores made within 1.8 s."""

    async def scenario():
        averager = _Declaring(declare_interval)
        loop = asyncio.create_task(loop_method(averager))
        await asyncio.sleep(0.05)
        for part in range(50):
            averager._state_updated.set()  # what upstream's _aggregate_with_group does after each tensor
            if part == 49:
                averager.state_sharing_priority = 7.0
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.2)
        loop.cancel()
        return averager.stores

    return asyncio.run(scenario())


def test_upstream_declares_once_per_averaged_tensor():
    stores = _declarations(DecentralizedAverager._declare_for_download_periodically, declare_interval=0)
    assert len(stores) > 25


def test_one_all_reduce_makes_one_declaration_of_the_newest_priority():
    stores = _declarations(PacedAverager._declare_for_download_periodically, declare_interval=1.0)
    assert stores == [("run_state_averager.all_averagers", 0.0), ("run_state_averager.all_averagers", 7.0)]


def test_zero_interval_is_upstreams_loop():
    stores = _declarations(PacedAverager._declare_for_download_periodically, declare_interval=0)
    assert len(stores) > 25


def test_every_swarmd_averager_gets_paced_leaders_when_upstream_builds_its_matchmaking():
    from swarmd.swarm.upstream.diloco_state import DiLoCoStateAverager
    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager, GradientAveragerKeepingOwn
    from swarmd.swarm.upstream.state_averager import ObservedStateAverager
    from swarmd.swarm.upstream.outer_round import OuterAverager

    for averager_type in (DiLoCoStateAverager, ObservedStateAverager, AdmittingGradientAverager,
                          GradientAveragerKeepingOwn, OuterAverager):
        assert issubclass(averager_type, PacedAverager), averager_type
        averager = object.__new__(averager_type)  # no process: only the attribute hook is under test
        averager._parent_pid = None  # what upstream's __del__ reads: not this process's averager
        averager.matchmaking_poll_interval, averager.assemble_when_triggered = 0.3, True
        with pytest.raises(AttributeError):
            averager._matchmaking  # noqa: B018 - upstream reads it only after building it; before, as if unset
        averager._matchmaking = matchmaking = SimpleNamespace(potential_leaders=PotentialLeaders(OWN, 3.0, 4))
        leaders = averager._matchmaking.potential_leaders
        assert isinstance(leaders, PacedPotentialLeaders)
        assert (leaders.peer_id, leaders.min_matchmaking_time, leaders.target_group_size) == (OWN, 3.0, 4)
        assert (leaders.poll_interval, leaders.assemble_when_triggered, leaders.matchmaking) == (0.3, True, matchmaking)


def test_the_default_poll_interval_is_a_tenth_of_the_matchmaking_time_and_a_negative_one_is_refused():
    assert poll_interval(None, 2.0) == pytest.approx(0.2)
    assert poll_interval(0.5, 2.0) == 0.5
    assert poll_interval(0, 2.0) == 0  # upstream's back-to-back reads
    with pytest.raises(ValueError, match="matchmaking_poll_interval must be >= 0"):
        poll_interval(-1.0, 2.0)


def test_only_the_gradient_averager_assembles_when_triggered_unless_told(monkeypatch):
    from hivemind.optim.grad_averager import GradientAverager

    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager

    seen = []
    monkeypatch.setattr(GradientAverager, "__init__", lambda self, *args, **kwargs: seen.append(kwargs))
    for opts in ({}, {"assemble_when_triggered": False}):
        averager = object.__new__(AdmittingGradientAverager)
        averager._parent_pid = None
        AdmittingGradientAverager.__init__(averager, **opts)
    assert [kwargs["assemble_when_triggered"] for kwargs in seen] == [True, False]
    # every other averager starts with upstream's scheduled assembly
    assert inspect.signature(PacedAverager.__init__).parameters["assemble_when_triggered"].default is False
