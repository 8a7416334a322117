"""The peer's ranks as the daemon and the worker use them: start, step protocol, per-rank figures, faults, stop.

One object on rank 0 (the daemon) over the pieces of this package: the process group (`RankGroup`, or
`TorchrunGroup` when torchrun started the ranks), rank 0's end of the step protocol (`StepSync`) and the per-rank
figures (`RankStats`). None of it exists for a one-rank peer: `OneRank` stands in for it, with nothing to lead,
average, watch or stop, so the daemon and the worker have no one-rank branches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["LocalRanks", "OneRank", "RanksReport", "start_local_ranks"]

_CONNECT_TIMEOUT = 300.0  # every rank imports torch, builds the task and the model before it reports ready


@dataclass(frozen=True)
class RanksReport:
    """What the status shows of a peer's ranks (status/snapshot.py: devices, ranks, ranks_dead, ranks_repairs_total)."""

    devices: tuple = ()  # one per rank, rank 0's first
    ranks: tuple = ()  # ranks/rank_stats.py RankReport of each rank
    dead: Optional[str] = None  # "rank 1 (cpu) was killed by SIGKILL"
    repairs_total: int = 0  # replicas found to differ (checksum) and re-broadcast


@dataclass
class LocalRanks:
    group: Any  # ranks/group.py RankGroup or TorchrunGroup
    sync: Any  # ranks/step_sync.py StepSync, rank 0's end
    stats: Any  # ranks/rank_stats.py RankStats
    devices: tuple

    def dead_rank(self) -> Optional[str]:
        """"rank 1 (cpu) was killed by SIGKILL", or None while every rank lives."""
        return self.group.dead_rank()

    def report(self) -> RanksReport:
        return RanksReport(
            devices=tuple(self.devices),
            ranks=self.stats.snapshot(),
            dead=self.dead_rank(),
            repairs_total=self.sync.repairs_total,
        )

    def stop(self) -> None:
        """From the worker, after its last step: the ranks leave their loop (and their exit is expected)."""
        self.group.expect_exit()
        self.sync.lead_stop()

    def close(self, timeout: float) -> bool:
        return self.group.close(timeout)


class _AloneInStep:
    """StepSync's rank-0 end for a peer of one rank: the step is this rank's alone."""

    def lead(self, **_) -> None:
        pass

    def abandon_step(self) -> None:
        pass

    def average_gradients(self, *, samples: int, loss: float):
        from swarmd.ranks.step_sync import StepTotals

        return StepTotals(samples=samples, loss=loss)


class _NoRankStats:
    def record(self, totals) -> None:
        pass


@dataclass
class OneRank:
    """A peer that trains on one device (this process): the null object of LocalRanks."""

    devices: tuple = ()
    sync: Any = dataclasses.field(default_factory=_AloneInStep)
    stats: Any = dataclasses.field(default_factory=_NoRankStats)

    def dead_rank(self) -> Optional[str]:
        return None

    def report(self) -> RanksReport:
        return RanksReport()  # the status shows no ranks, and rank 0's device (the identity's) as the only one

    def stop(self) -> None:
        pass

    def close(self, timeout: float) -> bool:
        return True


async def start_local_ranks(config, *, devices, model, init_seed: int, data_seed: int) -> LocalRanks | OneRank:
    """Start and connect ranks 1..N-1 (or join torchrun's group); OneRank for a one-rank peer.

    `start()` runs on the calling (main) thread: the children's PDEATHSIG follows the thread that forked them.
    A rank that cannot start raises RankFailure naming it (the daemon exits 1)."""
    from swarmd.ranks.group import RankGroup, TorchrunGroup, rank_timeouts
    from swarmd.ranks.layout import torchrun_rank
    from swarmd.ranks.rank_stats import RankStats
    from swarmd.ranks.step_sync import StepSync

    place = torchrun_rank(os.environ)
    leader_timeout, follower_timeout = rank_timeouts(config)
    if place is not None:
        group = TorchrunGroup(
            place, device=str(devices[0]), data_seed=data_seed, environ=os.environ, leader_timeout=leader_timeout
        )
    elif len(devices) > 1:
        group = RankGroup(
            devices=[str(d) for d in devices], config_data=config.to_dict(), workdir=config.state_path,
            init_seed=init_seed, data_seed=data_seed, leader_timeout=leader_timeout,
            follower_timeout=follower_timeout, threads=config.training.threads,
        )
    else:
        return OneRank(tuple(str(device) for device in devices))
    group.start()
    try:
        await asyncio.to_thread(group.connect, _CONNECT_TIMEOUT)
    except BaseException:
        group.close(10.0)
        raise
    sync = StepSync(model, rank=0, world_size=group.world_size, device=devices[0], describe_failure=group.dead_rank)
    return LocalRanks(group=group, sync=sync, stats=RankStats(group.devices), devices=tuple(group.devices))
