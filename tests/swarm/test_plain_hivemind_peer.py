"""A plain hivemind.Optimizer peer (benchmarks/hivemind_peer.py: no swarmd in its training path) trains in an open
swarmd run: it has no swarmd record, so the compatibility check neither checks nor refuses it, and the two average
gradients together under hivemind's own RPC names."""

import json
import os
import signal
import subprocess
import sys

from daemons import REPO, peer_config


def test_a_plain_hivemind_peer_averages_with_a_swarmd_peer(daemons, test_tasks_env, tmp_path):
    # paced steps (LR 0, 0.3 s each) held back until both have joined: neither races through epochs alone
    config = peer_config(
        task={"name": "toy-regression", "frozen_epochs": 10**6, "frozen_step_seconds": 0.3,
              "start_file": str(tmp_path / "start")},
        swarm={"target_batch_size": 64, "matchmaking_time": 2.0, "averaging_timeout": 20.0},
        training={"batch_size": 16, "seed": 0},
        checkpoint={"enabled": False},
    )
    swarmd_peer = daemons("swarmd", config, env=test_tasks_env)
    swarmd_peer.wait_status(lambda s: s["state"] == "training", timeout=120, what="training")

    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    log = open(tmp_path / "plain.log", "wb")
    plain = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "hivemind_peer.py"), "--config", str(swarmd_peer.config_path),
         "--state-dir", str(plain_dir), "--profile", "tuned",
         *[arg for addr in swarmd_peer.initial_peers() for arg in ("--initial-peers", addr)]],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
        env={**os.environ, **test_tasks_env, "PYTHONUNBUFFERED": "1"},
    )
    try:
        def plain_status():
            if plain.poll() is not None:
                raise AssertionError(f"the plain peer exited with {plain.returncode}: {(tmp_path / 'plain.log').read_text()[-3000:]}")
            path = plain_dir / "status.json"
            return json.loads(path.read_text()) if path.exists() else {}

        def averaged_together(status) -> bool:
            return any(r["kind"] == "gradients" and r["outcome"] == "success" and r["group_size"] == 2
                       for r in status["recent_averaging"])

        # its hivemind.Optimizer is built once its progress tracker reads the swarm (a log line of hivemind's)
        swarmd_peer.wait_for(lambda: plain_status() is not None and "Found no active peers" in
                             (tmp_path / "plain.log").read_text(errors="replace"), 120, "the plain peer's optimizer")
        (tmp_path / "start").touch()
        swarmd_peer.wait_status(averaged_together, timeout=120, what="a gradient round with the plain peer")
        seen = swarmd_peer.wait_for(
            lambda: (lambda s: s if s.get("averaging", {}).get("gradients", {}).get("success", 0) >= 2 else None)(
                plain_status()), 120, "two averaged rounds on the plain peer")
        assert seen["state"] == "training" and seen["num_peers"] == 2, seen
        status = swarmd_peer.status()
        assert status["incompatible_peers"] == [] and status["state"] == "training", status
    finally:
        if plain.poll() is None:
            os.killpg(plain.pid, signal.SIGKILL)
            plain.wait(10)
        log.close()
