"""DiLoCo in one process: the outer step on this peer's own pseudo-gradient when it is alone, when the round fails
and when the average is garbage; and a checkpoint that resumes mid-round with the outer state.

In-process hivemind peers (DHT + DiLoCoOptimizer from build_swarm_optimizer) driven step by step; the reference is
plain PyTorch: the inner SGD with its schedule, and torch.optim.SGD(nesterov=True) on the outer parameters.
"""

import threading

import pytest
import torch

from swarmd.config.schema import SwarmdConfig
from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from swarmd.tasks.base import StepOutput
from daemons import wait_for
from probe_task import ProbeTask, make_probe, probe_model

BATCH = 8
H = 3
INNER_LR = 0.1


class _Probe(ProbeTask):
    name = "diloco-probe"
    lr = INNER_LR
    target_scale = 1.0  # a peer with garbage data: targets 10^4 times too large

    def build_scheduler(self, optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, _multiplier)

    def training_step(self, model, batch):
        x, y = batch
        return StepOutput(loss=torch.nn.functional.mse_loss(model(x), y * self.target_scale), batch_size=x.shape[0])


def _multiplier(inner_step: int) -> float:
    return 1.0 / (1.0 + 0.2 * inner_step)


def _batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, 16, generator=generator), torch.randn(BATCH, 1, generator=generator)


def _config(run_id: str, **swarm) -> SwarmdConfig:
    return SwarmdConfig.model_validate(
        {
            "run_id": run_id,
            "swarm": {
                "strategy": "diloco",
                "matchmaking_time": 1.0,
                "averaging_timeout": 4.0,
                "grad_compression": "none",
                "diloco": {"inner_steps": H, "max_straggler_wait": 1.0},
                **swarm,
            },
            "training": {"batch_size": BATCH},
        }
    )


def _peer(dht, tmp_path, run_id: str, target_scale: float = 1.0, model=None, **swarm):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    task = make_probe(_Probe, tmp_path, BATCH)
    task.target_scale = target_scale
    model = model if model is not None else task.build_model()
    log = AveragingLog()
    optimizer = build_swarm_optimizer(dht=dht, config=_config(run_id, **swarm), model=model, task=task, averaging_log=log)
    return task, model, optimizer, log


def _train(task, model, optimizer, seeds):
    for seed in seeds:
        output = task.training_step(model, _batch(seed))
        output.loss.backward()
        optimizer.step(batch_size=output.batch_size)
        model.zero_grad()


class _Reference:
    """One model trained the textbook way: H inner steps, then the outer Nesterov step on a given pseudo-gradient."""

    def __init__(self, clip: float = 0.0):
        self.clip = clip  # swarm.clip_local_grad_norm: each inner step's gradient
        self.model = probe_model()
        self.inner = torch.optim.SGD(self.model.parameters(), lr=INNER_LR)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.inner, _multiplier)
        self.outer_params = [p.detach().clone().requires_grad_() for p in self.model.parameters()]
        self.outer = torch.optim.SGD(self.outer_params, lr=0.7, momentum=0.9, nesterov=True)

    def inner_steps(self, seeds):
        for seed in seeds:
            x, y = _batch(seed)
            torch.nn.functional.mse_loss(self.model(x), y).backward()
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.inner.step()
            self.schedule.step()
            self.model.zero_grad()

    def pseudo_gradient(self):
        return [o.detach() - p.detach() for o, p in zip(self.outer_params, self.model.parameters())]

    @torch.no_grad()
    def outer_step(self, pseudo_gradient, mixing: float = 0.0):
        """The outer step; the model takes the outer parameters, or with overlap (torchft's lerp) keeps `mixing` of
        its own: outer + mixing x (own - outer)."""
        for param, gradient in zip(self.outer_params, pseudo_gradient):
            param.grad = gradient.clone()
        self.outer.step()
        for param, outer in zip(self.model.parameters(), self.outer_params):
            param.copy_(outer + mixing * (param - outer))


def _max_difference(model, reference_model) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(model.parameters(), reference_model.parameters()))


@pytest.fixture
def dht():  # the daemon's DHT class, one per test (tests/swarm/conftest.py says why)
    node = ToleratesExitedCallers(start=True)
    yield node
    node.shutdown()


def test_a_lone_peer_steps_on_its_own_pseudo_gradient(dht, tmp_path):
    task, model, optimizer, log = _peer(dht, tmp_path, "diloco-alone")
    reference = _Reference()
    try:
        for epoch in range(3):
            seeds = range(epoch * H, (epoch + 1) * H)
            _train(task, model, optimizer, seeds)
            reference.inner_steps(seeds)
            reference.outer_step(reference.pseudo_gradient())
            assert optimizer.local_epoch == epoch + 1
        assert _max_difference(model, reference.model) < 1e-6
        assert [(r.kind, r.outcome, r.error) for r in log.summary().recent] == [("outer", "local", "alone in the swarm")] * 3
        # the inner schedule counts inner steps
        assert optimizer.param_groups[0]["lr"] == pytest.approx(INNER_LR * _multiplier(3 * H))
        # not a trivial trajectory: three outer steps moved the model
        assert _max_difference(model, probe_model()) > 1e-3
    finally:
        optimizer.shutdown()


