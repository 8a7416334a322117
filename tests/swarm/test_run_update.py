"""A private run's allow-list changed for every insider by one `swarmd run update`, with real peers and no restart.

The founder (alice, `swarmd run init` then `swarmd join --config`) and an insider that joined from the manifest
alone (bob: --initial-peers and nothing else of the run) average together; carol, whose own list names alice, is
refused by them. `swarmd run update --set network.allowed_peers=[alice,carol]` signs version 2: the founder's peer
publishes it, both insiders apply it at their next epoch boundary, and then alice averages with carol (its only
possible partner: bob is refused now) while bob is refused; nobody restarts.

The toy task at LR 0, slowed down so that three peers fit on two cores.
"""

import json
import time

import yaml

from hivemind.p2p import P2P, PeerID

from daemons import DaemonProcess, peer_config, run_cli

RUN = "private-manifest"
LOCAL = [  # bob's own machine's settings, which no manifest carries
    "--set", "network.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "--set", "network.bootstrap_attempts=1",
    "--set", "metrics.enabled=false", "--set", "checkpoint.enabled=false", "--set", "logging.format=plain",
    "--set", "daemon.tick_interval=0.5", "--set", "daemon.shutdown_timeout=40", "--set", "training.threads=1",
]


def identity(tmp_path, name: str) -> str:
    """A state dir with its identity made in advance, so the list can name the peer before it starts."""
    state = tmp_path / name
    state.mkdir()
    P2P.generate_identity(str(state / "identity.key"))
    return PeerID.from_identity((state / "identity.key").read_bytes()).to_base58()


def _config(tmp_path, *allowed) -> dict:
    return peer_config(
        run_id=RUN,
        task={"name": "toy-regression", "hidden": 32, "frozen_epochs": 1_000_000, "frozen_step_seconds": 0.2,
              "start_file": str(tmp_path / "start")},
        swarm={"target_batch_size": 64, "matchmaking_time": 2.0, "averaging_timeout": 10.0, "load_state_timeout": 10.0,
               "average_state_every": 1_000_000,
               "tracker_opts": {"min_refresh_period": 0.2, "default_refresh_period": 0.5}},
        network={"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "bootstrap_attempts": 1, "allowed_peers": list(allowed)},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )


def groups(status) -> list[int]:
    return [r["group_size"] for r in status["recent_averaging"] if r["outcome"] == "success"]


def _rounds_with_two_since(status, since: float) -> int:
    return sum(1 for r in status["recent_averaging"]
               if r["outcome"] == "success" and r["group_size"] == 2 and r["time"] > since)


def test_one_update_changes_the_allow_list_of_every_insider_without_a_restart(daemons, test_tasks_env, tmp_path):
    ids = {name: identity(tmp_path, name) for name in ("alice", "bob", "carol")}
    (tmp_path / "start").touch()  # the toy task trains at once
    founders = tmp_path / "founder.yaml"
    founders.write_text(yaml.safe_dump(_config(tmp_path, ids["alice"], ids["bob"])))
    founded = run_cli("run", "init", "--config", str(founders), "--state-dir", str(tmp_path / "alice"),
                      env=test_tasks_env)
    assert founded.returncode == 0, founded.stderr
    alice = daemons("alice", _config(tmp_path, ids["alice"], ids["bob"]), env=test_tasks_env,
                    state_dir=tmp_path / "alice")
    join_alice = alice.joining_args()
    bob = DaemonProcess(tmp_path / "bob", {}, env=test_tasks_env, name="bob")
    bob.args = [arg for arg in bob.args if arg not in ("--config", str(bob.config_path))] + [*join_alice, *LOCAL]
    try:
        bob.start()
        carol = daemons("carol", _config(tmp_path, ids["alice"], ids["carol"]), env=test_tasks_env,
                        state_dir=tmp_path / "carol", extra_args=join_alice)
        insiders = (alice, bob)
        for node in insiders:
            node.wait_status(lambda s: max(groups(s), default=1) == 2 and s["manifest"]["version"] == 1,
                             timeout=120, what="the insiders averaging together under manifest v1")
        alice.wait_for(lambda: f"Refused peer {ids['carol']}" in alice.log, timeout=60, what="carol refused")
        pids = [node.proc.pid for node in insiders]

        updated = run_cli("run", "update", "--state-dir", str(tmp_path / "alice"),
                          "--set", f"network.allowed_peers=[{ids['alice']},{ids['carol']}]", env=test_tasks_env)
        assert updated.returncode == 0, updated.stderr
        assert "Live at each peer's next epoch boundary: network.allowed_peers" in updated.stdout, updated.stdout
        since = time.time()
        for node, others in ((alice, 1), (bob, 2)):  # a list always allows its own peer: bob's is alice, carol, bob
            status = node.wait_status(lambda s: s["manifest"]["version"] == 2 and s["allowed_peers"] == others,
                                      timeout=60, what="manifest v2 applied to the allow-list")
            assert status["manifest"]["restart_needed"] == [] and status["manifest"]["started_version"] == 1
            assert "Applied the run's manifest v2 at epoch" in node.log
        # alice's only possible partner now is carol: bob is refused by both
        alice.wait_status(lambda s: _rounds_with_two_since(s, since) >= 1, timeout=60,
                          what="alice averaging with carol")
        carol.wait_status(lambda s: _rounds_with_two_since(s, since) >= 1, timeout=30, what="carol admitted")
        alice.wait_for(lambda: f"Refused peer {ids['bob']}" in alice.log, timeout=30, what="bob refused")
        assert [node.proc.pid for node in insiders] == pids and all(node.proc.poll() is None for node in insiders)
        fingerprint = founded.stdout.split("Key fingerprint: ")[1].split()[0]
        assert alice.status()["manifest"]["key_fingerprint"] == fingerprint
        # what `swarmd status --initial-peers` (and so the monitor) shows: the newest version the swarm serves
        seen = run_cli("status", "--initial-peers", join_alice[1], "--run-id", RUN, "--json", timeout=90)
        assert seen.returncode == 0, seen.stderr
        assert json.loads(seen.stdout)["manifest"]["version"] == 2, seen.stdout[-2000:]
        assert json.loads(seen.stdout)["manifest"]["key_fingerprint"] == fingerprint
    finally:
        bob.close()
