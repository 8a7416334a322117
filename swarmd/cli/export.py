"""`swarmd export`: a checkpoint of the state dir as a model directory that loads without swarmd."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer

__all__ = ["register"]


def export(
    output: str = typer.Option(
        ..., "--output", "-o", help="Directory to write (created; must be empty unless --force)."
    ),
    state_dir: Optional[str] = typer.Option(
        None, "--state-dir", help="The peer's state dir, whose checkpoints/ to read (default: the config's state_dir)."
    ),
    checkpoint: Optional[str] = typer.Option(
        None,
        "--checkpoint",
        help="A checkpoint folder name, e.g. epoch-00000012-20261129T170501.123Z (default: the newest that verifies).",
    ),
    config: Optional[str] = typer.Option(
        None,
        "--config",
        "-c",
        help="A config to rebuild the model with instead of the one the checkpoint recorded (checked against it).",
    ),
    assignments: list[str] = typer.Option(None, "--set", help="Any config key, as for `swarmd join`."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --output directory."),
) -> None:
    """Write a checkpoint as a self-describing model directory: ALBERT in the Hugging Face layout, Swin in timm's,
    other tasks as their plug-in writes them (default: model.safetensors); plus the swarmd config and
    swarmd-export.json (run, global epoch, checkpoint, versions). The model is rebuilt with the config the
    checkpoint recorded (under SWARMD_* and --set), or with --config."""
    from swarmd.config import load_config
    from swarmd.export import export_checkpoint

    # transformers would draw a bar for each file it writes (read when it is imported); two lines report the export
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    flags = {"state_dir": state_dir} if state_dir is not None else {}
    cfg = load_config(config, flags=flags, assignments=assignments or [])
    given = config is not None or bool(os.environ.get("SWARMD_CONFIG"))

    def with_recorded(recorded, source):
        # the checkpoint's own config, under the environment, the flags and --set as always
        return load_config(None, flags=flags, assignments=assignments or [], recorded=(recorded, source))

    result = export_checkpoint(
        cfg, output, checkpoint=checkpoint, force=force, with_recorded=None if given else with_recorded
    )
    for reason in result.skipped:
        print(f"swarmd: warning: {reason}; exported an older checkpoint", file=sys.stderr)
    which = ", with the config it recorded" if result.recorded_config else ""
    print(f"Exported {result.checkpoint} (task {result.task}, global epoch {result.epoch}{which}) to {result.output}")
    if result.load:
        print(f"Load it with: {result.load.replace('DIR', repr(str(result.output)))}")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
