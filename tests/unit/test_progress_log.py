import asyncio
import logging

from swarmd.daemon.progress_log import ProgressLogger, progress_line
from swarmd.status.snapshot import Snapshot
from swarmd.swarm.averaging_log import AveragingRound


def snapshot(**changes):
    base = dict(
        run_id="unit-run", public_name="alpha", task="swin", precision="fp32", client_mode=False, auxiliary=False,
        started_at=0.0, state="training", phase="training", local_epoch=12, global_epoch=13, num_peers=2,
        samples_per_second=245.4, loss=1.23456,
        last_averaging=AveragingRound("gradients", "success", 2, 0.5, 12, 0.0),
    )
    return Snapshot(**{**base, **changes})


def test_the_line_says_epoch_peers_rate_loss_and_the_last_round():
    assert progress_line(snapshot()) == (
        "epoch 12 (swarm at 13), 2 peers, 245.4 samples/s, loss 1.235, last round: gradients success with 2"
    )
    assert progress_line(snapshot(global_epoch=12, num_peers=1, loss=None, last_averaging=None)) == (
        "epoch 12, 1 peer, 245.4 samples/s"
    )
    # a view of the swarm from before this peer's own step (a solo peer's is, just after each of its epochs)
    assert progress_line(snapshot(global_epoch=11, num_peers=1, loss=None, last_averaging=None)) == (
        "epoch 12, 1 peer, 245.4 samples/s"
    )


def test_logs_at_most_once_per_interval_and_only_while_training(caplog):
    progress = ProgressLogger(interval=3600)
    progress._next = 0  # due now
    with caplog.at_level(logging.INFO, logger="swarmd.progress"):
        asyncio.run(progress.tick(None, snapshot(state="joining")))
        asyncio.run(progress.tick(None, snapshot()))
        asyncio.run(progress.tick(None, snapshot()))
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["epoch 12 (swarm at 13)"]
