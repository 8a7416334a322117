"""Canned data shaped like what the daemon serves, for tests that need no daemon."""


def sample_snapshot(now: float) -> dict:
    """What a training daemon of a two-peer swarm serves (the keys of swarmd/status/snapshot.py)."""
    peer = {
        "peer_id": "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "public_name": "alpha", "swarmd_version": "0.1.0",
        "task": "swin", "device": "cpu", "state": "training", "local_epoch": 7, "samples_per_second": 95.5,
        "samples_total": 4000, "loss": 1.75, "averaging_success": 6, "averaging_failed": 1, "uptime_seconds": 300.0,
        "client_mode": False, "auxiliary": False, "target_batch_size": 128, "time": now - 2, "last_seen_seconds": 2.0,
        "self": True,
    }
    other = {**peer, "peer_id": "QmcNFS8LmrN8bPVKQSBqWDaiy5RMnBUaqmvpQKjuDjiXwV", "public_name": "beta", "self": False,
             "loss": 1.8, "last_seen_seconds": 4.0}
    return {
        "api_version": 1, "swarmd_version": "0.1.0", "run_id": "unit-run", "peer_id": peer["peer_id"],
        "public_name": "alpha", "task": "swin", "device": "cpu", "state": "training", "phase": "training",
        "uptime_seconds": 300.0, "client_mode": False, "auxiliary": False, "local_epoch": 7, "global_epoch": 7,
        "num_peers": 2, "num_clients": 0, "samples_accumulated": 96, "target_batch_size": 128, "eta_seconds": 0.4,
        "samples_per_second": 95.5, "samples_total": 4000, "loss": 1.75,
        "loss_history": [[e, 2.3 - 0.08 * e] for e in range(7)],
        "recent_averaging": [
            {"kind": "gradients", "outcome": "success", "group_size": 2, "duration_seconds": 0.42, "epoch": 6,
             "time": now - 3, "error": ""},
        ],
        "averaging": {"gradients": {"success": 6, "failed": 1, "skipped": 0}}, "metrics_address": "127.0.0.1:9464",
        "peers": [peer, other],
    }


HOSTILE_NAME = "<script>alert(1)</script>"  # a name a stranger may publish: every page must show it as text


def three_peer_snapshot(now: float, *, rounds: int = 6, epoch: int = 12):
    """A real Snapshot (status/snapshot.py) of a training peer in a swarm of three, one of them named HOSTILE_NAME,
    with curves and rounds of group size 3: what the web page renders (tests of swarmd/web/)."""
    from swarmd.status.snapshot import Identity, build_snapshot
    from swarmd.swarm.averaging_log import AveragingRound

    identity = Identity(
        run_id="web-run", public_name="alpha", task="swin", precision="fp32", client_mode=False, auxiliary=False,
        target_batch_size=256, started_at=now - 1800, peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",
        device="cpu", compatibility={"protocol": 3, "task": "swin", "parameters": 28_300_000,
                                     "model_fingerprint": "f00d", "target_batch_size": 256, "strategy": "sync",
                                     "inner_steps": 0},
    )
    record = {
        "swarmd_version": "0.1.0", "task": "swin", "device": "cpu", "state": "training", "local_epoch": epoch,
        "samples_total": 40_000, "averaging_success": 11, "averaging_failed": 0, "uptime_seconds": 1800.0,
        "client_mode": False, "auxiliary": False, "target_batch_size": 256, "time": now - 2, "last_seen_seconds": 2.0,
    }
    peers = (
        {**record, "peer_id": identity.peer_id, "public_name": "alpha", "samples_per_second": 96.5, "loss": 1.62,
         "self": True},
        {**record, "peer_id": "QmcNFS8LmrN8bPVKQSBqWDaiy5RMnBUaqmvpQKjuDjiXwV", "public_name": "beta",
         "samples_per_second": 88.0, "loss": 1.66, "averaging_failed": 1, "self": False, "last_seen_seconds": 4.0},
        {**record, "peer_id": "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN", "public_name": HOSTILE_NAME,
         "samples_per_second": 51.25, "loss": 1.71, "self": False, "client_mode": True, "last_seen_seconds": 3.0},
    )
    recent = tuple(
        AveragingRound("gradients", "success", 3, 0.4 + 0.05 * i, epoch - rounds + i, now - 40 * (rounds - i))
        for i in range(rounds)
    ) + (AveragingRound("state", "failed", 1, 30.0, epoch, now - 5, error=f"TimeoutError('{HOSTILE_NAME}')"),)
    base = build_snapshot(identity, "training")
    return base.with_fields(dict(
        phase="training", local_epoch=epoch, global_epoch=epoch, num_peers=3, num_clients=1,
        samples_accumulated=180, eta_seconds=2.5, samples_per_second=96.5, samples_total=40_000, steps_total=2500,
        loss=1.62, loss_history=tuple((e, round(2.4 * 0.93 ** e, 4)) for e in range(epoch)),
        rate_history=tuple((e, 80.0 + 16 * (e % 3 == 0) + e) for e in range(epoch)),
        recent_averaging=recent, last_averaging=recent[-1], peers=peers, metrics_address="127.0.0.1:9464",
    ))


class CannedView:
    """A daemon's view (swarmd/extension.py DaemonView) serving fabricated snapshots: the first ones in turn, one per
    call, then the last one for ever (tests/unit/test_metrics.py FakeView is a daemon that is still starting)."""

    def __init__(self, *snapshots):
        import threading

        self.config, self.dht = None, None
        self._snapshots = list(snapshots)
        self._lock = threading.Lock()  # the HTTP server calls from a thread per request
        self.calls = 0

    def snapshot(self):
        with self._lock:
            self.calls += 1
            return self._snapshots[min(self.calls, len(self._snapshots)) - 1]

    def worker_activity(self):
        return None
