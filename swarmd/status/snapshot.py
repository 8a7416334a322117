"""The status snapshot: one dict that `swarmd status`, the Prometheus collector and the DHT record all read.

API_VERSION changes when a key is renamed or removed (adding keys does not change it). Top-level keys:

  api_version, swarmd_version, run_id, peer_id, public_name, task, device, precision, state, phase,
  started_at, uptime_seconds, client_mode, auxiliary, visible_maddrs,
  local_epoch, global_epoch, num_peers, num_clients, samples_accumulated, target_batch_size, eta_seconds,
  samples_per_second, samples_total, steps_total, compute_seconds_total, optimizer_seconds_total (time inside
  hivemind.Optimizer.step: accumulation, waits for averaging, updates), loss, loss_history [[epoch, loss], ...],
  last_averaging {kind, outcome, group_size, duration_seconds, epoch, time, error},
  averaging {gradients|state: {success, failed, skipped}}, recent_averaging [...],
  state_loads_total, failures_total, nonfinite_steps_total, restores_total, last_error,
  evaluation {epoch, metrics}, checkpoint {epoch, path, time, failures_total}, peers [...]

Added by the daemon's extensions (swarmd/daemon/extensions.py):
  metrics_address       host:port the /metrics endpoint is bound to (None: metrics off or the port was taken)
  peers                 the swarm's peer records from the DHT (swarm/peer_records.py), sorted by public_name:
                        {peer_id, public_name, swarmd_version, task, device, state, local_epoch,
                         samples_per_second, samples_total, loss, averaging_success, averaging_failed,
                         uptime_seconds, client_mode, auxiliary, target_batch_size, time, last_seen_seconds,
                         self (true for this daemon's own record)}
  peer_records_rejected_total   records read from the DHT that were malformed and ignored
"""

from __future__ import annotations

import socket
import time
from typing import Any, Optional

from swarmd import __version__

__all__ = ["API_VERSION", "PEER_STATES", "build_snapshot"]

API_VERSION = 1
PEER_STATES = ("starting", "joining", "training", "stopping")


def build_snapshot(
    *,
    config,
    state: str,
    started_at: float,
    peer_id: Optional[str],
    visible_maddrs: list[str],
    device: Optional[str],
    optimizer=None,
    stats=None,
    averaging_log=None,
    peers: Optional[list[dict[str, Any]]] = None,
) -> dict[str, Any]:
    """Read the live components (any may still be None while starting) into plain JSON-able data."""
    now = time.time()
    snapshot: dict[str, Any] = {
        "api_version": API_VERSION,
        "swarmd_version": __version__,
        "run_id": config.run_id,
        "peer_id": peer_id,
        "public_name": config.daemon.public_name or socket.gethostname(),
        "task": config.task.name,
        "device": device,
        "precision": config.training.precision,
        "state": state,
        "phase": stats.phase if stats is not None else state,
        "started_at": started_at,
        "uptime_seconds": round(now - started_at, 3),
        "client_mode": config.network.client_mode,
        "auxiliary": config.swarm.auxiliary,
        "visible_maddrs": visible_maddrs,
        "local_epoch": None,
        "global_epoch": None,
        "num_peers": None,
        "num_clients": None,
        "samples_accumulated": None,
        "target_batch_size": config.swarm.target_batch_size,
        "eta_seconds": None,
        "samples_per_second": 0.0,
        "samples_total": 0,
        "steps_total": 0,
        "compute_seconds_total": 0.0,
        "optimizer_seconds_total": 0.0,
        "loss": None,
        "loss_history": [],
        "last_averaging": None,
        "averaging": {},
        "recent_averaging": [],
        "state_loads_total": 0,
        "failures_total": 0,
        "nonfinite_steps_total": 0,
        "restores_total": 0,
        "last_error": "",
        "evaluation": None,
        "checkpoint": None,
        "peers": peers or [],
    }
    if optimizer is not None:
        progress = optimizer.tracker.global_progress
        snapshot.update(
            local_epoch=optimizer.local_epoch,
            global_epoch=progress.epoch,
            num_peers=progress.num_peers,
            num_clients=progress.num_clients,
            samples_accumulated=progress.samples_accumulated,
            target_batch_size=progress.target_batch_size,
            eta_seconds=_eta(progress.eta_next_epoch, now),
            state_loads_total=optimizer.state_loads_total,
        )
    if stats is not None:
        snapshot.update(
            samples_per_second=round(stats.samples_per_second, 3),
            samples_total=stats.samples_total,
            steps_total=stats.steps_total,
            compute_seconds_total=round(stats.compute_seconds_total, 3),
            optimizer_seconds_total=round(stats.optimizer_seconds_total, 3),
            loss=stats.loss,
            loss_history=[[epoch, loss] for epoch, loss in stats.loss_history()],
            failures_total=stats.failures_total,
            nonfinite_steps_total=stats.nonfinite_steps_total,
            restores_total=stats.restores_total,
            last_error=stats.last_error,
        )
        if stats.last_eval:
            snapshot["evaluation"] = {"epoch": stats.last_eval_epoch, "metrics": dict(stats.last_eval)}
        if stats.checkpoint_epoch is not None or stats.checkpoint_failures_total:
            snapshot["checkpoint"] = {
                "epoch": stats.checkpoint_epoch,
                "path": stats.checkpoint_path,
                "time": stats.checkpoint_time,
                "failures_total": stats.checkpoint_failures_total,
            }
    if averaging_log is not None:
        last = averaging_log.last()
        snapshot["last_averaging"] = last.to_dict() if last is not None else None
        counts: dict[str, dict[str, int]] = {}
        for (kind, outcome), count in averaging_log.counts().items():
            counts.setdefault(kind, {})[outcome] = count
        snapshot["averaging"] = counts
        snapshot["recent_averaging"] = [item.to_dict() for item in averaging_log.recent(10)]
    return snapshot


def _eta(eta_next_epoch: float, now: float) -> Optional[float]:
    if eta_next_epoch is None or eta_next_epoch == float("inf") or eta_next_epoch != eta_next_epoch:
        return None
    return round(max(0.0, eta_next_epoch - now), 3)
