"""What the defence against lying peers costs an honest swarm's round, side by side (issue 34: at most 5%).

The attack benchmark's clean cells compare defended and undefended swarms by their samples/s, whose run-to-run spread
(0.87-1.11x between pairs of the same code) is wider than the 5% it should show. What the defence adds to a clean
round is work in the averagers: each reducer buffers its share's parts and reduces them with CenteredClip (and
judges each sender's distance and direction), and each receiver checks the average every reducer returns
(swarm/upstream/robust_aggregation.py). This benchmark times that work where it happens: N averagers of `size` MB
each on 127.0.0.1 run all-reduce rounds (matchmaking not timed), three swarms of the same shape side by side,
interleaved round by round:

- `hivemind`: hivemind 1.1.12's DecentralizedAverager (the plain weighted mean);
- `swarmd mean`: swarmd's runner (the return check, the buffered parts) with `swarm.aggregation.method: mean`;
- `swarmd centered_clip`: the default, with the direction judged (as the gradient and outer averagers do).

The table gives each one's round seconds and its averagers' CPU seconds per round, and the defence's cost: the extra
seconds of a round, and the seconds of compute between rounds (a sync epoch's) above which that extra is at most 5%
of a peer's time (utilization = compute / (compute + round)).

    python benchmarks/defence_cost.py [--sizes 10 45] [--peers 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics

from allreduce import Swarm
from common import interleave, machine, print_table, summary

from swarmd.swarm.upstream.robust_aggregation import AggregatesRobustly, Aggregation

UTILIZATION_BOUND = 0.05  # the bound on what the defence may cost


class JudgesDirection(AggregatesRobustly):
    """swarmd's robust averager as the gradient and DiLoCo outer averagers use it: updates, judged by direction."""

    judges_direction = True


VARIANTS = {
    "hivemind": {},
    "swarmd mean": {"averager": JudgesDirection, "aggregation": Aggregation(method="mean")},
    "swarmd centered_clip": {"averager": JudgesDirection, "aggregation": Aggregation()},
}


def measure(peers: int, megabytes: float, repeats: int) -> dict[str, tuple[list[float], float]]:
    """Per variant: (round seconds of each repeat, median averagers' CPU seconds per round)."""
    swarms = {}
    try:
        for index, (name, kwargs) in enumerate(VARIANTS.items()):
            swarms[name] = Swarm(peers, megabytes, tag=f"v{index}", **kwargs)
        rounds = interleave({name: swarm.round_seconds for name, swarm in swarms.items()}, repeats)
        return {name: (rounds[name], statistics.median(cpu["averagers"] for cpu in swarm.cpu_per_round))
                for name, swarm in swarms.items()}
    finally:
        for swarm in swarms.values():
            swarm.close()


def rows_of(peers: int, megabytes: float, measured: dict) -> list[list[str]]:
    base = statistics.median(measured["hivemind"][0])
    rows = []
    for name, (seconds, cpu) in measured.items():
        extra = statistics.median(seconds) - base
        # compute + round with the defence, against the same without: extra / (compute + base + extra) <= bound
        compute = max(0.0, extra / UTILIZATION_BOUND - base - extra)
        rows.append([f"{peers}", f"{megabytes:g}", name, summary(seconds), f"{statistics.median(seconds) / base:.3f}x",
                     f"{cpu:.2f}", "-" if name == "hivemind" else f"{extra:+.3f}",
                     "-" if name == "hivemind" else f"{compute:.1f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 45], help="MB of float32 per peer")
    parser.add_argument("--peers", type=int, nargs="+", default=[4])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rows = []
    for megabytes in args.sizes:
        for peers in args.peers:
            print(f"{peers} peers, {megabytes:g} MB:", flush=True)
            rows += rows_of(peers, megabytes, measure(peers, megabytes, args.repeats))
    print_table(
        f"The defence's cost in a clean round: {args.repeats} interleaved rounds per variant, loopback, no "
        f"compression\n{machine()}",
        ["peers", "MB", "averager", "round s median [min..max]", "vs hivemind", "averagers' CPU s per round",
         "extra s per round", f"compute s between rounds above which the extra is <= {UTILIZATION_BOUND:.0%}"],
        rows,
    )


if __name__ == "__main__":
    main()
