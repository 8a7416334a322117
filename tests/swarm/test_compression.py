"""Two real peers average their gradients in 8 bits (hivemind's UNIFORM_8BIT and BLOCKWISE_8BIT wire formats,
under NumPy 2, blockwise without bitsandbytes): every round succeeds with both peers and the loss falls.

hivemind 1.1.12 could not decode these messages under NumPy 2 (and swarmd refused the names), so every round
failed and each peer stepped on its own gradients.

One peer sends UNIFORM_8BIT, the other BLOCKWISE_8BIT: each decodes the other's parts and returns the averaged
ones in the sender's format, so both codecs run in both directions in one swarm. The set-up is the equivalence
test's (tests/swarm/test_equivalence.py): the toy task, exact data shards and one step per peer per global epoch,
starting frozen (LR 0) until both peers have averaged once, so that from then on every epoch is averaged by both
instead of each peer racing through epochs alone. The daemons fixture kills both peers afterwards (a graceful stop
is tested elsewhere and would add half a minute).
"""

import os

from daemons import peer_config

BATCH = 16
TRAINED = 8  # global epochs trained in lockstep, every one averaged in 8 bits


def peer(tmp_path, index: int, compression: str) -> dict:
    return peer_config(
        task={
            "name": "toy-regression",
            "lr": 0.5,
            "frozen_step_seconds": 0.3,
            "shard": {"index": index, "count": 2, "data_seed": 7},
            "start_file": str(tmp_path / "start"),
            "unfreeze_file": str(tmp_path / "unfreeze"),
        },
        swarm={
            "target_batch_size": BATCH,
            "matchmaking_time": 2.0,
            "averaging_timeout": 20.0,
            "prescheduled_averaging": False,
            "grad_compression": compression,
            "average_state_every": 1_000_000,
            "tracker_opts": {"min_refresh_period": 0.1, "default_refresh_period": 0.2},
        },
        training={"batch_size": BATCH, "seed": 0},
        checkpoint={"enabled": False},
    )


def averaged_together(status) -> bool:
    return any(
        r["kind"] == "gradients" and r["outcome"] == "success" and r["group_size"] == 2
        for r in status["recent_averaging"]
    )


def test_two_peers_average_8bit_gradients_and_learn(daemons, test_tasks_env, tmp_path):
    first = daemons("uint8", peer(tmp_path, 0, "uint8"), env=test_tasks_env)
    second = daemons("blockwise8", peer(tmp_path, 1, "blockwise8"), env=test_tasks_env, extra_args=first.joining_args())
    for node in (first, second):
        node.wait_status(lambda s: s["state"] == "training", timeout=120, what="training")
    (tmp_path / "start").touch()
    formed = max(
        node.wait_status(averaged_together, timeout=90, what="a 2-peer gradient round")["local_epoch"]
        for node in (first, second)
    )
    start = formed + 2
    (tmp_path / "unfreeze.tmp").write_text(str(start))
    os.replace(tmp_path / "unfreeze.tmp", tmp_path / "unfreeze")

    for node in (first, second):
        seen = {}  # epoch -> (outcome, group size) of its gradient round; status shows the last 10 rounds only

        def trained_together(status) -> bool:
            seen.update({r["epoch"]: (r["outcome"], r["group_size"]) for r in status["recent_averaging"]
                         if r["kind"] == "gradients"})
            # an epoch's round is recorded during its last step, its mean loss just after: wait for both
            last_loss_in = start + TRAINED - 1 in dict(status["loss_history"])
            return all(e in seen for e in range(start, start + TRAINED)) and last_loss_in

        status = node.wait_status(trained_together, timeout=90, what=f"{TRAINED} trained epochs after epoch {start}")
        outcomes = {e: seen[e] for e in range(start, start + TRAINED)}
        assert all(outcome == ("success", 2) for outcome in outcomes.values()), (node.name, outcomes)
        assert status["averaging"]["gradients"]["rejected"] == 0  # no averaged gradient implausible against ours
        losses = dict(status["loss_history"])
        assert losses[start + TRAINED - 1] < 0.5 * losses[start], (node.name, losses)
