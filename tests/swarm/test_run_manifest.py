"""The run's signed manifest with real peers: a founder on the ALBERT micro config, and a peer started with nothing
but --initial-peers (and its own machine's settings) that takes the run's settings from the swarm, trains with the
founder in one model, and pins the run's key. A forged manifest (another key) is refused by the run's peers, a
joiner that trusts another key is refused, and so is the run founded anew under another key by the joiner that
pinned the first."""

import copy
import json
import signal
import subprocess
import sys

import yaml

from daemons import REPO, DaemonProcess, peer_config, run_cli

RUN = "manifest-run"
# this machine's settings, which no manifest carries: loopback, any port, quick ticks, one thread
LOCAL = [
    "--set", "network.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "--set", "network.bootstrap_attempts=1",
    "--set", "metrics.listen=127.0.0.1:0", "--set", "logging.format=plain", "--set", "daemon.tick_interval=0.5",
    "--set", "daemon.shutdown_timeout=40", "--set", "training.threads=1",
]


def _founders_config() -> dict:
    task = copy.deepcopy(yaml.safe_load((REPO / "configs" / "albert-micro.yaml").read_text())["task"])
    task["eval_every_epochs"] = 0
    task["data"]["generated"] = {"documents": 400, "vocab_size": 400, "max_seq_length": 32}  # generated in seconds
    return peer_config(run_id=RUN, task=task, swarm={"target_batch_size": 64}, training={"batch_size": 16})


def averaged_with_two(status) -> bool:
    return any(r["outcome"] == "success" and r["group_size"] == 2 for r in status["recent_averaging"])


def _joiner(tmp_path, founder, *extra) -> DaemonProcess:
    joiner = DaemonProcess(tmp_path / "joiner", {}, name="joiner")
    joiner.args = [arg for arg in joiner.args if arg not in ("--config", str(joiner.config_path))]
    joiner.args += [*founder.joining_args(), *LOCAL, *extra]
    return joiner


def test_a_peer_with_only_initial_peers_trains_the_founders_run_in_one_model(daemons, tmp_path):
    config = _founders_config()
    # where the corpus is generated is each peer's own setting (not in the manifest): here both use the founder's
    config["task"]["data"]["path"] = str(tmp_path / "corpus")
    config_file = tmp_path / "founder.yaml"
    config_file.write_text(yaml.safe_dump(config))
    founded = run_cli("run", "init", "--config", str(config_file), "--state-dir", str(tmp_path / "founder"))
    assert founded.returncode == 0, founded.stderr
    fingerprint = founded.stdout.split("Key fingerprint: ")[1].split()[0]

    founder = daemons("founder", config, state_dir=tmp_path / "founder")
    line = founder.join_line()
    assert "--config" not in line, line  # the one-line join: the swarm carries the run's settings
    joiner = _joiner(tmp_path, founder, "--set", f"task.data.path={tmp_path / 'corpus'}").start()
    try:
        statuses = [node.wait_status(lambda s: (s["local_epoch"] or 0) >= 2 and averaged_with_two(s), timeout=120,
                                     what="2+ global epochs averaged by the two peers") for node in (founder, joiner)]
        assert f"joining run {RUN} (manifest v1, key {fingerprint[:16]})" in joiner.log
        assert (tmp_path / "joiner" / "run-keys" / f"{RUN}.pinned").read_text().strip() == fingerprint
        assert statuses[0]["compatibility"] == statuses[1]["compatibility"]  # one model: same task, shapes, settings
        assert statuses[0]["start_values"] == statuses[1]["start_values"]
        assert statuses[1]["target_batch_size"] == 64 and statuses[1]["task"] == "albert"

        _forge_a_manifest(founder.initial_peers())
        # at once: what a reader shows (the founder's key alone) and a joiner that trusts another key (refused)
        show = _cli("run", "show", "--initial-peers", founder.initial_peers()[0], "--json")
        stranger = _cli("join", *founder.joining_args(), "--run-key", "f" * 64, "--state-dir",
                        str(tmp_path / "stranger"), *LOCAL)
        shown, refused = [process.communicate(timeout=60) for process in (show, stranger)]
        assert show.returncode == 0, shown[1]
        assert json.loads(shown[0])["key_fingerprint"] == fingerprint  # the forgery was not stored
        assert stranger.returncode == 2 and "refusing it" in refused[1], refused[1]
        for node in (founder, joiner):  # both stop at once: each SIGTERM once (a second forces the exit)
            node._remember_descendants()
            node.proc.send_signal(signal.SIGTERM)
        for node in (founder, joiner):
            assert node.proc.wait(timeout=60) == 0, node.tail()
            assert node.leftover_processes() == [], node.tail()
    finally:
        joiner.close()
    _refounded_run_is_refused(daemons, tmp_path, config, config_file, fingerprint)


