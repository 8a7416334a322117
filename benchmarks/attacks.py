"""Strangers who lie (issue 34): real swarmd peers of one run, one of which attacks, against the defences
(robust aggregation, receivers' checks, claims capped, exclusion on evidence; docs/FAULTS.md).

Each cell starts `--peers` daemons on 127.0.0.1 training the `faulty` test task (a small regression whose honest
loss falls from ~0.45 to ~0.01), one of them the attacker, and runs until honest peer 0 reaches the sample budget
(`--budget-epochs` global epochs past the one at which all peers trained together) or the cell's time runs out.
Attacks (the attacker's task settings):

    x -1e6          its gradients times -1e6 (loud)
    sign flip       its gradients times -1 (at honest scale: quiet)
    claims x100     honest gradients, but 100x the samples it computed reported (progress and averaging weight)
    zeros, x100     no gradient at all (times 0) while claiming 100x the samples
    noise           Gaussian noise at the norm of its honest gradient, instead of the gradient
    little shift    its honest gradient plus its norm along one direction every attacker shares ("a little is
                    enough": each attacker looks honest, together they pull one way)
    stale replays   the gradient at its parameters of 50 steps ago (an old update sent again)

Strategies: sync (gradient averaging), local (sync with use_local_updates: parameters averaged every epoch),
diloco (pseudo-gradients of 8 inner steps). `--attackers 2 --peers 6`: two attackers of six, attacking together.

Columns: the honest peer's loss at the budget (the median of its last three epoch means) against the clean run's,
the epochs from the start until an honest peer excluded the attacker (and by how many honest peers), honest
peers excluded by anyone (wrongly), and for the clean rows the defence's cost: samples/s and median gradient round
time with the defences on against off (hivemind's mean, no exclusion, no claim check), side by side. With
`--repeats N` every cell runs N times, interleaved (all cells once, then all again, so a slow spell of the machine
falls on every cell): the losses are then the median [min..max] of the runs, "x clean" each run's loss against the
clean runs' median (the clean row's own range is the spread an attack cell is judged against), the exclusions and
epochs one entry per run.

With `--without "the far-sender drop"` the clean run and each attack also run with that defence off
(`swarm.aggregation.far_ratio: 0`: far senders clipped like the others, not left out), in the same run, so the rows
compare side by side; `--without "the step on a partial average"` likewise with `swarm.step_on_partial_average:
false` (a peer whose gradient round came back in part steps on its own gradient everywhere), `--without "the direction
margin"` with `swarm.aggregation.direction_sigmas: 0` (any cosine below 0 is evidence). Two more columns say
what honest peers saw of each other: the gradient rounds that came back partial (summed over the honest peers,
per run) and the honest peers any honest peer held evidence against (suspected or excluded, per run). `--attacks`
with no attack runs the clean cells alone.

    python benchmarks/attacks.py [--strategies sync local diloco] [--attacks "x -1e6" "sign flip"] [--peers 4] \\
        [--attackers 1] [--budget-epochs 30] [--cell-timeout 240] [--repeats 3] [--without DEFENCE] [--keep-logs DIR]

Not covered here: NaN gradients (a swarmd worker skips a non-finite step before sending: it needs an attacker
that modifies its averager; tests/swarm/test_lying_peers.py covers the reducers' side, and every receiver refuses
a non-finite part, swarm/upstream/robust_aggregation.py).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import DaemonProcess, install_testtasks, machine, peer_config, print_table

ATTACKS = {
    "x -1e6": {"grad_scale": -1e6},
    "sign flip": {"grad_scale": -1.0},
    "claims x100": {"claim_scale": 100},
    "zeros, x100": {"grad_scale": 0.0, "claim_scale": 100},
    "noise": {"gradient_attack": "noise"},
    "little shift": {"gradient_attack": "shift", "shift_scale": 1.0},
    "stale replays": {"gradient_attack": "stale", "stale_steps": 50},
}
BATCH = 64
ROUND_KIND = {"sync": "gradients", "local": "state", "diloco": "outer"}  # the round each strategy averages in
# `--without NAME`: every attack cell also run with that one defence off, side by side ("<attack>, without NAME")
ABLATIONS = {"the far-sender drop": {"aggregation": {"far_ratio": 0.0}},
             "the step on a partial average": {"step_on_partial_average": False},
             "the direction margin": {"aggregation": {"direction_sigmas": 0.0}}}
UNDEFENDED = {"aggregation": {"method": "mean"}, "exclusion": {"enabled": False, "claim_rate_ratio": 0.0},
              "guard_gradient_norm_ratio": 0.0, "guard_parameter_change": 0.0}


def config(strategy: str, attack: dict, defended: bool = True, ablation: str | None = None) -> dict:
    swarm = {"target_batch_size": BATCH * 8, "matchmaking_time": 2.0, "averaging_timeout": 10.0,
             "exclusion": {"base_seconds": 600.0}}  # an exclusion lasts the whole cell
    if strategy == "diloco":
        swarm.update(strategy="diloco", diloco={"inner_steps": 8, "max_straggler_wait": 10.0})  # <= 2 x averaging_timeout
    elif strategy == "local":
        swarm.update(use_local_updates=True, average_state_every=1)
    if not defended:
        swarm.update(UNDEFENDED)
    if ablation is not None:
        swarm.update(ABLATIONS[ablation])
    return peer_config(
        task={"name": "faulty", "step_sleep": 0.02, **attack,
              "optim": {"lr": 0.01, "weight_decay": 0.0, "warmup_epochs": 0, "schedule": "constant"}},
        swarm=swarm, training={"batch_size": BATCH, "threads": 1, "seed": 0}, checkpoint={"enabled": False},
    )


def run_cell(root: Path, env: dict, strategy: str, attack: str | None, args, defended: bool = True,
             ablation: str | None = None) -> dict:
    """One swarm: (the honest loss at the budget, the epochs until exclusion, wrongly excluded peers, throughput,
    gradient round times)."""
    peers = []
    try:
        for index in range(args.peers):
            attacker = attack is not None and index >= args.peers - args.attackers
            settings = ATTACKS[attack] if attacker else {}
            extra = peers[0].joining_args() if peers else []
            peers.append(DaemonProcess(root / f"peer{index}", config(strategy, settings, defended, ablation), env=env,
                                       extra_args=extra, name="attacker" if attacker else f"honest{index}").start())
        first = peers[0]
        together = first.wait_status(lambda s: s["num_peers"] == args.peers and s["loss"] is not None, 180,
                                     "every peer training")
        start_epoch, started = together["global_epoch"], time.monotonic()
        ids = [peer.wait_status(lambda s: s["peer_id"], 60, "a peer id")["peer_id"] for peer in peers]
        honest_ids = set(ids[: args.peers - args.attackers]) if attack else set(ids)
        attacker_ids = set(ids) - honest_ids
        excluded_at: dict[str, int] = {}  # honest peer -> the global epoch its exclusion of the attacker appeared
        wrongly: dict[str, str] = {}  # an honest peer excluded by another -> why
        suspected: set[str] = set()  # honest peers another honest peer held evidence against
        partial_before = {peer_id: _partial_rounds(peer.status(), strategy)
                          for peer, peer_id in zip(peers, ids) if peer_id in honest_ids}
        samples_first = first.status()["samples_total"]
        status = together
        deadline = started + args.cell_timeout
        while status["global_epoch"] < start_epoch + args.budget_epochs and time.monotonic() < deadline:
            time.sleep(2)
            for peer, peer_id in zip(peers, ids):
                if peer_id not in honest_ids:
                    continue
                seen = peer.status()
                for entry in seen.get("excluded_peers") or ():
                    if entry["peer_id"] in attacker_ids:
                        excluded_at.setdefault(peer_id, seen["global_epoch"] - start_epoch)
                    elif entry["peer_id"] in honest_ids:
                        wrongly.setdefault(entry["peer_id"], entry["reason"])
                        suspected.add(entry["peer_id"])
                suspected.update(entry["peer_id"] for entry in seen.get("suspected_peers") or ()
                                 if entry["peer_id"] in honest_ids)
                if peer is first:
                    status = seen
        seconds = time.monotonic() - started
        partial = sum(_partial_rounds(peer.status(), strategy) - partial_before[peer_id]
                      for peer, peer_id in zip(peers, ids) if peer_id in honest_ids)
        losses = [loss for epoch, loss in status["loss_history"] if epoch > start_epoch]
        rounds = [r["duration_seconds"] for r in status["recent_averaging"]
                  if r["kind"] == ROUND_KIND[strategy] and r["outcome"] == "success"]
        return {
            "loss": statistics.median(losses[-3:]) if losses else float("nan"),
            "epochs": status["global_epoch"] - start_epoch,
            "excluded_at": sorted(excluded_at.values()),
            "wrongly": len(wrongly),
            "wrongly_why": sorted(wrongly.values()),
            "suspected": len(suspected),
            "partial": partial,
            "samples_per_second": (status["samples_total"] - samples_first) / seconds,
            "round_seconds": statistics.median(rounds) if rounds else float("nan"),
        }
    finally:
        for peer in peers:
            peer.close()


def _partial_rounds(status: dict, strategy: str) -> int:
    """The rounds of the strategy's kind that came back partial at this peer so far."""
    return int((status.get("averaging") or {}).get(ROUND_KIND[strategy], {}).get("partial", 0))


