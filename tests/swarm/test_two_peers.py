"""Two daemons started as a user would train together, stop cleanly and resume where they stopped."""

from daemons import peer_config

STOP_BOUND = 60  # seconds: the documented graceful-stop bound of the test config is 40


def swin_config(shared_data, **sections):
    task = {"name": "swin", "data": {"path": str(shared_data)}, "eval_every_epochs": 0}
    return peer_config(task=task, **sections)


def test_two_peers_average_stop_and_resume(daemons, shared_data):
    first = daemons("first", swin_config(shared_data))
    command = first.join_line()
    assert command[:2] == ["swarmd", "join"] and "--initial-peers" in command

    # The second peer joins with exactly the printed line (plus its own state dir and config).
    second = daemons("second", swin_config(shared_data), extra_args=command[2:])

    def trained_together(status):
        last = status["averaging"].get("gradients", {})
        return status["global_epoch"] is not None and status["global_epoch"] >= 3 and status["num_peers"] == 2 and last.get("success", 0) >= 1

    for peer in (first, second):
        status = peer.wait_status(trained_together, timeout=240, what="epoch >= 3 with two peers averaging")
        assert status["state"] == "training"
        together = [r for r in status["recent_averaging"] if r["kind"] == "gradients" and r["outcome"] == "success"]
        assert together and max(r["group_size"] for r in together) == 2, status["recent_averaging"]
        # the flight recorder's entry: when it asked, when the group's all-reduce began and ended, with whom
        timeline = next(r["timeline"] for r in reversed(together) if r["group_size"] == 2)
        marks = [timeline[mark] for mark in ("asked_at", "grouped_at", "reduced_at", "ended_at")]
        assert all(marks) and marks == sorted(marks), timeline
        assert status["peer_id"] in timeline["peers"] and len(set(timeline["peers"])) == 2, timeline
        # and what its all-reduce moved: half of its gradients out to the other reducer, that half's average back
        sent, received = timeline["sent_bytes"], timeline["received_bytes"]
        assert sent > 10_000 and received > 10_000 and 0.5 < sent / received < 2, timeline
        assert status["loss"] is not None
        for key in ("run_id", "peer_id", "local_epoch", "samples_accumulated", "target_batch_size", "eta_seconds", "samples_per_second"):
            assert key in status

    first_id = first.status()["peer_id"]
    second.wait_status(lambda s: s["local_epoch"] >= 3, timeout=60, what="local epoch 3")

    # SIGTERM: exit 0 within the bound, a checkpoint on disk, nothing left running.
    saved_epochs = {}
    for peer in (second, first):
        epoch_before = peer.status()["local_epoch"]
        assert peer.terminate(timeout=STOP_BOUND) == 0, peer.tail()
        assert peer.leftover_processes() == [], peer.tail()
        assert peer.leftover_shared_memory() == [], peer.tail()
        assert not (peer.state_dir / "swarmd.sock").exists()
        checkpoints = sorted((peer.state_dir / "checkpoints").glob("epoch-*"))
        assert checkpoints, peer.tail()
        saved_epochs[peer.name] = int(checkpoints[-1].name.split("-")[1])
        assert saved_epochs[peer.name] >= epoch_before
        assert "Stopped (exit code 0)" in peer.log

    # Restart the first peer alone: same identity, resumes at (not below) its saved epoch.
    restarted = daemons("first-again", swin_config(shared_data), state_dir=first.state_dir)
    status = restarted.wait_status(lambda s: s["local_epoch"] is not None, timeout=120, what="restart")
    assert status["peer_id"] == first_id
    assert status["local_epoch"] >= saved_epochs["first"]
    assert "Resuming from checkpoint" in restarted.log
    assert restarted.terminate(timeout=STOP_BOUND) == 0
    assert restarted.leftover_processes() == []
