"""What one garbage peer does to honest peers, with swarmd's guards on and off (docs/FAULTS.md).

Two honest peers train the test-only `faulty` regression task; once they have learned, a third peer joins
whose gradients are multiplied by SCALE. For each guard setting the table shows the honest peers' loss before
the garbage peer joined and after EPOCHS more global epochs, and the averaging rounds rejected.

    python benchmarks/garbage_peer.py [--scale -1e6] [--epochs 10]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import DaemonProcess, install_testtasks, peer_config


def config(guard: bool, grad_scale: float = 1.0) -> dict:
    return peer_config(
        task={"name": "faulty", "grad_scale": grad_scale},
        swarm={
            "target_batch_size": 96,
            "matchmaking_time": 2.0,
            "averaging_timeout": 10.0,
            # fp32 on the wire: with fp16 a 1e6-scaled gradient overflows to Inf and only the NaN/Inf check is tried
            "grad_compression": "none",
            "guard_gradient_norm_ratio": 10.0 if guard else 0.0,
            "guard_parameter_change": 1.0 if guard else 0.0,
            # hivemind's mean, so that the guards alone are measured (robust aggregation: docs/FAULTS.md)
            "aggregation": {"method": "mean"},
        },
        training={"batch_size": 16, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
    )


def run(guard: bool, scale: float, epochs: int, root: Path, env: dict) -> dict:
    peers = []
    try:
        a = DaemonProcess(root / f"a-{guard}", config(guard), env=env, name="a").start()
        peers.append(a)
        initial = a.wait_status(lambda s: s["loss_history"], 120, "a first epoch")["loss_history"][0][1]
        extra = a.joining_args()
        b = DaemonProcess(root / f"b-{guard}", config(guard), env=env, extra_args=extra, name="b").start()
        peers.append(b)
        before = a.wait_status(lambda s: s["num_peers"] == 2 and s["local_epoch"] >= 8, 240, "honest training")
        g = DaemonProcess(root / f"g-{guard}", config(guard, scale), env=env, extra_args=extra, name="garbage").start()
        peers.append(g)
        a.wait_status(lambda s: s["num_peers"] == 3, 120, "the garbage peer joined")
        start = a.status()["local_epoch"]
        after = a.wait_status(lambda s: s["local_epoch"] >= start + epochs, 600, "epochs with the garbage peer")
        worst = max(loss for epoch, loss in after["loss_history"] if epoch >= start)
        return {
            "initial": initial,
            "before": before["loss"],
            "after": after["loss"],
            "worst": worst,
            "rejected": after["averaging"]["gradients"].get("rejected", 0),
            "restores": after["restores_total"],
        }
    finally:
        for peer in peers:
            peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=-1e6)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = install_testtasks(root / "testtasks")
        rows = {guard: run(guard, args.scale, args.epochs, root, env) for guard in (True, False)}
    print(f"\nGarbage peer with gradients x {args.scale:g}; honest peer 'a', {args.epochs} global epochs after it joined")
    print(f"{'guards':<8} {'initial':>9} {'before':>9} {'after':>9} {'worst':>9} {'after/before':>13} {'rejected':>9} {'restores':>9}")
    for guard, r in rows.items():
        print(
            f"{'on' if guard else 'off':<8} {r['initial']:>9.4f} {r['before']:>9.4f} {r['after']:>9.4f} {r['worst']:>9.4f} "
            f"{r['after'] / r['before']:>13.2f} {r['rejected']:>9} {r['restores']:>9}"
        )


if __name__ == "__main__":
    main()
