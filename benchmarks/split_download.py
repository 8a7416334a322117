"""A joiner's state download from one donor at a time against one split across three donors (issue 37, item 4).

Three donors and a joiner, each in its own network namespace on one bridge (benchmarks/netlab.py); every donor's
link is limited to --donor-mbit both ways (a home line's upload), the joiner's to --joiner-mbit. The donors hold
the same state (--megabytes of fp32 in eight tensors) and offer it at one epoch. The joiner times
`load_state_from_peers` (from asking to the state in its hands, checked exact), interleaved, --repeats times:
- one at a time: the download as before the split (swarm/upstream/state_stream.py): one donor sends everything;
- split across three: a part from each donor at once, each part compared with the others' samples of it
  (swarm/upstream/split_download.py);
- one at a time, one lies / split, one lies: the same two with one donor serving its state sign-flipped (offering
  the same epoch). One at a time takes the liar's state whenever the liar is asked first (the "exact state" column
  counts the downloads that brought the honest state); split, the liar is outvoted and its part asked again of an
  honest donor (the row says what the defence costs when it has work to do);
- split across two that disagree: the liar and one honest donor only (the third's offer hidden from the joiner).
  Two cannot outvote each other, so the joiner takes the state of the donor that one at a time asks first, asking
  it only for the part it did not send yet; "..., whole state after" is the way before 2026-12-07: the whole state
  again from that donor once the split found no majority.
Ratios divide by "one at a time" of the same repeat.

    sudo .venv/bin/python benchmarks/split_download.py [--megabytes 48] [--donor-mbit 40] [--repeats 3]

Needs root and iproute2. Every process is killed and the namespaces removed on the way out, even on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, print_table  # noqa: E402
from netlab import Lab, cleanup_leftovers, is_root, tbf_args  # noqa: E402

PREFIX = "split-benchmark"
DONORS = 3
JOINER = DONORS  # the lab's last namespace
MODES = ("one at a time", "split across three", "one at a time, one lies", "split, one lies",
         "split across two that disagree", "split across two that disagree, whole state after")
TENSORS = 8


def state(megabytes: float):
    import torch

    generator = torch.Generator().manual_seed(7)
    numel = int(megabytes * 1e6 / 4 / TENSORS)
    return [torch.randn(numel, generator=generator) for _ in range(TENSORS)]


def averager_class():
    """A state averager with swarmd's downloads, a layout (which the split needs) and two switches: `split` (off:
    one donor at a time) and a donor's lie (its tensors sign-flipped while the file `lie_file` exists)."""
    import multiprocessing as mp

    from hivemind.averaging import DecentralizedAverager

    from swarmd.swarm.state_layout import StateLayout
    from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
    from swarmd.swarm.upstream.split_download import SplitsDownloads

    class BenchmarkAverager(UpstreamRpcNames, SplitsDownloads, DecentralizedAverager):
        _upstream = DecentralizedAverager
        _rpc_handlers = None
        lie_file = None

        hidden = None  # a donor's peer id (base58) whose offer this joiner does not see while `two` is set

        def __init__(self, *args, **kwargs):
            # shared: the download runs in the averager's process
            self.split, self.two, self.rest_only = mp.Value("b", 1), mp.Value("b", 0), mp.Value("b", 1)
            super().__init__(*args, **kwargs)

        async def _state_offers(self):
            offers = await super()._state_offers()
            return {peer: epoch for peer, epoch in offers.items()
                    if not (self.two.value and peer.to_base58() == self.hidden)}

        async def _rest_of_the_first(self, *args, **kwargs):
            return await super()._rest_of_the_first(*args, **kwargs) if self.rest_only.value else None

        def state_layout(self, kind):
            with self.get_tensors() as tensors:
                return StateLayout(tuple(tuple(t.shape) for t in tensors))

        async def _download_in_parts(self, kind, offers, waits):
            return await super()._download_in_parts(kind, offers, waits) if self.split.value else None

        def get_current_state(self):
            metadata, tensors, infos = super().get_current_state()
            if self.lie_file is not None and os.path.exists(self.lie_file):
                tensors = [-t for t in tensors]
            return metadata, tensors, infos

    return BenchmarkAverager


