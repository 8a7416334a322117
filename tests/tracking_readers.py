"""Read back what the tracking backends wrote: TensorBoard event files and wandb's offline run files."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def tensorboard_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from the event files in `run_dir`, through tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return {
        tag: {event.step: event.value for event in accumulator.Scalars(tag)}
        for tag in accumulator.Tags()["scalars"]
    }


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline run (`run-<id>.wandb`): wandb's record log, LevelDB's log format.

    The file starts with a 7-byte header (":W&B", version, magic); then 32 KiB blocks of chunks, each with a
    7-byte header (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last); a block's last < 7 bytes are zero
    padding. Every record is a wandb_internal_pb2.Record; history rows are those whose record_type is history.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(run_file).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{run_file} is not a wandb run file")
    block, position, pending, rows = 32768, 7, b"", []
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:
            position += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:  # zero padding to the block's end
            position += room
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
                )
    return rows
