"""A real daemon that a lying donor puts behind judges the state it downloads (swarmd/worker/download_judge.py).

A swarmd daemon trains alone on the `faulty` test task for 20 steps of its own. Then a plain hivemind peer in this
process joins its run: a TrainingStateAverager under the run's state-averager key that offers the task's model x1000
at an epoch far ahead, and a progress record at that epoch. The daemon sees the swarm ahead of it, downloads that
state (the only donor, by hivemind's RPC) and takes its first step on it. With `swarm.guard_download_loss_ratio` at
its default (100) that step's loss is ~1e6 times the largest of the daemon's own last steps: the state is refused,
the daemon's own parameters come back, and the donor is excluded for it (reason "state"; `swarm.exclusion.rounds: 1`
here, so that one refused state excludes: by default three do, and one makes a suspect). With the judge off (0)
the same daemon keeps the broken state: its loss stays ~1e5, proof that the first test fails without the defence.
"""

import functools

import pytest
import torch

from daemons import peer_config

RUN_ID = peer_config()["run_id"]
UNTRAINED_LOSS = 0.45  # the faulty task's mean y**2: the loss of a model that outputs about 0
EPOCHS_AHEAD = 10_000  # the liar's claimed epoch, ahead of the daemon's
SCALE = 1000.0  # the liar's parameters: the faulty task's model x1000


def _config(guard_ratio):
    swarm = {"target_batch_size": 128, "matchmaking_time": 1.0, "averaging_timeout": 5.0,
             "exclusion": {"rounds": 1, "base_seconds": 600.0}}  # one refused state excludes, for the whole test
    if guard_ratio is not None:
        swarm["guard_download_loss_ratio"] = guard_ratio
    return peer_config(
        task={"name": "faulty", "step_sleep": 0.02},
        swarm=swarm,
        checkpoint={"enabled": False},
    )


