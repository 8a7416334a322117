"""Can one home peer reach another through a public peer's relay? Measured in the router lab (benchmarks/routerlab.py).

issue 33: two home peers behind different masquerading routers have no path to each other (docs/NAT.md), so a
group holding both as reducers cannot complete, and a late home peer cannot download the state from a home peer.
hivemind 1.1.12's p2pd has circuit relay v2: every peer serves as a relay by default, and a peer behind NAT can
hold a reservation on one (AutoRelay) through which others dial it. In the lab with swarmd's settings AutoRelay
never started: it starts only once AutoNAT has decided the peer is private, which it never did with one public
peer to ask. This script starts three plain hivemind DHT nodes (public0, home0, home1; no swarmd), the home ones
with p2pd's `-forceReachabilityPrivate -autoRelay` (hivemind's `force_reachability="private"`,
`use_auto_relay=True`), and measures how long until home1 can open a connection to home0 through public0's relay
(`/ip4/<public0>/tcp/<port>/p2p/<public0>/p2p-circuit`) and ping home0's DHT node over it.

    sudo .venv/bin/python benchmarks/home_relay.py [--homes-forced-private | --no-force] [--timeout 400]

Needs root, iproute2 and nftables. Every node is killed and the lab torn down on the way out, even on failure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import routerlab  # noqa: E402
from common import machine, print_table, raise_exit  # noqa: E402

PORT = 40100
# hivemind's vendored multiaddr writes /p2p/<id> as a CID (0x01 0x72 + multihash); p2pd reads a bare multihash and
# answers "length greater than remaining number of bytes in buffer": rewrite the component's bytes
_CID_P2P, _MULTIHASH_P2P = bytes.fromhex("a503240172"), bytes.fromhex("a50322")


def circuit_address(relay_address: str):
    from hivemind.utils.multiaddr import Multiaddr

    return Multiaddr(Multiaddr(f"{relay_address}/p2p-circuit").to_bytes().replace(_CID_P2P, _MULTIHASH_P2P))


async def _dial_through(_dht, node, target: str, relay_address: str):
    """In the DHT's process: connect to `target` through the relay, then ping its DHT node (None: no answer)."""
    from hivemind.p2p import PeerID

    peer = PeerID.from_base58(target)
    try:
        await node.p2p._client.connect(peer, [circuit_address(relay_address)])
    except Exception as e:  # noqa: BLE001 - the reason is the measurement
        return f"no connection: {str(e).splitlines()[-1][:160]}", None
    return "connected", await node.protocol.call_ping(peer, validate=False)


def run_node(role: str, out: Path, initial: list[str], private: bool) -> None:
    """One DHT node (inside a lab namespace): writes {peer_id, dial} to `out` every 2 s; dials `out.target`."""
    from hivemind import DHT

    identity = out.with_suffix(".key")
    identity.unlink(missing_ok=True)  # an RSA identity (Qm...): the id kind swarmd peers use
    extra = {"force_reachability": "private", "use_auto_relay": True} if private else {}
    dht = DHT(host_maddrs=[f"/ip4/0.0.0.0/tcp/{PORT}"], initial_peers=initial, identity_path=str(identity),
              start=True, **extra)
    started, dial = time.monotonic(), None
    try:
        while True:
            target_file = out.with_suffix(".target")
            if target_file.exists():
                target, relay = target_file.read_text().split()
                began = time.monotonic()
                outcome, answer = dht.run_coroutine(functools.partial(_dial_through, target=target, relay_address=relay))
                dial = {"outcome": outcome, "pinged": answer is not None, "seconds": time.monotonic() - began,
                        "since_start": time.monotonic() - started}
            out.write_text(json.dumps({"peer_id": dht.peer_id.to_base58(), "dial": dial}))
            time.sleep(2)
    finally:
        dht.shutdown()


def _read(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def measure(private: bool, timeout: float, work: Path) -> dict:
    lab = routerlab.RouterLab(public=1, homes=2)
    nodes: list[subprocess.Popen] = []

    def start(namespace: str, role: str, *initial: str) -> Path:
        out = work / f"{role}.json"
        for stale in (out, out.with_suffix(".target")):
            stale.unlink(missing_ok=True)
        args = [sys.executable, __file__, "--node", role, str(out), *(["--private"] if private and role != "public0"
                                                                         else []), *initial]
        log = open(work / f"{role}.log", "w")
        nodes.append(subprocess.Popen([*lab.exec_prefix(namespace), *args], stdout=log, stderr=subprocess.STDOUT))
        return out

    with lab:
        try:
            public = start(lab.public_namespace(0), "public0")
            deadline = time.monotonic() + 60
            while _read(public) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"public0 did not start: see {work / 'public0.log'}")
                time.sleep(0.5)
            relay = f"/ip4/{lab.public_address(0)}/tcp/{PORT}/p2p/{_read(public)['peer_id']}"
            started = time.monotonic()
            home0 = start(lab.home_namespace(0), "home0", relay)
            home1 = start(lab.home_namespace(1), "home1", relay)
            while _read(home0) is None or _read(home1) is None:
                time.sleep(0.5)
            home1.with_suffix(".target").write_text(f"{_read(home0)['peer_id']} {relay}")
            last = None
            while time.monotonic() - started < timeout:
                dial = (_read(home1) or {}).get("dial")
                if dial and "dial backoff" not in dial["outcome"]:  # p2pd's "backoff" hides why the last dial failed
                    last = dial
                if last and last["pinged"]:
                    break
                time.sleep(2)
            return {"private": private, "seconds": time.monotonic() - started, "last": last}
        finally:
            for node in nodes:
                node.kill()
            for node in nodes:
                node.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--node":
        role, out, *rest = sys.argv[2:]
        private = "--private" in rest
        run_node(role, Path(out), [a for a in rest if a != "--private"], private)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-force", action="store_true", help="home nodes as swarmd starts them (no forced "
                                                                "private reachability, no AutoRelay)")
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds to wait for the dial (default 400)")
    parser.add_argument("--work-dir", default="/tmp/swarmd-home-relay", help="the nodes' logs and files")
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, raise_exit)  # a kill stops the nodes and tears the lab down like Ctrl-C
    missing = routerlab.missing_tools()
    if missing:
        sys.exit(f"home_relay.py needs {', '.join(missing)} (run as root; apt-get install iproute2 nftables)")
    work = Path(options.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    result = measure(not options.no_force, options.timeout, work)
    last = result["last"] or {}
    homes = "forced private + AutoRelay" if result["private"] else "as swarmd starts them"
    reached = "pinged over the relay" if last.get("pinged") else "no"
    print_table(machine(), ["home peers", "home1 -> home0 through public0", "after (s)", "last outcome"],
                [[homes, reached, f"{result['seconds']:.0f}", last.get("outcome", "no dial yet")]])
    print(f"(logs: {work}; a node's p2pd messages: HIVEMIND_LOGLEVEL=DEBUG GOLOG_LOG_LEVEL=error,autorelay=debug)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
