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

The model trains at AdamW's 1e-4 (`OPTIM`), a rate at which it learns; until 2026-12-07 it ran at the task's default
3e-3, at which it diverges and one step moves its output layer by 40% of its norm (the mode "parameters again, lr
3e-3 (a diverging model)" runs it so): two insiders a step apart then disagree on the state beyond the split
download's vote, which a real task's would not.

Cold and warm starts are reported apart (issue 37: the first join of a run was the slowest). A warm start finds
torch, hivemind and the task in the page cache; with `--cold` every repetition also starts one joiner right after
`echo 3 > /proc/sys/vm/drop_caches` (root only; the insiders, already running, read back what they need). Each join
records the machine's load (the 1-minute `os.getloadavg()`, sampled every second while it joins), and a second table
lists every join with its load, so that a busy machine cannot pass for a slow join, nor a quiet one for a fast
join. The last line quotes the medians of this run with its command.

Layouts: `shared` runs all three peers on all the machine's cores, so the joiner's start-up competes with two
trainers for the cores (2 cores here: three trainers on two). `own-core` pins the two insiders to the first core
and the joiner to the last, as when the joiner has a machine of its own; the insiders then train at about half the
rate, so `--own-core-target-batch-size` (default half of the shared one) keeps their epochs about as long.

    python benchmarks/join_time.py [--repeats 5] [--cold] [--hidden 4900] [--modes "parameters again"] \
        [--layouts shared own-core]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import statistics
import sys
import tempfile
import threading
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
    # the sync default without the round's epochs: a joiner one behind learns it from upstream's exact check only
    "parameters again, without the round's epochs": {"catch_up_by_averaging": False, "refresh_parameters": True,
                                                      "round_epoch_check": False},
    # the sync default with hivemind's search for a state round's group (as long as averaging_timeout)
    "parameters again, upstream's state round search": {"catch_up_by_averaging": False, "refresh_parameters": True,
                                                         "state_round_search": 0},
    # the sync default on the model as every run before 2026-12-07 trained it: at the task's default learning rate
    # (3e-3) this 20M-parameter model diverges (its loss from 0.48 to 4-40), one step moves its output layer by 40%
    # of its norm, and two insiders whose rounds differed by one step disagree on the state beyond the split
    # download's vote (swarm/upstream/split_download.py)
    "parameters again, lr 3e-3 (a diverging model)": {"catch_up_by_averaging": False, "refresh_parameters": True,
                                                      "task": {"optim": {"lr": 3e-3}}},
    # the sync default as before 2026-12-07 (evening): a download that ended exactly one epoch behind the swarm is
    # followed by the parameters again too, instead of taking the swarm's epoch a step stale (hivemind's rule)
    "parameters again, also one behind": {"catch_up_by_averaging": False, "refresh_parameters": True,
                                          "refresh_one_behind": True},
}
# The task's optimizer: AdamW at a rate at which the widened model trains (its loss from 0.48 to 0.30 in 12 steps of
# 256 samples, each step moving a tensor by 0.2-0.5% of its norm, as a real task's would; a mode's `task` overrides)
OPTIM = {"lr": 1e-4, "weight_decay": 0.0, "warmup_epochs": 0, "schedule": "constant"}


LAYOUTS = ("shared", "own-core")
STARTS = ("cold", "warm")  # a cold join starts right after the page cache is dropped; a warm one after any other
DROP_CACHES = "/proc/sys/vm/drop_caches"


