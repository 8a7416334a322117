"""`swarmd service install`: run this peer as a systemd service (see swarmd/install.py and systemd/)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

__all__ = ["app"]

app = typer.Typer(help="Run swarmd as a systemd service.", no_args_is_help=True, add_completion=False)


@app.command("install")
def install(
    config: Optional[str] = typer.Option(
        None, "--config", "-c", help="YAML config to install (default: the embedded default, written out)."
    ),
    name: Optional[str] = typer.Option(
        None, "--name", help="Install the instance swarmd@NAME (config /etc/swarmd/NAME.yaml); default: swarmd.service."
    ),
    root: str = typer.Option("/", "--root", help="Write into this directory instead of / (images, tests)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing config file or an edited unit."),
) -> None:
    """Write the config to /etc/swarmd/, install the unit, create the swarmd user; print how to start it.

    Exit codes: 0 installed; 2 refused (not root, bad name or config, files in the way), with one line saying why.
    """
    from swarmd.install import install_service

    done = install_service(config=config, name=name, root=root, force=force)
    for warning in done.warnings:
        print(f"swarmd: warning: {warning}", file=sys.stderr)
    into = "" if root == "/" else f" into {root}"
    unit_note = "" if done.unit_changed else " (unchanged)"
    print(f"Installed {done.unit}{into}:")
    print(f"  config  {done.config_file}")
    print(f"  unit    {done.unit_file}{unit_note}")
    if done.user in ("created", "exists"):
        print(f"  user    swarmd ({done.user})")
    else:
        print(f"  user    swarmd does not exist yet; create it: {done.user}")
    print("Start it now and at every boot:")
    print(f"  systemctl daemon-reload && systemctl enable --now {done.unit}")
    print(f"Logs:    journalctl -u {done.unit} -f")
    print(f"Status:  sudo -u swarmd {done.command} status --state-dir {done.state_dir}")