def test_a_lone_peer_says_it_is_alone_once_at_info_not_a_warning_each_outer_step(dht, tmp_path, caplog):
    """A solo run is normal (sync says so at info): one line when the peer finds itself alone, none per step."""
    task, model, optimizer, log = _peer(dht, tmp_path, "diloco-alone-log")
    try:
        with caplog.at_level("INFO", logger="swarmd.swarm.strategies.diloco_optimizer"):
            _train(task, model, optimizer, range(3 * H))
        assert optimizer.local_epoch == 3
        lone = [r for r in caplog.records if r.name == "swarmd.swarm.strategies.diloco_optimizer" and "alone in the swarm" in r.getMessage()]
        assert [r.levelname for r in lone] == ["INFO"], [(r.levelname, r.getMessage()) for r in lone]
        assert not [r for r in caplog.records if r.name == "swarmd.swarm.strategies.diloco_optimizer" and r.levelno >= 30]
    finally:
        optimizer.shutdown()


def test_undoing_an_outer_step_drops_the_outer_momentum_it_added_and_a_mid_round_restore_keeps_it(dht, tmp_path):
    """The worker rejects an outer step (parameters moved too far) and puts back the last good parameters: the outer
    parameters go back too and the momentum that carried the step is dropped (kept, every later restore met a
    larger step); a restore mid-round (NaN parameters at an inner step) leaves outer parameters and momentum alone."""
    task, model, optimizer, _ = _peer(dht, tmp_path, "diloco-restore")
    reference = _Reference()
    try:
        _train(task, model, optimizer, range(H))  # outer step 1: momentum = its pseudo-gradient
        reference.inner_steps(range(H))
        reference.outer_step(reference.pseudo_gradient())
        # what the worker keeps: the parameters in the optimizer's order (its param groups)
        good = [p.detach().clone() for p in optimizer.state_averager.main_parameters]
        _, momentum = optimizer._outer_state()
        assert momentum and all(float(m.abs().max()) > 0 for m in momentum)

        optimizer._apart_from_swarm = False  # alone, it is apart: as if the step had been a round with company
        _train(task, model, optimizer, range(H, H + 1))  # an inner step into round 2, then "NaN": a mid-round restore
        optimizer.restore_parameters(good)
        _, kept = optimizer._outer_state()
        assert [torch.equal(a, b) for a, b in zip(kept, momentum)] == [True] * len(momentum)
        assert _max_difference(model, reference.model) == 0.0 and not optimizer._apart_from_swarm

        _train(task, model, optimizer, range(H, 2 * H))  # outer step 2, which the worker rejects
        assert optimizer.local_epoch == 2
        optimizer.restore_parameters(good)
        outer, dropped = optimizer._outer_state()
        assert all(torch.equal(o, g) for o, g in zip(outer, good))
        assert all(float(m.abs().max()) == 0 for m in dropped) and optimizer._apart_from_swarm
        assert all(torch.equal(p.detach(), g) for p, g in zip(optimizer.state_averager.main_parameters, good))
    finally:
        optimizer.shutdown()


def test_clip_local_grad_norm_clips_each_inner_step(dht, tmp_path):
    """swarm.clip_local_grad_norm under DiLoCo clips every inner step's gradient (it was once ignored there)."""
    clip = 0.05
    task, model, optimizer, _ = _peer(dht, tmp_path, "diloco-clip", clip_local_grad_norm=clip)
    clipped, unclipped = _Reference(clip=clip), _Reference()
    try:
        _train(task, model, optimizer, range(H + 1))  # one outer step and an inner step into the next round
        for reference in (clipped, unclipped):
            reference.inner_steps(range(H))
            reference.outer_step(reference.pseudo_gradient())
            reference.inner_steps([H])
        assert _max_difference(model, clipped.model) < 1e-6
        assert _max_difference(clipped.model, unclipped.model) > 1e-3  # the clip bit: the gradients were larger
    finally:
        optimizer.shutdown()


@pytest.mark.parametrize("next_chunk_timeout", [None, 7.0])
def test_every_averager_waits_next_chunk_timeout_for_a_part(dht, tmp_path, next_chunk_timeout):
    """swarm.next_chunk_timeout reaches the outer round's averager and the state averager (repairs, downloads);
    unset, it is hivemind's matchmaking_time, which cut rounds short on a 20 Mbit/s link."""
    _, _, optimizer, _ = _peer(dht, tmp_path, f"diloco-chunk-{next_chunk_timeout or 0:g}", next_chunk_timeout=next_chunk_timeout)
    expected = next_chunk_timeout or _config("any").swarm.matchmaking_time
    try:
        for averager in (optimizer.outer_averager, optimizer.state_averager):
            assert averager.next_chunk_timeout == expected
            assert averager.allreduce_kwargs["sender_timeout"] == expected
            assert averager.allreduce_kwargs["reducer_timeout"] == 2 * expected
        # only the state averager offers a download: the outer one holds a round's pseudo-gradients, of no use
        assert optimizer.state_averager.allow_state_sharing and not optimizer.outer_averager.allow_state_sharing
    finally:
        optimizer.shutdown()


