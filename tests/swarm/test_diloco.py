"""swarm.strategy: diloco with real daemons: exactly DiLoCo, a late joiner, and a peer killed mid-round.

Exactness: two peers (toy-regression, exact data shards, inner SGD, fp32, no compression) take H = 4 inner steps
each per outer step, average their pseudo-gradients and take torch's Nesterov SGD step. The reference in this file
does the same with two in-process models. Both start frozen (LR 0), as in test_equivalence.py: at LR 0 a round
changes nothing (the pseudo-gradient is 0, so is the momentum), whoever is alone or not yet in step. Once the
peers have averaged together, the test names the first trained outer step E a few steps ahead; the inner schedule
counts inner steps, so the unfreeze file holds E x H. From E on, losses, parameters and the outer momentum must
match the reference to float tolerance (float32 summation order only), and a reference that never averages must
not (the check can tell).
"""

import json
import os
import time

import torch

from daemons import peer_config

BATCH = 16
H = 4
MAX_EPOCHS = 14  # outer steps; the peers stop here
TRAINED = 5  # at least this many trained outer steps are compared
TOLERANCE = 1e-4  # relative
TASK = {"name": "toy-regression", "lr": 0.2, "lr_decay": 0.05, "frozen_step_seconds": 0.05}
DILOCO = {"inner_steps": H, "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True, "max_straggler_wait": 10.0}
SWARM = {
    "strategy": "diloco",
    "diloco": DILOCO,
    "matchmaking_time": 2.0,
    "averaging_timeout": 15.0,
    "grad_compression": "none",  # exact: fp16 on the wire would round the averaged pseudo-gradient
    "tracker_opts": {"min_refresh_period": 0.1, "default_refresh_period": 0.2},
}


def exact_peer(tmp_path, index: int) -> dict:
    return peer_config(
        task={
            **TASK,
            "shard": {"index": index, "count": 2, "data_seed": 7},
            "start_file": str(tmp_path / "start"),
            "unfreeze_file": str(tmp_path / "unfreeze"),
            "trace_path": str(tmp_path / f"trace-{index}.txt"),
        },
        swarm=SWARM,
        training={"batch_size": BATCH, "max_epochs": MAX_EPOCHS, "seed": 0, "threads": 1},
        checkpoint={"every_epochs": 1000},
    )


def outer_rounds(status, outcome="success"):
    return [r for r in status["recent_averaging"] if r["kind"] == "outer" and r["outcome"] == outcome]


def averaged_together(status) -> bool:
    return any(r["group_size"] == 2 for r in outer_rounds(status))


def test_two_peers_take_exactly_the_diloco_steps(daemons, test_tasks_env, tmp_path):
    first = daemons("a", exact_peer(tmp_path, 0), env=test_tasks_env)
    second = daemons("b", exact_peer(tmp_path, 1), env=test_tasks_env, extra_args=first.joining_args())
    for node in (first, second):
        node.wait_status(lambda s: s["state"] == "training", timeout=180, what="training")
    (tmp_path / "start").touch()
    epochs = [
        node.wait_status(averaged_together, timeout=120, what="a 2-peer outer step")["local_epoch"]
        for node in (first, second)
    ]
    start = max(epochs) + 2
    assert start <= MAX_EPOCHS - TRAINED, f"the swarm formed only at outer step {max(epochs)}"
    (tmp_path / "unfreeze.tmp").write_text(str(start * H))
    os.replace(tmp_path / "unfreeze.tmp", tmp_path / "unfreeze")
    for node in (first, second):
        assert node.proc.wait(timeout=240) == 0, node.tail()

    diagnostics = "\n".join(_outer_lines(node) for node in (first, second))
    reference = _reference(test_tasks_env, start, average=True)
    alone = _reference(test_tasks_env, start, average=False)
    trained = range(start, MAX_EPOCHS)
    for index, node in enumerate((first, second)):
        losses = _trace(tmp_path / f"trace-{index}.txt", start)
        expected = reference["losses"][index]
        error = max(abs(losses[e][j] - expected[e][j]) / expected[e][j] for e in trained for j in range(H))
        assert error < TOLERANCE, f"{node.name}: losses off by {error:.2e} (relative)\n{diagnostics}"
        checkpoint = _checkpoint(node)
        param_error = max(float((checkpoint.model_state[k] - v).norm() / v.norm()) for k, v in reference["params"].items())
        assert param_error < TOLERANCE, f"{node.name}: parameters off by {param_error:.2e}\n{diagnostics}"
        momentum = _momentum(checkpoint, reference["optimizer_order"])
        momentum_error = max(float((momentum[k] - v).norm() / v.norm()) for k, v in reference["momentum"].items())
        assert momentum_error < TOLERANCE, f"{node.name}: outer momentum off by {momentum_error:.2e}\n{diagnostics}"
    # without averaging, the trajectory leaves the tolerance far behind: the check can tell
    alone_error = max(
        float((alone["params"][k] - v).norm() / v.norm()) for k, v in reference["params"].items()
    )
    assert alone_error > 100 * TOLERANCE, alone_error
    first_loss, last_loss = reference["losses"][0][start][0], reference["losses"][0][MAX_EPOCHS - 1][0]
    assert last_loss < 0.7 * first_loss  # it learns: not a trivial trajectory
    print(json.dumps({"first_trained_outer_step": start, "param_error": param_error, "alone_error": alone_error}))


def _reference(env, start: int, *, average: bool) -> dict:
    """Two in-process workers on the peers' shards: H inner SGD steps each from the outer parameters, then
    torch.optim.SGD(nesterov=True) on the mean pseudo-gradient (or, with average=False, on peer 0's own)."""
    import sys

    site = env["PYTHONPATH"].split(os.pathsep)[0]
    if site not in sys.path:
        sys.path.append(site)
    from swarmd.tasks.base import TaskContext
    from swarmd_test_tasks.toy import ToyRegressionTask, ToySettings

    values = {key: value for key, value in TASK.items() if key != "name"}
    tasks, workers = [], []
    for index in (0, 1):
        settings = ToySettings.model_validate(
            {**values, "frozen_epochs": start * H, "frozen_step_seconds": 0, "shard": {"index": index, "count": 2, "data_seed": 7}}
        )
        task = ToyRegressionTask(settings, TaskContext(None, torch.device("cpu"), "fp32", BATCH, 0))
        task.prepare()
        torch.manual_seed(0)  # what the daemon does with training.seed 0
        model = task.build_model()
        inner = task.build_optimizer(task.parameter_groups(model))
        tasks.append(task)
        workers.append((model, inner, task.build_scheduler(inner), task.train_batches(seed=0)))
    outer_params = [p.detach().clone() for p in workers[0][0].parameters()]
    outer = torch.optim.SGD(outer_params, lr=DILOCO["outer_lr"], momentum=DILOCO["outer_momentum"], nesterov=True)
    losses = ({}, {})
    for epoch in range(MAX_EPOCHS):
        pseudo_gradients = []
        for index, (model, inner, schedule, batches) in enumerate(workers):
            with torch.no_grad():
                for param, value in zip(model.parameters(), outer_params):
                    param.copy_(value)
            tasks[index].set_epoch(epoch)
            losses[index][epoch] = []
            for _ in range(H):
                output = tasks[index].training_step(model, next(batches))
                losses[index][epoch].append(output.loss.item())
                output.loss.backward()
                inner.step()
                schedule.step()
                inner.zero_grad()
            pseudo_gradients.append([o - p.detach() for o, p in zip(outer_params, model.parameters())])
        chosen = [(a + b) / 2 for a, b in zip(*pseudo_gradients)] if average else pseudo_gradients[0]
        for param, gradient in zip(outer_params, chosen):
            param.grad = gradient
        outer.step()
    model = workers[0][0]
    names = [name for name, _ in model.named_parameters()]
    name_of = {id(param): name for name, param in model.named_parameters()}
    return {
        "losses": losses,
        "params": dict(zip(names, outer_params)),
        "momentum": {name: outer.state[p]["momentum_buffer"] for name, p in zip(names, outer_params)},
        # the daemon's optimizer holds the parameters in the task's group order (matrices, then biases)
        "optimizer_order": [name_of[id(p)] for group in tasks[0].parameter_groups(model) for p in group["params"]],
    }


def _trace(path, start: int) -> dict[int, list[float]]:
    losses: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        epoch, loss = int(line.split()[0]), float(line.split()[1])
        losses.setdefault(epoch, []).append(loss)
    for epoch in range(start, MAX_EPOCHS):
        assert len(losses.get(epoch, [])) == H, f"outer step {epoch}: {losses.get(epoch)} (expected {H} inner steps)"
    return losses


def _checkpoint(node, epoch: int = MAX_EPOCHS):
    from swarmd.daemon.checkpoint import CheckpointStore

    store = CheckpointStore(node.state_dir / "checkpoints", keep=1000)
    for path in store.list():
        checkpoint = store.load(path)
        if checkpoint.epoch == epoch:
            return checkpoint
    raise AssertionError(f"{node.name} has no checkpoint of epoch {epoch}: {store.list()}\n{node.tail()}")


def _momentum(checkpoint, names_in_optimizer_order) -> dict:
    state = checkpoint.optimizer_state["state"]
    return {name: state[index]["outer_momentum"] for index, name in enumerate(names_in_optimizer_order)}


def _outer_lines(node) -> str:
    keep = ("Outer step", "outer step", "swarm's state", "Took the swarm", "straggler", "slowest")
    return "\n".join(f"{node.name}: {line}" for line in node.log.splitlines() if any(k in line for k in keep))


# --- a late joiner ------------------------------------------------------------------------------------------


def free_peer(**training) -> dict:
    return peer_config(
        task={"name": "toy-regression", "lr": 0.1, "frozen_step_seconds": 0},
        swarm=SWARM,
        training={"batch_size": BATCH, "seed": 0, "threads": 1, **training},
        checkpoint={"every_epochs": 1, "keep": 1000},
    )


def test_a_late_joiner_has_the_swarms_parameters_after_its_first_outer_step(daemons, test_tasks_env):
    first = daemons("a", free_peer(), env=test_tasks_env)
    second = daemons("b", free_peer(), env=test_tasks_env, extra_args=first.joining_args())
    for node in (first, second):
        node.wait_status(lambda s: averaged_together(s) and s["local_epoch"] >= 2, timeout=180, what="two outer steps")
    # another seed: its own initial parameters, which the download must replace
    late = daemons("c", free_peer(seed=1), env=test_tasks_env, extra_args=first.joining_args())
    status = late.wait_status(lambda s: outer_rounds(s), timeout=180, what="the joiner's first averaged outer step")
    joined = outer_rounds(status)[0]
    assert joined["group_size"] >= 2, joined
    epoch = joined["epoch"] + 1  # the parameters right after that outer step
    assert "Took the swarm's state" in late.log, late.tail()
    for node in (first, second):
        node.wait_status(lambda s: s["local_epoch"] > epoch, timeout=60, what=f"epoch {epoch + 1}")
    states = {node.name: _checkpoint(node, epoch).model_state for node in (first, second, late)}
    for name in ("b", "c"):
        difference = max(float((states[name][k] - v).abs().max()) for k, v in states["a"].items())
        assert difference < 1e-6, f"{name} differs from a at epoch {epoch} by {difference}"
    # not equal by accident: the joiner's own initial parameters were far from these
    assert max(float((states["c"][k] - v).abs().max()) for k, v in _toy_init(test_tasks_env).items()) > 1e-3


def _toy_init(env) -> dict:
    import sys

    site = env["PYTHONPATH"].split(os.pathsep)[0]
    if site not in sys.path:
        sys.path.append(site)
    from swarmd.tasks.base import TaskContext
    from swarmd_test_tasks.toy import ToyRegressionTask, ToySettings

    task = ToyRegressionTask(ToySettings(), TaskContext(None, torch.device("cpu"), "fp32", BATCH, 1))
    torch.manual_seed(1)  # what the daemon does with training.seed 1
    return {k: v.detach() for k, v in task.build_model().state_dict().items()}


# --- a peer killed mid-round --------------------------------------------------------------------------------


def test_the_swarm_goes_on_when_a_peer_is_killed_mid_round(daemons, test_tasks_env):
    nodes = [daemons("a", free_peer(), env=test_tasks_env)]
    joining = nodes[0].joining_args()
    nodes += [daemons(name, free_peer(), env=test_tasks_env, extra_args=joining) for name in ("b", "c")]
    three = lambda s: any(r["group_size"] == 3 for r in outer_rounds(s))  # noqa: E731
    for node in nodes:
        node.wait_status(three, timeout=240, what="a 3-peer outer step")
    victim, survivors = nodes[2], nodes[:2]
    before = {node.name: node.status()["local_epoch"] for node in survivors}
    victim.kill()  # SIGKILL: no goodbye, its progress record stays in the DHT until it expires
    killed = time.monotonic()
    averaging_timeout = SWARM["averaging_timeout"]
    for node in survivors:
        status = node.wait_status(
            lambda s, e=before[node.name]: any(r["epoch"] > e for r in outer_rounds(s)),
            timeout=averaging_timeout + DILOCO["max_straggler_wait"] + 10,
            what="an averaged outer step without the killed peer",
        )
        after = [r for r in outer_rounds(status) if r["epoch"] > before[node.name]]
        assert after[0]["group_size"] == 2, after
    elapsed = time.monotonic() - killed
    # the straggler wait ends when the dead peer's extrapolated progress says it is done, or at its bound
    assert elapsed < averaging_timeout + DILOCO["max_straggler_wait"] + 10, elapsed
