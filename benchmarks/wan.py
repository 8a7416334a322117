"""Training over links like the internet: two peers in their own network namespaces, each link rate-limited.

Each peer is a real `swarmd join` (or a plain hivemind.Optimizer peer, benchmarks/hivemind_peer.py) started with
`ip netns exec` in its own namespace on a bridge (benchmarks/netlab.py), listening on 198.18.0.X, pinned to its
own core (taskset) with one torch thread. Every peer's link is limited to the same rate both ways with tbf (no
added delay: the kernel here has no netem). For each link rate and each strategy, two peers train the same model
from the same seed for a fixed sample budget; the table shows, per peer:

- samples/s, and its ratio to a solo peer on the same core (utilization), from the first global epoch both
  peers are in to the end of the budget;
- the median seconds of an averaging round (what swarmd's averaging log records: the wait for the gradient
  round, or the background parameter round with local updates);
- averaging rounds that succeeded and failed in that window, global epochs per minute, and MB sent per global
  epoch (p2pd's TCP payload from the kernel's sock_diag counters, read inside the peer's namespace);
- the validation loss at the end of the sample budget;
- each peer's own samples/s (a pair held to its slower peer's pace shows here), the share of a DiLoCo peer's time
  its training stood still for outer rounds (for slower peers before sending, or for a round's result), and the
  CPU of the peer's child processes (hivemind's DHT process, averagers and p2pd) in % of its core.

Rows: sync (gradient averaging every epoch), dpu (delayed parameter updates), local (local updates, parameters
averaged every 5 epochs), diloco where this build has it (swarm.strategy), and plain hivemind.Optimizer with its
own defaults and tuned like swarmd. The solo row trains alone on the same budget. Variants are interleaved; medians
over the repeats. Needs root; every namespace, veth, bridge and qdisc is removed at the end, also on failure or
Ctrl-C, and leftovers of a crashed earlier run are removed at the start.

    sudo python benchmarks/wan.py                       # 1000, 100, 20 Mbit/s, all strategies (about an hour)
    sudo python benchmarks/wan.py --quick               # 20 Mbit/s, a 2-epoch budget (minutes; see PERFORMANCE.md)
    sudo python benchmarks/wan.py --rates 20 --strategies sync local --epochs 8
"""

from __future__ import annotations

import argparse
import collections
import math
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DILOCO_CHILDREN, HIVEMIND_PROFILES, SYNC_CHILDREN, DaemonProcess, HivemindPeer, child_roles, cpu_seconds,
    interleave, machine, p2pd_bytes, peer_config, print_table, raise_exit,
)
from netlab import Lab, cleanup_leftovers, in_namespace, is_root, leftovers  # noqa: E402

from swarmd.tasks.swin import SwinConfig  # noqa: E402 - light: the model code loads when the task is built

PEERS = 2
BATCH = 32
# A four-stage micro Swin: the micro config's first two stages plus two wider ones that see 2x2 and 1x1 tokens,
# so it has 17x the micro's parameters for 2x its compute (docs/PERFORMANCE.md, "Slow links", has the arithmetic).
MODEL = {"embed_dim": 64, "depths": [2, 2, 2, 2], "num_heads": [2, 4, 8, 16]}
MODEL_PARAMETERS = 9.08e6
# The swin task's optimizer defaults: warm-up and cosine length in global epochs of the target batch. Under DiLoCo
# the schedule counts inner steps, so the DiLoCo rows get the same schedule in samples (optim_section): with the
# default's 200 inner steps the inner LR reached 0 after two outer steps of H = 96.
OPTIM = SwinConfig().optim.model_dump(mode="json")
WIRE_BYTES_PER_VALUE = 2  # fp16 gradients (swarmd's default)

