"""An optimizer whose construction fails part-way shuts down what it started and leaves the garbage collector nothing
that raises.

Upstream's `Optimizer.__del__` reads `state_averager` and `ProgressTracker.__del__` asserts on its thread; on a
half-built object both raise from the garbage collector. Python 3.11 formats such "unraisable" exceptions with
ast.parse, and when the collection runs inside another ast.parse (pytest formatting a failure) the outer one fails
with SystemError "AST constructor recursion depth mismatch": one CI run ended with INTERNALERROR so."""

import gc
import sys

import pytest
import torch

from swarmd.swarm.averaging_log import AveragingLog
from swarmd.swarm.upstream.optimizer import SwarmOptimizer


class _AveragerThatCannotStart(RuntimeError):
    pass


@pytest.fixture
def unraisables(monkeypatch):
    caught = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: caught.append(f"{u.object!r}: {u.exc_type.__name__}"))
    yield caught


def _collect(unraisables) -> list:
    gc.collect()
    gc.collect()
    return unraisables


def _sync_kwargs(dht, run_id: str) -> dict:
    model = torch.nn.Linear(4, 2)
    return dict(
        averaging_log=AveragingLog(),
        dht=dht,
        run_id=run_id,
        params=model.parameters(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        target_batch_size=8,
        batch_size_per_step=1,
        use_local_updates=True,
        matchmaking_time=1.0,
        averaging_timeout=5.0,
    )


def test_a_failed_state_averager_shuts_down_the_started_tracker_and_leaves_no_unraisable(dht, unraisables):
    class FailingSwarmOptimizer(SwarmOptimizer):
        def _make_state_averager(self, **kwargs):
            raise _AveragerThatCannotStart("the averager did not start")

    trackers = []
    original = FailingSwarmOptimizer._make_progress_tracker

    def keep_tracker(self, *args, **kwargs):
        trackers.append(original(self, *args, **kwargs))
        return trackers[-1]

    FailingSwarmOptimizer._make_progress_tracker = keep_tracker
    with pytest.raises(_AveragerThatCannotStart):
        FailingSwarmOptimizer(**_sync_kwargs(dht, "failed_state_averager"))
    assert len(trackers) == 1 and not trackers[0].is_alive(), "the tracker's thread outlived the failed construction"
    trackers.clear()
    assert _collect(unraisables) == []


def test_a_tracker_whose_dht_read_fails_leaves_no_unraisable(dht, unraisables, monkeypatch):
    def fail(*args, **kwargs):
        raise TimeoutError("the DHT did not answer")

    monkeypatch.setattr(dht, "get", fail)
    with pytest.raises(TimeoutError):
        SwarmOptimizer(**_sync_kwargs(dht, "failed_tracker"))
    monkeypatch.undo()
    assert _collect(unraisables) == []


def test_a_failed_outer_averager_shuts_down_the_diloco_peers_state_averager(dht, unraisables, monkeypatch):
    from swarmd.swarm.strategies import diloco_optimizer as diloco

    built = []
    original_init = diloco.DiLoCoOptimizer.__init__

    def remember(self, *args, **kwargs):
        built.append(self)
        original_init(self, *args, **kwargs)

    def no_outer_averager(cls, *args, **kwargs):
        raise _AveragerThatCannotStart("the outer averager did not start")

    monkeypatch.setattr(diloco.DiLoCoOptimizer, "__init__", remember)
    monkeypatch.setattr(diloco.OuterAverager, "beside", classmethod(no_outer_averager))
    model = torch.nn.Linear(4, 2)
    with pytest.raises(_AveragerThatCannotStart):
        diloco.DiLoCoOptimizer(
            params=[{"params": list(model.parameters())}],
            inner_optimizer=lambda groups: torch.optim.SGD(groups, lr=0.1),
            inner_scheduler=None,
            batch_size=1,
            inner_steps=4,
            outer_lr=0.7,
            outer_momentum=0.9,
            nesterov=True,
            max_straggler_wait=1.0,
            prescheduled_outer_rounds=False,
            overlap_steps=0,
            overlap_mixing=0.5,
            average_state_every=1,
            grad_compression=None,
            state_check_tolerance=1e-3,
            averaging_log=AveragingLog(),
            dht=dht,
            run_id="failed_outer_averager",
            matchmaking_time=1.0,
            averaging_timeout=5.0,
        )
    (peer,) = built
    assert not peer.state_averager.is_alive(), "the state averager's process outlived the failed construction"
    assert not peer.tracker.is_alive(), "the tracker's thread outlived the failed construction"
    built.clear()
    del peer
    assert _collect(unraisables) == []
