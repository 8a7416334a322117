"""A peer of several ranks (training.devices: [cpu, cpu], gloo on 127.0.0.1) as a user runs it: `swarmd join`.

- it trains exactly what one rank with the union batch trains (the toy task's exact shards);
- it trains in a swarm with a one-rank peer, contributing twice the samples per step;
- kill -9 of its second rank stops it with one line naming the rank, exit 1, no process left, and a restart
  resumes from the checkpoint it wrote.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from daemons import peer_config

pytestmark = pytest.mark.swarm

BATCH = 8
EPOCHS = 6


def toy(tmp_path: Path, *, ranks: int, batch: int, **swarm) -> dict:
    return peer_config(
        run_id=f"ranks-{ranks}",
        task={"name": "toy-regression", "lr": 0.3, "lr_decay": 0.0, "frozen_step_seconds": 0.0,
              "shard": {"index": 0, "count": 1, "data_seed": 3}},
        swarm={"target_batch_size": 2 * BATCH, "matchmaking_time": 2.0, "averaging_timeout": 20.0,
               "grad_compression": "none", **swarm},
        training={"batch_size": batch, "seed": 0, "max_epochs": EPOCHS, "threads": 1,
                  **({"devices": ["cpu"] * ranks} if ranks > 1 else {})},
        checkpoint={"every_epochs": 1},
    )


def checkpoints(node) -> list:
    """The peer's checkpoints, newest first."""
    from swarmd.checkpoints.store import CheckpointStore

    store = CheckpointStore(node.state_dir / "checkpoints", keep=3)
    return [store.load(path) for path in store.list()]


def two_ranks_against_one(daemons, env, tmp_path, **swarm):
    """Run a two-rank peer (batch B) and a one-rank peer (batch 2B) alone to the end; check they end with the same
    model and that it trained. Returns their last checkpoints (one's, two's)."""
    two = daemons("two", toy(tmp_path, ranks=2, batch=BATCH, **swarm), env=env)
    one = daemons("one", toy(tmp_path, ranks=1, batch=2 * BATCH, **swarm), env=env)
    for node in (two, one):
        assert node.proc.wait(timeout=300) == 0, node.tail()
    assert "Training on 2 ranks: cpu, cpu" in two.log
    assert two.leftover_processes() == []
    [expected, *_], [got, *older] = checkpoints(one), checkpoints(two)
    assert expected.epoch == got.epoch == EPOCHS, two.tail()
    for name, value in expected.model_state.items():
        error = float((got.model_state[name] - value).norm() / value.norm())
        assert error < 1e-5, f"{name}: off by {error:.2e} (relative)"
    # it trained: the parameters moved between the epochs compared
    moved = max(float((got.model_state[k] - older[-1].model_state[k]).norm()) for k in expected.model_state)
    assert moved > 1e-3, moved
    return expected, got


def test_two_ranks_train_what_one_rank_with_the_union_batch_trains(daemons, test_tasks_env, tmp_path):
    two_ranks_against_one(daemons, test_tasks_env, tmp_path)


def test_a_two_rank_diloco_peer_takes_the_inner_and_outer_steps_of_one_rank_with_the_union_batch(
    daemons, test_tasks_env, tmp_path
):
    """strategy diloco on two ranks: every inner step on the ranks' averaged gradient (rank 0 steps, the other rank
    takes the new parameters), the pseudo-gradient of the replicas at the round's end, alone here, so the outer
    step is on it: the same outer parameters, momentum and model as one rank with the union batch."""
    diloco = {"strategy": "diloco", "diloco": {"inner_steps": 3, "max_straggler_wait": 0.0}}
    expected, got = two_ranks_against_one(daemons, test_tasks_env, tmp_path, **diloco)
    state, reference = got.optimizer_state["state"], expected.optimizer_state["state"]
    for index in (key for key in reference if isinstance(key, int)):
        for key in ("outer_param", "outer_momentum"):
            error = float((state[index][key] - reference[index][key]).norm() / reference[index][key].norm())
            assert error < 1e-5, f"{key} {index}: off by {error:.2e} (relative)"


def test_a_two_rank_peer_and_a_one_rank_peer_average_together(daemons, test_tasks_env, tmp_path):
    config = toy(tmp_path, ranks=2, batch=BATCH)
    config["run_id"] = "mixed-ranks"
    config["training"]["max_epochs"] = 0
    config["task"].pop("shard")
    first = daemons("two-ranks", config, env=test_tasks_env)
    single = toy(tmp_path, ranks=1, batch=BATCH)
    single["run_id"], single["training"]["max_epochs"] = "mixed-ranks", 0
    single["task"].pop("shard")
    second = daemons("one-rank", single, env=test_tasks_env, extra_args=first.joining_args())

    def averaged_in_pairs(status):
        return status["num_peers"] == 2 and any(
            r["kind"] == "gradients" and r["outcome"] == "success" and r["group_size"] == 2
            for r in status["recent_averaging"]
        )

    status = first.wait_status(averaged_in_pairs, 240, "a gradient round of the two peers")
    second.wait_status(averaged_in_pairs, 120, "the same round seen by the one-rank peer")
    assert status["devices"] == ["cpu", "cpu"] and [r["rank"] for r in status["ranks"]] == [0, 1]
    assert all(r["samples_total"] > 0 for r in status["ranks"])
    assert status["samples_total"] == 2 * BATCH * status["steps_total"]  # both ranks' samples, every step
    own = second.status()
    assert own["samples_total"] == BATCH * own["steps_total"] and own["devices"] == ["cpu"] and own["ranks"] == []
    for node in (first, second):
        assert node.terminate() == 0, node.tail()
        assert node.leftover_processes() == []


def compute_rank_pids(node) -> list[int]:
    pids = []
    for pid in node.descendants():
        try:
            if b"swarmd.ranks.compute_rank" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            pass
    return pids


def test_kill_9_of_a_rank_stops_the_peer_cleanly_and_it_resumes(daemons, test_tasks_env, tmp_path):
    config = toy(tmp_path, ranks=2, batch=BATCH)
    config["training"]["max_epochs"] = 0
    config["task"]["frozen_step_seconds"] = 0.3  # paced, so the kill lands mid-run
    config["task"]["frozen_epochs"] = 10**6
    state_dir = tmp_path / "killed"
    peer = daemons("killed", config, env=test_tasks_env, state_dir=state_dir)
    peer.wait_status(lambda s: ((s["checkpoint"] or {}).get("epoch") or 0) >= 3, 240, "a few checkpoints")
    [rank_pid] = compute_rank_pids(peer)
    os.kill(rank_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert peer.proc.wait(timeout=60) == 1, peer.tail()
    assert time.monotonic() - killed_at < 30
    lines = [line for line in peer.log.splitlines() if "Stopping: rank 1 (cpu) was killed by SIGKILL" in line]
    assert len(lines) == 1, peer.tail()
    assert peer.leftover_processes() == []
    saved = peer.log.count("Saved checkpoint")
    assert saved >= 1

    again = daemons("again", config, env=test_tasks_env, state_dir=state_dir)
    again.wait_for(lambda: "Resuming from checkpoint" in again.log, 240, "the resume")
    again.wait_status(lambda s: s["state"] == "training" and s["steps_total"] > 0, 240, "training again on 2 ranks")
    assert again.terminate() == 0, again.tail()
    assert again.leftover_processes() == []
