"""`swarmd monitor`: watch a run from outside it, log the swarm's totals, serve them and its web page, keep its
model."""

from __future__ import annotations

import sys
from typing import Optional

import typer

__all__ = ["register"]

DEFAULT_METRICS = "127.0.0.1:9466"  # beside a peer's 9464 on the same host


def monitor(
    config: Optional[str] = typer.Option(
        None, "--config", "-c", help="The run's config: its task (to keep the model) and its tracking backends."
    ),
    initial_peers: list[str] = typer.Option(
        None, "--initial-peers", help="Multiaddr of a peer of the run (repeatable; default: the config's)."
    ),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="The run to watch (default: the config's)."),
    state_dir: Optional[str] = typer.Option(
        None, "--state-dir", help="Where the kept checkpoints, model/ and tracking go (default: the config's + '-monitor')."
    ),
    interval: float = typer.Option(30.0, "--interval", min=1.0, help="Seconds between reads of the swarm."),
    keep_every: float = typer.Option(
        10.0, "--keep-every", min=0.0, help="Minutes between downloads of the swarm's model (0: never keep it)."
    ),
    metrics_addr: str = typer.Option(
        DEFAULT_METRICS, "--metrics-addr",
        help="host:port of the swarm's web page (/), its JSON (/api/status) and /metrics; '' for none.",
    ),
    assignments: list[str] = typer.Option(None, "--set", help="Any config key, as for `swarmd join`."),
) -> None:
    """Watch a run without training: every --interval seconds log the swarm as a whole (peers, samples/s, loss
    averaged over all peers' samples, averaging health) to the config's tracking backends and /metrics, and serve
    the swarm's web page beside it (http://127.0.0.1:9466/ by default: the run, the peers, the curves, the
    averaging reports; updated live, the tables complete without JavaScript); every
    --keep-every minutes download the swarm's model and keep it as a checkpoint and an export (STATE_DIR/model),
    and once more on SIGTERM or SIGINT (Ctrl-C), so the run keeps its model when every peer has left."""
    from swarmd.config import load_config
    from swarmd.errors import ConfigError
    from swarmd.logs import configure_logging
    from swarmd.monitor.page import check_listen
    from swarmd.monitor.runner import Monitor
    from swarmd.status.remote import RemoteSwarm

    flags = {"network.client_mode": True}
    if initial_peers:
        flags["network.initial_peers"] = list(initial_peers)
    if run_id is not None:
        flags["run_id"] = run_id
    cfg = load_config(config, flags=flags, assignments=assignments or [])
    # its own state dir and name: the run's config names a peer's (--set daemon.public_name=... still wins)
    monitor_flags = {"state_dir": state_dir or f"{cfg.state_path}-monitor", "daemon.public_name": "monitor"}
    cfg = load_config(config, flags={**flags, **monitor_flags}, assignments=assignments or [])
    if not cfg.network.initial_peers:
        raise ConfigError("--initial-peers: the monitor needs the address of a peer of the run (or network.initial_peers)")
    if metrics_addr:
        check_listen(metrics_addr)  # a taken port: one line and exit 3 now, not after joining the DHT
    configure_logging(cfg.logging.level, cfg.logging.format)
    cfg.state_path.mkdir(parents=True, exist_ok=True)
    with RemoteSwarm(list(cfg.network.initial_peers), cfg.run_id) as swarm:
        runner = Monitor(cfg, swarm, interval=interval, keep_every=keep_every * 60, metrics_listen=metrics_addr or None)
        sys.exit(runner.run())


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor)
