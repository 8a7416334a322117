"""Bytes on the wire per global epoch per peer, for each collaboration strategy and compression, and the loss reached.

Two peers on 127.0.0.1 (each pinned to its own core) train the micro Swin from the same seed for a fixed number of
global epochs, i.e. a fixed number of samples (epochs x target batch). For every (strategy, compression) pair the
table shows the TCP payload p2pd sent per global epoch per peer (the kernel's sock_diag counters, the same that the
daemon exports), its ratio to the fp32 gradient all-reduce figure 2(N-1)/N x model bytes, and the validation loss
both peers reach at the last epoch, so that a saving bought with divergence shows up. Compression applies to
gradients and to parameter averaging alike. Variants are interleaved; medians over the repeats.

The default runs each of the ten variants once (about 8 minutes); bytes barely vary between runs, the loss does:
pass --repeats 3 with fewer --variants to see its spread.

    python benchmarks/wire_bytes.py [--repeats 1] [--epochs 12] [--variants sync/none sync/fp16 ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import interleave, machine, p2pd_bytes, peer_config, pinned_pair, print_table

MODEL_BYTES = 0.54e6 * 4
PEERS = 2

STRATEGIES = {
    # synchronous gradient averaging (pre-scheduled), parameters re-averaged every 10 epochs to repair drift
    "sync": {"average_state_every": 10},
    # the same with parameter averaging every epoch (the schema's default before this benchmark)
    "sync1": {"average_state_every": 1},
    "dpu": {"delay_grad_averaging": True, "delay_optimizer_step": True, "average_state_every": 10},
    "local5": {"use_local_updates": True, "average_state_every": 5},
}
COMPRESSIONS = ("none", "fp16", "scaled-fp16")
EIGHT_BIT = ("uint8", "quantile8", "blockwise8")  # not in the default run; --variants sync/blockwise8 ...
DEFAULT_VARIANTS = ["sync1/none"] + [f"{strategy}/{c}" for strategy in ("sync", "dpu", "local5") for c in COMPRESSIONS]


def config(data: str, strategy: str, compression: str, args) -> dict:
    return peer_config(
        task={"name": "swin", "eval_every_epochs": args.epochs, "data": {"path": data}},
        swarm={
            "target_batch_size": args.target_batch_size,
            "matchmaking_time": 2.0,
            "averaging_timeout": 30.0,
            "grad_compression": compression,
            "state_averaging_compression": compression,
            **STRATEGIES[strategy],
        },
        training={"batch_size": 32, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
        daemon={"shutdown_timeout": 30.0, "tick_interval": 1.0},
    )


def run_pair(variant: str, data: str, root: Path, args, counter: list[int]) -> dict:
    strategy, compression = variant.split("/")
    counter[0] += 1
    with pinned_pair(root, f"{strategy}-{compression}-{counter[0]}", config(data, strategy, compression, args)) as peers:
        # bytes are counted from the first epoch both peers are in (state download and join traffic excluded)
        for peer in peers:
            peer.wait_status(lambda s: s["num_peers"] == PEERS and (s["local_epoch"] or 0) >= 1, 300, "two peers")
        start_epoch = max(p.status()["local_epoch"] for p in peers)
        sent0 = [p2pd_bytes(p)[0] for p in peers]
        started = time.monotonic()
        finals = [
            p.wait_status(
                lambda s: s["evaluation"] is not None and s["evaluation"]["epoch"] >= args.epochs,
                600,
                f"the evaluation at epoch {args.epochs}",
            )
            for p in peers
        ]
        # the evaluation is reached a moment after the epoch turns; count bytes up to the epoch that was evaluated
        end_epoch = min(s["local_epoch"] for s in finals)
        sent1 = [p2pd_bytes(p)[0] for p in peers]
        return {
            "bytes_per_epoch": statistics.mean(b - a for a, b in zip(sent0, sent1)) / max(end_epoch - start_epoch, 1),
            "val_loss": statistics.mean(s["evaluation"]["metrics"]["val_loss"] for s in finals),
            "top1": statistics.mean(s["evaluation"]["metrics"]["top1"] for s in finals),
            "seconds": time.monotonic() - started,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--target-batch-size", type=int, default=512)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    args = parser.parse_args()
    for variant in args.variants:
        strategy, _, compression = variant.partition("/")
        if strategy not in STRATEGIES or compression not in COMPRESSIONS + EIGHT_BIT:
            parser.error(f"variant {variant!r}: use STRATEGY/COMPRESSION with {sorted(STRATEGIES)} x "
                         f"{'|'.join(COMPRESSIONS + EIGHT_BIT)}")

    ideal = 2 * (PEERS - 1) / PEERS * MODEL_BYTES
    with tempfile.TemporaryDirectory() as tmp:
        root, data, counter = Path(tmp), str(Path(tmp) / "data"), [0]
        results = interleave(
            {variant: lambda variant=variant: run_pair(variant, data, root, args, counter) for variant in args.variants},
            args.repeats,
        )
    rows = []
    for variant, runs in results.items():
        per_epoch = statistics.median(r["bytes_per_epoch"] for r in runs)
        losses = [r["val_loss"] for r in runs]
        rows.append([
            variant,
            f"{per_epoch / 1e6:.2f}",
            f"{per_epoch / ideal:.2f}",
            f"{statistics.median(losses):.3f}" + (f" [{min(losses):.3f}..{max(losses):.3f}]" if len(losses) > 1 else ""),
            f"{statistics.median(r['top1'] for r in runs):.2f}",
            f"{statistics.median(r['seconds'] for r in runs):.0f}",
        ])
    print_table(
        f"Bytes on the wire: micro Swin ({MODEL_BYTES / 1e6:.2f} MB fp32), {PEERS} peers, target batch "
        f"{args.target_batch_size}, {args.epochs} global epochs ({args.epochs * args.target_batch_size} samples), "
        f"{args.repeats} repeat(s)\n{machine()}",
        ["strategy/compression", "MB sent/epoch/peer", "vs fp32 all-reduce", f"val loss @ epoch {args.epochs}",
         "top-1", "seconds"],
        rows,
    )
    print(f"fp32 gradient all-reduce per epoch per peer, 2(N-1)/N x model bytes: {ideal / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
