"""SwarmOptimizer's averagers must speak hivemind's protocol: same RPC names as the upstream classes."""

import pytest

from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager

from swarmd.swarm.upstream.gradient_averager import GradientAveragerKeepingOwn
from swarmd.swarm.upstream.state_averager import ObservedStateAverager, bounded_search


@pytest.mark.parametrize(
    "ours, upstream",
    [(ObservedStateAverager, TrainingStateAverager), (GradientAveragerKeepingOwn, GradientAverager)],
)
def test_rpc_handler_names_are_upstreams(ours, upstream):
    for method in ("rpc_join_group", "rpc_aggregate_part", "rpc_download_state"):
        assert ours._get_handle_name("run_grad_averager", method) == upstream._get_handle_name("run_grad_averager", method)
    ours._collect_rpc_handlers()
    upstream._collect_rpc_handlers()
    # plus, on the state averager, the parameters alone (swarm/upstream/parameter_refresh.py), which upstream lacks
    extra = {"rpc_download_parameters"} if ours is ObservedStateAverager else set()
    assert {h.method_name for h in ours._rpc_handlers} == {h.method_name for h in upstream._rpc_handlers} | extra


def test_the_round_recording_hook_sits_between_the_state_averager_and_hivemind():
    mro = ObservedStateAverager.__mro__
    names = [cls.__name__ for cls in mro]
    assert names.index("TrainingStateAverager") < names.index("RecordsRounds") < names.index("DecentralizedAverager")


def test_a_live_load_state_timeout_reaches_the_downloads_of_either_strategy():
    """`swarm run update` sets swarm.load_state_timeout on the running optimizer (daemon/retune.py): the bound each
    download then takes is StateDownloads', not a copy made at start."""
    from swarmd.swarm.strategies.diloco_optimizer import DiLoCoOptimizer
    from swarmd.swarm.upstream.optimizer import SwarmOptimizer
    from swarmd.swarm.upstream.peer_parts import StateDownloads

    for strategy_type in (SwarmOptimizer, DiLoCoOptimizer):
        optimizer = object.__new__(strategy_type)
        optimizer.downloads = StateDownloads(attempts=1, timeout=600.0, dht=None)
        optimizer.load_state_timeout = 42.0
        assert optimizer.downloads.timeout == 42.0 and optimizer.load_state_timeout == 42.0


@pytest.mark.parametrize("auxiliary", [False, True], ids=["trainer", "auxiliary"])
def test_an_auxiliary_peer_never_offers_its_state_which_it_never_steps(auxiliary):
    """After a download (or a catch-up ending) a trainer serves its state again; an auxiliary peer never does: its
    parameters stay those it downloaded while its epoch moves on with the swarm's (before: it served them, labelled
    with the swarm's epoch, to the next joiner)."""
    from types import SimpleNamespace

    from swarmd.swarm.upstream.optimizer import SwarmOptimizer

    optimizer = object.__new__(SwarmOptimizer)
    optimizer.state_averager = SimpleNamespace(allow_state_sharing=False, round_weight=None)
    optimizer.grad_averager = None
    optimizer.client_mode, optimizer.auxiliary, optimizer.inexact_state = False, auxiliary, False
    optimizer._set_catching_up(False)
    assert optimizer.state_averager.allow_state_sharing is (not auxiliary)


def test_a_state_rounds_search_is_cut_to_the_limit_past_its_scheduled_start():
    assert bounded_search(30.0, None, 2.0, now=100.0) == 2.0  # begins now
    assert bounded_search(30.0, 103.0, 2.0, now=100.0) == 5.0  # pre-scheduled 3 s ahead: 2 s past that
    assert bounded_search(30.0, 99.0, 2.0, now=100.0) == 2.0  # its start has passed
    assert bounded_search(1.5, 103.0, 2.0, now=100.0) == 1.5  # a shorter timeout stays