class LyingDonor:
    """A plain hivemind peer of the run that offers a broken state (the faulty task's model x SCALE, Adam's
    statistics as initialised) at `epoch`, and publishes a progress record at that epoch: whoever reads it is
    behind and downloads from it."""

    def __init__(self, initial_peers: list[str], epoch: int):
        from hivemind.optim.progress_tracker import ProgressTracker
        from hivemind.optim.state_averager import TrainingStateAverager

        from swarmd.swarm import averager_keys
        from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
        from swarmd.tasks.optim import OptimConfig, build_optimizer

        self.dht = ToleratesExitedCallers(start=True, initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        self.averager = self.tracker = None
        try:
            # the faulty task's model and optimizer (its defaults), so the state fits the daemon's layout
            with torch.random.fork_rng():
                torch.manual_seed(1)
                model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(SCALE)
            params = list(model.parameters())
            groups = [{"params": [p for p in params if p.ndim >= 2]},
                      {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
            optim = OptimConfig(lr=3e-3, weight_decay=0.0, warmup_epochs=0, total_epochs=10_000, schedule="constant")
            self.averager = TrainingStateAverager(
                dht=self.dht, optimizer=functools.partial(build_optimizer, optim), params=groups,
                prefix=averager_keys.averager_prefix(RUN_ID, averager_keys.STATE), start=True,
            )
            self.averager.local_epoch = epoch
            self.averager.state_sharing_priority = epoch
            self.tracker = ProgressTracker(self.dht, prefix=RUN_ID, target_batch_size=128, start=True)
            # a record with samples: upstream's tracker publishes only while the peer reports some
            self.tracker.report_local_progress(epoch, samples_accumulated=1)
        except BaseException:
            self.shutdown()
            raise

    @property
    def peer_id(self) -> str:
        return self.dht.peer_id.to_base58()

    def shutdown(self) -> None:
        for part in (self.tracker, self.averager, self.dht):
            if part is not None and part.is_alive():
                part.shutdown()


def _train_then_meet_the_liar(daemons, env, guard_ratio):
    """A daemon that trained 20 steps of its own, then downloaded the liar's state: (the daemon, the liar, the
    daemon's status before the liar came); the caller shuts the liar down."""
    daemon = daemons("daemon", _config(guard_ratio), env=env)
    before = daemon.wait_status(lambda s: s["state"] == "training" and s["steps_total"] >= 20 and s["loss"] is not None,
                                120, "20 steps of its own")
    liar = LyingDonor(daemon.initial_peers(), before["global_epoch"] + EPOCHS_AHEAD)
    try:
        daemon.wait_status(lambda s: s["state_loads_total"] >= 1, 60, "a download of the liar's state")
        assert f"Downloaded the state of {liar.peer_id}" in daemon.log, daemon.tail()
    except BaseException:
        liar.shutdown()
        raise
    return daemon, liar, before


@pytest.mark.timeout(240)
def test_a_daemon_refuses_a_downloaded_state_far_worse_than_its_own(daemons, test_tasks_env):
    """Judged at the default ratio: refused, the donor excluded for it, the daemon's own parameters back (its loss
    learned, not the liar's ~1e5)."""
    daemon, liar, before = _train_then_meet_the_liar(daemons, test_tasks_env, None)  # the default ratio (100)
    try:
        status = daemon.wait_status(lambda s: s["excluded_peers"], 60, "the liar excluded")
        [excluded] = status["excluded_peers"]
        assert excluded["peer_id"] == liar.peer_id and excluded["reason"] == "state", excluded
        assert excluded["refused_states"] >= 1, excluded
        assert status["exclusions_total"]["state"] == 1 and status["restores_total"] >= 1, status
        assert f"Refused the state downloaded from {liar.peer_id}" in daemon.log, daemon.tail()
        # its own parameters are back: the loss of its next steps is its own model's, not the liar's (~1e5)
        steps = status["steps_total"]
        after = daemon.wait_status(lambda s: s["steps_total"] >= steps + 20, 60, "20 steps after the refusal")
        print(f"\nguarded: loss {before['loss']:.4f} before the liar, {after['loss']:.4f} 20 steps after the refusal; "
              f"excluded {excluded}; downloads {after['state_loads_total']}, restores {after['restores_total']}, "
              f"epoch {before['local_epoch']} before, {after['local_epoch']} after")
        assert after["loss"] < UNTRAINED_LOSS, after["loss"]
        # the epoch came back with the parameters: the liar's word (EPOCHS_AHEAD on) is neither trained nor published
        assert after["local_epoch"] < before["local_epoch"] + 100, after["local_epoch"]
        assert after["global_epoch"] < before["global_epoch"] + 100, after["global_epoch"]
        # Behind the liar's record again, the daemon downloads again until the exclusion has reached its tick and its
        # averager (2 or 3 downloads within 0.2 s, in CI): each such state refused too, and none once the liar's
        # records count for nothing. The state is its own again: never taken again for where a refused one came from.
        assert after["restores_total"] == after["state_loads_total"], after
        later = daemon.wait_status(lambda s: s["steps_total"] >= after["steps_total"] + 10, 60, "10 steps more")
        assert later["state_loads_total"] == after["state_loads_total"], "downloads went on after the exclusion"
        assert "which it now has evidence against: taking the state again" not in daemon.log, daemon.tail()
        # the schedule went back with the epoch, built again from the factory the state averager was given
        assert "cannot be set back" not in daemon.log, daemon.tail()
    finally:
        liar.shutdown()


@pytest.mark.timeout(240)
def test_without_the_judge_the_daemon_keeps_the_broken_state(daemons, test_tasks_env):
    """The same scenario with `swarm.guard_download_loss_ratio: 0`: the broken state stays (what the judge is for,
    and proof that the test above fails without it)."""
    daemon, liar, before = _train_then_meet_the_liar(daemons, test_tasks_env, 0.0)
    try:
        steps = daemon.status()["steps_total"]
        after = daemon.wait_status(lambda s: s["steps_total"] >= steps + 20, 60, "20 steps after the download")
        print(f"\nunguarded: loss {before['loss']:.4f} before the liar, {after['loss']:.4g} 20 steps after the "
              f"download; downloads {after['state_loads_total']}, restores {after['restores_total']}")
        assert after["loss"] > 1000 * UNTRAINED_LOSS, after["loss"]
        assert after["restores_total"] == 0 and after["suspected_peers"] == [] and after["excluded_peers"] == []
        assert after["exclusions_total"]["state"] == 0
    finally:
        liar.shutdown()