def spread(values: list[float], digits: int = 4) -> str:
    """One run's value, or the median [min..max] of several."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]"


def exclusion_cell(results: list[dict], honest: int) -> str:
    """When the attacker was first excluded in each run, and by how many honest peers."""
    return "; ".join(f"{r['excluded_at'][0]} ({len(r['excluded_at'])} of {honest})" if r["excluded_at"] else "never"
                     for r in results)


def wrongly_cell(results: list[dict]) -> str:
    """Honest peers excluded by anyone, per run, with the reasons."""
    return "; ".join(f"{r['wrongly']} ({', '.join(r['wrongly_why'])})" if r["wrongly"] else "0" for r in results)


def table_rows(strategy: str, cells: dict[str, list[dict]], honest: int) -> list[list[str]]:
    """The strategy's rows: every cell's runs against the clean (defended) runs' median loss."""
    clean, undefended = cells["clean"], cells["clean, undefended"]
    clean_loss = statistics.median(r["loss"] for r in clean)
    rate = statistics.median(r["samples_per_second"] for r in clean)
    undefended_rate = statistics.median(r["samples_per_second"] for r in undefended)
    rows = []
    for name, results in cells.items():
        losses = [r["loss"] for r in results]
        rates = [r["samples_per_second"] for r in results]
        rounds = statistics.median(r["round_seconds"] for r in results)
        row = [strategy, {"clean": "clean (defended)"}.get(name, name), spread(losses),
               spread([loss / clean_loss for loss in losses], 2), exclusion_cell(results, honest),
               wrongly_cell(results), ",".join(str(r["suspected"]) for r in results),
               ",".join(str(r["partial"]) for r in results), spread(rates, 1), f"{rounds:.2f}",
               ",".join(str(r["epochs"]) for r in results)]
        if name == "clean":
            undefended_rounds = statistics.median(r["round_seconds"] for r in undefended)
            row[8] += f" ({rate / undefended_rate:.3f}x undefended)"
            row[9] += f" (undefended {undefended_rounds:.2f})"
        if name.startswith("clean"):
            row[4] = "—"
        if name == "clean, undefended":
            row[5] = "—"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=["sync"], choices=["sync", "local", "diloco"])
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--without", nargs="+", default=[], choices=list(ABLATIONS), metavar="DEFENCE",
                        help=f"also run each attack with this defence off: {', '.join(map(repr, ABLATIONS))}")
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--attackers", type=int, default=1, help="the last ATTACKERS peers attack, all alike")
    parser.add_argument("--budget-epochs", type=int, default=30)
    parser.add_argument("--cell-timeout", type=float, default=240.0, help="seconds a cell may train")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of every cell, interleaved (all cells once, then again): a median and its range")
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                        help="keep every peer's state dir and log under DIR/cell<N>/ (a surprising cell's evidence)")
    args = parser.parse_args()

    print(machine())
    cells = {"clean": (None, None), "clean, undefended": (None, None)}  # name -> (attack, ablation)
    cells.update({f"clean, without {ablation}": (None, ablation) for ablation in args.without})
    for attack in args.attacks:
        cells[attack] = (attack, None)
        cells.update({f"{attack}, without {ablation}": (attack, ablation) for ablation in args.without})
    names = list(cells)
    results: dict[str, dict[str, list[dict]]] = {s: {name: [] for name in names} for s in args.strategies}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep_logs.resolve() if args.keep_logs else Path(tmp)
        env = install_testtasks(root / "plugins")
        cell = 0
        for repeat in range(args.repeats):
            for strategy in args.strategies:
                for name in names:
                    cell += 1
                    print(f"  [{cell}] run {repeat + 1}: {strategy}: {name}", flush=True)
                    attack, ablation = cells[name]
                    result = run_cell(root / f"cell{cell}", env, strategy, attack, args,
                                      defended=name != "clean, undefended", ablation=ablation)
                    print(f"      {result}", flush=True)
                    results[strategy][name].append(result)
    rows = [row for strategy in args.strategies
            for row in table_rows(strategy, results[strategy], args.peers - args.attackers)]
    runs = f", {args.repeats} runs per cell: median [min..max]" if args.repeats > 1 else ""
    print_table(
        f"{args.peers} peers ({args.attackers} attacking), faulty task, budget {args.budget_epochs} global epochs (or "
        f"{args.cell_timeout:.0f} s){runs}",
        ["strategy", "cell", "honest loss", "x clean", "excluded at epoch (by), per run", "honest excluded",
         "honest suspected", "partial rounds", "peer 0 samples/s", "round s (median)", "epochs"],
        rows,
    )


if __name__ == "__main__":
    main()