def config(hidden: int, features: int, mode: dict, target_batch_size: int = 256) -> dict:
    swarm = dict(mode)
    optim = {**OPTIM, **swarm.pop("task", {}).get("optim", {})}
    return peer_config(
        task={"name": "faulty", "features": features, "hidden": hidden, "samples": 2048, "optim": optim},
        swarm={"target_batch_size": target_batch_size, "matchmaking_time": 3.0, "averaging_timeout": 60.0,
               "load_state_timeout": 120.0, **swarm},
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
# requires the swarm's exact epoch); a catch-up by averaging is swarmd's way out of that (swarm/upstream/optimizer.py), and
# the next state round gives the joiner the swarm's parameters.
DOWNLOADED = "Downloaded the swarm's state"
REFRESHED = "took its parameters again"  # the parameters alone, after a download the swarm outran (swarm/upstream/parameter_refresh.py)
CAUGHT_UP_BY_AVERAGING = "The swarm moved on during the state download"
HOLDS_THE_SWARMS_PARAMETERS = re.compile(r"Took the swarm's parameters by averaging: caught up at epoch (\d+)")
JOINED_EPOCH = re.compile(r"joining the swarm's epoch (\d+)")


class EpochWatch:
    """The joiner's local epoch at each look: the longest it stood at one epoch, seconds (one epoch's length in a
    joiner that keeps up; a state round it waits on, or a chase of downloads, shows as far more); and, given the
    insider's epoch at the same look, the seconds it was behind the insider (from each look to the next, as the
    look found it: an epoch's end shows for a look or two; a joiner one behind each round shows as most of it)."""

    def __init__(self):
        self.epoch, self.since, self.longest = None, 0.0, 0.0
        self.behind, self._last_look, self._was_behind = 0.0, None, False

    def see(self, epoch: int, now: float, insiders_epoch: int | None = None) -> None:
        if epoch != self.epoch:
            self.epoch, self.since = epoch, now
        self.longest = max(self.longest, now - self.since)
        if self._was_behind:
            self.behind += now - self._last_look
        self._last_look, self._was_behind = now, insiders_epoch is not None and epoch < insiders_epoch


def drop_page_cache(path: str = DROP_CACHES) -> None:
    """Empty the page cache (root only): the next process reads torch, hivemind and the task from the disk."""
    os.sync()
    with open(path, "w") as f:
        f.write("3\n")


def cannot_drop_page_cache(path: str = DROP_CACHES) -> str:
    """Why --cold cannot work here ("" when it can): tried once, as the cold joins will."""
    try:
        drop_page_cache(path)
    except OSError as e:
        return f"--cold drops the page cache ({path}), which this machine does not permit: {e.strerror or e}"
    return ""


class LoadSampler:
    """The 1-minute load average, sampled every `interval` seconds from `start()` to `stop()`, which returns their
    mean (at least one sample, taken at the start)."""

    def __init__(self, interval: float = 1.0, read=lambda: os.getloadavg()[0]):
        self.interval, self.read = interval, read
        self.samples: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "LoadSampler":
        self.samples.append(self.read())
        self._thread.start()
        return self

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return statistics.mean(self.samples)

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.samples.append(self.read())


# the joiner's one-line phase summary (daemon/join_phases.py): "Joined in 12.3 s: imports 4.1 s, DHT 1.6 s, ..."
JOINED_IN = re.compile(r"Joined in ([\d.]+) s: (.*?)(?: \(phases overlap\))?$", re.M)
PHASE = re.compile(r"([\w-]+) ([\d.]+) s")


def joined_in(log: str) -> dict:
    """The joiner's own phase summary as {"phase:<name>": seconds, "joined_in": total}; {} from a swarmd without it."""
    match = JOINED_IN.search(log)
    if match is None:
        return {}
    found = {f"phase:{name}": float(seconds) for name, seconds in PHASE.findall(match.group(2))}
    return {"joined_in": float(match.group(1)), **found}


def insiders_loss(status: dict, first: int, last: int) -> tuple[float, float]:
    """An insider's mean loss over the 3 epochs before `first`, and its worst epoch from `first` to `last`: a joiner
    whose gradients (taken at older parameters) went into the average would show as a jump."""
    history = {epoch: loss for epoch, loss in status["loss_history"]}
    before = [loss for epoch, loss in history.items() if first - 3 <= epoch < first]
    during = [loss for epoch, loss in history.items() if first <= epoch <= last]
    return statistics.mean(before), max(during)


def join_once(root: Path, env: dict, args, index: int, mode: dict, layout: str = "shared", start_kind: str = "warm"
              ) -> dict:
    """One join of a third peer; `layout` is "shared" (all peers on all cores) or "own-core" (the insiders on the
    first core, the joiner alone on the last); `start_kind` "cold": the page cache dropped right before it starts."""
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
        if start_kind == "cold":
            drop_page_cache()
        load = LoadSampler().start()
        started = time.time()
        start(c, cores[-1])

        def first_round(status):
            rounds = [r for r in status["recent_averaging"] if r["outcome"] == "success" and r["group_size"] >= 2]
            return rounds[0]["time"] if rounds else None

        try:
            averaged_at = c.wait_for(lambda: first_round(c.status()), 300, "the first averaged round")
        finally:
            load_during = load.stop()
        log = c.log
        after = {}
        if CAUGHT_UP_BY_AVERAGING in log:
            c.wait_for(lambda: HOLDS_THE_SWARMS_PARAMETERS.search(c.log), 300, "the state round after the catch-up")
            holds = when(c.log, "Took the swarm's parameters by averaging")
            first, last = int(JOINED_EPOCH.search(c.log).group(1)), int(HOLDS_THE_SWARMS_PARAMETERS.search(c.log).group(1))
        else:
            # the last download, or refresh of the parameters, before that round
            holds = max(stamp for stamp in stamps(log, DOWNLOADED) + stamps(log, REFRESHED) if stamp <= averaged_at)
            first = c.status()["local_epoch"]
            last = first + 10
            watch = EpochWatch()

            def ten_epochs_on(status) -> bool:
                watch.see(c.status()["local_epoch"], time.monotonic(), status["local_epoch"])
                return status["local_epoch"] > last

            a.wait_status(ten_epochs_on, 300, "ten epochs with the joiner")
            after = {"longest_stand": watch.longest, "behind_after": watch.behind,
                     "downloads_after": len(stamps(c.log, DOWNLOADED)) - count_until(log, DOWNLOADED, averaged_at),
                     "refreshes_after": len(stamps(c.log, REFRESHED)) - count_until(log, REFRESHED, averaged_at)}
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
            "load": load_during,
            **after,
            **joined_in(log),
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
    ("  the joiner's own line: start -> holding the state", "joined_in"),
    ("  its imports (torch, hivemind)", "phase:imports"),
    ("  its task and model", "phase:model"),
    ("  its DHT (reachability probe, bootstrap)", "phase:DHT"),
    ("  its optimizer (averagers' processes)", "phase:optimizer"),
    ("machine load during the join (1-min loadavg)", "load"),
    ("state downloads before that round (count)", "downloads"),
    ("parameter refreshes before it (count)", "refreshes"),
    ("catch-ups by averaging before it (count)", "catch_ups"),
    ("start -> holding the swarm's parameters", "holds"),
    ("insider's worst epoch loss meanwhile / before (x)", "loss_jump"),
    ("the joiner's longest time at one epoch in the ten after (s)", "longest_stand"),
    ("its state downloads in those ten epochs (count)", "downloads_after"),
    ("its parameter refreshes in those ten epochs (count)", "refreshes_after"),
    ("its time behind an insider's epoch in those ten epochs (s)", "behind_after"),
]