def test_a_checkpoint_resumes_mid_round_with_the_outer_state(dht, tmp_path):
    """Through the daemon's own restore path (daemon/checkpointer.py), which once put the model's mid-round (inner)
    parameters over the outer ones: a DiLoCo peer stopped mid-round lost its outer parameters (issue 30)."""
    from swarmd.daemon.checkpointer import Checkpointer

    checkpointer = Checkpointer(tmp_path, run_id="diloco-save", task="diloco-probe", keep=1)
    task, model, optimizer, _ = _peer(dht, tmp_path, "diloco-save")
    try:
        _train(task, model, optimizer, range(H + 2))  # one outer step, then two steps into the next round
        checkpointer.save(model, optimizer)
        assert checkpointer.info().failures_total == 0
        outer = [p.detach().clone() for p in optimizer._outer_parameters()]
        momentum = [optimizer.state_averager.optimizer.state[p]["momentum_buffer"].clone() for p in optimizer._outer_parameters()]
        lr = optimizer.param_groups[0]["lr"]
        assert any(not torch.equal(o, p) for o, p in zip(outer, model.parameters()))  # mid-round: they differ
        assert any(m.abs().max() > 0 for m in momentum)
    finally:
        optimizer.shutdown()

    # What the daemon does at start (daemon/lifecycle.py): the model from the checkpoint, the optimizer built on
    # it, then the checkpoint into the optimizer
    restored = probe_model()
    checkpoint = checkpointer.load_into_model(restored)
    assert checkpoint is not None
    _, _, resumed, _ = _peer(dht, tmp_path, "diloco-resume", model=restored)
    try:
        checkpointer.load_into_optimizer(resumed, checkpoint, restored)
        assert (resumed.local_epoch, resumed.round_steps, resumed.state_averager.inner_step) == (1, 2, H + 2)
        assert resumed.param_groups[0]["lr"] == pytest.approx(lr)
        for param, expected in zip(resumed._outer_parameters(), outer):
            assert torch.equal(param, expected)
        for param, expected in zip(resumed._outer_parameters(), momentum):
            assert torch.equal(resumed.state_averager.optimizer.state[param]["momentum_buffer"], expected)
        for param, expected in zip(restored.parameters(), model.parameters()):
            assert torch.equal(param, expected)  # the model keeps its mid-round (inner) parameters
    finally:
        resumed.shutdown()


def test_a_failed_round_and_a_garbage_average_fall_back_to_the_own_pseudo_gradient(dht, tmp_path):
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    honest = _peer(dht, tmp_path, "diloco-guard")
    # a peer whose targets are 10^4 times too large: its pseudo-gradient is garbage to everyone else. It signs its
    # progress with a key of its own: with the process-wide one, both peers' records would be one DHT entry.
    garbage = _peer(
        other_dht, tmp_path, "diloco-guard", target_scale=1e4, tracker_opts={"private_key": RSAPrivateKey()}
    )
    try:
        # Round 0: the garbage peer is in the swarm (it took a step) but never comes to the round: it fails.
        _train(*garbage[:3], [100])
        wait_for(lambda: honest[2].tracker.other_peers == 1, "the honest peer to see the other")
        reference = _Reference()
        _train(*honest[:3], range(H))
        reference.inner_steps(range(H))
        reference.outer_step(reference.pseudo_gradient())
        first = honest[3].last("outer")
        assert (first.outcome, first.group_size) == ("local", 1), first
        assert first.error.startswith("the round failed"), first.error
        assert _max_difference(honest[1], reference.model) < 1e-6

        # Round 1 for both: they average, and the honest peer refuses the garbage: the share the garbage peer
        # reduced comes back thousands of times the honest peer's part (robust_aggregation.py implausible_return),
        # so the round is partial and it steps on its own pseudo-gradient. (Before receivers checked what comes
        # back, the whole average arrived and the pseudo-gradient guard rejected it: the same step.)
        garbage[2].load_state_from_peers()  # the garbage peer catches up with the honest one at epoch 1
        assert garbage[2].local_epoch == 1
        seeds = range(H, 2 * H)
        thread = threading.Thread(target=_train, args=(*garbage[:3], [200 + s for s in seeds]))
        thread.start()
        _train(*honest[:3], seeds)
        thread.join(30)
        reference.inner_steps(seeds)
        reference.outer_step(reference.pseudo_gradient())
        second = honest[3].last("outer")
        assert (second.outcome, second.group_size) == ("partial", 1), second
        assert "of the average did not arrive" in second.error, second.error
        assert _max_difference(honest[1], reference.model) < 1e-6
        assert garbage[3].last("outer").outcome == "success"  # its own norm is the larger one: it takes the average
    finally:
        honest[2].shutdown()
        garbage[2].shutdown()
        other_dht.shutdown()


class _StepsWhenServingReleases:
    """lock_averaged_tensors, except that when the serving thread releases it, the outer step runs (in another
    thread) before the serving thread goes on: the moment upstream then reads local_epoch for the state's label."""

    def __init__(self, lock, serving_thread_name: str, outer_step):
        self._lock, self._serving, self._outer_step = lock, serving_thread_name, outer_step
        self.step_thread = None

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()
        if threading.current_thread().name == self._serving and self.step_thread is None:
            self.step_thread = threading.Thread(target=self._outer_step)
            self.step_thread.start()
            self.step_thread.join(2.0)  # with the state lock it cannot finish now: it waits for the serve

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        return self._lock.release()


