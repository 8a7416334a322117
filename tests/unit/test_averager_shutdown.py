"""An averager stopped while a round runs finalizes that round instead of dying of AttributeError (hivemind 1.1.12
keeps asyncio.Futures of the runners in _running_groups, and its _shutdown calls .finalize() on them)."""

import asyncio
import inspect
from types import SimpleNamespace

import pytest
from hivemind.averaging import DecentralizedAverager

from swarmd.swarm.upstream.averager_shutdown import FinalizesRunningRoundsAtShutdown


class _Runner:
    finalized = False

    def finalize(self, cancel: bool):
        self.finalized = cancel

        async def done():
            return None

        return {asyncio.ensure_future(done())}


def _shutdown(shutdown_method):
    """Runs `shutdown_method` on an averager-like object with two rounds: one whose runner is set, one still
    matchmaking; returns (runner, the pending round's future)."""

    async def scenario():
        runner = _Runner()
        with_runner, pending = asyncio.get_running_loop().create_future(), asyncio.get_running_loop().create_future()
        with_runner.set_result(runner)
        averager = SimpleNamespace(client_mode=True, _running_groups={b"a": with_runner, b"b": pending})
        await shutdown_method(averager, 5.0)
        return runner, pending

    return asyncio.run(scenario())


def test_a_round_with_a_runner_is_finalized_and_one_without_is_cancelled():
    runner, pending = _shutdown(FinalizesRunningRoundsAtShutdown._shutdown)
    assert runner.finalized is True
    assert pending.cancelled()


def test_upstreams_shutdown_dies_on_the_same_rounds():
    # what the subclass is for: if a hivemind upgrade fixes this, the subclass can go
    with pytest.raises(AttributeError, match="finalize"):
        _shutdown(DecentralizedAverager._shutdown)


def test_every_swarmd_averager_carries_it():
    from swarmd.swarm.upstream.diloco_state import DiLoCoStateAverager
    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager, GradientAveragerKeepingOwn
    from swarmd.swarm.upstream.state_averager import ObservedStateAverager
    from swarmd.swarm.upstream.outer_round import OuterAverager

    for averager in (DiLoCoStateAverager, ObservedStateAverager, AdmittingGradientAverager,
                     GradientAveragerKeepingOwn, OuterAverager):
        # upstream's _shutdown is reached through the fix only: every override above it hands on to super()
        mro = averager.__mro__
        above = mro[:mro.index(FinalizesRunningRoundsAtShutdown)]
        for klass in above:
            if "_shutdown" in vars(klass):
                assert "await super()._shutdown(timeout)" in inspect.getsource(klass._shutdown), (averager, klass)