STRATEGIES = {
    "sync": {"average_state_every": 10},
    "dpu": {"delay_grad_averaging": True, "delay_optimizer_step": True, "average_state_every": 10},
    "local": {"use_local_updates": True, "average_state_every": 5},
}
# diloco-overlap: the pseudo-gradient goes out --diloco-overlap-steps before the H-th inner step (Streaming DiLoCo);
# -8bit: and on the wire in 8 bits (blockwise8, swarm/upstream/quantization.py) instead of fp16, as INTELLECT-1 sends its
# pseudo-gradients in int8: half the seconds on a slow link, so the same overlap hides a round twice as long
# -nice: and hivemind's processes at nice 10 (daemon.background_priority): an overlapped round's CPU work then
# yields the peer's one core to the inner steps, and the overlap hides the round's longer time
DILOCO_STRATEGIES = ["diloco", "diloco-overlap", "diloco-overlap-8bit", "diloco-overlap-8bit-nice"]
DILOCO_8BIT = "blockwise8"
QUICK = {"rates": [20.0], "epochs": 2, "repeats": 1}
# turned into SystemExit, so that the finally clause removes the namespaces (SIGINT already raises)
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def diloco_available() -> bool:
    """Whether this build has the DiLoCo strategy (issue 12): SwarmConfig gained a `strategy` field with it."""
    from swarmd.config.schema import SwarmConfig

    return "strategy" in SwarmConfig.model_fields


def strategy_names(with_diloco: bool) -> list[str]:
    return [*STRATEGIES, *(DILOCO_STRATEGIES if with_diloco else []), *HIVEMIND_PROFILES]


