"""Bad input at start: the documented exit code, one line naming the problem, no traceback, nothing left over."""

import os
import socket
import stat

import pytest
import yaml

from daemons import peer_config, run_cli

UNREACHABLE = "/ip4/127.0.0.1/tcp/1/p2p/QmTHaX7imb5woUpi9SPeMv2xryqqAscAruYiyV3SNkQxQN"


def join(tmp_path, *args, config=None):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config or peer_config()))
    return run_cli("join", "--config", str(path), "--state-dir", str(tmp_path / "state"), *args, timeout=180)


def assert_one_line(result, code, *fragments):
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    error_lines = [line for line in result.stderr.splitlines() if " ERROR " in line or line.startswith("swarmd: error")]
    assert len(error_lines) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in error_lines[0], error_lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--set", "swarm.no_such_knob=1"], ["unknown key swarm.no_such_knob"]),
        (["--set", "swarm.target_batch_size=lots"], ["swarm.target_batch_size", "valid integer"]),
        (["--initial-peers", "/ip4/999.0.0.1/tcp/31337/p2p/QmTHaX7imb5woUpi9SPeMv2xryqqAscAruYiyV3SNkQxQN"], ["not an IPv4 address"]),
        (["--initial-peers", "127.0.0.1:31337"], ["must start with '/'"]),
    ],
)
def test_config_errors_exit_2(tmp_path, args, fragments):
    assert_one_line(join(tmp_path, *args), 2, *fragments)


def test_missing_and_invalid_config_files_exit_2(tmp_path):
    result = run_cli("join", "--config", str(tmp_path / "nope.yaml"), timeout=60)
    assert_one_line(result, 2, "nope.yaml does not exist")
    broken = tmp_path / "broken.yaml"
    broken.write_text("swarm:\n  target_batch_size: [1, 2\n")
    result = run_cli("join", "--config", str(broken), timeout=60)
    assert_one_line(result, 2, "is not valid YAML at line")


def test_unreachable_initial_peer_exits_3_with_advice(tmp_path):
    config = peer_config(network={"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "bootstrap_attempts": 2, "bootstrap_retry_delay": 0.5})
    result = join(tmp_path, "--initial-peers", UNREACHABLE, config=config)
    assert_one_line(result, 3, "none of the initial peers answered", "--client-mode")
    assert "attempt 1/2" in result.stderr  # it retried, boundedly


def test_port_in_use_exits_3(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = join(tmp_path, "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}")
    assert_one_line(result, 3, "already in use", "--host-maddrs")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_state_dir_exits_3(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    result = run_cli("join", "--state-dir", str(locked / "state"), timeout=60)
    assert_one_line(result, 3, "is not usable", "--state-dir")


def test_state_dir_that_is_a_file_exits_3(tmp_path):
    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    result = run_cli("join", "--state-dir", str(blocker), "--set", "network.host_maddrs=[/ip4/127.0.0.1/tcp/0]", timeout=60)
    assert_one_line(result, 3, "is not usable", "--state-dir")


def test_missing_data_folder_is_a_config_error(tmp_path):
    config = peer_config(task={"name": "swin", "data": {"source": "folder", "path": str(tmp_path / "imagenet")}})
    assert_one_line(join(tmp_path, config=config), 2, "task.data.path", "does not exist")


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_another_swarmd_peer_holds_exits_3(daemons, tmp_path, host):
    """p2pd listens with SO_REUSEPORT: unchecked, a second peer bound the same port too, and both trained and printed
    the same address to join. The same address, and the default 0.0.0.0 next to a peer on 127.0.0.1, both refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = daemons("first", peer_config(network={"host_maddrs": [f"/ip4/127.0.0.1/tcp/{port}"], "bootstrap_attempts": 1}))
    first.join_line()  # p2pd listens
    result = join(tmp_path, "--host-maddrs", f"/ip4/{host}/tcp/{port}")
    assert_one_line(result, 3, f"TCP port {port} is already in use", "--host-maddrs")
    assert first.proc.poll() is None  # the first peer trains on
