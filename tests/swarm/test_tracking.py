"""A real peer with tracking on: TensorBoard event files and an offline wandb run hold its epochs, and the wandb
process it started is gone when it stops."""

import json

from daemons import peer_config
from tracking_readers import tensorboard_scalars, wandb_history

MAX_EPOCHS = 6


def test_a_peer_logs_every_epoch_to_tensorboard_and_wandb_offline(daemons, test_tasks_env, tmp_path):
    config = peer_config(
        # steps paced at 0.4 s (2 per epoch) so the daemon's 0.5 s tick sees every epoch
        task={"name": "toy-regression", "frozen_epochs": MAX_EPOCHS, "frozen_step_seconds": 0.4},
        swarm={"target_batch_size": 64},
        training={"batch_size": 32, "max_epochs": MAX_EPOCHS},
        daemon={"public_name": "tracked"},
        tracking={"backends": ["tensorboard", "wandb"], "log_every_steps": 2, "wandb": {"mode": "offline"}},
    )
    peer = daemons("peer", config, env=test_tasks_env)
    peer.wait_status(
        lambda s: s.get("tracking", {}).get("backends") == ["tensorboard", "wandb"] and (s["local_epoch"] or 0) >= 1,
        timeout=120,
        what="tracking running with both backends",
    )
    assert peer.proc.wait(timeout=180) == 0, peer.tail()
    assert "Reached training.max_epochs" in peer.log
    assert peer.leftover_processes() == [], peer.tail()  # wandb's own process included
    assert "Tracking backend" not in peer.log, peer.tail()
    assert "wandb-core" not in peer.log and "Traceback" not in peer.log, peer.tail()  # wandb stopped in order

    runs = list((peer.state_dir / "tracking" / "tensorboard").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("tracked-")
    scalars = tensorboard_scalars(runs[0])
    print(json.dumps({tag: sorted(points) for tag, points in scalars.items()}))
    epochs = sorted(scalars["swarm/local_epoch"])
    assert epochs == list(range(epochs[0], MAX_EPOCHS + 1)) and epochs[0] <= 1, epochs
    assert all(scalars["swarm/local_epoch"][e] == e for e in epochs)
    # every epoch this peer finished has its mean loss (the last one, MAX_EPOCHS, never ran a step)
    assert sorted(scalars["loss_metrics/epoch_avg_loss"]) == list(range(MAX_EPOCHS)), scalars["loss_metrics/epoch_avg_loss"]
    assert len(scalars["loss_metrics/recent_avg_loss"]) >= MAX_EPOCHS // 2
    assert scalars["swarm/num_peers"][MAX_EPOCHS] == 1.0  # (0 until hivemind's tracker has read its own report)
    assert scalars["throughput/local_samples_per_second"][MAX_EPOCHS] > 0
    assert sorted(scalars["lr/group_0"]) == epochs
    # the norm of the gradient each global step used (local here: one peer), from the first step on
    assert set(scalars["loss_metrics/grad_norm"]) >= set(range(1, MAX_EPOCHS + 1)), scalars["loss_metrics/grad_norm"]
    assert all(value > 0 for value in scalars["loss_metrics/grad_norm"].values())

    run_files = list((peer.state_dir / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    rows = wandb_history(run_files[0])
    logged = {row["epoch"] for row in rows if "loss_metrics/epoch_avg_loss" in row}
    assert logged == set(range(MAX_EPOCHS)), rows


def test_a_broken_backend_is_dropped_and_training_goes_on(daemons, test_tasks_env, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the log dir should go")  # mkdir under it fails, as a full or gone disk would
    config = peer_config(
        task={"name": "toy-regression", "frozen_epochs": 5, "frozen_step_seconds": 0.4},
        swarm={"target_batch_size": 64},
        training={"batch_size": 32, "max_epochs": 5},
        tracking={"backends": ["tensorboard"], "tensorboard": {"log_dir": str(blocker / "tensorboard")}},
    )
    peer = daemons("peer", config, env=test_tasks_env)
    status = peer.wait_status(
        lambda s: s.get("tracking", {}).get("failures_total") == 1 and (s["local_epoch"] or 0) >= 1,
        timeout=150,
        what="the tensorboard backend dropped while training goes on",
    )
    assert status["tracking"]["backends"] == [] and status["tracking"]["failed"][0].startswith("tensorboard: ")
    assert peer.proc.wait(timeout=120) == 0, peer.tail()
    assert "Reached training.max_epochs=5" in peer.log
    assert peer.log.count("Tracking backend tensorboard failed") == 1, peer.tail()
