"""Collaborative training's core claim: averaging two peers' gradients IS training on the union of their batches.

Two real peers (toy-regression plug-in, exact data shards, SGD, fp32, no compression) each compute the gradient of
b = 16 rows per global step; the swarm averages them and steps. One plain PyTorch process trains the same model
(same seed) on the same 2b rows per step. Their loss trajectories and final parameters must agree.

Why target_batch_size is b (not 2b): in hivemind the first peer to report samples cannot see the other's samples
yet, so with a target of 2b it takes a second local step before the epoch ends and averages 2b of its own samples
against b of the other's, a different (sample-weighted) average than the 2b-row batch. With target b each peer ends
every epoch after exactly one step, so every global step averages one b-row shard from each peer: 2b rows, equal
weights, exactly the single process's batch.

Why the run starts frozen (LR 0): a peer appears in the swarm's progress only after it has reported samples, so
the first steps cannot be averaged, and the two peers may need a few epochs (and a state download) to fall into
step. At LR 0 those epochs change nothing (plain SGD has no state). Once both peers have averaged gradients with
each other, the test names the first trained epoch E a few epochs ahead; from E on both train in lockstep.

Why without pre-scheduled averaging: hivemind starts a pre-scheduled round before the epoch ends; with target b an
epoch ends right after each step, and in about half of the runs on a loaded 2-core box one round then completed
with a part missing ("Averaging: received 99.8% results": hivemind counts it a success, and that part is left
un-averaged), which an exactness check cannot accept. Formed at the step instead, every round was complete in all
runs measured. (This mode skipped every second round until swarm/upstream/optimizer.py cleared finished rounds.)

Tolerance: float32 sums the two half-batch gradients in another order than the single 2b-row backward pass, so the
trajectories differ by rounding only (measured 2-3e-7 in the losses, 2e-6 to 1e-5 in the final parameters). A missing or
mis-weighted average differs by orders of magnitude more, which the test checks too, so it cannot pass by accident.
"""

import json
import os
import threading
from typing import Optional

import pytest
import torch

from daemons import peer_config

BATCH = 16
TRAINED = 10  # global epochs trained (after the frozen ones) that are compared with the single process
MAX_EPOCHS = 20  # the peers stop here; the first trained epoch must leave TRAINED epochs before it
TOLERANCE = 1e-4  # relative; see the module docstring
TASK = {"name": "toy-regression", "lr": 0.5, "lr_decay": 0.1, "frozen_step_seconds": 0.5}


def peer(tmp_path, index: int) -> dict:
    return peer_config(
        task={
            **TASK,
            "shard": {"index": index, "count": 2, "data_seed": 7},
            "start_file": str(tmp_path / "start"),
            "unfreeze_file": str(tmp_path / "unfreeze"),
            "trace_path": str(tmp_path / f"trace-{index}.txt"),
        },
        swarm={
            "target_batch_size": BATCH,
            "matchmaking_time": 2.0,
            "averaging_timeout": 20.0,
            "prescheduled_averaging": False,
            "grad_compression": "none",  # exact: fp16 on the wire would round the averaged gradient
            "average_state_every": 1_000_000,  # gradient averaging only: parameters stay equal by themselves
            "tracker_opts": {"min_refresh_period": 0.1, "default_refresh_period": 0.2},
        },
        training={"batch_size": BATCH, "max_epochs": MAX_EPOCHS, "seed": 0},
        checkpoint={"every_epochs": 1000},
    )


class RoundRecorder(threading.Thread):
    """Polls the peers' status while they run: which global epochs each peer averaged, and with whom."""

    def __init__(self, nodes):
        super().__init__(daemon=True)
        self.nodes, self.rounds, self.done = nodes, {node.name: {} for node in nodes}, threading.Event()

    def run(self):
        while not self.done.is_set():
            for node in self.nodes:
                try:
                    for r in node.status()["recent_averaging"]:
                        if r["kind"] == "gradients":
                            self.rounds[node.name][r["epoch"]] = f"{r['outcome']}/{r['group_size']}"
                except Exception:  # noqa: BLE001 - a peer that stopped answers no more
                    pass
            self.done.wait(0.3)

    def partial_rounds(self, epochs) -> str:
        """The peers' rounds of `epochs` that came back in part ("" when none did)."""
        return "; ".join(
            f"{name} at epoch {e}" for name, rounds in self.rounds.items() for e in epochs
            if rounds.get(e, "").startswith("partial")
        )

    def summary(self, epochs) -> str:
        return "; ".join(
            f"{name}: " + " ".join(f"{e}={rounds.get(e, '?')}" for e in epochs) for name, rounds in self.rounds.items()
        )


def averaged_together(status) -> bool:
    return status["num_peers"] == 2 and any(
        r["kind"] == "gradients" and r["outcome"] == "success" and r["group_size"] == 2
        for r in status["recent_averaging"]
    )


def test_two_peers_match_one_process_with_the_union_batch(daemons, test_tasks_env, tmp_path):
    """A round that came back in part (a reducer late under the machine's load: seen in CI once, 11.3 % of one
    epoch's average missing) leaves that epoch on local gradients, as it should (swarm/upstream/partial_rounds.py), and such
    a run cannot be compared with the single process. It is run again, in a run of its own, once."""
    for attempt in range(2):
        workdir = tmp_path / f"attempt-{attempt}"
        workdir.mkdir()
        disturbed = _train_together_and_compare(daemons, test_tasks_env, workdir, suffix=str(attempt))
        if disturbed is None:
            return
    pytest.fail(f"both runs had a round that came back in part: {disturbed}")


