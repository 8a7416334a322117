"""`swarmd join`: load the config, start the daemon, exit with its code."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
from typing import Optional

import typer

__all__ = ["register"]

# Named flags and the config keys they set (everything else: --set key=value).
FLAG_KEYS = {
    "initial_peers": "network.initial_peers",
    "run_id": "run_id",
    "state_dir": "state_dir",
    "host_maddrs": "network.host_maddrs",
    "announce_maddrs": "network.announce_maddrs",
    "client_mode": "network.client_mode",
    "auxiliary": "swarm.auxiliary",
    "device": "training.device",
    "devices": "training.devices",
    "metrics_addr": "metrics.listen",
}


def join(
    config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML config file (see configs/)."),
    initial_peers: list[str] = typer.Option(
        None, "--initial-peers", help="Multiaddr of a running peer, as it printed it (repeatable)."
    ),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="The run to join (peers of a run train together)."),
    state_dir: Optional[str] = typer.Option(None, "--state-dir", help="Identity, checkpoints, data, status socket."),
    host_maddrs: list[str] = typer.Option(None, "--host-maddrs", help="Listen multiaddr (repeatable); default tcp 31337."),
    announce_maddrs: list[str] = typer.Option(None, "--announce-maddrs", help="Public multiaddr to announce (repeatable)."),
    client_mode: bool = typer.Option(False, "--client-mode", help="No inbound connections (behind NAT/firewall)."),
    auxiliary: bool = typer.Option(False, "--auxiliary", help="Only help averaging, do not train."),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N."),
    devices: Optional[str] = typer.Option(
        None, "--devices", help="One data-parallel rank per device: auto, or a list like cuda:0,cuda:1 (cpu,cpu)."
    ),
    metrics_addr: Optional[str] = typer.Option(None, "--metrics-addr", help="host:port of the Prometheus endpoint."),
    assignments: list[str] = typer.Option(None, "--set", help="Any config key: --set swarm.target_batch_size=4096."),
    run_key: Optional[str] = typer.Option(
        None, "--run-key", help="Without --config: trust only the run's manifest signed by this key (its fingerprint)."
    ),
    manifest_wait: float = typer.Option(30.0, "--manifest-wait", min=0, help="Without --config: seconds to wait "
                                        "for the run's manifest at the initial peers."),
) -> None:
    """Join a swarm (or start a new one) and train until stopped (SIGTERM/SIGINT).

    With --initial-peers and no --config, the run's settings come from its signed manifest in the swarm."""
    from swarmd.config import load_config

    given = dict(
        initial_peers=initial_peers or None,
        run_id=run_id,
        state_dir=state_dir,
        host_maddrs=host_maddrs or None,
        announce_maddrs=announce_maddrs or None,
        client_mode=client_mode or None,
        auxiliary=auxiliary or None,
        device=device,
        devices=devices,
        metrics_addr=metrics_addr,
    )
    flags = {FLAG_KEYS[name]: value for name, value in given.items() if value is not None}
    cfg = load_config(config, flags=flags, assignments=assignments or [])
    from swarmd.swarm.manifest_update import founder_assignments

    # the founder's `swarmd run update`s ([] on any peer that holds no key of the run: a joiner's come with the
    # manifest), with a config file or the embedded default alike
    updates = founder_assignments(cfg.state_path, cfg.run_id)
    if updates:
        cfg = load_config(config, flags=flags, assignments=[*(assignments or []), *updates])
    manifest = None
    if config is None and not os.environ.get("SWARMD_CONFIG") and cfg.network.initial_peers:
        from swarmd.cli.run import join_by_manifest

        cfg, manifest = join_by_manifest(cfg, flags=flags, assignments=assignments or [], run_key=run_key,
                                         run_id_given=_names_the_run(run_id, assignments or []), wait=manifest_wait)
    elif run_key is not None:
        from swarmd.errors import ConfigError

        raise ConfigError("--run-key is for joining from the run's manifest: pass --initial-peers and no --config")
    sys.exit(run_daemon(cfg, config_path=_config_to_share(cfg, config, manifest), manifest=manifest))


def _names_the_run(run_id: Optional[str], assignments: list[str]) -> bool:
    """Whether this command chose the run (else the one run the initial peers serve is joined)."""
    return bool(run_id or os.environ.get("SWARMD_RUN_ID") or any(a.strip().startswith("run_id=") for a in assignments))


def _config_to_share(cfg, config: Optional[str], manifest) -> Optional[str]:
    """The --config of the `To join:` line: none where the run's manifest carries the settings (a joiner from it,
    or the founder holding the run's key)."""
    from swarmd.swarm.manifest import run_key_path

    if manifest is not None or run_key_path(cfg.state_path, cfg.run_id).exists():
        return None
    return config


def run_daemon(cfg, *, config_path: Optional[str] = None, manifest: Optional[bytes] = None) -> int:
    import uvloop

    from swarmd.daemon.assembly import build_extensions
    from swarmd.daemon.lifecycle import Daemon
    from swarmd.logs import configure_logging
    from swarmd.ranks.layout import torchrun_rank

    configure_logging(cfg.logging.level, cfg.logging.format)
    # A native crash (torch, a hivemind process) prints every thread's Python stack to stderr, i.e. the log or the
    # journal, before the process dies; the children forked later inherit it. systemd's watchdog SIGABRT too.
    with contextlib.suppress(AttributeError, OSError, ValueError):  # a stderr without a file descriptor
        faulthandler.enable(all_threads=True)
    place = torchrun_rank(os.environ)
    if place is not None and not place.hosts_hivemind:
        # under torchrun every process runs `swarmd join`; only global rank 0 is the peer (DHT, hivemind, status)
        from swarmd.ranks.compute_rank import run_torchrun_rank

        return run_torchrun_rank(cfg, place, os.environ)
    daemon = Daemon(cfg, extensions=build_extensions(cfg, manifest=manifest), config_path=config_path)
    return uvloop.run(daemon.run())


def register(app: typer.Typer) -> None:
    app.command("join")(join)