def test_a_state_from_a_peer_with_evidence_against_it_since_is_taken_again_once(tmp_path):
    """A joiner may download a liar's state before any evidence is in; once this peer holds evidence against a donor
    of its state (a suspect, or excluded), its next step takes the state again (from the peers without evidence
    first), once per donor and degree: with every donor a suspect, the downloads do not go from one to the other at
    each step (seen: eight in 0.4 s between an honest suspect and the liar), and a suspect's exclusion is a reason
    again."""
    from types import SimpleNamespace

    from swarmd.swarm import exclusion
    from swarmd.swarm.exclusion import ExclusionList
    from swarmd.swarm.upstream.peer_parts import StateDownloads

    downloads = StateDownloads(attempts=1, timeout=1.0, dht=None)
    donors = ["QmLiar"]
    state_averager = SimpleNamespace(donors_of_the_state=lambda: list(donors))
    listed = ExclusionList(tmp_path / "excluded_peers.active")
    listed.start()
    assert not downloads.came_from_a_suspect(state_averager)  # no exclusions installed (a standalone optimizer)
    exclusion.install(listed)
    try:
        assert not downloads.came_from_a_suspect(state_averager)  # no evidence against the donor
        listed.publish([], suspects=["QmLiar", "QmSuspect"])
        assert downloads.came_from_a_suspect(state_averager)
        assert not downloads.came_from_a_suspect(state_averager)  # taken again: not for the same reason twice
        donors[:] = ["QmSuspect"]
        assert downloads.came_from_a_suspect(state_averager)
        donors[:] = ["QmLiar"]  # every donor a suspect: kept
        assert not downloads.came_from_a_suspect(state_averager)
        donors[:] = ["QmHonest"]
        assert not downloads.came_from_a_suspect(state_averager)
        donors[:] = ["QmHonest", "QmLiar"]
        listed.publish(["QmLiar"], suspects=["QmSuspect"])  # the suspect excluded: a new reason
        assert downloads.came_from_a_suspect(state_averager)
        assert not downloads.came_from_a_suspect(state_averager)
    finally:
        exclusion.install(None)


def test_the_donors_of_a_download_are_kept_whole_within_their_buffer():
    """What the averager's process notes of a download's donors, for the host: whole peer ids, as many as fit."""
    import multiprocessing as mp
    from types import SimpleNamespace

    from swarmd.swarm.upstream.state_stream import STATE_DONORS_BYTES, DownloadsState

    averager = SimpleNamespace(state_donors=mp.Array("c", STATE_DONORS_BYTES))
    assert DownloadsState.donors_of_the_state(averager) == []
    DownloadsState.note_donors(averager, ["QmA", "QmB"])
    assert DownloadsState.donors_of_the_state(averager) == ["QmA", "QmB"]
    many = [f"Qm{index:050d}" for index in range(40)]
    DownloadsState.note_donors(averager, many)
    kept = DownloadsState.donors_of_the_state(averager)
    assert kept == many[:len(kept)] and 15 <= len(kept) < 40


@pytest.mark.parametrize("doubted", [False, True])
def test_a_state_taken_again_from_a_doubted_donor_is_the_whole_state(doubted, tmp_path):
    """Where the last download already ended behind the swarm, the sync optimizer catches up by averaging, or takes
    the parameters again without the optimizer statistics. Neither when the state is taken again because its donor
    was found lying since: its optimizer statistics would stay (under sync nothing checks them); the whole state is
    downloaded."""
    import contextlib
    from types import SimpleNamespace

    from swarmd.swarm import exclusion
    from swarmd.swarm.exclusion import ExclusionList
    from swarmd.swarm.upstream.optimizer import SwarmOptimizer
    from swarmd.swarm.upstream.peer_parts import StateDownloads

    calls = []
    optimizer = object.__new__(SwarmOptimizer)
    optimizer.scheduled_grads = None
    optimizer.state_averager = SimpleNamespace(
        step=lambda **_: None, local_epoch=5, donors_of_the_state=lambda: ["QmLiar"],
        load_state_from_peers=lambda **_: calls.append("whole state"), download_refusals=SimpleNamespace(value=0),
    )
    optimizer.tracker = SimpleNamespace(pause_updates=contextlib.nullcontext, global_epoch=9)
    optimizer.downloads = StateDownloads(attempts=1, timeout=1.0, dht=None)
    optimizer._swarm_epoch_from_round = None
    optimizer._should_catch_up_by_averaging = lambda: calls.append("catch-up?") or False
    optimizer._one_behind_after_download = lambda: False  # four epochs behind
    optimizer._download_parameters_again = lambda behind: calls.append("parameters again") or True
    optimizer._set_inexact_state = optimizer._start_epoch_afresh = lambda *_: None
    listed = ExclusionList(tmp_path / "excluded_peers.active")
    listed.start()
    listed.publish([], suspects=["QmLiar"] if doubted else [])
    exclusion.install(listed)
    try:
        assert optimizer.downloads.came_from_a_suspect(optimizer.state_averager) is doubted
        optimizer.load_state_from_peers()
    finally:
        exclusion.install(None)
    assert calls == (["whole state"] if doubted else ["catch-up?", "parameters again"])
    assert not optimizer.downloads.whole_state_due  # the next one may take the parameters alone again