def cell(runs: list[dict], key: str) -> str:
    """median [min..max] of `key` over the joins that have it; "-" when none has (an older swarmd's log)."""
    values = [run[key] for run in runs if key in run]
    return summary(values) if values else "-"


def column_name(way_name: str, start_kind: str, cold: bool) -> str:
    return f"{way_name}, {start_kind}" if cold else way_name


def table_rows(runs: dict) -> list[list[str]]:
    """The main table's rows: one per ROWS entry, one column per (way, start kind) of `runs` (in its order)."""
    return [[label, *(cell(column, key) for column in runs.values())] for label, key in ROWS]


def each_join_rows(joins: list[tuple[str, dict]]) -> list[list[str]]:
    """The second table: every join in the order it ran, with the machine's load meanwhile."""
    return [[str(number), name, f"{run['total']:.1f}", f"{run['load']:.2f}",
             f"{run['joined_in']:.1f}" if "joined_in" in run else "-"]
            for number, (name, run) in enumerate(joins, 1)]


def latest_line(runs: dict, command: str) -> str:
    """The medians of this run, with its command: what a summary (docs/PERFORMANCE.md) quotes."""
    medians = ", ".join(f"{name} {statistics.median(r['total'] for r in column):.1f} s "
                        f"(load {statistics.median(r['load'] for r in column):.1f})"
                        for name, column in runs.items() if column)
    joins = min(len(column) for column in runs.values())
    return f"Median join, {joins} join(s) each: {medians}. Command: {command}"


