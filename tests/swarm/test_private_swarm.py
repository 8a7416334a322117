"""Who may join, with real peers. A private swarm (`network.allowed_peers`): an outsider that knows the run id and an
insider's address is not counted, never averages with the insiders and cannot download their state; once its id is
added to the list file and the insiders get SIGHUP, it joins them. Compatibility: two peers whose model or target
batch size differ from the swarm's (the toy model twice as wide; another target batch size) stop before they
average anything, with exit code 2 and one line naming the difference. One scenario, to start peers only once.

Three peers on the toy task at LR 0, slowed down so that they fit on two cores. The outsider starts once the
insiders train, so their state is on offer: it asks for it at start-up (swarm/initial_state.py) and is refused.
All are at epoch 0 when they start training, so the outsider is in step and tries to join the insiders' groups.
"""

import os
import signal

from hivemind.p2p import P2P, PeerID

from daemons import peer_config


def identity(tmp_path, name: str) -> str:
    """A state dir with its identity made in advance, so the list can name the peer before it starts."""
    state = tmp_path / name
    state.mkdir()
    P2P.generate_identity(str(state / "identity.key"))
    return PeerID.from_identity((state / "identity.key").read_bytes()).to_base58()


def config(tmp_path, allowed_peers=None, step_seconds=0.2, hidden=32, target_batch_size=64) -> dict:
    return peer_config(
        task={"name": "toy-regression", "hidden": hidden, "frozen_epochs": 1_000_000,
              "frozen_step_seconds": step_seconds, "start_file": str(tmp_path / "start")},
        swarm={
            "target_batch_size": target_batch_size,
            "matchmaking_time": 2.0,
            "averaging_timeout": 10.0,
            "load_state_timeout": 10.0,
            "average_state_every": 1_000_000,
            "tracker_opts": {"min_refresh_period": 0.2, "default_refresh_period": 0.5},
        },
        network={"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "bootstrap_attempts": 1,
                 **({"allowed_peers": str(allowed_peers)} if allowed_peers else {})},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )


def groups(status) -> list[int]:
    return [r["group_size"] for r in status["recent_averaging"] if r["outcome"] == "success"]


def test_outsiders_are_refused_until_listed_and_misfits_exit_2(daemons, test_tasks_env, tmp_path):
    ids = {name: identity(tmp_path, name) for name in ("alice", "bob", "outsider")}
    listed = tmp_path / "allowed_peers.txt"
    listed.write_text(f"# the run's peers\n{ids['alice']}\n{ids['bob']}  # bob\n")
    alice = daemons("alice", config(tmp_path, listed), env=test_tasks_env, state_dir=tmp_path / "alice")
    join_alice = alice.joining_args()
    bob = daemons("bob", config(tmp_path, listed), env=test_tasks_env, state_dir=tmp_path / "bob", extra_args=join_alice)
    # it runs a private config of its own (so its records carry its peer id), but the insiders' list lacks it; slower
    # than the insiders, so that after trying to average with them in step it falls behind and asks for the state
    its_own = tmp_path / "outsiders_list.txt"
    its_own.write_text(f"{ids['alice']}\n{ids['bob']}\n")
    insiders = (alice, bob)
    for node in insiders:
        node.wait_status(lambda s: s["state"] == "training", timeout=90, what="training")
    outsider = daemons("outsider", config(tmp_path, its_own, step_seconds=0.6), env=test_tasks_env,
                       state_dir=tmp_path / "outsider", extra_args=join_alice)
    outsider.wait_status(lambda s: s["state"] == "training", timeout=90, what="training")
    misfits = {  # they compare themselves with the swarm's peer records right after joining the DHT
        daemons("wider", config(tmp_path, hidden=64), env=test_tasks_env, extra_args=join_alice):
            "the swarm trains 577 parameters, this config builds 1,153: use the run's config",
        daemons("bigger-batch", config(tmp_path, target_batch_size=128), env=test_tasks_env, extra_args=join_alice):
            "the swarm's target_batch_size is 64, this config's is 128: set swarm.target_batch_size: 64",
    }
    for node, line in misfits.items():
        assert node.proc.wait(60) == 2, node.tail()
        [error] = [text for text in node.log.splitlines() if " ERROR " in text]
        assert line in error, error
        assert "Joined run" not in node.log  # stopped before the optimizer (and its averagers) existed
    # Everyone at epoch 0: the outsider is in step and tries to join the insiders' group of epoch 0, its one chance
    # (once behind, it asks for the state). Only now, with the misfits gone: seen in CI, two daemons starting up
    # beside epoch 0 slowed the outsider past the insiders' matchmaking, and no join was refused.
    (tmp_path / "start").touch()

    def refused_everywhere(_status) -> bool:
        statuses = [node.status() for node in insiders]
        if not all(2 in groups(status) for status in statuses):
            return False  # the insiders have not averaged together yet
        refusals = [status["refusals"] for status in statuses]
        return all(sum(r[where] for r in refusals) for where in ("dht_records", "join_group", "download_state"))

    try:
        alice.wait_status(refused_everywhere, timeout=60, what="the outsider's records, join and download refused")
    except AssertionError as e:  # say which part is missing: the full logs are printed below, but may be cut
        seen = {node.name: (node.status()["refusals"], groups(node.status())) for node in insiders}
        asked = [line[11:] for line in outsider.log.splitlines() if "ownload" in line or "veraging" in line]
        raise AssertionError(f"insiders' refusals and groups: {seen}; the outsider: {asked[-6:]}\n{e}") from None
    for node in insiders:
        status = node.status()
        assert status["allowed_peers"] == 1, status["allowed_peers"]
        assert status["num_peers"] == 2, (node.name, status["num_peers"])  # the outsider's progress is not counted
        assert max(groups(status)) == 2, (node.name, groups(status))
        assert ids["outsider"] not in {peer["peer_id"] for peer in status["peers"]}
        assert f"Refused peer {ids['outsider']}" in node.log
    assert max(groups(outsider.status()), default=1) == 1  # it never averaged with anyone

    listed.write_text(listed.read_text() + f"{ids['outsider']}\n")
    for node in insiders:
        os.kill(node.proc.pid, signal.SIGHUP)
    outsider.wait_status(lambda s: max(groups(s), default=1) >= 2, timeout=60, what="the admitted peer averaging")
    alice.wait_status(lambda s: s["num_peers"] == 3 and s["allowed_peers"] == 2, timeout=30, what="three peers")
    assert "SIGHUP: network.allowed_peers read again: 2 peer(s) (1 added, 0 removed)" in alice.log