def run_donor(args) -> None:
    from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers

    dht = ToleratesExitedCallers(initial_peers=args.initial_peers, host_maddrs=[f"/ip4/{args.address}/tcp/0"], start=True)
    averager = averager_class()(state(args.megabytes), dht, prefix=PREFIX, target_group_size=2, start=True)
    averager.lie_file = args.lie_file
    # blocked only now: the DHT's and averager's processes (and p2pd) must not inherit a mask that ignores SIGTERM
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    print(json.dumps({"maddr": str(dht.get_visible_maddrs()[0])}), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    averager.shutdown()
    dht.shutdown()


def run_joiner(args) -> None:
    import logging

    import torch

    if args.verbose:  # the download's own lines (which donor sent what, why a part was asked again) on stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logging.getLogger("swarmd").addHandler(handler)
        logging.getLogger("swarmd").setLevel(logging.INFO)

    from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
    from swarmd.swarm.upstream.state_stream import state_offers

    expected = state(args.megabytes)
    dht = ToleratesExitedCallers(initial_peers=args.initial_peers, host_maddrs=[f"/ip4/{args.address}/tcp/0"],
                                 start=True)
    joiner_class = averager_class()
    joiner_class.hidden = args.initial_peers[0].rsplit("/p2p/", 1)[1]  # the first donor: an honest one
    joiner = joiner_class([torch.zeros_like(t) for t in expected], dht, prefix=PREFIX, target_group_size=2,
                          client_mode=True, start=True)
    deadline = time.monotonic() + 120
    while len(state_offers(dht.get(f"{PREFIX}.all_averagers", latest=True), joiner.peer_id, None)) < DONORS:
        if time.monotonic() > deadline:
            raise SystemExit("the donors' offers did not reach the joiner in 120 s")
        time.sleep(0.5)
    for _ in range(args.repeats):
        for mode in MODES:
            joiner.split.value = mode.startswith("split")
            joiner.two.value = "two" in mode
            joiner.rest_only.value = not mode.endswith("whole state after")
            lies = "lies" in mode or "disagree" in mode
            Path(args.lie_file).touch() if lies else Path(args.lie_file).unlink(missing_ok=True)
            began = time.perf_counter()
            loaded = joiner.load_state_from_peers(timeout=300)
            seconds = time.perf_counter() - began
            exact = loaded is not None and all(torch.equal(a, b) for a, b in zip(loaded[1], expected))
            print(json.dumps({"mode": mode, "seconds": seconds, "exact": exact}), flush=True)
    joiner.shutdown()
    dht.shutdown()


def measure(args) -> list[dict]:
    """The joiner's results, a dict per download, with the donors and joiner in the lab."""
    with Lab(peers=DONORS + 1, rate_mbit=args.donor_mbit) as lab, tempfile.TemporaryDirectory() as work:
        for namespace, dev in ((lab.namespace(JOINER), f"{lab.prefix}{JOINER}p"),
                               (lab.bridge_namespace, f"{lab.prefix}{JOINER}b")):
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", dev, "root",
                            *tbf_args(args.joiner_mbit)], check=True, timeout=30)
        lie_file = str(Path(work) / "lie")
        processes: list[subprocess.Popen] = []
        try:
            # each process is given every address before it: p2pd finds no route to a peer it has no address of
            # ("routing: not found"), which swarmd's daemons fix with their address records (docs/NAT.md)
            maddrs: list[str] = []
            for index in range(DONORS):
                donor = _start(lab, index, "donor", args, maddrs, lie_file if index == DONORS - 1 else None)
                processes.append(donor)
                started = json.loads(donor.stdout.readline() or "{}")
                if "maddr" not in started:
                    raise SystemExit(f"donor {index} did not start")
                maddrs.append(started["maddr"])
            joiner = _start(lab, JOINER, "joiner", args, maddrs, lie_file)
            processes.append(joiner)
            results = [json.loads(line) for line in joiner.stdout if line.startswith("{")]
            if joiner.wait(60) != 0 or len(results) != args.repeats * len(MODES):
                raise SystemExit(f"the joiner ended early (exit {joiner.returncode}): {len(results)} downloads")
            return results
        finally:
            for process in processes:
                if process.poll() is None:
                    process.terminate()
            for process in processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()


def _start(lab: Lab, index: int, role: str, args, initial: list[str], lie_file: Optional[str]) -> subprocess.Popen:
    command = [*lab.exec_prefix(index), sys.executable, __file__, "--role", role, "--address", lab.address(index),
               "--megabytes", str(args.megabytes), "--repeats", str(args.repeats)]
    command += ["--verbose"] if args.verbose and role == "joiner" else []
    command += ["--initial-peers", *initial] if initial else []
    command += ["--lie-file", lie_file] if lie_file else []
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def report(args, results: list[dict]) -> None:
    by_mode = {mode: [r for r in results if r["mode"] == mode] for mode in MODES}
    base = [r["seconds"] for r in by_mode["one at a time"]]
    rows = []
    for mode in MODES:
        seconds = [r["seconds"] for r in by_mode[mode]]
        ratios = [s / b for s, b in zip(seconds, base)]
        rows.append([mode, f"{statistics.median(seconds):.2f} [{min(seconds):.2f}..{max(seconds):.2f}]",
                     f"{args.megabytes / statistics.median(seconds):.1f}", f"{statistics.median(ratios):.2f}x",
                     f"{sum(r['exact'] for r in by_mode[mode])} of {len(seconds)}"])
    print(f"\n{machine()}")
    print_table(
        f"State download of {args.megabytes:g} MB: {DONORS} donors at {args.donor_mbit:g} Mbit/s each, the joiner at "
        f"{args.joiner_mbit:g} Mbit/s; {args.repeats} repeats, interleaved",
        ["download", "seconds, median [min..max]", "MB/s", "vs one at a time", "exact state"], rows)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=48.0)
    parser.add_argument("--donor-mbit", type=float, default=40.0)
    parser.add_argument("--joiner-mbit", type=float, default=400.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="the joiner's log of each download, on stderr")
    parser.add_argument("--role", choices=("donor", "joiner"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--initial-peers", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--lie-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "donor":
        run_donor(args)
        return 0
    if args.role == "joiner":
        run_joiner(args)
        return 0
    if not is_root():
        print("benchmarks/split_download.py needs root (network namespaces): run it with sudo", file=sys.stderr)
        return 2
    cleanup_leftovers()
    report(args, measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
