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