def test_the_state_served_during_an_outer_step_is_labelled_with_its_own_epoch(dht, tmp_path):
    """A joiner that took the old outer parameters labelled with the new epoch stayed one outer step apart from
    the swarm for good (the late joiner of test_diloco.py, once in a while)."""
    task, model, optimizer, _ = _peer(dht, tmp_path, "diloco-serve")
    averager = optimizer.state_averager
    try:
        _train(task, model, optimizer, range(H - 1))  # the next inner step ends the round: the outer step
        before = [param.detach().clone() for param in optimizer._outer_parameters()]
        lock = _StepsWhenServingReleases(
            averager.lock_averaged_tensors, "serving", lambda: _train(task, model, optimizer, [H - 1])
        )
        averager.lock_averaged_tensors = lock
        served = {}
        serving = threading.Thread(target=lambda: served.update(state=averager.get_current_state()), name="serving")
        serving.start()
        serving.join(30)
        lock.step_thread.join(30)
        metadata, tensors, _ = served["state"]
        after = [param.detach().clone() for param in optimizer._outer_parameters()]
        assert optimizer.local_epoch == 1 and any(not torch.equal(a, b) for a, b in zip(after, before))
        expected = {0: before, 1: after}[metadata["epoch"]]
        assert all(torch.equal(tensor, param) for tensor, param in zip(tensors, expected)), (
            f"the parameters served as epoch {metadata['epoch']} are not that epoch's"
        )
        assert metadata["diloco"]["round_steps"] == {0: H - 1, 1: 0}[metadata["epoch"]]
    finally:
        optimizer.shutdown()


def _outer_state(optimizer) -> list:
    params = optimizer._outer_parameters()
    state = optimizer.state_averager.optimizer.state
    return [p.detach().clone() for p in params] + [state[p]["momentum_buffer"].clone() for p in params]


