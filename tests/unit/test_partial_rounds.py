"""An averager's round that returned only part of the average says so (swarm/upstream/partial_rounds.py): the share that did
not arrive rides on the gathered data across the pipe to the host, with the times the all-reduce began and ended."""

import asyncio
import pickle
import time
import types

from hivemind.averaging import DecentralizedAverager

from swarmd.swarm.upstream.partial_rounds import GatheredRound, ReportsPartialRounds, missing_share


def test_the_missing_share_crosses_a_pipe_and_reads_as_the_gathered_dict():
    gathered = pickle.loads(pickle.dumps(GatheredRound({"peer-a": [1, False], "peer-b": [1, False]}, 0.25)))
    assert missing_share(gathered) == 0.25
    assert dict(gathered) == {"peer-a": [1, False], "peer-b": [1, False]} and len(gathered) == 2
    assert missing_share({"peer-a": 1}) == 0.0


def _round(monkeypatch, failed_size: int, total_size: int):
    """What ReportsPartialRounds makes of a round whose all-reduce left `failed_size` of `total_size` unaveraged."""

    async def upstream(self, group_info, min_vector_size, **kwargs):
        return {"peer-a": 1, "peer-b": 1}

    monkeypatch.setattr(DecentralizedAverager, "_aggregate_with_group", upstream)
    averager = object.__new__(ReportsPartialRounds)
    averager._parent_pid = None  # what upstream's __del__ reads: not this process's averager
    runner = types.SimpleNamespace(
        tensor_part_container=types.SimpleNamespace(failed_size=failed_size, total_size=total_size)
    )

    async def run():
        finished = asyncio.get_running_loop().create_future()
        finished.set_result(runner)
        averager._running_groups = {b"group": finished}
        return await averager._aggregate_with_group(types.SimpleNamespace(group_id=b"group"), 0)

    return asyncio.run(run())


def test_a_round_with_a_failed_part_reports_its_share(monkeypatch):
    gathered = _round(monkeypatch, failed_size=30, total_size=120)
    assert isinstance(gathered, GatheredRound) and missing_share(gathered) == 0.25
    assert dict(gathered) == {"peer-a": 1, "peer-b": 1}


def test_a_whole_round_reads_as_upstreams_dict_and_carries_its_all_reduce_times(monkeypatch):
    before = time.time()
    gathered = _round(monkeypatch, failed_size=0, total_size=120)
    assert isinstance(gathered, GatheredRound) and missing_share(gathered) == 0.0
    assert dict(gathered) == {"peer-a": 1, "peer-b": 1}
    assert before <= gathered.grouped_at <= gathered.reduced_at <= time.time()
    again = pickle.loads(pickle.dumps(gathered))  # to the host's process
    assert (again.grouped_at, again.reduced_at) == (gathered.grouped_at, gathered.reduced_at)
