"""Peers that lie, against robust aggregation (swarmd/swarm/robust_aggregation.py, docs/FAULTS.md).

- One all-reduce: two swarmd averagers (DiLoCo's outer averager, the same base as the gradient and state averagers)
  and a plain hivemind averager that sends x -1000 its honest tensors, over three DHTs on 127.0.0.1. With
  `swarm.aggregation: centered_clip` the honest peers, which reduce the vector's shares, get close to their own
  mean; with hivemind's mean the liar sets the result.
- A swarm: two honest daemons and one whose gradients are x -1000 (the `faulty` test plug-in), with and without
  the defence: the honest loss stays learned, or climbs past the untrained one.
"""

import pytest
import torch

from swarmd.swarm.robust_aggregation import Aggregation

SIZE = 50_000  # two parts per honest reducer at hivemind's default part size: the reducer's part loop runs


@pytest.fixture(scope="module")
def dhts():
    from swarmd.swarm.dht_process import ToleratesExitedCallers

    loopback = ["/ip4/127.0.0.1/tcp/0"]
    first = ToleratesExitedCallers(start=True, host_maddrs=loopback)
    nodes = [first]
    try:
        initial = [str(addr) for addr in first.get_visible_maddrs()]
        for _ in range(2):
            nodes.append(ToleratesExitedCallers(start=True, initial_peers=initial, host_maddrs=loopback))
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


def _round(dhts, method: str):
    """One all-reduce of the three; returns (honest mean, honest results, signal, group sizes)."""
    from hivemind.averaging import DecentralizedAverager

    from swarmd.swarm.outer_round import OuterAverager

    generator = torch.Generator().manual_seed(0)
    signal = torch.randn(SIZE, generator=generator)
    honest = [signal + 0.3 * torch.randn(SIZE, generator=generator) for _ in range(2)]
    settings = dict(prefix=f"robust-{method}", target_group_size=3, min_group_size=3, min_matchmaking_time=2.0,
                    request_timeout=1.0, start=True)
    averagers = [
        OuterAverager(averaged_tensors=[tensor.clone()], dht=dht, aggregation=Aggregation(method=method), **settings)
        for tensor, dht in zip(honest, dhts)
    ]
    try:
        # a plain hivemind peer that only sends (client mode): the shares are reduced by the honest swarmd peers
        liar = DecentralizedAverager([-1000.0 * signal], dhts[2], client_mode=True, **settings)
        averagers.append(liar)
        controls = [averager.step(wait=False, timeout=30) for averager in averagers]
        groups = [control.result(40) for control in controls]
        results = []
        for averager in averagers[:2]:
            with averager.get_tensors() as tensors:
                results.append(tensors[0].clone())
        return torch.stack(honest).mean(0), results, signal, [len(group) for group in groups]
    finally:
        for averager in averagers:
            averager.shutdown()


def _relative_error(result, reference, signal):
    return float(torch.linalg.vector_norm(result - reference) / torch.linalg.vector_norm(signal))


def test_centered_clip_keeps_the_honest_peers_near_their_mean(dhts):
    honest_mean, results, signal, groups = _round(dhts, "centered_clip")
    assert groups == [3, 3, 3]
    errors = [_relative_error(result, honest_mean, signal) for result in results]
    print(f"\ncentered_clip: honest results off their mean by {errors} of the signal's norm")
    assert max(errors) < 0.3, errors


def test_the_plain_mean_follows_the_liar(dhts):
    honest_mean, results, signal, groups = _round(dhts, "mean")
    assert groups == [3, 3, 3]
    errors = [_relative_error(result, honest_mean, signal) for result in results]
    print(f"\nmean: honest results off their mean by {errors} of the signal's norm")
    assert min(errors) > 100, errors  # (2 g - 1000 g) / 3 - g


LIAR_TEST_LR = 0.01
LIAR_TEST_BATCH = 64  # honest gradients of 64-sample steps agree closely: a small clip radius next to the liar's