def _round_together(peers, seeds):
    """H - 1 inner steps each, then (once they see each other) the last one at once: one outer round together."""
    for peer in peers:
        _train(*peer[:3], seeds[:-1])
    wait_for(lambda: all(peer[2].tracker.other_peers == 1 for peer in peers), "the peers to see each other")
    threads = [threading.Thread(target=_train, args=(*peer[:3], seeds[-1:])) for peer in peers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def test_a_downloaded_state_is_the_donors_and_members_that_differ_average_before_the_step(dht, tmp_path):
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    first = _peer(dht, tmp_path, "diloco-check")
    second = None
    try:
        _train(*first[:3], range(2 * H))  # alone: two outer steps, so its outer momentum is not zero
        second = _peer(other_dht, tmp_path, "diloco-check", tracker_opts={"private_key": RSAPrivateKey()})
        # a donor whose outer SGD says other hyperparameters (a liar, or a mistake): the joiner keeps the run's
        donor_groups = first[2].state_averager.optimizer.param_groups
        honest = [dict(lr=group["lr"], momentum=group["momentum"]) for group in donor_groups]
        for group in donor_groups:
            group.update(lr=123.0, momentum=0.5)
        second[2].load_state_from_peers()
        for group, values in zip(donor_groups, honest):
            group.update(values)
        assert [(g["lr"], g["momentum"]) for g in second[2].state_averager.optimizer.param_groups] == [(0.7, 0.9)] * len(honest)
        assert second[2].local_epoch == first[2].local_epoch == 2
        for mine, donors in zip(_outer_state(second[2]), _outer_state(first[2])):
            assert torch.equal(mine, donors)  # outer parameters and momentum, exactly
        for param, outer in zip(second[2].state_averager.main_parameters, second[2]._outer_parameters()):
            assert torch.equal(param.detach(), outer)  # the model starts from them

        _round_together((first, second), list(range(2 * H, 3 * H)))  # first was apart (alone): they repair
        assert all(peer[3].last("outer").outcome == "success" for peer in (first, second))
        repairs = [peer[3].summary().counts["state", "success"] for peer in (first, second)]

        # second's outer momentum goes off (as if it had taken another epoch's state): the next round notices
        momentum = second[2].state_averager.optimizer.state
        for param in second[2]._outer_parameters():
            momentum[param]["momentum_buffer"].mul_(1.5)
        assert second[2]._apart_from_swarm is False  # nobody stepped alone: only the fingerprints can tell
        _round_together((first, second), list(range(3 * H, 4 * H)))
        for peer, before in zip((first, second), repairs):
            assert peer[3].last("outer").outcome == "success"
            assert peer[3].summary().counts["state", "success"] == before + 1, "no repair"
        for mine, theirs in zip(_outer_state(second[2]), _outer_state(first[2])):
            assert float((mine - theirs).abs().max()) < 1e-6
    finally:
        first[2].shutdown()
        if second is not None:
            second[2].shutdown()
        other_dht.shutdown()


def test_a_donor_whose_state_is_not_finite_is_not_taken(dht, tmp_path):
    """A lying or broken donor serves NaN outer momentum: the joiner takes nothing from it (it would have stepped on
    NaN from its first outer step), and keeps its own state."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmd.swarm.upstream.state_stream import unusable_state

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    liar = _peer(dht, tmp_path, "diloco-nan-donor")
    joiner = None
    try:
        _train(*liar[:3], range(2 * H))
        momentum = liar[2].state_averager.optimizer.state
        for param in liar[2]._outer_parameters():
            momentum[param]["momentum_buffer"][0] = float("nan")
        joiner = _peer(other_dht, tmp_path, "diloco-nan-donor", tracker_opts={"private_key": RSAPrivateKey()})
        own = [p.detach().clone() for p in joiner[2].state_averager.main_parameters]
        joiner[2].load_state_from_peers()
        assert joiner[2].local_epoch == 0
        assert all(torch.equal(p.detach(), o) for p, o in zip(joiner[2].state_averager.main_parameters, own))
        assert all(bool(torch.isfinite(t).all()) for t in _outer_state(joiner[2]))
    finally:
        liar[2].shutdown()
        if joiner is not None:
            joiner[2].shutdown()
        other_dht.shutdown()
    assert unusable_state(({}, [torch.zeros(2), torch.tensor([1.0, float("inf")])])) == "tensor 1 of 2 is not finite"
    assert unusable_state(({}, [torch.zeros(2)])) == "" and unusable_state("garbage") == "not (metadata, tensors)"


def test_a_state_from_a_peer_found_lying_since_is_taken_again_once(dht, tmp_path, caplog):
    """A DiLoCo joiner may download a liar's outer state before any evidence is in: once it holds evidence against
    the donor (here: a suspect), its next step takes the state again, once per donor and degree (the retake's
    rules: tests/unit/test_swarm_optimizer.py)."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmd.swarm import exclusion
    from swarmd.swarm.exclusion import ExclusionList

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    donor = _peer(dht, tmp_path, "diloco-doubted-donor")
    joiner = None
    listed = ExclusionList(tmp_path / "excluded_peers.active")
    listed.start()
    try:
        _train(*donor[:3], range(H))
        joiner = _peer(other_dht, tmp_path, "diloco-doubted-donor", tracker_opts={"private_key": RSAPrivateKey()})
        joiner[2].load_state_from_peers()
        assert joiner[2].state_averager.donors_of_the_state() == [str(dht.peer_id)]
        downloads = joiner[2].state_loads_total
        exclusion.install(listed)
        _train(*joiner[:3], [100])
        assert joiner[2].state_loads_total == downloads, "taken again with no evidence against its donor"
        listed.publish([], suspects=[str(dht.peer_id)])
        with caplog.at_level("WARNING"):
            _train(*joiner[:3], [101])
        assert joiner[2].state_loads_total == downloads + 1
        assert "which it now has evidence against: taking the state again" in caplog.text
        _train(*joiner[:3], [102, 103])
        assert joiner[2].state_loads_total == downloads + 1, "taken again for the same reason twice"
    finally:
        exclusion.install(None)
        donor[2].shutdown()
        if joiner is not None:
            joiner[2].shutdown()
        other_dht.shutdown()


@pytest.mark.parametrize("start", ["alike", "apart"])
def test_the_first_outer_step_averages_the_outer_state_only_when_the_members_started_apart(dht, tmp_path, start):
    """Peers of one run start from one initialisation: the first outer step sends a digest of each member's outer
    state, and averages parameters and momentum (slow on a slow link) only when the digests differ."""
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    model = probe_model()
    if start == "apart":
        with torch.no_grad():
            next(model.parameters()).add_(0.5)  # another seed, in effect
    # 10 s for a round (4 s in the others): the full suite's load once cut this one's outer round short (11.7% of
    # the average came in 4 s) and with it the state averaging the test is about
    peers = [_peer(dht, tmp_path, f"diloco-first-{start}", averaging_timeout=10.0),
             _peer(other_dht, tmp_path, f"diloco-first-{start}", model=model, averaging_timeout=10.0,
                   tracker_opts={"private_key": RSAPrivateKey()})]
    try:
        assert (peers[0][2]._state_digest() == peers[1][2]._state_digest()) == (start == "alike")
        _round_together(peers, list(range(H)))
        for peer in peers:
            assert peer[3].last("outer").outcome == "success", peer[3].last("outer")
            assert peer[3].summary().counts.get(("state", "success"), 0) == (1 if start == "apart" else 0)
        for mine, theirs in zip(_outer_state(peers[1][2]), _outer_state(peers[0][2])):
            assert float((mine - theirs).abs().max()) < 1e-6  # equal after the first outer step either way
    finally:
        for peer in peers:
            peer[2].shutdown()
        other_dht.shutdown()


def test_a_round_that_returned_part_of_the_average_is_partial_not_a_success(dht, tmp_path):
    """hivemind keeps a peer's own values for the parts whose reducer failed and calls the round a success; the
    outer averager says what did not arrive, and the peer steps on its own pseudo-gradient, apart (repaired later)."""
    import time
    from concurrent.futures import Future

    from swarmd.swarm.upstream.outer_round import SentRound
    from swarmd.swarm.upstream.partial_rounds import GatheredRound

    _, _, optimizer, _ = _peer(dht, tmp_path, "diloco-partial")
    try:
        optimizer._alone = lambda: False

        def partial_round(**kwargs):
            control = Future()
            control.set_result(GatheredRound({"another-peer": [0, False, []]}, 0.25))
            return control

        optimizer.outer_averager.step = partial_round
        own = [torch.ones_like(param) for param in optimizer._outer_parameters()]
        sent = SentRound(0, own, 8.0, time.perf_counter(), overlapped=False)
        optimizer._send(sent)
        result, outcome, group_size, why, _ = optimizer._receive(sent)
        assert (result, outcome, group_size) == (own, "partial", 1)
        assert "25.0% of the average did not arrive" in why, why
        optimizer._finish_round(sent)
        assert optimizer.averaging_log.last("outer").outcome == "partial"
        assert optimizer._apart_from_swarm  # the next outer step with company averages the outer state first
    finally:
        optimizer.shutdown()


@pytest.mark.parametrize("swarm_ahead", [True, False], ids=["swarm-ahead", "swarm-level"])
def test_a_round_that_found_no_group_while_the_swarm_is_past_its_step_takes_the_swarms_state(
        dht, tmp_path, swarm_ahead):
    """A peer whose outer round found no group because the other peer already took that step alone (it had not
    seen this one yet) downloads the swarm's state instead of stepping alone: a lone step kept two peers one outer
    step apart for good in CI, every round of both failing. Where the swarm is level, it steps alone as before."""
    import time
    from concurrent.futures import Future

    from hivemind.averaging.allreduce import AllreduceException

    from swarmd.swarm.upstream.outer_round import SentRound

    _, _, optimizer, _ = _peer(dht, tmp_path, f"diloco-ahead-{swarm_ahead}")
    try:
        optimizer._alone = lambda: False
        optimizer._swarm_moved_on = lambda epoch: swarm_ahead
        downloads = []
        optimizer.load_state_from_peers = lambda **kwargs: downloads.append(kwargs)

        def failed_round(**kwargs):
            control = Future()
            control.set_exception(AllreduceException("Averaging step failed: could not find a group"))
            return control

        optimizer.outer_averager.step = failed_round
        own = [torch.ones_like(param) for param in optimizer._outer_parameters()]
        sent = SentRound(0, own, 8.0, time.perf_counter(), overlapped=False)
        optimizer._send(sent)
        optimizer._finish_round(sent)
        if swarm_ahead:
            assert downloads and optimizer.averaging_log.last("outer").outcome == "skipped"
            assert optimizer.local_epoch == 0  # no lone step
        else:
            assert not downloads and optimizer.averaging_log.last("outer").outcome == "local"
            assert optimizer.local_epoch == 1
    finally:
        optimizer.shutdown()


def test_an_outer_round_scheduled_during_the_last_inner_steps_averages_once_the_round_ends(dht, tmp_path):
    """Matchmaking begins before the H-th inner step (as hivemind pre-schedules a synchronous gradient round) and
    the all-reduce waits for it: the round then averages the pseudo-gradients of the H-th step, exactly."""
    from hivemind.averaging.control import AveragingStage
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    peers = [_peer(dht, tmp_path, "diloco-scheduled"),
             _peer(other_dht, tmp_path, "diloco-scheduled", tracker_opts={"private_key": RSAPrivateKey()})]
    reference = [_Reference(), _Reference()]
    seeds = [list(range(H)), list(range(100, 100 + H))]
    try:
        for peer, ref, own in zip(peers, reference, seeds):
            _train(*peer[:3], own[:-1])
            ref.inner_steps(own[:-1])
        wait_for(lambda: all(peer[2].tracker.other_peers == 1 for peer in peers), "the peers to see each other")

        def scheduled(optimizer) -> bool:  # as step() does after each inner step
            optimizer._maybe_schedule_outer_round()
            return optimizer._scheduled_round is not None

        # once each peer's view of the swarm says the slowest peer is within matchmaking_time of its H-th step
        wait_for(lambda: all(scheduled(peer[2]) for peer in peers), "the outer round to be scheduled")
        controls = [peer[2]._scheduled_round[1] for peer in peers]
        wait_for(lambda: all(control.stage == AveragingStage.AWAITING_TRIGGER for control in controls),
                  "the group to form before the H-th step")
        threads = [threading.Thread(target=_train, args=(*peer[:3], own[-1:])) for peer, own in zip(peers, seeds)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

        for peer in peers:
            assert peer[3].last("outer").outcome == "success", peer[3].last("outer")
            assert peer[2].prescheduled_rounds_total == 1 and peer[2]._scheduled_round is None
        for ref, own in zip(reference, seeds):
            ref.inner_steps(own[-1:])
        # one initialisation: the first outer step steps on the average without averaging the (equal) parameters
        assert all(peer[3].summary().counts.get(("state", "success"), 0) == 0 for peer in peers)
        average = [(a + b) / 2 for a, b in zip(reference[0].pseudo_gradient(), reference[1].pseudo_gradient())]
        reference[0].outer_step(average)
        for peer in peers:
            assert _max_difference(peer[1], reference[0].model) < 1e-5
    finally:
        for peer in peers:
            peer[2].shutdown()
        other_dht.shutdown()


def test_a_peer_faster_than_the_other_waits_for_it_and_says_how_long(dht, tmp_path):
    """Every peer takes H inner steps: one that is done first waits, before it sends, until the slowest peer is
    within matchmaking_time of its H-th step, and the round's record says how long (the operator's view of a
    swarm paced by its slowest peer)."""
    import time

    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    step_seconds = 3.0  # the slow peer's pace: its H - 1 = 2 steps left are 6 s, 5 s beyond matchmaking_time
    diloco = {"inner_steps": H, "max_straggler_wait": 7.0}
    # not pre-scheduled: a round whose matchmaking began early waits for the slower peer in matchmaking instead,
    # which its duration counts
    swarm = dict(diloco=diloco, prescheduled_averaging=False)
    peers = [_peer(dht, tmp_path, "diloco-slower", **swarm),
             _peer(other_dht, tmp_path, "diloco-slower", **swarm, tracker_opts={"private_key": RSAPrivateKey()})]

    def slowly(peer, seeds):
        for seed in seeds:
            time.sleep(step_seconds)
            _train(*peer[:3], [seed])

    try:
        _train(*peers[0][:3], [0])  # a peer is in the swarm's progress once it has reported a step
        slowly(peers[1], [100])
        wait_for(lambda: all(peer[2].tracker.other_peers == 1 for peer in peers), "the peers to see each other")
        threads = [threading.Thread(target=_train, args=(*peers[0][:3], range(1, H))),
                   threading.Thread(target=slowly, args=(peers[1], range(101, 100 + H)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        fast, slow = (peer[3].last("outer") for peer in peers)
        assert fast.outcome == slow.outcome == "success" and fast.group_size == slow.group_size == 2, (fast, slow)
        # the fast peer waited until the other was about matchmaking_time from done (about 4 s; the ETA is an
        # estimate, refreshed as the tracker fetches)
        assert 1.0 <= fast.peer_wait_seconds <= diloco["max_straggler_wait"], fast
        assert slow.peer_wait_seconds < 0.5, slow  # the slow peer found the fast one done: it waited for nobody
    finally:
        for peer in peers:
            peer[2].shutdown()
        other_dht.shutdown()


def test_a_peer_the_swarm_outruns_during_its_downloads_catches_up_by_averaging(dht, tmp_path):
    """On a link too slow for the state, every download ends with the swarm further on. After two downloads that
    did, the peer joins the swarm's round with nothing to contribute; the round's state averaging gives it the
    swarm's outer state (its own weighs next to nothing), and both step on the swarm's pseudo-gradient."""
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    swarm = _peer(dht, tmp_path, "diloco-catch-up")
    joiner = None
    seeds = iter(range(10**6))
    try:
        _train(*swarm[:3], [next(seeds) for _ in range(2 * H)])  # alone: two outer steps
        joiner = _peer(other_dht, tmp_path, "diloco-catch-up", tracker_opts={"private_key": RSAPrivateKey()})
        joiner[2].load_state_from_peers()
        for _ in range(2):
            # while the joiner "downloads", the swarm takes two outer steps (the joiner never comes: local ones)
            _train(*swarm[:3], [next(seeds) for _ in range(2 * H)])
            epoch = swarm[2].local_epoch
            wait_for(lambda: joiner[2].tracker.global_epoch == epoch, "the joiner to see the swarm's epoch")
            _train(*joiner[:3], [next(seeds)])  # behind: a download the first time, catching up the second
        assert joiner[3].summary().counts.get(("state", "success"), 0) == 0
        assert joiner[2].catching_up and joiner[2].local_epoch == swarm[2].local_epoch == 6
        assert not joiner[2].state_averager.allow_state_sharing  # its outer state is not its epoch's
        assert _max_difference(joiner[1], swarm[1]) > 1e-3  # the joiner's state is the swarm's of 2 steps ago

        # what the swarm alone would step to: its outer state, stepped on its own pseudo-gradient
        round_seeds = [next(seeds) for _ in range(H)]
        expected = _outer_step_alone(swarm, round_seeds)
        _train(*swarm[:3], round_seeds[:-1])
        wait_for(lambda: all(peer[2].tracker.other_peers == 1 for peer in (swarm, joiner)), "the peers to meet")
        threads = [threading.Thread(target=_train, args=(*swarm[:3], round_seeds[-1:])),
                   threading.Thread(target=_train, args=(*joiner[:3], [next(seeds)]))]  # joins the round's end
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for peer in (swarm, joiner):
            assert peer[3].last("outer").outcome == "success", peer[3].last("outer")
            assert peer[3].last("state").outcome == "success", peer[3].last("state")
        assert not joiner[2].catching_up and joiner[2].state_averager.allow_state_sharing
        for mine, theirs, wanted in zip(_outer_state(joiner[2]), _outer_state(swarm[2]), expected):
            assert float((mine - theirs).abs().max()) < 1e-6
            assert float((theirs - wanted).abs().max()) < 1e-5  # the joiner's old state weighed next to nothing
    finally:
        swarm[2].shutdown()
        if joiner is not None:
            joiner[2].shutdown()
        other_dht.shutdown()


def _outer_step_alone(peer, seeds) -> list:
    """The outer parameters and momentum `peer` would have after its next round alone on `seeds` (its inner SGD
    replayed on a copy of its model, then the outer Nesterov step on the pseudo-gradient)."""
    import copy

    _, model, optimizer, _ = peer
    before = _outer_state(optimizer)
    count = len(before) // 2
    replay = copy.deepcopy(model)
    first_step = optimizer.state_averager.inner_step
    for index, seed in enumerate(seeds):
        x, y = _batch(seed)
        torch.nn.functional.mse_loss(replay(x), y).backward()
        with torch.no_grad():
            for param in replay.parameters():
                param -= INNER_LR * _multiplier(first_step + index) * param.grad
                param.grad = None
    params = [p.clone().requires_grad_() for p in before[:count]]
    outer = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    name_of = {id(param): name for name, param in model.named_parameters()}
    replayed = dict(replay.named_parameters())
    local_params = [replayed[name_of[id(param)]] for param in optimizer.state_averager.main_parameters]
    for param, outer_param, momentum, local in zip(params, before[:count], before[count:], local_params):
        param.grad = outer_param - local.detach()
        outer.state[param]["momentum_buffer"] = momentum.clone()
    outer.step()
    return [p.detach() for p in params] + [outer.state[p]["momentum_buffer"] for p in params]


def test_an_overlapped_round_sends_before_the_round_ends_and_mixes_the_outer_step_into_the_later_steps(dht, tmp_path):
    """Streaming DiLoCo's overlap (swarm.diloco.overlap_steps): the pseudo-gradient of inner step H - overlap goes
    out, the peer keeps stepping while the swarm averages it, and at the H-th step the outer step on the average
    lands, mixed with the peer's own parameters. Two peers, H=4, overlap 2, mixing 0.5, two outer steps, against
    the textbook reference."""
    from hivemind.utils.crypto import RSAPrivateKey

    inner_steps, overlap, mixing = 4, 2, 0.5
    diloco = dict(inner_steps=inner_steps, overlap_steps=overlap, overlap_mixing=mixing, max_straggler_wait=1.0)
    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    peers = [_peer(dht, tmp_path, "diloco-overlap", diloco=diloco),
             _peer(other_dht, tmp_path, "diloco-overlap", diloco=diloco,
                   tracker_opts={"private_key": RSAPrivateKey()})]
    sent_at = [[], []]  # the inner step of the round at which each peer sent its pseudo-gradient
    for peer, log in zip(peers, sent_at):
        send = peer[2]._send_round

        def recording_send(came_with_state, optimizer=peer[2], send=send, log=log):
            log.append(optimizer.round_steps)
            return send(came_with_state)

        peer[2]._send_round = recording_send
    seeds = [list(range(2 * inner_steps)), list(range(100, 100 + 2 * inner_steps))]
    try:
        for peer, own in zip(peers, seeds):
            _train(*peer[:3], own[:1])  # reports progress: the peers see each other
        wait_for(lambda: all(peer[2].tracker.other_peers == 1 for peer in peers), "the peers to see each other")
        threads = [threading.Thread(target=_train, args=(*peer[:3], own[1:])) for peer, own in zip(peers, seeds)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)

        for peer, log in zip(peers, sent_at):
            assert peer[3].summary().counts["outer", "success"] == 2, peer[3].last("outer")
            assert log == [inner_steps - overlap] * 2
        reference = [_Reference(), _Reference()]
        for start in (0, inner_steps):
            sent = []
            for ref, own in zip(reference, seeds):
                ref.inner_steps(own[start : start + inner_steps - overlap])
                sent.append(ref.pseudo_gradient())
                ref.inner_steps(own[start + inner_steps - overlap : start + inner_steps])  # while the round runs
            average = [(a + b) / 2 for a, b in zip(*sent)]
            for ref in reference:
                ref.outer_step(average, mixing)
        for peer, ref in zip(peers, reference):
            assert _max_difference(peer[1], ref.model) < 1e-5
            position = {id(param): i for i, param in enumerate(peer[1].parameters())}  # groups may reorder them
            for main, outer in zip(peer[2].state_averager.main_parameters, peer[2]._outer_parameters()):
                expected = ref.outer_params[position[id(main)]]
                assert float((outer - expected.detach()).abs().max()) < 1e-5
        # the models keep half of their own last steps: they differ, while their outer parameters agree
        assert _max_difference(peers[0][1], peers[1][1]) > 1e-4
    finally:
        for peer in peers:
            peer[2].shutdown()
        other_dht.shutdown()


def test_a_peer_that_took_a_state_past_the_send_step_downloads_the_outer_step_once_the_swarm_took_it(dht, tmp_path):
    """With overlap, a round cannot be joined after its pseudo-gradients went out: a joiner whose downloaded state
    is in the overlap steps waits until the swarm took that outer step, and downloads its result."""
    from hivemind.utils.crypto import RSAPrivateKey

    diloco = dict(inner_steps=4, overlap_steps=2, max_straggler_wait=1.0)
    dhts = [ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True) for _ in range(2)]
    first = _peer(dht, tmp_path, "diloco-overlap-join", diloco=diloco)
    second = _peer(dhts[0], tmp_path, "diloco-overlap-join", diloco=diloco, tracker_opts={"private_key": RSAPrivateKey()})
    joiner = None
    try:
        for peer in (first, second):
            _train(*peer[:3], [0])
        wait_for(lambda: all(peer[2].tracker.other_peers == 1 for peer in (first, second)), "the peers to see each other")
        threads = [threading.Thread(target=_train, args=(*peer[:3], [1, 2])) for peer in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert all(peer[2]._sent_round is not None and peer[2].round_steps == 3 for peer in (first, second))

        joiner = _peer(dhts[1], tmp_path, "diloco-overlap-join", diloco=diloco,
                       tracker_opts={"private_key": RSAPrivateKey()})
        joiner[2].load_state_from_peers()
        assert (joiner[2].local_epoch, joiner[2].round_steps) == (0, 3)  # inside the overlap steps
        wait_for(lambda: joiner[2].tracker.other_peers == 2, "the joiner to see the swarm")
        threads = [threading.Thread(target=_train, args=(*peer[:3], [3])) for peer in (first, second, joiner)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

        assert [peer[3].last("outer").outcome for peer in (first, second)] == ["success", "success"]
        skipped = joiner[3].last("outer")
        assert skipped.outcome == "skipped" and "after its pseudo-gradients were sent" in skipped.error, skipped
        assert joiner[2].local_epoch == first[2].local_epoch == 1
        for mine, swarms in zip(_outer_state(joiner[2]), _outer_state(first[2])):
            assert torch.equal(mine, swarms)  # the outer step's result, momentum included
    finally:
        for peer in (first, second, joiner):
            if peer is not None:
                peer[2].shutdown()
        for node in dhts:
            node.shutdown()