def parse_args(argv: Optional[list[str]] = None, *, with_diloco: bool = False) -> argparse.Namespace:
    names = strategy_names(with_diloco)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[1000.0, 100.0, 20.0], help="Mbit/s per peer link")
    parser.add_argument("--strategies", nargs="+", default=names, help=f"from {', '.join(names)}")
    parser.add_argument("--epochs", type=int, default=12, help="sample budget in global epochs of the target batch")
    parser.add_argument("--target-batch-size", type=int, default=1024)
    parser.add_argument("--matchmaking-time", type=float, default=2.0)
    parser.add_argument("--averaging-timeout", type=float, default=60.0)
    parser.add_argument("--next-chunk-timeout", type=float, default=10.0,
                        help="swarm.next_chunk_timeout for every row but hivemind's defaults (hivemind's own default, "
                             "the matchmaking time, cut rounds short at 20 Mbit/s)")
    parser.add_argument("--diloco-inner-steps", type=int, default=16,
                        help="H; the outer step then covers H x batch x peers samples")
    parser.add_argument("--diloco-overlap-steps", type=int, default=None,
                        help="diloco-overlap: inner steps that run while the outer round does (swarm.diloco."
                             "overlap_steps; default 3/8 of H); size it to the round's seconds x inner steps per "
                             "second")
    parser.add_argument("--diloco-overlap-mixing", type=float, default=0.5, help="swarm.diloco.overlap_mixing")
    parser.add_argument("--diloco-inner-lr", type=float, default=None,
                        help=f"peak LR of the inner AdamW steps (default: the sync rows' {OPTIM['lr']:g}, which is for "
                             "steps of the whole target batch; an inner step is one peer's batch)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--side-by-side", action="store_true",
                        help="with DiLoCo rows: also two lone DiLoCo peers at once, one per core (the 'vs 2 solos' "
                             "column), a baseline that the cores' contention slows down as it does a pair")
    parser.add_argument("--only", nargs="+", metavar="RATE/STRATEGY", default=None,
                        help="of the rates x strategies, run only these rows (e.g. 1000/sync 20/diloco-overlap-8bit), "
                             "besides the solo rows")
    parser.add_argument("--quick", action="store_true",
                        help=f"one rate ({QUICK['rates'][0]:g} Mbit/s), {QUICK['epochs']} epochs, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.rates, args.epochs, args.repeats = list(QUICK["rates"]), QUICK["epochs"], QUICK["repeats"]
    unknown = [name for name in args.strategies if name not in names]
    if set(DILOCO_STRATEGIES) & set(unknown) and not with_diloco:
        parser.error("diloco: this build has no swarm.strategy (swarmd.config.schema.SwarmConfig); leave it out")
    if unknown:
        parser.error(f"unknown strategies {unknown}; choose from {names}")
    if any(rate <= 0 for rate in args.rates):
        parser.error("--rates must be positive")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is warm-up)")
    if args.diloco_overlap_steps is None:
        args.diloco_overlap_steps = max(1, args.diloco_inner_steps * 3 // 8)
    overlapped = any(name.startswith("diloco-overlap") for name in args.strategies)
    if overlapped and not 0 < args.diloco_overlap_steps < args.diloco_inner_steps:
        parser.error("--diloco-overlap-steps must be between 1 and --diloco-inner-steps - 1")
    if args.diloco_inner_lr is None:
        args.diloco_inner_lr = OPTIM["lr"]
    every_row = {f"{rate:g}/{name}": (rate, name) for rate in args.rates for name in args.strategies}
    unknown_rows = [row for row in args.only or [] if row not in every_row]
    if unknown_rows:
        parser.error(f"--only {' '.join(unknown_rows)}: not among --rates x --strategies ({', '.join(every_row)})")
    args.rows = [pair for row, pair in every_row.items() if not args.only or row in args.only]  # (rate, strategy)
    if args.target_batch_size % (BATCH * PEERS):
        parser.error(f"--target-batch-size must be a multiple of {BATCH * PEERS} (batch x peers)")
    return args


def samples_per_epoch(strategy: str, args) -> int:
    if strategy in DILOCO_STRATEGIES:
        return args.diloco_inner_steps * BATCH * PEERS
    return args.target_batch_size


def budget_epochs(strategy: str, args) -> int:
    """Global epochs that cover the sample budget (epochs x target batch) for this strategy."""
    return max(2, math.ceil(args.epochs * args.target_batch_size / samples_per_epoch(strategy, args)))


def round_seconds_estimate(rate_mbit: float, peers: int = PEERS) -> float:
    """Seconds one butterfly all-reduce of the fp16 gradients needs on a link of `rate_mbit`: each peer sends
    (and receives) 2(N-1)/N of the vector."""
    return MODEL_PARAMETERS * WIRE_BYTES_PER_VALUE * 2 * (peers - 1) / peers * 8 / (rate_mbit * 1e6)


def swarm_section(strategy: str, args) -> dict:
    swarm = {
        "target_batch_size": samples_per_epoch(strategy, args),
        "matchmaking_time": args.matchmaking_time,
        "averaging_timeout": args.averaging_timeout,
        "next_chunk_timeout": args.next_chunk_timeout,
        "load_state_timeout": 300.0,
    }
    if strategy in DILOCO_STRATEGIES:
        diloco = {"inner_steps": args.diloco_inner_steps}
        if strategy.startswith("diloco-overlap"):
            diloco.update(overlap_steps=args.diloco_overlap_steps, overlap_mixing=args.diloco_overlap_mixing)
        swarm.update(strategy="diloco", diloco=diloco)
        if "-8bit" in strategy:
            swarm.update(grad_compression=DILOCO_8BIT)
    elif strategy in STRATEGIES:
        swarm.update(STRATEGIES[strategy])
    else:
        swarm.update(STRATEGIES["sync"])  # the hivemind rows: gradient averaging, tuned like swarmd's sync
    return swarm


def optim_section(strategy: str, args, peers: int = PEERS) -> dict:
    """OPTIM in this strategy's units: a DiLoCo schedule counts inner steps, target batch / (batch x peers) of
    them per global epoch of the sync rows, so both warm up and decay over the same samples."""
    if strategy not in DILOCO_STRATEGIES:
        return dict(OPTIM)
    steps_per_epoch = max(1, args.target_batch_size // (BATCH * peers))
    return {**OPTIM, "lr": args.diloco_inner_lr, "warmup_epochs": OPTIM["warmup_epochs"] * steps_per_epoch,
            "total_epochs": OPTIM["total_epochs"] * steps_per_epoch}


def config(strategy: str, address: str, port: int, data: str, args, peers: int = PEERS) -> dict:
    task = {"name": "swin", "eval_every_epochs": budget_epochs(strategy, args), "model": MODEL, "data": {"path": data},
            "optim": optim_section(strategy, args, peers)}
    return peer_config(
        task=task,
        network={"host_maddrs": [f"/ip4/{address}/tcp/{port}"], "bootstrap_attempts": 6, "bootstrap_retry_delay": 1.0},
        swarm=swarm_section(strategy, args),
        training={"batch_size": BATCH, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
        daemon={"shutdown_timeout": 30.0, "tick_interval": 1.0,
                "background_priority": "nice" if strategy.endswith("-nice") else "normal"},
    )


# --- peers ---------------------------------------------------------------------------------------------------


def make_identity(state_dir: Path) -> str:
    """Write the identity file the peer will use and return its peer id, so the other peer can start at once."""
    from hivemind.p2p import P2P, PeerID

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "identity.key"
    P2P.generate_identity(str(path))
    return PeerID.from_identity(path.read_bytes()).to_base58()


def start_peer(strategy: str, index: int, lab: Lab, state_dir: Path, cfg: dict, extra_args=()) -> DaemonProcess:
    name = f"p{index}"
    if strategy in HIVEMIND_PROFILES:
        peer = HivemindPeer(state_dir, cfg, profile=HIVEMIND_PROFILES[strategy], extra_args=extra_args, name=name)
    else:
        peer = DaemonProcess(state_dir, cfg, extra_args=extra_args, name=name)
    # core `index`, one thread, inside the peer's namespace; both exec, so the pid stays the peer's own
    peer.args = ["taskset", "-c", str(index), *lab.exec_prefix(index), *peer.args]
    return peer.start()


def sent_bytes(peer: DaemonProcess, namespace: str) -> int:
    # sock_diag answers for the namespace the asking socket lives in
    return in_namespace(namespace, lambda: p2pd_bytes(peer)[0])


# --- one run -------------------------------------------------------------------------------------------------


def round_seconds(status: dict) -> Optional[float]:
    """Median duration of the successful rounds of the kind this peer averages most (gradients, or parameters
    with local updates) among its recent rounds."""
    rounds = [r for r in status.get("recent_averaging") or [] if r["outcome"] == "success"]
    if not rounds:
        return None
    kind = collections.Counter(r["kind"] for r in rounds).most_common(1)[0][0]
    return statistics.median(r["duration_seconds"] for r in rounds if r["kind"] == kind)


def outer_round_waits(status: dict, since_epoch: int) -> Optional[float]:
    """Seconds the training of a DiLoCo peer stood still for its outer rounds from `since_epoch` to its epoch now:
    the wait for slower peers before sending, plus what an overlapped round still made it wait (without overlap: the
    whole round). None when the peer took no outer round, or when its status no longer lists every one of them (it
    keeps the newest few; an epoch a download skipped has none): a sum of some would understate the wait."""
    rounds = [r for r in status.get("recent_averaging") or [] if r["kind"] == "outer" and r["epoch"] >= since_epoch]
    if not rounds or len(rounds) < status["local_epoch"] - since_epoch:
        return None
    return sum((r.get("peer_wait_seconds") or 0.0)
               + (r["waited_seconds"] if r.get("waited_seconds") is not None else r["duration_seconds"])
               for r in rounds)


def helper_cpu_seconds(peer: DaemonProcess, python_roles: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds so far of each of the peer's child processes: hivemind's DHT process, its averagers and p2pd, the
    work of the swarm that runs beside the training on the peer's one core."""
    seconds = {}
    for pid, name in child_roles(peer, python_roles).items():
        try:
            seconds[name] = seconds.get(name, 0.0) + cpu_seconds(f"/proc/{pid}/stat")
        except (OSError, ValueError):
            continue  # ended meanwhile
    return seconds


def round_counts(status: dict) -> tuple[int, int]:
    """(succeeded, failed) averaging rounds of every kind so far."""
    counts = status.get("averaging") or {}
    return (sum(c.get("success", 0) for c in counts.values()), sum(c.get("failed", 0) for c in counts.values()))


def wait_all(peers: list[DaemonProcess], predicate, timeout: float, what: str) -> None:
    """Until `predicate(status)` holds for every peer; fails at once when any of them exits."""
    pending = list(peers)
    deadline = time.monotonic() + timeout
    while pending:
        for peer in list(pending):
            if peer.proc.poll() is not None:
                raise AssertionError(f"{peer.name} exited with {peer.proc.returncode} waiting for {what}:\n{peer.tail()}")
            try:
                if predicate(peer.status()):
                    pending.remove(peer)
            except Exception:  # noqa: BLE001 - not answering yet (no socket or status file yet)
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                                 + "\n".join(f"--- {p.name}\n{p.tail(15)}" for p in pending))
        time.sleep(0.5)


def measure(peers: list[DaemonProcess], lab: Lab, strategy: str, args, *, swarm_size: Optional[int] = None) -> dict:
    """From the first epoch all peers are in to the evaluation at the end of the sample budget. `swarm_size`: the
    peers each one should see (default: all of them; 1 for peers that train side by side, each alone)."""
    end_epoch = budget_epochs(strategy, args)
    swarm_size = swarm_size or len(peers)
    wait_all(
        peers,
        lambda s: s["state"] == "training" and (s["local_epoch"] or 0) >= 1 and s["num_peers"] == swarm_size,
        300.0, "every peer in the swarm, past epoch 1",
    )
    roles = DILOCO_CHILDREN if strategy in DILOCO_STRATEGIES else SYNC_CHILDREN
    begin, helpers_begin = [], [helper_cpu_seconds(peer, roles) for peer in peers]
    for index, peer in enumerate(peers):
        status = peer.status()
        begin.append((time.monotonic(), status, sent_bytes(peer, lab.namespace(index))))
    # a generous bound: a round per epoch at the slowest rate, on a shared machine
    budget = 120.0 + end_epoch * (60.0 + 3 * round_seconds_estimate(lab.rate_mbit))
    end: list = [None] * len(peers)
    helpers_end: list = [{} for _ in peers]
    deadline = time.monotonic() + budget
    while any(item is None for item in end):
        for index, peer in enumerate(peers):
            if end[index] is None:
                if peer.proc.poll() is not None:
                    raise AssertionError(f"{peer.name} exited with {peer.proc.returncode}:\n{peer.tail()}")
                status = peer.wait_status(lambda s: True, 30, "status")
                evaluation = status.get("evaluation")
                if evaluation and evaluation["epoch"] >= end_epoch:
                    end[index] = (time.monotonic(), status, sent_bytes(peer, lab.namespace(index)))
                    helpers_end[index] = helper_cpu_seconds(peer, roles)
        if time.monotonic() > deadline:
            raise AssertionError(f"{strategy}: no evaluation at epoch {end_epoch} within {budget:.0f} s:\n"
                                 + "\n".join(p.tail(15) for p in peers))
        time.sleep(0.5)
    rates, epochs_per_min, bytes_per_epoch, ok, failed, rounds, waits = [], [], [], [], [], [], []
    for (t0, s0, b0), (t1, s1, b1) in zip(begin, end):
        epochs = max(s1["local_epoch"] - s0["local_epoch"], 1)
        rates.append((s1["samples_total"] - s0["samples_total"]) / (t1 - t0))
        waited = outer_round_waits(s1, s0["local_epoch"])
        waits.append(None if waited is None else waited / (t1 - t0))
        epochs_per_min.append(epochs / (t1 - t0) * 60)
        bytes_per_epoch.append((b1 - b0) / epochs)
        ok.append(round_counts(s1)[0] - round_counts(s0)[0])
        failed.append(round_counts(s1)[1] - round_counts(s0)[1])
        rounds.append(round_seconds(s1))
    known_rounds = [r for r in rounds if r is not None]
    known_waits = [w for w in waits if w is not None]
    # per peer and child process: its share of a core over the peer's window
    shares = [{name: (h1[name] - h0.get(name, 0.0)) / (t1 - t0) for name in h1}
              for h0, h1, (t0, _, _), (t1, _, _) in zip(helpers_begin, helpers_end, begin, end)]
    helpers = [sum(share.values()) for share in shares]
    return {
        "rate": statistics.mean(rates),
        "peer_rates": rates,
        "wait_share": statistics.mean(known_waits) if known_waits else None,
        "helper_cores": statistics.mean(helpers),
        "helper_cores_by_process": {name: round(statistics.mean(s.get(name, 0.0) for s in shares), 4)
                                    for name in sorted({n for s in shares for n in s})},
        "round_s": statistics.median(known_rounds) if known_rounds else None,
        "rounds": f"{min(ok)}/{max(failed)}",
        "epochs_per_min": statistics.mean(epochs_per_min),
        "bytes_per_epoch": statistics.mean(bytes_per_epoch),
        "val_loss": statistics.mean(s["evaluation"]["metrics"]["val_loss"] for _, s, _ in end),
        "samples": sum(s["samples_total"] for _, s, _ in end),
    }


class Runner:
    """Starts each variant's peers in the lab with a fresh state dir and port, and always stops them."""

    def __init__(self, lab: Lab, root: Path, data: str, args):
        self.lab, self.root, self.data, self.args = lab, root, data, args
        self.count = 0
        self.running: list[DaemonProcess] = []

    def run(self, strategy: str, rate: Optional[float], *, side_by_side: bool = False) -> dict:
        """`rate` None: one solo peer; with `side_by_side`, PEERS solo peers at once, each on its own core and in its
        own swarm, which the VM's cores slow down as they slow a pair down (docs/RANKS.md: one loop beside another
        made 0.84-0.97 of its rate alone), with no link between them."""
        self.count += 1
        port = 31400 + self.count  # a fresh port per run: nothing waits for the last run's sockets to close
        tag = f"{self.count:02d}-{strategy}{'-x2' if side_by_side else ''}"
        peers_wanted = PEERS if (rate is not None or side_by_side) else 1
        if rate is not None:
            self.lab.set_rate(rate)
        started = time.monotonic()
        try:
            first_dir = self.root / f"{tag}-p0"
            first_id = make_identity(first_dir)
            join = ["--initial-peers", f"/ip4/{self.lab.address(0)}/tcp/{port}/p2p/{first_id}"]
            for index in range(peers_wanted):
                cfg = config(strategy, self.lab.address(index), port, self.data, self.args,
                             peers=1 if side_by_side else peers_wanted)
                if side_by_side:
                    cfg["run_id"] = f"{cfg['run_id']}-{index}"
                self.running.append(start_peer(strategy, index, self.lab, self.root / f"{tag}-p{index}", cfg,
                                               extra_args=join if index and not side_by_side else ()))
            result = measure(self.running, self.lab, strategy, self.args, swarm_size=1 if side_by_side else None)
            result["wall_s"] = time.monotonic() - started
            return result
        finally:
            self.stop()

    def stop(self) -> None:
        while self.running:
            self.running.pop().close()


# --- report --------------------------------------------------------------------------------------------------


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _median_rate(runs: list[dict]) -> float:
    return statistics.median(r["rate"] for r in runs)


def table_rows(results: dict[str, list[dict]], solo_rate: float) -> list[list[str]]:
    """One row per variant. "vs own solo" divides a DiLoCo row by the lone DiLoCo peer's rate (solo-diloco: the
    same inner steps, an optimizer step per batch, no company): what communication costs that strategy; "vs 2
    solos" by the rate of two lone DiLoCo peers side by side (solo-diloco-x2), which also takes out what the
    cores cost each other."""
    solo_diloco_rate = _median_rate(results["solo-diloco"]) if "solo-diloco" in results else None
    side_by_side_rate = _median_rate(results["solo-diloco-x2"]) if "solo-diloco-x2" in results else None
    rows = []
    for variant, runs in results.items():
        rate, _, strategy = variant.partition("/")
        rates = [r["rate"] for r in runs]
        median_rate = statistics.median(rates)
        spread = f" [{min(rates):.0f}..{max(rates):.0f}]" if len(rates) > 1 else ""
        round_values = [r["round_s"] for r in runs if r["round_s"] is not None]
        wait_values = [r["wait_share"] for r in runs if r.get("wait_share") is not None]
        helper_values = [r["helper_cores"] for r in runs if r.get("helper_cores") is not None]
        # each peer's own rate, in the median run: a pair at the pace of its slower peer shows here
        median_run = min(runs, key=lambda r: abs(r["rate"] - median_rate))
        each = "/".join(f"{value:.0f}" for value in median_run.get("peer_rates", []))
        solo = variant.startswith("solo")
        diloco = strategy in DILOCO_STRATEGIES or variant.startswith("solo-diloco")
        own_solo_rate = solo_diloco_rate if diloco else solo_rate
        rows.append([
            "-" if solo else rate,
            variant.replace("-", " ") if solo else strategy,
            f"{median_rate:.1f}{spread}",
            f"{median_rate / solo_rate:.2f}",
            _fmt(median_rate / own_solo_rate if own_solo_rate else None, ".2f"),
            _fmt(median_rate / side_by_side_rate if diloco and side_by_side_rate else None, ".2f"),
            _fmt(statistics.median(round_values) if round_values else None, ".2f"),
            "-" if solo else runs[0]["rounds"],
            f"{statistics.median(r['epochs_per_min'] for r in runs):.1f}",
            "-" if solo else f"{statistics.median(r['bytes_per_epoch'] for r in runs) / 1e6:.1f}",
            f"{statistics.median(r['val_loss'] for r in runs):.3f}",
            f"{statistics.median(r['samples'] for r in runs):.0f}",
            f"{statistics.median(r['wall_s'] for r in runs):.0f}",
            each if len(median_run.get("peer_rates", [])) > 1 else "-",
            _fmt(100 * statistics.median(wait_values) if wait_values else None, ".1f"),
            _fmt(100 * statistics.median(helper_values) if helper_values else None, ".1f"),
        ])
    return rows


HEADER = ["Mbit/s", "strategy", "samples/s/peer", "vs solo", "vs own solo", "vs 2 solos", "s/round", "rounds ok/failed", "epochs/min",
          "MB sent/epoch/peer", "val loss", "samples", "wall s", "each peer", "waited %", "hivemind CPU %"]


def print_report(results: dict[str, list[dict]], args, *, with_diloco: bool, command: str) -> None:
    solo_rate = _median_rate(results["solo"])
    budget = args.epochs * args.target_batch_size
    print_table(
        f"Slow links: 4-stage micro Swin ({MODEL_PARAMETERS / 1e6:.2f}M params), batch {BATCH}, 1 thread per peer "
        f"pinned to its own core, {PEERS} peers in network namespaces, tbf both ways per peer link; target batch "
        f"{args.target_batch_size}, DiLoCo inner LR {args.diloco_inner_lr:g}, matchmaking {args.matchmaking_time:g} s, next chunk {args.next_chunk_timeout:g} s, budget {budget} samples "
        f"({args.epochs} epochs), {args.repeats} repeat(s){' [quick]' if args.quick else ''}\n{machine()}\n{command}",
        HEADER,
        table_rows(results, solo_rate),
    )
    print("vs solo: per-peer samples/s over the solo peer's on the same core; vs own solo: diloco rows over a lone "
          "diloco peer's (its inner optimizer steps every batch: what communication costs it); vs 2 solos: over two "
          "lone diloco peers at once, one per core (also takes out what the cores cost each other); s/round: median "
          "successful round (gradient wait, or background parameter round with local updates; diloco: from the "
          "send to the result); each peer: its own samples/s in the median run; waited %: the share of a diloco "
          "peer's time its training stood still for outer rounds (for slower peers before sending, and for the "
          "round's result); hivemind CPU %: the peer's child processes (DHT, averagers, p2pd) in % of a core; "
          "val loss at the end of the budget")
    for rate in args.rates:
        print(f"fp16 gradient all-reduce on {rate:g} Mbit/s: {round_seconds_estimate(rate):.2f} s per round on the wire "
              f"({MODEL_PARAMETERS * WIRE_BYTES_PER_VALUE / 1e6:.1f} MB sent and received per peer)")
    if not with_diloco:
        print("diloco: not in this build (swarmd.config.schema.SwarmConfig has no `strategy` field); no diloco rows")


# --- main ----------------------------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    with_diloco = diloco_available()
    args = parse_args(argv, with_diloco=with_diloco)
    if not is_root():
        print("benchmarks/wan.py needs root (network namespaces, veth, tc); run it with sudo", file=sys.stderr)
        return 2
    removed = cleanup_leftovers()
    if removed:
        print(f"removed leftovers of an earlier run: {', '.join(removed)}")
    previous = {sig: signal.signal(sig, raise_exit) for sig in _SIGNALS}
    lab = Lab(PEERS, args.rates[0])
    runner = None
    try:
        with tempfile.TemporaryDirectory(prefix="swarmd-wan-") as tmp:
            lab.start()
            root, data = Path(tmp), str(Path(tmp) / "data")
            prepare_data(data)
            runner = Runner(lab, root, data, args)
            variants = {"solo": lambda: runner.run("sync", None)}
            if any(strategy in DILOCO_STRATEGIES for _, strategy in args.rows):
                variants["solo-diloco"] = lambda: runner.run("diloco", None)
                if args.side_by_side:
                    variants["solo-diloco-x2"] = lambda: runner.run("diloco", None, side_by_side=True)
            for rate, strategy in args.rows:
                variants[f"{rate:g}/{strategy}"] = lambda rate=rate, strategy=strategy: runner.run(strategy, rate)
            results = interleave(variants, args.repeats)
    finally:
        for sig in (signal.SIGINT, *_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        if runner is not None:
            runner.stop()
        lab.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    left = leftovers(lab.prefix)
    command = "sudo python benchmarks/wan.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print_report(results, args, with_diloco=with_diloco, command=command.strip())
    print(f"cleanup: {'nothing left' if not left else 'LEFT BEHIND: ' + ', '.join(left)}")
    return 1 if left else 0


def prepare_data(data: str) -> None:
    """Generate the shared image folder once, before peers race to do it."""
    from swarmd.config import load_config
    from swarmd.config.task_resolver import use_task_resolver
    from swarmd.tasks.registry import resolve_task
    from swarmd.tasks.swin.generated import ensure_generated_folder

    use_task_resolver(resolve_task)
    generated = load_config(environ={}).task.settings.data.generated
    ensure_generated_folder(Path(data), num_classes=generated.num_classes, train_per_class=generated.train_per_class,
                            val_per_class=generated.val_per_class, image_size=32)


if __name__ == "__main__":
    sys.exit(main())
