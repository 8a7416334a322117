"""Faults across peers: a peer that contributes garbage, killed mid-run and restarted."""

import time

from daemons import peer_config


def swarm_config(**task):
    return peer_config(
        task={"name": "faulty", **task},
        swarm={
            "target_batch_size": 96,
            "matchmaking_time": 2.0,
            "averaging_timeout": 10.0,
            "load_state_timeout": 30.0,
            # a peer that dies without a goodbye drops out of num_peers when its progress record expires
            "tracker_opts": {"metadata_expiration": 15.0},
            # hivemind's mean: the garbage reaches the average, which is what the guards under test must catch
            # (robust aggregation would clip it first: tests/swarm/test_lying_peers.py)
            "aggregation": {"method": "mean"},
        },
        training={"batch_size": 16, "threads": 1, "seed": 0},
        checkpoint={"every_epochs": 2, "keep": 3},
    )


def peers_together(n):
    return lambda s: s["num_peers"] == n and s["local_epoch"] is not None and s["local_epoch"] >= 2


def test_a_garbage_peer_is_rejected_and_when_killed_survived_and_it_rejoins_from_its_checkpoint(daemons, test_tasks_env):
    """One three-peer swarm for both faults (each scenario alone cost ~80 s of swarm set-up on 2 cores): a peer
    whose gradients are garbage joins two honest ones, is rejected, is killed -9 mid-round, and restarts."""
    a = daemons("honest-a", swarm_config(step_sleep=0.02), env=test_tasks_env)
    # the mean loss of the first epoch, before any learning (read early: the history window is bounded)
    initial_loss = a.wait_status(lambda s: s["loss_history"], 120, "a first epoch")["loss_history"][0][1]
    extra = a.joining_args()
    b = daemons("honest-b", swarm_config(step_sleep=0.02), env=test_tasks_env, extra_args=extra)
    before = a.wait_status(lambda s: s["num_peers"] == 2 and s["local_epoch"] >= 5 and s["loss"], 180, "honest training")
    assert before["loss"] < 0.5 * initial_loss  # the honest pair learns

    # A peer whose gradients are scaled by -1e6: garbage that would push everyone uphill.
    garbage_config = swarm_config(step_sleep=0.02, grad_scale=-1e6)
    c = daemons("garbage", garbage_config, env=test_tasks_env, extra_args=extra)
    for peer in (a, b, c):
        peer.wait_status(peers_together(3), 180, "three peers training together")
    for peer in (a, b):
        status = peer.wait_status(
            lambda s: s["averaging"]["gradients"].get("rejected", 0) >= 3, 180, "garbage averages rejected"
        )
        assert status["num_peers"] == 3
    assert "Rejected the averaged gradients" in a.log
    c_id = c.wait_status(lambda s: s["checkpoint"] is not None, 60, "a checkpoint of the garbage peer")["peer_id"]

    # Kill it while a round is coming: the swarm has accumulated most of the target batch.
    a.wait_status(lambda s: s["samples_accumulated"] >= 0.5 * s["target_batch_size"], 60, "a round about to start")
    epoch_at_kill = a.status()["global_epoch"]
    killed_at = time.monotonic()
    c.kill()
    assert c.leftover_processes() == []
    for peer in (a, b):
        peer.wait_status(lambda s: s["global_epoch"] >= epoch_at_kill + 3, 120, "epochs after the kill")
    epochs_resumed_after = time.monotonic() - killed_at
    for peer in (a, b):
        peer.wait_status(lambda s: s["num_peers"] == 2, 90, "the swarm shrinking to 2")
    shrunk_after = time.monotonic() - killed_at
    # Parameter averaging mixed in the garbage peer's (slowly worsening) weights, so the loss may have risen a
    # little; blowing up would mean leaving the learned regime (without the guard it climbs past the start).
    after = a.status()
    assert after["loss"] < 0.5 * initial_loss, (initial_loss, before["loss"], after["loss"])

    restarted_at = time.monotonic()
    c2 = daemons("garbage-again", garbage_config, env=test_tasks_env, extra_args=extra, state_dir=c.state_dir)
    status = c2.wait_status(lambda s: s["state"] == "training" and s["local_epoch"] is not None, 120, "c restarted")
    assert status["peer_id"] == c_id
    assert "Resuming from checkpoint" in c2.log
    swarm_epoch = a.status()["global_epoch"]
    c2.wait_status(lambda s: s["local_epoch"] >= swarm_epoch and s["num_peers"] == 3, 120, "c caught up, three peers")
    rejoined_after = time.monotonic() - restarted_at
    a.wait_status(lambda s: s["num_peers"] == 3, 60, "a sees three peers again")
    print(
        f"\nrecovery: survivors advanced 3 epochs {epochs_resumed_after:.1f} s after the kill; "
        f"num_peers==2 after {shrunk_after:.1f} s; the restarted peer caught up in {rejoined_after:.1f} s"
    )
    for peer in (a, b, c2):
        assert peer.terminate() == 0
        assert peer.leftover_processes() == []
