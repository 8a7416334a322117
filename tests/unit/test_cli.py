"""The command line: fast commands stay light, and every user error is one line with its exit code."""

import asyncio
import json
import threading
import time

import pytest

from daemons import blocked_imports_env, run_cli
from samples import sample_snapshot


@pytest.fixture
def without_heavy_packages(tmp_path):
    """A PYTHONPATH where importing torch or hivemind fails loudly, to prove a command does not import them."""
    return blocked_imports_env(tmp_path)


def test_help_does_not_import_torch(without_heavy_packages):
    result = run_cli("--help", env=without_heavy_packages)
    assert result.returncode == 0, result.stderr
    assert "join" in result.stdout and "status" in result.stdout


def test_status_without_a_daemon_is_one_line_and_exit_1(tmp_path, without_heavy_packages):
    for mode in ("--json", "--once"):
        result = run_cli("status", mode, "--state-dir", str(tmp_path), env=without_heavy_packages)
        assert result.returncode == 1, result.stderr
        assert result.stderr.count("\n") == 1
        assert "no swarmd daemon is running" in result.stderr
        assert "Traceback" not in result.stderr


def test_status_from_the_default_state_dir_imports_no_config_code(tmp_path):
    """Neither yaml nor swarmd's pydantic schema (typer itself imports pydantic since 0.2x; the schema is ours)."""
    env = blocked_imports_env(tmp_path, names=("torch", "hivemind", "yaml"))
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # the default state dir: nothing runs there
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # every import, one line each on stderr
    result = run_cli("status", "--json", env=env)
    assert result.returncode == 1, result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "swarmd.cli.status" in imported and "swarmd.config.paths" in imported  # the profile is real
    assert not {name for name in imported if name.startswith(("swarmd.config.schema", "swarmd.config.loader"))}
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and "no swarmd daemon is running" in errors[0], errors


def test_config_validate_reports_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("swarm:\n  target_batch_size: lots\n")
    result = run_cli("config", "validate", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("swarmd: error: config error: swarm.target_batch_size")
    assert result.stderr.count("\n") == 1


def test_config_show_prints_the_effective_config():
    result = run_cli("config", "show", "--set", "swarm.matchmaking_time=9")
    assert result.returncode == 0, result.stderr
    assert "matchmaking_time: 9" in result.stdout
    assert "name: swin" in result.stdout


def test_unknown_option_is_a_usage_error():
    result = run_cli("join", "--no-such-flag")
    assert result.returncode == 2
    assert "No such option" in result.stderr


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("swarmd ")


@pytest.fixture
def fake_daemon(tmp_path):
    """A status socket in tmp_path answering like a training daemon (the real server, a canned snapshot)."""
    from swarmd.status.server import SOCKET_NAME, StatusServer

    snapshot = sample_snapshot(time.time())
    loop = asyncio.new_event_loop()
    server = StatusServer(tmp_path / SOCKET_NAME, lambda: snapshot)
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield tmp_path, snapshot
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_status_json_and_once_read_a_daemon_without_torch(fake_daemon, without_heavy_packages):
    state_dir, snapshot = fake_daemon
    result = run_cli("status", "--json", "--state-dir", str(state_dir), env=without_heavy_packages)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == snapshot

    result = run_cli("status", "--once", "--state-dir", str(state_dir), env={**without_heavy_packages, "COLUMNS": "120"})
    assert result.returncode == 0, result.stderr
    frame = result.stdout
    assert "global epoch 7" in frame and "96 / 128 samples (75%)" in frame
    bar = next(line for line in frame.splitlines() if "samples (75%)" in line)
    assert bar.count("━") == 30 and bar.count("─") == 10  # 75% of a 40-wide bar, readable without colour
    assert "alpha *" in frame and "beta" in frame and "peers (2)" in frame
    assert "Traceback" not in result.stderr


def test_remote_status_usage_errors_are_one_line(without_heavy_packages, tmp_path):
    peer = "/ip4/127.0.0.1/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    cases = [
        (("--initial-peers", peer), "remote mode needs --run-id"),
        (("--initial-peers", "/ip4/1.2.3/tcp/1/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "--run-id", "r"),
         "not a multiaddr"),
        (("--initial-peers", "/ip4/127.0.0.1/tcp/31337", "--run-id", "r"), "no peer id"),
        (("--initial-peers", peer, "--run-id", "bad run"), "is not a run id"),
        (("--initial-peers", peer, "--run-id", "r", "--state-dir", str(tmp_path)), "needs none"),
        (("--run-id", "r"), "--run-id is for remote mode"),
    ]
    for args, message in cases:
        result = run_cli("status", "--json", *args, env=without_heavy_packages)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and message in result.stderr, (args, result.stderr)


def test_join_refuses_a_peer_id_cut_short_at_once(tmp_path, without_heavy_packages):
    """Before anything starts (no torch, no hivemind, no 19 s wait): exit 2, one line naming the fix."""
    cut = "/ip4/127.0.0.1/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXm"
    started = time.monotonic()
    result = run_cli("join", "--state-dir", str(tmp_path / "state"), "--initial-peers", cut, env=without_heavy_packages)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "network.initial_peers" in result.stderr and "cut short" in result.stderr and "`To join:` line" in result.stderr
    assert time.monotonic() - started < 30
