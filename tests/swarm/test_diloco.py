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
from swarmd.checkpoints.store import CheckpointStore, checkpoint_epoch

BATCH = 16
H = 4
# outer steps; the peers stop here. Room for a swarm that forms a few steps late: a peer that takes step 0 alone
# before it sees the other puts them one step apart until the one behind takes the swarm's state (DILOCO.md)
MAX_EPOCHS = 14  # room for a first group as late as outer step 7 on a loaded machine (CI: step 6)
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

# a round that loses part of the average breaks exactness: under the full suite's load (CI of 2384ebd) a stall of
# ~10 s cut outer step 7 short on one peer (11.3% did not arrive, its parts waited 2 s) and failed it on the other.
# Longer bounds cost nothing where rounds take their usual ~2 s.
EXACT_SWARM = {**SWARM, "averaging_timeout": 30.0, "next_chunk_timeout": 10.0}


def exact_peer(tmp_path, index: int) -> dict:
    return peer_config(
        task={
            **TASK,
            "shard": {"index": index, "count": 2, "data_seed": 7},
            "start_file": str(tmp_path / "start"),
            "unfreeze_file": str(tmp_path / "unfreeze"),
            "trace_path": str(tmp_path / f"trace-{index}.txt"),
        },
        swarm=EXACT_SWARM,
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
    # it learns, not a trivial trajectory: the last outer step's losses against the frozen model's, on many batches
    # (one batch's loss at the first trained step is too noisy: it failed whenever the swarm formed late)
    frozen = [loss for epoch in range(start) for loss in reference["losses"][0][epoch]]
    last = reference["losses"][0][MAX_EPOCHS - 1]
    assert sum(last) / len(last) < 0.5 * sum(frozen) / len(frozen), (last, frozen)
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
    store = _store(node)
    for path in store.list():
        if checkpoint_epoch(path) == epoch:
            checkpoint = store.load(path)
            assert checkpoint.epoch == epoch, (path, checkpoint.epoch)
            return checkpoint
    raise AssertionError(f"{node.name} has no checkpoint of epoch {epoch}: {store.list()}\n{node.tail()}")


def _has_checkpoint(node, epoch: int) -> bool:
    return any(checkpoint_epoch(path) == epoch for path in _store(node).list())


def _store(node):
    return CheckpointStore(node.state_dir / "checkpoints", keep=1000)


def _momentum(checkpoint, names_in_optimizer_order) -> dict:
    state = checkpoint.optimizer_state["state"]
    return {name: state[index]["outer_momentum"] for index, name in enumerate(names_in_optimizer_order)}


def _outer_lines(node) -> str:
    keep = (
        "Outer step", "outer step", "swarm's state", "Took the swarm", "straggler", "slowest", "behind",
        "Saved checkpoint",
    )
    return "\n".join(f"{node.name}: {line}" for line in node.log.splitlines() if any(k in line for k in keep))


# --- a late joiner ------------------------------------------------------------------------------------------


def free_peer(start_file, **training) -> dict:
    """Shuffled (not sharded) data, no freezing; the first batch waits for `start_file`, so that every daemon can
    start at once (a start takes most of a test's time on a loaded box) and begin training when told."""
    return peer_config(
        task={"name": "toy-regression", "lr": 0.1, "frozen_step_seconds": 0, "start_file": str(start_file)},
        swarm=SWARM,
        training={"batch_size": BATCH, "seed": 0, "threads": 1, **training},
        checkpoint={"every_epochs": 1, "keep": 1000},
    )


def start_three(daemons, env, tmp_path, late_seed: int = 0):
    """a, b and c started together; a and b train from the start file, c from its own."""
    first = daemons("a", free_peer(tmp_path / "start"), env=env)
    joining = first.joining_args()
    second = daemons("b", free_peer(tmp_path / "start"), env=env, extra_args=joining)
    third = daemons("c", free_peer(tmp_path / "start-c", seed=late_seed), env=env, extra_args=joining)
    for node in (first, second, third):
        node.wait_status(lambda s: s["state"] == "training", timeout=180, what="training")
    return first, second, third


def test_a_late_joiner_has_the_swarms_parameters_after_its_first_outer_step(daemons, test_tasks_env, tmp_path):
    # c has another seed: its own initial parameters, which the download must replace
    first, second, late = start_three(daemons, test_tasks_env, tmp_path, late_seed=1)
    (tmp_path / "start").touch()
    for node in (first, second):
        node.wait_status(lambda s: averaged_together(s) and s["local_epoch"] >= 2, timeout=120, what="two outer steps")
    (tmp_path / "start-c").touch()  # c has been waiting in the swarm without training: it joins now
    status = late.wait_status(lambda s: outer_rounds(s), timeout=90, what="the joiner's first averaged outer step")
    joined = outer_rounds(status)[0]
    assert joined["group_size"] >= 2, joined
    assert "Took the swarm's state" in late.log, late.tail()
    epoch = _epoch_after_a_step_of_all((first, second, late), joined["epoch"])
    history = "\n".join(_outer_lines(node) for node in (first, second, late))  # for a failure's message
    states = _assert_same_outer_state((first, second, late), epoch, history)
    # not equal by accident: the joiner's own initial parameters were far from these
    assert max(float((states["c"][k] - v).abs().max()) for k, v in _toy_init(test_tasks_env).items()) > 1e-3


def _epoch_after_a_step_of_all(nodes, first_step: int, timeout: float = 90.0) -> int:
    """The epoch right after the first outer step from `first_step` on that every node took with all the others
    and saved a checkpoint of, once each node is past it. A round that returns part of the average to one
    peer (a chunk timeout on a busy core) has that peer step on its own pseudo-gradient, apart from the others by
    design, until the next step taken together averages the outer state first (docs/DILOCO.md): the parameters
    right after such a round differ, those after the repair must not. A node saves no checkpoint of an epoch whose
    state is not yet the swarm's (catching up, worker/trainer.py) or that a download skipped: the next step taken
    together is compared then."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = [node.status() for node in nodes]
        together = [{r["epoch"] for r in outer_rounds(s) if r["group_size"] >= len(nodes)} for s in statuses]
        steps = sorted(step for step in set.intersection(*together) if step >= first_step)
        passed = [step for step in steps if all(s["local_epoch"] > step + 1 for s in statuses)]
        saved = [step for step in passed if all(_has_checkpoint(node, step + 1) for node in nodes)]
        if saved:
            return saved[0] + 1
        assert time.monotonic() < deadline, "no outer step taken by all of them:\n" + "\n".join(
            _outer_lines(node) for node in nodes
        )
        time.sleep(0.5)


def _assert_same_outer_state(nodes, epoch: int, history: str = "") -> dict:
    """The parameters and outer momentum in each node's checkpoint of `epoch` (taken right after the outer step)
    are the same; returns the parameters by node name."""
    checkpoints = {node.name: _checkpoint(node, epoch) for node in nodes}
    reference = checkpoints[nodes[0].name]
    momentum = {name: _momentum_tensors(c) for name, c in checkpoints.items()}
    assert momentum[nodes[0].name] and any(float(m.abs().max()) > 0 for m in momentum[nodes[0].name])
    for node in nodes[1:]:
        difference = _parameter_difference(reference, checkpoints[node.name])
        assert difference < 1e-6, (
            f"{node.name}'s parameters differ from {nodes[0].name}'s at epoch {epoch} by {difference}\n{history}"
        )
        difference = max(float((m - r).abs().max()) for m, r in zip(momentum[node.name], momentum[nodes[0].name]))
        assert difference < 1e-6, f"{node.name}'s outer momentum differs at epoch {epoch} by {difference}\n{history}"
    return {name: c.model_state for name, c in checkpoints.items()}


def _parameter_difference(reference, checkpoint) -> float:
    return max(float((checkpoint.model_state[k] - v).abs().max()) for k, v in reference.model_state.items())


def _momentum_tensors(checkpoint) -> list:
    state = checkpoint.optimizer_state["state"]
    return [state[i]["outer_momentum"] for i in sorted(k for k in state if isinstance(k, int))]


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


def test_the_swarm_goes_on_when_a_peer_is_killed_mid_round(daemons, test_tasks_env, tmp_path):
    nodes = start_three(daemons, test_tasks_env, tmp_path)
    (tmp_path / "start").touch()
    (tmp_path / "start-c").touch()
    three = lambda s: any(r["group_size"] == 3 for r in outer_rounds(s))  # noqa: E731
    for node in nodes:
        node.wait_status(three, timeout=120, what="a 3-peer outer step")
    victim, survivors = nodes[2], nodes[:2]
    before = {node.name: node.status()["local_epoch"] for node in survivors}
    victim.kill()  # SIGKILL: no goodbye, its progress record stays in the DHT until it expires
    killed = time.monotonic()
    bound = SWARM["averaging_timeout"] + DILOCO["max_straggler_wait"] + SWARM["matchmaking_time"]
    for node in survivors:
        status = node.wait_status(
            lambda s, e=before[node.name]: any(r["epoch"] >= e and r["group_size"] == 2 for r in outer_rounds(s)),
            timeout=bound + 30,
            what="an averaged outer step without the killed peer",
        )
    elapsed = time.monotonic() - killed
    # at most: the straggler wait for the dead peer, then a round that may fail on it, then one without it
    assert elapsed < bound + 10, f"{elapsed:.0f} s\n" + "\n".join(_outer_lines(node) for node in survivors)

    # restarted from its checkpoint, it takes the swarm's outer state (momentum included) and averages again
    logged = len(victim.log)
    restarted = daemons(
        "c", free_peer(tmp_path / "start-c"), env=test_tasks_env, extra_args=survivors[0].joining_args(),
        state_dir=victim.state_dir,
    )
    resumed = lambda s: [r for r in outer_rounds(s) if r["group_size"] == 3]  # noqa: E731
    status = restarted.wait_status(resumed, timeout=150, what="the restarted peer's averaged outer step")
    assert "Resuming from checkpoint" in restarted.log[logged:], restarted.tail()
    assert "Took the swarm's state" in restarted.log[logged:], restarted.tail()
    epoch = _epoch_after_a_step_of_all((*survivors, restarted), resumed(status)[0]["epoch"])
    _assert_same_outer_state((*survivors, restarted), epoch)
