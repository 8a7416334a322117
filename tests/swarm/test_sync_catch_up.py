"""A sync peer whose state download the swarm outran catches up by averaging instead of downloading again.

When the swarm's epoch is shorter than a state download (docs/PERFORMANCE.md section 5: 3.5 s against 6 s for 20M
parameters), every download ends more than an epoch behind and upstream sends the peer back for another: the join
time's "chase". Two in-process hivemind peers: the swarm trains on while the joiner "downloads"; the joiner then
takes the swarm's epoch with its older state, trains along, and the next state averaging (every STATE_EVERY
epochs) gives it the swarm's parameters with its own weighing next to nothing.
"""

import threading
import time

import pytest
import torch

from swarmd.config.schema import StrictModel, SwarmdConfig
from swarmd.swarm.dht_process import ToleratesExitedCallers
from swarmd.tasks.base import StepOutput, Task, TaskContext

BATCH = 8
STATE_EVERY = 4


class _Probe(Task):
    name = "sync-catch-up-probe"
    Config = StrictModel

    def build_model(self):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def build_optimizer(self, param_groups):
        return torch.optim.SGD(param_groups, lr=0.1)

    def train_batches(self, seed):
        raise NotImplementedError  # the test steps the optimizer itself

    def training_step(self, model, batch):
        x, y = batch
        return StepOutput(loss=torch.nn.functional.mse_loss(model(x), y), batch_size=x.shape[0])


def _peer(dht, tmp_path, offload_optimizer: bool, **tracker_opts):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategy import build_swarm_optimizer

    config = SwarmdConfig.model_validate(
        {
            "run_id": "sync-catch-up",
            "swarm": {
                "target_batch_size": 2 * BATCH,  # epochs the two peers share once both train
                "matchmaking_time": 1.0,
                "averaging_timeout": 5.0,
                "prescheduled_averaging": False,
                "grad_compression": "none",
                "state_averaging_compression": "none",  # fp16 would blur the 1e-6 weight the test measures
                "average_state_every": STATE_EVERY,
                "offload_optimizer": offload_optimizer,
                "tracker_opts": {"min_refresh_period": 0.1, "default_refresh_period": 0.2, **tracker_opts},
            },
            "training": {"batch_size": BATCH},
        }
    )
    task = _Probe(StrictModel(), TaskContext(tmp_path, torch.device("cpu"), "fp32", BATCH, 0))
    model = task.build_model()
    log = AveragingLog()
    optimizer = build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=log)
    return task, model, optimizer, log


def _train_step(peer, seed: int, compute_seconds: float = 0.0) -> None:
    task, model, optimizer, _ = peer
    time.sleep(compute_seconds)  # a step of a real model: the peers' trackers see each other's progress meanwhile
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randn(BATCH, 16, generator=generator), torch.randn(BATCH, 1, generator=generator)
    output = task.training_step(model, batch)
    output.loss.backward()
    optimizer.step(batch_size=output.batch_size)
    model.zero_grad()


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _max_difference(model, other) -> float:
    return max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(model.parameters(), other.parameters()))


# hivemind's default on CPU offloads the optimizer: the state averager then averages the offloaded parameters in
# place (reuse_tensors), and the drift it would have measured against its own is not there to read.
@pytest.mark.parametrize("offload_optimizer", [True, False], ids=["offloaded", "in-place"])
def test_a_sync_peer_the_swarm_outran_during_its_download_catches_up_by_averaging(dht, tmp_path, offload_optimizer):
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    swarm = _peer(dht, tmp_path, offload_optimizer)
    joiner = None
    seeds = iter(range(10**6))
    try:
        for _ in range(4):
            _train_step(swarm, next(seeds))  # alone: two epochs of two steps
        joiner = _peer(other_dht, tmp_path, offload_optimizer, private_key=RSAPrivateKey())  # its own progress record
        joiner[2].load_state_from_peers()
        assert joiner[2].local_epoch == 2 and joiner[2].state_loads_total == 1
        for _ in range(4):
            _train_step(swarm, next(seeds))  # "during the download": two more epochs, its rounds find nobody
        _wait_for(lambda: joiner[2].tracker.global_epoch == 4, "the joiner to see the swarm's epoch")

        _train_step(joiner, next(seeds))  # behind: upstream would download again
        assert joiner[2].state_loads_total == 1, "the joiner downloaded again instead of catching up"
        assert joiner[2].catching_up and joiner[2].local_epoch == 4
        assert not joiner[2].state_averager.allow_state_sharing  # its state is not its epoch's
        assert _max_difference(joiner[1], swarm[1]) > 1e-3  # the swarm's state of 2 steps ago

        stop = threading.Event()
        failures = []

        def train(peer):
            try:
                while not stop.is_set():
                    _train_step(peer, next(seeds), compute_seconds=0.1)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failures.append(e)

        threads = [threading.Thread(target=train, args=(peer,)) for peer in (swarm, joiner)]
        for thread in threads:
            thread.start()
        try:
            _wait_for(lambda: not joiner[2].catching_up or failures, "the joiner to catch up", timeout=90)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert not failures, failures
        state_round = joiner[3].last("state")
        assert state_round.outcome == "success" and state_round.group_size == 2, state_round
        assert joiner[2].state_averager.allow_state_sharing and joiner[2].state_averager.round_weight is None
        if offload_optimizer:
            return
        # The joiner's parameters were 2 steps stale, the swarm's weighed all but everything in the average:
        joiner_drift = joiner[2].state_averager.last_parameter_drift
        swarm_drift = swarm[2].state_averager.last_parameter_drift
        assert joiner_drift > 1e-3, joiner_drift
        assert swarm_drift < 1e-5, f"the catching-up peer's state moved the swarm's: drift {swarm_drift}"
    finally:
        swarm[2].shutdown()
        if joiner is not None:
            joiner[2].shutdown()
        other_dht.shutdown()
