"""All-reduce throughput: one hivemind averaging round against a raw TCP transfer of the same bytes.

For each (peers, size): N DHT + averager processes on 127.0.0.1 each hold `size` MB of float32; they matchmake
(not timed), then are triggered together and the all-reduce itself is timed. Effective MB/s = size / time.
The physical limit is measured in the same run: a raw TCP transfer of the same bytes between two processes on
loopback. Butterfly all-reduce moves 2(N-1)/N x size per peer, so the ideal time is that over the TCP rate.
Where the time goes: the CPU seconds the averager processes and the p2pd daemons spend during the timed rounds
(every byte is serialized by the averager, handed to its p2pd over a Unix socket, encrypted by libp2p, and
the reverse on the other side).

    python benchmarks/allreduce.py [--sizes 10 100] [--peers 2 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time

from common import cpu_seconds, interleave, machine, print_table, process_name, summary

from swarmd.swarm.children import descendant_pids

_CHUNK = 1 << 20


def raw_tcp_seconds(num_bytes: int) -> float:
    """Seconds to push num_bytes from one process to another over a loopback TCP socket."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    child = mp.get_context("fork").Process(target=_sink, args=(port, num_bytes))
    child.start()
    conn, _ = server.accept()
    payload = bytes(_CHUNK)
    started = time.perf_counter()
    sent = 0
    while sent < num_bytes:
        sent += conn.send(payload[: min(_CHUNK, num_bytes - sent)])
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the sink acknowledges once it has read everything
    elapsed = time.perf_counter() - started
    conn.close()
    server.close()
    child.join()
    return elapsed


def _sink(port: int, num_bytes: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    received = 0
    while received < num_bytes:
        chunk = sock.recv(_CHUNK)
        if not chunk:
            break
        received += len(chunk)
    sock.send(b"k")
    sock.close()


class Swarm:
    """N DHT nodes and averagers holding `megabytes` MB each, kept alive across rounds."""

    def __init__(self, peers: int, megabytes: float, averager=None, tag: str = "", **averager_kwargs):
        """`averager`: the averager class (hivemind's DecentralizedAverager by default), built with
        `averager_kwargs` besides the benchmark's; `tag` tells swarms of the same shape apart."""
        import hivemind
        import torch

        averager = averager or hivemind.averaging.DecentralizedAverager
        self.dhts, self.averagers = [], []
        self.cpu_per_round: list[dict[str, float]] = []
        numel = int(megabytes * 1e6 / 4)
        for index in range(peers):
            initial = [str(a) for a in self.dhts[0].get_visible_maddrs()] if self.dhts else []
            dht = hivemind.DHT(start=True, initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
            self.dhts.append(dht)
            tensors = [torch.randn(numel // 4) for _ in range(4)]
            self.averagers.append(
                averager(
                    tensors, dht, prefix=f"bench{tag}{peers}x{int(megabytes * 1000)}", target_group_size=peers,
                    min_group_size=peers, min_matchmaking_time=3.0, request_timeout=1.0, start=True, **averager_kwargs,
                )
            )

    def round_seconds(self) -> float:
        from hivemind.averaging.control import AveragingStage
        from hivemind.utils import get_dht_time

        start_at = get_dht_time() + 4.0
        controls = [a.step(scheduled_time=start_at, require_trigger=True, wait=False, timeout=120) for a in self.averagers]
        deadline = time.monotonic() + 60
        while not all(c.stage == AveragingStage.AWAITING_TRIGGER for c in controls):
            if time.monotonic() > deadline or any(c.done() for c in controls):
                raise RuntimeError(f"matchmaking failed: {[c.stage for c in controls]}")
            time.sleep(0.01)
        cpu_before = self._cpu_by_role()
        started = time.perf_counter()
        for control in controls:
            control.allow_allreduce()
        groups = [control.result(120) for control in controls]
        elapsed = time.perf_counter() - started
        cpu_after = self._cpu_by_role()
        self.cpu_per_round.append({role: cpu_after[role] - cpu_before[role] for role in cpu_after})
        if any(len(group) != len(self.averagers) for group in groups):
            raise RuntimeError("a round ran with a partial group")
        return elapsed

    def _cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the averager processes, the p2pd daemons and the DHT processes, summed per role."""
        averagers = {averager.pid for averager in self.averagers}
        totals = {"averagers": 0.0, "p2pd": 0.0, "dht": 0.0}
        for pid in descendant_pids(os.getpid()):
            try:
                role = "averagers" if pid in averagers else "p2pd" if process_name(pid) == "p2pd" else "dht"
                totals[role] += cpu_seconds(f"/proc/{pid}/stat")
            except OSError:  # the process ended meanwhile
                continue
        return totals

    def close(self) -> None:
        for averager in self.averagers:
            averager.shutdown()
        for dht in self.dhts:
            dht.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 100], help="MB of float32 per peer")
    parser.add_argument("--peers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rows = []
    for megabytes in args.sizes:
        for peers in args.peers:
            print(f"{peers} peers, {megabytes:g} MB:", flush=True)
            swarm = Swarm(peers, megabytes)
            try:
                num_bytes = int(megabytes * 1e6)
                results = interleave(
                    {"allreduce": swarm.round_seconds, "raw_tcp": lambda: raw_tcp_seconds(num_bytes)}, args.repeats
                )
                cpu = {role: statistics.median(r[role] for r in swarm.cpu_per_round) for role in ("averagers", "p2pd")}
            finally:
                swarm.close()
            allreduce, tcp = statistics.median(results["allreduce"]), statistics.median(results["raw_tcp"])
            tcp_rate = megabytes / tcp
            ideal = 2 * (peers - 1) / peers * megabytes / tcp_rate
            rows.append([
                f"{peers}", f"{megabytes:g}", summary(results["allreduce"]), f"{megabytes / allreduce:.1f}",
                f"{tcp_rate:.0f}", f"{ideal:.3f}", f"{allreduce / ideal:.1f}x",
                f"{cpu['averagers']:.2f} / {cpu['p2pd']:.2f}",
            ])
    print_table(
        f"All-reduce (hivemind DecentralizedAverager, no compression) vs raw TCP on loopback, "
        f"{args.repeats} interleaved repeats\n{machine()}",
        ["peers", "MB", "round s median [min..max]", "effective MB/s", "raw TCP MB/s", "ideal s", "round/ideal",
         "CPU s in round: averagers / p2pd"],
        rows,
    )


if __name__ == "__main__":
    main()
