"""Home peers on rate-limited links: what client mode costs the swarm and its public peer, and how long a home peer
takes to join against a public one. Measured in the router lab (benchmarks/routerlab.py; issue 33, item 6).

Three real `swarmd join` peers of one run (the toy task widened to 4.2M parameters: an 8.4 MB fp16 gradient), every
internet-side link limited to --rate Mbit/s both ways (tbf), in three layouts, one after another in each repeat:
- public only: three public peers;
- one home: two public peers, and a home peer behind its own masquerading router;
- two homes: one public peer, and two home peers each behind its own router.
In each, the first two peers start together and train --warmup global epochs; then the third (a home one in the
home layouts) joins with nothing but `--initial-peers`. Its join is timed from its start to the state applied
(its "Joined in" line) and to its first averaged gradient round. Then the three train for --seconds: the swarm's
samples/s (and its ratio to public only's in the same repeat), gradient rounds that succeeded and failed on the
first public peer, and the bytes its p2pd sent and received per global epoch (the kernel's TCP counters; a public
peer reduces the clients' whole gradients, docs/NAT.md), and what it forwarded of clients' state.

    sudo .venv/bin/python benchmarks/home_swarm.py [--rate 100] [--seconds 60] [--repeats 1] [--keep-logs DIR]

Needs root, iproute2 and nftables. Every peer is killed and the lab torn down on the way out, even on failure.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import routerlab  # noqa: E402
from common import (  # noqa: E402
    DaemonProcess, install_testtasks, machine, p2pd_bytes, peer_config, print_table, raise_exit,
)
from netlab import in_namespace  # noqa: E402

INPUTS, HIDDEN = 64, 65536  # 64*65536 + 65536 + 65536 + 1 = 4.33M parameters
# start order: the last host is the late joiner
LAYOUTS = {
    "public only": ("public0", "public1", "public2"),
    "one home": ("public0", "public1", "home0"),
    "two homes": ("public0", "home0", "home1"),
}


def config(args) -> dict:
    cfg = peer_config(
        task={"name": "toy-regression", "inputs": INPUTS, "hidden": HIDDEN, "lr": 0.0005},
        swarm={"target_batch_size": args.target_batch_size, "matchmaking_time": 3.0, "averaging_timeout": 60.0,
               "next_chunk_timeout": 20.0, "load_state_timeout": 120.0, "average_state_every": 1_000_000,
               "tracker_opts": {"min_refresh_period": 0.2, "default_refresh_period": 0.5}},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )
    cfg["network"] = {"bootstrap_attempts": 4, "bootstrap_retry_delay": 1.0}  # swarmd's default port, all interfaces
    return cfg


def namespace(lab: routerlab.RouterLab, host: str) -> str:
    index = int(host[-1])
    return lab.public_namespace(index) if host.startswith("public") else lab.home_namespace(index)


def joined_seconds(peer: DaemonProcess) -> Optional[float]:
    found = re.search(r"Joined in ([\d.]+) s", peer.log)
    return float(found.group(1)) if found else None


def gradient_rounds(status: dict) -> tuple[int, int]:
    counts = (status.get("averaging") or {}).get("gradients") or {}
    return counts.get("success", 0), counts.get("failed", 0) + counts.get("partial", 0)


def run_layout(name: str, args, root: Path, env: dict) -> dict:
    hosts = LAYOUTS[name]
    homes = sum(host.startswith("home") for host in hosts)
    lab = routerlab.RouterLab(public=len(hosts) - homes, homes=homes, rate_mbit=args.rate)
    peers: dict[str, DaemonProcess] = {}

    def start(host: str, extra=()) -> DaemonProcess:
        peer = DaemonProcess(root / f"{name.replace(' ', '-')}-{host}", config(args), extra_args=extra, env=env,
                             name=host)
        peer.args = [*lab.exec_prefix(namespace(lab, host)), *peer.args]
        peers[host] = peer
        return peer.start()

    with lab:
        try:
            first = start(hosts[0])
            joining = first.joining_args(timeout=90)
            start(hosts[1], joining)
            for peer in peers.values():
                peer.wait_status(lambda s: (s["local_epoch"] or 0) >= args.warmup, timeout=300, what="the warm-up")
            began = time.monotonic()
            late = start(hosts[2], joining)
            late.wait_status(lambda s: s["state"] == "training", timeout=120, what="the late peer training")
            try:
                late.wait_status(lambda s: gradient_rounds(s)[0] >= 1, timeout=args.first_round_timeout,
                                 what="the late peer's first round")
                first_round = time.monotonic() - began
            except AssertionError:  # the table says it: "none in N s"
                first_round = None
            return {"joiner": hosts[2], "joined": joined_seconds(late), "first_round": first_round,
                    **measure(peers[hosts[0]], list(peers.values()), namespace(lab, hosts[0]), args.seconds),
                    "downloads": late.status()["state_loads_total"]}
        finally:
            for host, peer in peers.items():
                peer.close()
                if args.keep_logs:
                    keep = Path(args.keep_logs) / name.replace(" ", "-")
                    keep.mkdir(parents=True, exist_ok=True)
                    (keep / f"{host}.log").write_text(peer.log)


def measure(public: DaemonProcess, peers: list[DaemonProcess], public_namespace: str, seconds: float) -> dict:
    """The swarm over `seconds`: samples/s, the public peer's gradient rounds, its bytes per global epoch."""
    before = [peer.status() for peer in peers]
    bytes_before = in_namespace(public_namespace, lambda: p2pd_bytes(public))
    time.sleep(seconds)
    after = [peer.status() for peer in peers]
    bytes_after = in_namespace(public_namespace, lambda: p2pd_bytes(public))
    samples = sum(a["samples_total"] - b["samples_total"] for a, b in zip(after, before))
    epochs = max(1, (after[0]["global_epoch"] or 0) - (before[0]["global_epoch"] or 0))
    rounds = [a - b for a, b in zip(gradient_rounds(after[0]), gradient_rounds(before[0]))]
    moved = sum(bytes_after) - sum(bytes_before)
    return {"samples_per_s": samples / seconds, "rounds_ok": rounds[0], "rounds_failed": rounds[1],
            "epochs": epochs, "public_mb_per_epoch": moved / epochs / 1e6,
            "forwarded_mb": after[0]["state_forwarded_bytes_total"] / 1e6}