def _train_together_and_compare(daemons, test_tasks_env, tmp_path, suffix: str) -> Optional[str]:
    """None after the comparison's assertions; else the rounds that came back in part (nothing compared)."""
    first = daemons("a" + suffix, peer(tmp_path, 0), env=test_tasks_env)
    joining = first.joining_args()
    second = daemons("b" + suffix, peer(tmp_path, 1), env=test_tasks_env, extra_args=joining)
    for node in (first, second):
        node.wait_status(lambda s: s["state"] == "training", timeout=180, what="training")
    recorder = RoundRecorder([first, second])
    recorder.start()
    (tmp_path / "start").touch()  # both peers begin (frozen) together
    epochs = [
        node.wait_status(averaged_together, timeout=120, what="a 2-peer gradient round")["local_epoch"]
        for node in (first, second)
    ]
    start = max(epochs) + 3
    assert start <= MAX_EPOCHS - TRAINED, f"the swarm formed only at epoch {max(epochs)}"
    (tmp_path / "unfreeze.tmp").write_text(str(start))
    os.replace(tmp_path / "unfreeze.tmp", tmp_path / "unfreeze")
    for node in (first, second):
        assert node.proc.wait(timeout=300) == 0, node.tail()
    recorder.done.set()
    partial = recorder.partial_rounds(range(start, MAX_EPOCHS))
    if partial:
        return partial

    swarm_losses = _swarm_losses(tmp_path, start)
    reference_losses, reference_params = _single_process(test_tasks_env, start, batch=2 * BATCH, count=1)
    alone_losses, _ = _single_process(test_tasks_env, start, batch=BATCH, count=2)  # peer 0's shard, never averaged

    trained = range(start, MAX_EPOCHS)
    diagnostics = "\n".join([f"rounds: {recorder.summary(range(MAX_EPOCHS))}", _averaging_lines(first), _averaging_lines(second)])
    loss_error = max(abs(swarm_losses[e] - reference_losses[e]) / reference_losses[e] for e in trained)
    assert loss_error < TOLERANCE, f"loss trajectory off by {loss_error:.2e} (relative)\n{diagnostics}"
    param_errors = {}
    for node in (first, second):
        params = _checkpoint_params(node)
        param_errors[node.name] = max(float((params[k] - v).norm() / v.norm()) for k, v in reference_params.items())
        assert param_errors[node.name] < TOLERANCE, (
            f"{node.name}: final parameters off by {param_errors[node.name]:.2e}\n{diagnostics}"
        )
    assert reference_losses[MAX_EPOCHS - 1] < 0.5 * reference_losses[start]  # it learns: not a trivial trajectory
    # Without averaging the trajectory leaves the tolerance far behind: the check can tell.
    alone_error = max(abs(alone_losses[e] - reference_losses[e]) / reference_losses[e] for e in trained)
    assert alone_error > 100 * TOLERANCE, alone_error
    print(json.dumps({"first_trained_epoch": start, "loss_error": loss_error, "param_errors": param_errors,
                      "alone_error": alone_error}))
    return None


def _averaging_lines(node) -> str:
    keep = ("averag", "Averag", "received", "state", "epoch", "sync", "Download")
    return "\n".join(f"{node.name}: {line}" for line in node.log.splitlines() if any(k in line for k in keep))


def _swarm_losses(tmp_path, start: int) -> dict[int, float]:
    """Per trained global epoch: the mean of the two peers' half-batch losses (= the loss over the union batch)."""
    per_peer = []
    for index in (0, 1):
        losses = {}
        trace = (tmp_path / f"trace-{index}.txt").read_text()
        for line in trace.splitlines():
            epoch, loss = int(line.split()[0]), float(line.split()[1])
            # While frozen a peer may repeat an epoch (a step hivemind discarded to resync it): harmless at LR 0.
            assert epoch < start or epoch not in losses, f"peer {index} took two steps in epoch {epoch}:\n{trace}"
            losses[epoch] = loss
        assert set(range(start, MAX_EPOCHS)) <= losses.keys(), trace
        per_peer.append(losses)
    return {e: (per_peer[0][e] + per_peer[1][e]) / 2 for e in range(start, MAX_EPOCHS)}


def _single_process(env, start: int, *, batch: int, count: int):
    """The textbook loop: the task's model, optimizer and schedule, one full step per global epoch."""
    import sys

    site = env["PYTHONPATH"].split(os.pathsep)[0]
    if site not in sys.path:
        sys.path.append(site)
    from swarmd.tasks.base import TaskContext
    from swarmd_test_tasks.toy import ToyRegressionTask, ToySettings

    values = {key: value for key, value in TASK.items() if key != "name"}
    settings = ToySettings.model_validate(
        {**values, "frozen_epochs": start, "frozen_step_seconds": 0, "shard": {"count": count, "data_seed": 7}}
    )
    task = ToyRegressionTask(settings, TaskContext(None, torch.device("cpu"), "fp32", batch, 0))
    task.prepare()
    torch.manual_seed(0)  # what the daemon does with training.seed 0
    model = task.build_model()
    optimizer = task.build_optimizer(task.parameter_groups(model))
    scheduler = task.build_scheduler(optimizer)
    batches = task.train_batches(seed=0)
    losses = {}
    for epoch in range(MAX_EPOCHS):
        task.set_epoch(epoch)
        output = task.training_step(model, next(batches))
        losses[epoch] = output.loss.item()
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _checkpoint_params(node) -> dict:
    from swarmd.checkpoints.store import CheckpointStore

    checkpoint = CheckpointStore(node.state_dir / "checkpoints", keep=1).load_latest()
    assert checkpoint is not None and checkpoint.epoch == MAX_EPOCHS, node.tail()
    return checkpoint.model_state
