"""Join time: from `swarmd join --initial-peers ...` to the first global step averaged with the swarm.

Two peers train a ~20M-parameter model (the test-only regression task, widened); a third joins with the line
the first printed. Its log and status split the time into: process start to DHT up (imports, task, model,
DHT bootstrap), DHT up to the optimizer built (its averager processes), the look for whose state to take, the
download of parameters and optimizer state, and download to the first gradient round averaged with the group.
Then: when the joiner held the swarm's parameters, and how the swarm's loss fared meanwhile.

Joins alternate between three ways a joiner that the swarm outran during its download gets in: catching up by
averaging (`swarm.catch_up_by_averaging`), taking the swarm's parameters again without the optimizer statistics, a
third of the bytes (`swarm.refresh_parameters`, the sync default), and downloading the whole state again
(hivemind's way); and the sync default once more with the downloads by hivemind's RPC (`swarm.state_stream: false`)
instead of swarmd's state stream.

Layouts: `shared` runs all three peers on all the machine's cores, so the joiner's start-up competes with two
trainers for the cores (2 cores here: three trainers on two). `own-core` pins the two insiders to the first core
and the joiner to the last, as when the joiner has a machine of its own; the insiders then train at about half the
rate, so `--own-core-target-batch-size` (default half of the shared one) keeps their epochs about as long.

    python benchmarks/join_time.py [--repeats 3] [--hidden 4900] [--modes "parameters again"] \
        [--layouts shared own-core]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from common import DaemonProcess, install_testtasks, machine, peer_config, pinned, print_table, summary

STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) ", re.M)


# the `swarm:` settings of each way
MODES = {
    "catch up by averaging": {"catch_up_by_averaging": True},
    "parameters again": {"catch_up_by_averaging": False, "refresh_parameters": True},
    "whole state again": {"catch_up_by_averaging": False, "refresh_parameters": False},
    # the sync default, downloading by hivemind's RPC (protobuf parts) instead of swarmd's state stream
    "parameters again, by RPC": {"catch_up_by_averaging": False, "refresh_parameters": True, "state_stream": False},
}


LAYOUTS = ("shared", "own-core")


def config(hidden: int, features: int, mode: dict, target_batch_size: int = 256) -> dict:
    return peer_config(
        task={"name": "faulty", "features": features, "hidden": hidden, "samples": 2048},
        swarm={"target_batch_size": target_batch_size, "matchmaking_time": 3.0, "averaging_timeout": 60.0, "load_state_timeout": 120.0,
               **mode},
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


def stamps(log: str, needle: str) -> list[float]:
    """When the log lines with `needle` were written."""
    found = []
    for line in log.splitlines():
        match = STAMP.match(line)
        if match and needle in line:
            found.append(datetime.fromisoformat(match.group(1)).timestamp())
    return found


def count_until(log: str, needle: str, moment: float) -> int:
    """Log lines with `needle` up to `moment`."""
    return sum(stamp <= moment for stamp in stamps(log, needle))


# More than one download means the swarm's epoch ended during a download and the joiner downloaded again (hivemind
# requires the swarm's exact epoch); a catch-up by averaging is swarmd's way out of that (swarm/optimizer.py), and
# the next state round gives the joiner the swarm's parameters.
DOWNLOADED = "Downloaded the swarm's state"
REFRESHED = "took its parameters again"  # the parameters alone, after a download the swarm outran (swarm/parameter_refresh.py)
CAUGHT_UP_BY_AVERAGING = "The swarm moved on during the state download"
HOLDS_THE_SWARMS_PARAMETERS = re.compile(r"Took the swarm's parameters by averaging: caught up at epoch (\d+)")
JOINED_EPOCH = re.compile(r"joining the swarm's epoch (\d+)")


def insiders_loss(status: dict, first: int, last: int) -> tuple[float, float]:
    """An insider's mean loss over the 3 epochs before `first`, and its worst epoch from `first` to `last`: a joiner
    whose gradients (taken at older parameters) went into the average would show as a jump."""
    history = {epoch: loss for epoch, loss in status["loss_history"]}
    before = [loss for epoch, loss in history.items() if first - 3 <= epoch < first]
    during = [loss for epoch, loss in history.items() if first <= epoch <= last]
    return statistics.mean(before), max(during)


def join_once(root: Path, env: dict, args, index: int, mode: dict, layout: str = "shared") -> dict:
    """One join of a third peer; `layout` is "shared" (all peers on all cores) or "own-core" (the insiders on the
    first core, the joiner alone on the last)."""
    cores = sorted(os.sched_getaffinity(0))
    own_core = layout == "own-core"
    cfg = config(args.hidden, args.features, mode,
                 args.own_core_target_batch_size if own_core else args.target_batch_size)

    def start(peer: DaemonProcess, core: int) -> DaemonProcess:
        return pinned(peer, core) if own_core else peer.start()

    peers = []
    try:
        a = start(DaemonProcess(root / f"a{index}", cfg, env=env, name="a"), cores[0])
        peers.append(a)
        extra = a.joining_args()
        b = start(DaemonProcess(root / f"b{index}", cfg, env=env, extra_args=extra, name="b"), cores[0])
        peers.append(b)
        a.wait_status(lambda s: s["num_peers"] == 2 and s["local_epoch"] >= 3, 300, "two peers training")
        c = DaemonProcess(root / f"c{index}", cfg, env=env, extra_args=extra, name="c")
        peers.append(c)
        started = time.time()
        start(c, cores[-1])

        def first_round(status):
            rounds = [r for r in status["recent_averaging"] if r["outcome"] == "success" and r["group_size"] >= 2]
            return rounds[0]["time"] if rounds else None

        averaged_at = c.wait_for(lambda: first_round(c.status()), 300, "the first averaged round")
        log = c.log
        if CAUGHT_UP_BY_AVERAGING in log:
            c.wait_for(lambda: HOLDS_THE_SWARMS_PARAMETERS.search(c.log), 300, "the state round after the catch-up")
            holds = when(c.log, "Took the swarm's parameters by averaging")
            first, last = int(JOINED_EPOCH.search(c.log).group(1)), int(HOLDS_THE_SWARMS_PARAMETERS.search(c.log).group(1))
        else:
            # the last download, or refresh of the parameters, before that round
            holds = max(stamp for stamp in stamps(log, DOWNLOADED) + stamps(log, REFRESHED) if stamp <= averaged_at)
            first = c.status()["local_epoch"]
            last = first + 10
            a.wait_status(lambda s: s["local_epoch"] > last, 300, "ten epochs with the joiner")
        loss_before, loss_worst = insiders_loss(a.status(), first, last)
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
            "downloads": count_until(log, DOWNLOADED, averaged_at),
            "refreshes": count_until(log, REFRESHED, averaged_at),
            "catch_ups": count_until(log, CAUGHT_UP_BY_AVERAGING, averaged_at),
            "holds": holds - started,
            "loss_jump": loss_worst / loss_before,
        }
    finally:
        for peer in peers:
            peer.close()


ROWS = [
    ("start -> DHT up (imports, task, model, bootstrap)", "dht"),
    ("DHT up -> optimizer built (averager processes)", "optimizer"),
    ("optimizer -> download asked (whose state to take)", "decide"),
    ("download asked -> state applied (first transfer)", "transfer"),
    ("downloaded -> first round averaged with the swarm", "first_round"),
    ("total", "total"),
    ("state downloads before that round (count)", "downloads"),
    ("parameter refreshes before it (count)", "refreshes"),
    ("catch-ups by averaging before it (count)", "catch_ups"),
    ("start -> holding the swarm's parameters", "holds"),
    ("insider's worst epoch loss meanwhile / before (x)", "loss_jump"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4900)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=["shared"])
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--own-core-target-batch-size", type=int, default=None,
                        help="own-core layout's target batch (default: half of --target-batch-size)")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (the peers' logs, states and configs)")
    args = parser.parse_args()
    if args.own_core_target_batch_size is None:
        args.own_core_target_batch_size = args.target_batch_size // 2
    if "own-core" in args.layouts and len(os.sched_getaffinity(0)) < 2:
        parser.error("--layouts own-core needs two cores or more")
    params = args.features * args.hidden + 2 * args.hidden + 1
    ways = [(mode, layout) for layout in args.layouts for mode in args.modes]
    names = {way: way[0] if len(args.layouts) == 1 else f"{way[0]}, {way[1]}" for way in ways}
    runs = {way: [] for way in ways}
    with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = install_testtasks(root / "testtasks")
        for index in range(args.repeats):
            for number, way in enumerate(ways):
                mode, layout = way
                runs[way].append(join_once(root, env, args, len(ways) * index + number, MODES[mode], layout))
                result = ", ".join(f"{key}={value:.3g}" for key, value in runs[way][-1].items())
                print(f"  [{index + 1}/{args.repeats}] {names[way]}: {result}", flush=True)
    state_mb = params * 4 * 3 / 1e6  # parameters + Adam's two statistics
    batches = ", ".join(
        f"{layout}: target batch {args.own_core_target_batch_size if layout == 'own-core' else args.target_batch_size}"
        for layout in args.layouts
    )
    print_table(
        f"Join time of a third peer, {params / 1e6:.1f}M parameters (~{state_mb:.0f} MB of state to download), "
        f"{args.repeats} joins each way, interleaved ({batches})\n{machine()}",
        ["seconds, median [min..max]", *names.values()],
        [[label, *(summary([r[key] for r in runs[way]]) for way in ways)] for label, key in ROWS],
    )
    for way in ways:
        rate = state_mb / statistics.median(r["transfer"] for r in runs[way])
        print(f"transfer rate (median), {names[way]}: {rate:.0f} MB/s")


if __name__ == "__main__":
    main()
