"""Join time: from `swarmd join --initial-peers ...` to the first global step averaged with the swarm.

Two peers train a ~20M-parameter model (the test-only regression task, widened); a third joins with the line
the first printed. Its log and status split the time into: process start to DHT up (imports, task, model,
DHT bootstrap), DHT up to the optimizer built (its averager processes), the look for whose state to take, the
download of parameters and optimizer state, and download to the first gradient round averaged with the group.

    python benchmarks/join_time.py [--repeats 3] [--hidden 4900]
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from common import DaemonProcess, install_testtasks, machine, peer_config, print_table, summary

STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) ", re.M)


def config(hidden: int, features: int) -> dict:
    return peer_config(
        task={"name": "faulty", "features": features, "hidden": hidden, "samples": 2048},
        swarm={"target_batch_size": 256, "matchmaking_time": 3.0, "averaging_timeout": 60.0, "load_state_timeout": 120.0},
        training={"batch_size": 16, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )


def when(log: str, needle: str) -> float:
    for line in log.splitlines():
        if needle in line:
            match = STAMP.match(line)
            if match:
                return datetime.fromisoformat(match.group(1)).timestamp()
    raise AssertionError(f"{needle!r} not in the log")


def downloads_until(log: str, moment: float) -> int:
    """State downloads the joiner finished by `moment`: more than one means the swarm's epoch ended during a download
    and the joiner, an epoch behind, downloaded again (hivemind requires the swarm's exact epoch)."""
    count = 0
    for line in log.splitlines():
        match = STAMP.match(line)
        if match and "Downloaded the swarm's state" in line and datetime.fromisoformat(match.group(1)).timestamp() <= moment:
            count += 1
    return count


def join_once(root: Path, env: dict, args, index: int) -> dict:
    cfg = config(args.hidden, args.features)
    peers = []
    try:
        a = DaemonProcess(root / f"a{index}", cfg, env=env, name="a").start()
        peers.append(a)
        extra = a.joining_args()
        b = DaemonProcess(root / f"b{index}", cfg, env=env, extra_args=extra, name="b").start()
        peers.append(b)
        a.wait_status(lambda s: s["num_peers"] == 2 and s["local_epoch"] >= 3, 300, "two peers training")
        c = DaemonProcess(root / f"c{index}", cfg, env=env, extra_args=extra, name="c")
        peers.append(c)
        started = time.time()
        c.start()

        def first_round(status):
            rounds = [r for r in status["recent_averaging"] if r["outcome"] == "success" and r["group_size"] >= 2]
            return rounds[0]["time"] if rounds else None

        averaged_at = c.wait_for(lambda: first_round(c.status()), 300, "the first averaged round")
        log = c.log
        dht_up = when(log, "DHT is up")
        joined = when(log, "Joined run")  # the optimizer (and its averagers) built
        asked = when(log, "Downloading the swarm's state")
        downloaded = when(log, "Downloaded the swarm's state")
        return {
            "dht": dht_up - started,
            "optimizer": joined - dht_up,
            "decide": asked - joined,
            "transfer": downloaded - asked,
            "first_round": averaged_at - downloaded,
            "total": averaged_at - started,
            "downloads": downloads_until(log, averaged_at),
        }
    finally:
        for peer in peers:
            peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4900)
    args = parser.parse_args()
    params = args.features * args.hidden + 2 * args.hidden + 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = install_testtasks(root / "testtasks")
        runs = []
        for index in range(args.repeats):
            runs.append(join_once(root, env, args, index))
            print(f"  [{index + 1}/{args.repeats}] " + ", ".join(f"{k}={v:.1f}" for k, v in runs[-1].items()), flush=True)
    state_mb = params * 4 * 3 / 1e6  # parameters + Adam's two statistics
    print_table(
        f"Join time of a third peer, {params / 1e6:.1f}M parameters (~{state_mb:.0f} MB of state to download), "
        f"{args.repeats} joins\n{machine()}",
        ["phase", "seconds median [min..max]"],
        [
            ["start -> DHT up (imports, task, model, bootstrap)", summary([r["dht"] for r in runs])],
            ["DHT up -> optimizer built (averager processes)", summary([r["optimizer"] for r in runs])],
            ["optimizer -> download asked (whose state to take)", summary([r["decide"] for r in runs])],
            ["download asked -> state applied (first transfer)", summary([r["transfer"] for r in runs])],
            ["downloaded -> first round averaged with the swarm", summary([r["first_round"] for r in runs])],
            ["total", summary([r["total"] for r in runs])],
            ["state downloads before that round (count)", summary([r["downloads"] for r in runs])],
        ],
    )
    print(f"transfer rate (median): {state_mb / statistics.median(r['transfer'] for r in runs):.0f} MB/s")


if __name__ == "__main__":
    main()