def _liar_config(method: str, grad_scale: float = 1.0) -> dict:
    from daemons import peer_config

    return peer_config(
        # a learning rate at which six reversed steps show (Adam takes the direction of the mean, not its size)
        task={"name": "faulty", "step_sleep": 0.02, "grad_scale": grad_scale,
              "optim": {"lr": LIAR_TEST_LR, "weight_decay": 0.0, "warmup_epochs": 0, "schedule": "constant"}},
        swarm={
            "target_batch_size": LIAR_TEST_BATCH * 6,
            "matchmaking_time": 2.0,
            "averaging_timeout": 10.0,
            # the older defences off: what keeps the honest peers learning here is the aggregation alone
            "guard_gradient_norm_ratio": 0.0,
            "guard_parameter_change": 0.0,
            "aggregation": {"method": method},
        },
        training={"batch_size": LIAR_TEST_BATCH, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
        # The liar joins as a client: it averages (its parts reach the honest reducers) but serves no state. Seen
        # in CI: an honest peer that fell behind downloaded the liar's state (loss 0.018 -> 0.35), the other way a
        # liar gets in, which aggregation does not cover (issue 34 item 4: not downloaded from once excluded).
        network={"client_mode": grad_scale != 1.0},
    )


def _gradient_rounds_of_three(status) -> int:
    return sum(r["kind"] == "gradients" and r["outcome"] == "success" and r["group_size"] == 3
               for r in status["recent_averaging"])


def _honest_loss_beside_a_liar(daemons, env, method: str) -> tuple[float, float, dict]:
    """Two honest daemons and a liar, every one reducing with `method`: (the honest peer's loss when the three
    began to train together, after 10 more global epochs, its last status)."""
    a = daemons("honest-a", _liar_config(method), env=env)
    extra = a.joining_args()
    b = daemons("honest-b", _liar_config(method), env=env, extra_args=extra)
    liar = daemons("liar", _liar_config(method, grad_scale=-1000.0), env=env, extra_args=extra)
    together = a.wait_status(lambda s: s["num_peers"] == 3 and s["loss"] is not None, 120, "three peers training")
    start_epoch = together["global_epoch"]
    status = a.wait_status(lambda s: _gradient_rounds_of_three(s) >= 4 and s["global_epoch"] >= start_epoch + 10, 90,
                           "gradient rounds with the liar")
    print(f"\n{method}: honest peer a's loss {together['loss']:.4f} as the liar joined, {status['loss']:.4f} after "
          f"{status['global_epoch'] - start_epoch} epochs; its gradient rounds {status['averaging']['gradients']}")
    status["peer_ids"] = {peer.name: peer.status()["peer_id"] for peer in (a, b, liar)}
    status["log"] = a.log
    return together["loss"], status["loss"], status


def test_two_honest_daemons_keep_learning_beside_a_daemon_whose_gradients_are_x_minus_1000(daemons, test_tasks_env):
    """Real peers: two honest swarmd daemons and a third whose task multiplies its gradients by -1000 (the test
    plug-in). Every peer reduces its share with CenteredClip, so the liar's gradients are clipped wherever they
    meet the others': the rounds of three succeed and the honest loss stays learned (measured over 10 epochs:
    0.0279 -> 0.0205)."""
    joined, after, status = _honest_loss_beside_a_liar(daemons, test_tasks_env, "centered_clip")
    assert after < max(2 * joined, 0.05), (joined, after)
    # the evidence: honest peer a clipped the liar in its share, and never its honest partner
    assert status["outliers_clipped_total"] >= 1
    assert f"clipped {status['peer_ids']['liar']} as an outlier" in status["log"]
    assert f"clipped {status['peer_ids']['honest-b']} as an outlier" not in status["log"]


def test_without_the_defence_the_same_swarm_climbs_the_loss(daemons, test_tasks_env):
    """The scenario above with hivemind's mean (and no guard): what the defence is for, and proof that the test
    above would fail without it (measured over 10 epochs: 0.0257 -> 2.14, past the untrained loss)."""
    joined, after, status = _honest_loss_beside_a_liar(daemons, test_tasks_env, "mean")
    assert after > max(2 * joined, 0.05), (joined, after)
    assert status["outliers_clipped_total"] == 0