def parse_args(argv=None, *, page_cache_check=lambda: cannot_drop_page_cache()) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="joins per row (default 5)")
    parser.add_argument("--cold", action="store_true",
                        help="also one cold join per repetition: the page cache dropped before it starts (root)")
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4900)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=["shared"])
    parser.add_argument("--target-batch-size", type=int, default=256)
    parser.add_argument("--own-core-target-batch-size", type=int, default=None,
                        help="own-core layout's target batch (default: half of --target-batch-size)")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (the peers' logs, states and configs)")
    args = parser.parse_args(argv)
    if args.own_core_target_batch_size is None:
        args.own_core_target_batch_size = args.target_batch_size // 2
    if "own-core" in args.layouts and len(os.sched_getaffinity(0)) < 2:
        parser.error("--layouts own-core needs two cores or more")
    why = page_cache_check() if args.cold else ""
    if why:
        parser.error(why)
    return args


def main() -> None:
    args = parse_args()
    starts = STARTS if args.cold else ("warm",)
    params = args.features * args.hidden + 2 * args.hidden + 1
    ways = [(mode, layout) for layout in args.layouts for mode in args.modes]
    names = {way: way[0] if len(args.layouts) == 1 else f"{way[0]}, {way[1]}" for way in ways}
    columns = [(way, kind) for way in ways for kind in starts]
    runs = {column_name(names[way], kind, args.cold): [] for way, kind in columns}
    joins: list[tuple[str, dict]] = []
    with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = install_testtasks(root / "testtasks")
        for index in range(args.repeats):
            for number, (way, kind) in enumerate(columns):  # a cold join, then a warm one, of each way
                mode, layout = way
                name = column_name(names[way], kind, args.cold)
                run = join_once(root, env, args, len(columns) * index + number, MODES[mode], layout, kind)
                runs[name].append(run)
                joins.append((name, run))
                result = ", ".join(f"{key}={value:.3g}" for key, value in run.items())
                print(f"  [{index + 1}/{args.repeats}] {name}: {result}", flush=True)
    state_mb = params * 4 * 3 / 1e6  # parameters + Adam's two statistics
    batches = ", ".join(
        f"{layout}: target batch {args.own_core_target_batch_size if layout == 'own-core' else args.target_batch_size}"
        for layout in args.layouts
    )
    print_table(
        f"Join time of a third peer, {params / 1e6:.1f}M parameters (~{state_mb:.0f} MB of state to download), "
        f"{args.repeats} joins each way, interleaved ({batches})\n{machine()}",
        ["seconds, median [min..max]", *runs],
        table_rows(runs),
    )
    for name, column in runs.items():
        rate = state_mb / statistics.median(r["transfer"] for r in column)
        print(f"transfer rate (median), {name}: {rate:.0f} MB/s")
    print_table("Each join, in the order it ran", ["#", "way", "start -> first round, s", "load", "its own line, s"],
                each_join_rows(joins))
    print("\n" + latest_line(runs, shlex.join(["python", "benchmarks/join_time.py", *sys.argv[1:]])))


if __name__ == "__main__":
    main()