def _refounded_run_is_refused(daemons, tmp_path, config, config_file, fingerprint):
    """The run founded anew under the same id and another key (its founder's state dir, and key, lost): the
    joiner, which pinned the first key when it joined, refuses it rather than follow a key nobody vouched for. And a
    newcomer that sets a run-wide key otherwise is refused by the manifest."""
    refounded = run_cli("run", "init", "--config", str(config_file), "--state-dir", str(tmp_path / "refounder"))
    assert refounded.returncode == 0, refounded.stderr
    assert refounded.stdout.split("Key fingerprint: ")[1].split()[0] != fingerprint
    refounder = daemons("refounder", config, state_dir=tmp_path / "refounder")
    refounder.join_line()
    # a newcomer whose own settings contradict a run-wide key of the manifest stops before it joins
    conflicting = run_cli("join", *refounder.joining_args(), "--state-dir", str(tmp_path / "conflicting"),
                          "--set", "swarm.target_batch_size=32", *LOCAL, timeout=120)
    assert conflicting.returncode == 2, conflicting.stderr
    assert "swarm.target_batch_size is run-wide: the run's manifest v1 says 64, this peer's settings say 32" in \
        conflicting.stderr, conflicting.stderr
    result = run_cli("join", *refounder.joining_args(), "--state-dir", str(tmp_path / "joiner"),
                     "--manifest-wait", "15", *LOCAL, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "signed by another key than the run's key this peer trusts" in result.stderr, result.stderr
    assert (tmp_path / "joiner" / "run-keys" / f"{RUN}.pinned").read_text().strip() == fingerprint  # unchanged


def test_a_peer_with_only_initial_peers_trains_a_diloco_founders_run_in_one_model(daemons, tmp_path):
    """The founder's run on ALBERT micro under DiLoCo (H = 4): the config-less joiner takes the strategy and H from
    the manifest and averages its pseudo-gradients with the founder's in outer rounds of two, in one model."""
    config = _founders_config()
    config["swarm"] = {**config["swarm"], "strategy": "diloco",
                       "diloco": {"inner_steps": 4, "max_straggler_wait": 10.0}}
    # Under DiLoCo the schedule counts inner steps, and LAMB's steps are a fixed share of each weight's norm: at the
    # recipe's lr 0.05 the outer Nesterov step (0.7, momentum 0.9) made the founder, alone for its first ~40 outer
    # steps, diverge (loss 6.7 -> 44-99, then no finite gradient and no round: a CI failure); at 0.01 it trains.
    config["task"]["optim"] = {**config["task"]["optim"], "lr": 0.01, "warmup_epochs": 16, "total_epochs": 4000}
    config["task"]["data"]["path"] = str(tmp_path / "corpus")
    config_file = tmp_path / "founder.yaml"
    config_file.write_text(yaml.safe_dump(config))
    founded = run_cli("run", "init", "--config", str(config_file), "--state-dir", str(tmp_path / "founder"))
    assert founded.returncode == 0, founded.stderr
    founder = daemons("founder", config, state_dir=tmp_path / "founder")
    founder.join_line()
    joiner = _joiner(tmp_path, founder, "--set", f"task.data.path={tmp_path / 'corpus'}").start()
    try:
        def outer_rounds_of_two(status) -> bool:
            return (status["local_epoch"] or 0) >= 2 and any(
                r["kind"] == "outer" and r["outcome"] == "success" and r["group_size"] == 2
                for r in status["recent_averaging"])

        statuses = [node.wait_status(outer_rounds_of_two, timeout=150, what="2+ outer steps averaged by the two")
                    for node in (founder, joiner)]
        assert statuses[0]["compatibility"] == statuses[1]["compatibility"]  # one model: task, shapes, strategy, H
        assert statuses[0]["start_values"] == statuses[1]["start_values"]
        compatibility = statuses[1]["compatibility"]
        assert (compatibility["strategy"], compatibility["inner_steps"]) == ("diloco", 4), compatibility
        # training, not diverging: the MLM + SOP loss of the untrained model is ln(400) + ln(2) = 6.7
        assert all(status["loss"] is not None and status["loss"] < 7.5 for status in statuses), statuses
    finally:
        joiner.close()


def _cli(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "swarmd", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)


def _forge_a_manifest(initial_peers):
    """Another key signs the run's settings with a smaller target batch and offers it to the run's peers."""
    import hivemind
    from hivemind.utils import get_dht_time

    from swarmd.swarm import manifest as mf
    from swarmd.swarm.manifest_records import RUNS_KEY, manifest_key, subkey_of

    config = {**_founders_config(), "swarm": {"target_batch_size": 1}}
    forged = mf.sign(mf._crypto().RSAPrivateKey(), run_id=RUN, version=99, config=config)
    dht = hivemind.DHT(initial_peers=initial_peers, client_mode=True, start=True,
                       host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        until = get_dht_time() + 300
        # every node it can reach is a peer of the run, which trusts the founder's key: none stores the forgery
        assert not dht.store(manifest_key(RUN), forged.envelope, until, subkey=subkey_of(forged))
        dht.store(RUNS_KEY, forged.fingerprint, until, subkey=RUN)
    finally:
        dht.shutdown()


def test_a_joiner_finding_no_manifest_stops_with_a_clear_error(tmp_path):
    import hivemind

    swarm = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])  # a swarm that serves no manifest
    try:
        address = str(swarm.get_visible_maddrs()[0])
        result = run_cli("join", "--initial-peers", address, "--state-dir", str(tmp_path / "joiner"),
                         "--manifest-wait", "3", *LOCAL, timeout=90)
    finally:
        swarm.shutdown()
    assert result.returncode == 2, result.stderr
    assert "no peer at --initial-peers served a run's manifest within 3 s" in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("swarmd: error: no peer at --initial-peers") and "pass --config" in last, result.stderr


def test_a_run_without_a_manifest_is_joined_with_the_commands_own_settings_as_before(daemons, shared_data, tmp_path):
    """Today's way: a founder with a config file and no run key publishes no manifest; a peer that names the run
    (the founder's `To join:` line) and passes no config sees the run's peer records without a manifest and starts
    with its own settings, at once rather than after the whole wait."""
    task = {"name": "swin", "data": {"path": str(shared_data)}}
    founder = daemons("founder", peer_config(task=task), state_dir=tmp_path / "founder")
    line = founder.join_line()
    assert "--config" in line, line
    founder.wait_status(lambda s: s["state"] == "training", timeout=90, what="training")
    joiner = _joiner(tmp_path, founder, "--run-id", "test-run", "--set", f"task.data.path={shared_data}",
                     "--manifest-wait", "60").start()
    try:
        joiner.wait_for(lambda: "publishes no manifest: joining with this command's own settings" in joiner.log,
                        timeout=45, what="the fallback to the command's own settings")
        joiner.wait_for(lambda: "To join:" in joiner.log, timeout=60, what="the joiner's own start")
    finally:
        joiner.close()
