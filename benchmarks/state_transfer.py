"""A state download against the transport under it and a raw TCP copy, side by side (issue 15).

The same bytes (--megabytes, default 241: the join benchmark's 20M-parameter state) on loopback, three ways,
interleaved:
- raw TCP: a socket pair in this process, 1 MB writes;
- p2pd stream: one hivemind `P2P` to another through a binary stream (the swarm's authenticated, encrypted
  libp2p connection through each side's p2pd), 64 kB writes as hivemind's parts;
- hivemind state download: `load_state_from_peers` of a `DecentralizedAverager` holding fp32 tensors of that size
  (what a plain hivemind joiner does), protobuf parts of 64 kB through the same p2pd;
- swarmd state download: the same with swarmd's state stream (swarm/upstream/state_stream.py): the tensors' raw bytes on
  one stream, read into shared memory.
Each ratio divides by the row above (or by the p2pd stream's) in the same repeat.

    python benchmarks/state_transfer.py [--megabytes 241] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleave, machine, print_table  # noqa: E402

PART = 64 * 1024  # hivemind's DEFAULT_MAX_MSG_SIZE split of a streamed tensor


def raw_tcp_seconds(size: int) -> float:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    chunk = b"x" * (1 << 20)

    def serve():
        connection, _ = listener.accept()
        with connection:
            for _ in range(size // len(chunk)):
                connection.sendall(chunk)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with socket.create_connection(listener.getsockname()) as client:
        began, received = time.perf_counter(), 0
        while received < size // len(chunk) * len(chunk):
            data = client.recv(1 << 20)
            if not data:
                break
            received += len(data)
        seconds = time.perf_counter() - began
    server.join()
    listener.close()
    return seconds


def p2pd_stream_seconds(size: int) -> float:
    from hivemind.p2p import P2P

    async def run() -> float:
        server = await P2P.create()
        client = await P2P.create(initial_peers=await server.get_visible_maddrs())
        chunk = b"x" * PART

        async def handler(_info, _reader, writer):
            for _ in range(size // PART):
                writer.write(chunk)
                await writer.drain()
            writer.close()

        try:
            await server.add_binary_stream_handler("state-transfer-benchmark", handler)
            began = time.perf_counter()
            _, reader, writer = await client.call_binary_stream_handler(server.peer_id, "state-transfer-benchmark")
            received = 0
            while received < size // PART * PART:
                data = await reader.read(1 << 20)
                if not data:
                    break
                received += len(data)
            seconds = time.perf_counter() - began
            writer.close()
            return seconds
        finally:
            await client.shutdown()
            await server.shutdown()

    return asyncio.run(run())


def state_download_seconds(size: int, streamed: bool) -> float:
    import torch
    from hivemind import DHT
    from hivemind.averaging import DecentralizedAverager

    from swarmd.swarm.upstream.state_stream import DownloadsState

    class StreamingAverager(DownloadsState, DecentralizedAverager):
        pass

    averager_class = StreamingAverager if streamed else DecentralizedAverager

    first = DHT(start=True)
    second = DHT(initial_peers=first.get_visible_maddrs(), start=True)
    values = size // 4 // 8
    tensors = [torch.randn(values) for _ in range(8)]
    donor = averager_class(tensors, first, prefix="state-transfer", target_group_size=2, start=True)
    joiner = averager_class([torch.zeros(values) for _ in range(8)], second, prefix="state-transfer",
                            target_group_size=2, start=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the donor's "I have state" declaration is visible to the joiner
            began = time.perf_counter()
            loaded = joiner.load_state_from_peers(timeout=120)
            if loaded is not None:
                seconds = time.perf_counter() - began
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the joiner found no peer to download the state from within 60 s")
            time.sleep(0.5)
        _, received = loaded
        assert all(torch.equal(a, b) for a, b in zip(received, tensors)), "the downloaded state differs"
        return seconds
    finally:
        for node in (joiner, donor):
            node.shutdown()
        for node in (second, first):
            node.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=241.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    size = int(args.megabytes * 1e6) // (1 << 20) * (1 << 20)  # whole 1 MB writes for the raw copy
    variants = {
        "raw TCP": lambda: raw_tcp_seconds(size),
        "p2pd stream": lambda: p2pd_stream_seconds(size),
        "hivemind state download": lambda: state_download_seconds(size, streamed=False),
        "swarmd state download": lambda: state_download_seconds(size, streamed=True),
    }
    results = interleave(variants, args.repeats)

    def ratio(seconds, base) -> str:  # per repeat: this row's seconds over the base row's in the same repeat
        ratios = [s / b for s, b in zip(seconds, base)]
        return f"{statistics.median(ratios):.1f}x [{min(ratios):.1f}..{max(ratios):.1f}]"

    rows, previous = [], None
    for name, seconds in results.items():
        rates = [size / s / 1e6 for s in seconds]
        rows.append([
            name, f"{statistics.median(seconds):.3f} [{min(seconds):.3f}..{max(seconds):.3f}]",
            f"{statistics.median(rates):.0f}", ratio(seconds, previous) if previous else "-",
            ratio(seconds, results["p2pd stream"]) if name.endswith("download") else "-",
        ])
        previous = seconds
    print_table(
        f"{size / 1e6:.0f} MB on loopback, {args.repeats} interleaved repeats\n{machine()}",
        ["path", "seconds median [min..max]", "MB/s", "time vs the row above", "time vs the p2pd stream"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
