"""Each task's shipped micro config, trained by two real peers on 127.0.0.1: the loss falls over several global epochs.

The task sections come from configs/*-micro.yaml as shipped; the tests only shrink the swarm's target batch (so an
epoch takes seconds on a shared 2-core box) and point the data at a copy the session prepared once.
"""

import copy
import json
from pathlib import Path

import yaml

from daemons import peer_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STOP_BOUND = 60


def shipped_task(name: str, **changes) -> dict:
    task = copy.deepcopy(yaml.safe_load((CONFIGS / name).read_text())["task"])
    for key, value in changes.items():
        task[key] = {**task[key], **value} if isinstance(value, dict) else value
    return task


def averaged_with_two(status) -> bool:
    return any(r["kind"] == "gradients" and r["outcome"] == "success" and r["group_size"] == 2 for r in status["recent_averaging"])


def loss_drop(status) -> float:
    """Mean loss of the first two global epochs minus that of the last two this peer trained in."""
    losses = [loss for _, loss in status["loss_history"]]
    return sum(losses[:2]) / 2 - sum(losses[-2:]) / 2


def train_two_peers(daemons, configs, *, epochs: int, min_drop: float, extra=lambda status: True):
    """Two peers train until each has averaged with the other and its loss fell by `min_drop`, within a bound.

    Per-epoch losses of a micro run with augmentation are noisy (one epoch can sit above the one before), so the
    test waits for the drop over at least `epochs` global epochs instead of sampling one fixed moment; a run that
    does not learn still fails at the timeout.
    """
    first = daemons("first", configs[0])
    joining = first.joining_args()
    second = daemons("second", configs[1], extra_args=joining)
    statuses = []
    for node in (first, second):
        statuses.append(
            node.wait_status(
                lambda s: (s["local_epoch"] or 0) >= epochs and len(s["loss_history"]) >= 4 and averaged_with_two(s)
                and loss_drop(s) > min_drop and extra(s),
                timeout=420,
                what=f"{epochs}+ global epochs averaged by two peers and a loss drop above {min_drop}",
            )
        )
    for node in (first, second):
        assert node.terminate(timeout=STOP_BOUND) == 0, node.tail()
        assert node.leftover_processes() == [], node.tail()
    for status in statuses:
        print(json.dumps({k: status[k] for k in ("task", "precision", "local_epoch", "loss_history", "evaluation")}))
    return statuses


def test_swin_micro_trains_with_an_fp32_and_an_fp16_peer_and_reports_accuracy(daemons, shared_data):
    """An fp32 peer next to an fp16 one (loss scaling, fp16 autocast on the CPU): both send fp32 gradients."""
    task = shipped_task(
        "swin-micro.yaml", data={"path": str(shared_data)}, eval_every_epochs=3, eval_max_batches=5
    )
    configs = [
        peer_config(task=task, swarm={"target_batch_size": 512}, training={"batch_size": 32, "precision": precision})
        for precision in ("fp32", "fp16")
    ]
    statuses = train_two_peers(
        daemons, configs, epochs=6, min_drop=0.05, extra=lambda s: s["evaluation"] is not None
    )
    assert [status["precision"] for status in statuses] == ["fp32", "fp16"]
    assert statuses[1]["loss_scale"] is not None and statuses[0]["loss_scale"] is None
    for status in statuses:
        assert status["nonfinite_steps_total"] == 0
        assert loss_drop(status) > 0.05, status["loss_history"]
        metrics = status["evaluation"]["metrics"]
        assert 0.0 <= metrics["top1"] <= metrics["top5"] <= 1.0 and metrics["val_samples"] > 0, metrics
        assert status["evaluation"]["epoch"] % 3 == 0


def test_albert_micro_trains_with_two_peers_of_different_precision(daemons, albert_prepared):
    """fp16 with reuse_grad_buffers next to bf16 without: both send fp32 gradients, so they average as usual."""
    assert albert_prepared.first_run.returncode == 0, albert_prepared.first_run.stderr[-3000:]
    task = shipped_task(
        "albert-micro.yaml", data={"source": "prepared", "path": str(albert_prepared.output)}, eval_every_epochs=0
    )
    configs = [
        peer_config(
            task=task,
            swarm={"target_batch_size": 128, "reuse_grad_buffers": reuse},
            training={"batch_size": 16, "precision": precision},
        )
        for precision, reuse in (("fp16", True), ("bf16", False))
    ]
    statuses = train_two_peers(daemons, configs, epochs=8, min_drop=0.2)
    for status, precision in zip(statuses, ("fp16", "bf16")):
        assert status["precision"] == precision
        assert status["nonfinite_steps_total"] == 0
        assert loss_drop(status) > 0.2, status["loss_history"]