def table(results: dict[str, list[dict]]) -> list[list[str]]:
    base = results["public only"]
    rows = []
    for name, runs in results.items():
        def median(key: str, of=runs) -> float:
            return statistics.median(run[key] for run in of)

        rounds = [run["first_round"] for run in runs if run["first_round"] is not None]
        base_rounds = [run["first_round"] for run in base if run["first_round"] is not None]
        first_round = f"{statistics.median(rounds):.1f}" if rounds else "none in time"
        versus = f"{statistics.median(rounds) / statistics.median(base_rounds):.2f}x" if rounds and base_rounds else "-"
        rows.append([
            name, runs[0]["joiner"], f"{median('joined'):.1f}", first_round, versus,
            f"{median('samples_per_s'):.0f}", f"{median('samples_per_s') / median('samples_per_s', base):.2f}x",
            f"{median('rounds_ok'):.0f} / {median('rounds_failed'):.0f}", f"{median('public_mb_per_epoch'):.1f}",
            f"{median('forwarded_mb'):.1f}",
        ])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="Mbit/s of every internet-side link, both ways")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window with three peers")
    parser.add_argument("--warmup", type=int, default=2, help="global epochs of the first two before the third joins")
    parser.add_argument("--target-batch-size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--first-round-timeout", type=float, default=240.0,
                        help="seconds the late peer's first averaged round is waited for")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy every peer's log there, by layout")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_exit)  # a kill stops the peers and tears the lab down like Ctrl-C
    missing = routerlab.missing_tools()
    if missing:
        parser.error(f"the router lab needs {', '.join(missing)} (run as root; apt-get install iproute2 nftables)")
    if "public only" not in args.layouts:
        args.layouts.insert(0, "public only")  # every ratio divides by it
    results: dict[str, list[dict]] = {name: [] for name in args.layouts}
    with tempfile.TemporaryDirectory(prefix="swarmd-home-swarm-") as work:
        env = install_testtasks(Path(work) / "plugins")
        for repeat in range(args.repeats):
            for name in args.layouts:
                results[name].append(run_layout(name, args, Path(work) / f"r{repeat}", env))
                print(f"repeat {repeat + 1}, {name}: {results[name][-1]}", flush=True)
    print_table(
        f"Three peers at {args.rate:g} Mbit/s per link, {args.seconds:g} s measured, target batch "
        f"{args.target_batch_size}, medians of {args.repeats} ({machine()})",
        ["layout", "late joiner", "joined in s", "to its first gradient round s", "vs public", "swarm samples/s",
         "vs public", "public0 rounds ok / failed", "public0 MB per epoch", "forwarded MB"],
        table(results),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
