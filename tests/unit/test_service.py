"""The shipped systemd units and `swarmd service install`."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from daemons import REPO, run_cli
from swarmd.config.schema import DaemonConfig
from swarmd.install import SHIPPED_EXEC, InstallError, exec_command, install_service

UNITS = REPO / "systemd"
PEER_UNITS = ["swarmd.service", "swarmd@.service"]
SHIPPED = [*PEER_UNITS, "swarmd-monitor.service"]


@pytest.fixture
def systemd_analyze():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("SWARMD_REQUIRE_TOOLS") == "1":
            pytest.fail("systemd-analyze is required (SWARMD_REQUIRE_TOOLS=1): apt-get install systemd")
        pytest.skip("systemd-analyze is not installed")
    return tool


def verify(tool, *paths) -> str:
    result = subprocess.run([tool, "verify", *map(str, paths)], capture_output=True, text=True, timeout=60)
    return (result.stdout + result.stderr).strip()


def read_unit(path: Path) -> dict[str, list[str]]:
    """key -> values, over all sections (enough for these units)."""
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def seconds(value: str) -> float:
    units = {"s": 1, "min": 60, "h": 3600, "": 1}
    match = re.fullmatch(r"(\d+)(s|min|h|)", value)
    return int(match.group(1)) * units[match.group(2)]


def test_shipped_units_verify_cleanly_with_a_real_executable(systemd_analyze, tmp_path):
    """`systemd-analyze verify` checks that ExecStart's program exists, and /usr/local/bin/swarmd need not exist
    here. So the shipped files are verified twice: as they are, where the only complaint allowed is that missing
    program, and as copies whose ExecStart names the console script this test runs with (what `swarmd service
    install` writes), which must print nothing at all."""
    command = exec_command()
    for name in SHIPPED:
        shipped = (UNITS / name).read_text()
        as_is = verify(systemd_analyze, UNITS / name)
        for line in as_is.splitlines():
            assert f"Command {SHIPPED_EXEC} is not executable" in line, as_is
        copy = tmp_path / name
        copy.write_text(shipped.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={' '.join(command)} "))
        assert copy.read_text().count(" ".join(command)) == 1  # nothing else changed
    assert verify(systemd_analyze, tmp_path / "swarmd.service") == ""
    assert verify(systemd_analyze, tmp_path / "swarmd-monitor.service") == ""
    # the template is checked as itself (instance "i") and as an instance loaded from it
    assert verify(systemd_analyze, tmp_path / "swarmd@.service", tmp_path / "swarmd@albert.service") == ""


def test_verify_would_catch_a_broken_unit(systemd_analyze, tmp_path):
    broken = (UNITS / "swarmd.service").read_text().replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={exec_command()[0]} ")
    (tmp_path / "swarmd.service").write_text(broken.replace("KillMode=mixed", "KillMode=mixd"))
    assert "mixd" in verify(systemd_analyze, tmp_path / "swarmd.service")


@pytest.mark.parametrize("name", PEER_UNITS)
def test_units_say_what_the_issue_asks(name):
    unit = read_unit(UNITS / name)
    one = {key: values[-1] for key, values in unit.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert seconds(one["WatchdogSec"]) >= 60
    assert one["Restart"] == "on-failure" and seconds(one["RestartSec"]) >= 5
    assert "2" in one["RestartPreventExitStatus"].split()  # exit 2: configuration error
    # longer than the documented graceful-stop bound (the daemon also extends it to its configured bound)
    assert seconds(one["TimeoutStopSec"]) > DaemonConfig().shutdown_timeout
    assert one["KillMode"] == "mixed"  # SIGTERM to swarmd only: it stops hivemind's processes in order
    assert int(one["LimitNOFILE"]) >= 65536
    assert one["User"] == "swarmd" and one["ConfigurationDirectory"] == "swarmd"
    assert one["NoNewPrivileges"] == "yes" and one["ProtectSystem"] == "strict"
    assert one["ProtectHome"] == "yes" and one["PrivateTmp"] == "yes"
    assert "PrivateDevices" not in one and "DevicePolicy" not in one and "ProtectClock" not in one  # the GPU
    assert "AF_NETLINK" in one["RestrictAddressFamilies"]
    if name == "swarmd@.service":
        assert one["StateDirectory"] == "swarmd/%i"
        assert one["ExecStart"] == f"{SHIPPED_EXEC} join --config %E/swarmd/%i.yaml"
    else:
        assert one["StateDirectory"] == "swarmd"
        assert one["ExecStart"] == f"{SHIPPED_EXEC} join --config %E/swarmd/swarmd.yaml"


def test_the_monitor_unit_runs_the_monitor_of_the_peers_config():
    one = {key: values[-1] for key, values in read_unit(UNITS / "swarmd-monitor.service").items()}
    assert one["ExecStart"] == f"{SHIPPED_EXEC} monitor --config %E/swarmd/swarmd.yaml --state-dir %S/swarmd-monitor"
    assert one["StateDirectory"] == "swarmd-monitor" and one["User"] == "swarmd"
    assert one["Restart"] == "on-failure" and "2" in one["RestartPreventExitStatus"].split()
    assert one["KillSignal"] == "SIGTERM" and seconds(one["TimeoutStopSec"]) >= 120  # it keeps the model once more


def test_install_an_instance_into_a_root(systemd_analyze, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    config = REPO / "configs" / "swin-micro.yaml"
    result = run_cli("service", "install", "--root", str(root), "--name", "albert", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "systemctl daemon-reload && systemctl enable --now swarmd@albert" in result.stdout
    assert "journalctl -u swarmd@albert" in result.stdout

    installed_config = root / "etc/swarmd/albert.yaml"
    assert yaml.safe_load(installed_config.read_text()) == yaml.safe_load(config.read_text())
    assert "state_dir is not set here" in installed_config.read_text()
    unit = root / "etc/systemd/system/swarmd@.service"
    assert read_unit(unit)["ExecStart"] == [f"{' '.join(exec_command())} join --config %E/swarmd/%i.yaml"]
    assert verify(systemd_analyze, unit, root / "etc/systemd/system/swarmd@albert.service") == ""

    assert (root / "etc/sysusers.d/swarmd.conf").read_text() == (UNITS / "swarmd.sysusers").read_text()
    if shutil.which("systemd-sysusers"):
        passwd = (root / "etc/passwd").read_text()
        assert re.search(r"^swarmd:x:\d+:\d+:[^:]*:/var/lib/swarmd:/usr/sbin/nologin$", passwd, re.M), passwd
        assert "user    swarmd (created)" in result.stdout

    # again: the config is the operator's, kept unless --force; the unit is ours and the same
    again = run_cli("service", "install", "--root", str(root), "--name", "albert", "--config", str(config))
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert f"{installed_config} exists; pass --force" in again.stderr
    forced = run_cli("service", "install", "--root", str(root), "--name", "albert", "--config", str(config), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "(unchanged)" in forced.stdout


def test_install_the_single_unit_with_the_default_config(tmp_path):
    result = run_cli("service", "install", "--root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "systemctl enable --now swarmd\n" in result.stdout
    assert (tmp_path / "etc/systemd/system/swarmd.service").exists()
    written = tmp_path / "etc/swarmd/swarmd.yaml"
    assert "state_dir" not in yaml.safe_load(written.read_text())  # systemd's StateDirectory= decides
    check = run_cli("config", "validate", str(written))
    assert check.returncode == 0, check.stderr


def test_an_edited_unit_is_not_overwritten(tmp_path):
    assert run_cli("service", "install", "--root", str(tmp_path)).returncode == 0
    unit = tmp_path / "etc/systemd/system/swarmd.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=2min", "WatchdogSec=10min"))
    result = run_cli("service", "install", "--root", str(tmp_path), "--name", "other")
    assert result.returncode == 0, result.stderr  # another unit file: no conflict
    (tmp_path / "etc/swarmd/swarmd.yaml").unlink()
    result = run_cli("service", "install", "--root", str(tmp_path))
    assert result.returncode == 2 and "differs from this swarmd's unit" in result.stderr
    assert "WatchdogSec=10min" in unit.read_text()


@pytest.mark.parametrize(
    "args, content, fragment",
    [
        (["--name", "../etc"], None, "--name '../etc': use letters"),
        (["--name", "swarmd"], None, "leave --name out"),
        ([], "state_dir: /srv/peer\n", "sets state_dir: under systemd the state lives in /var/lib/swarmd"),
        ([], "swarm:\n  target_batch_size: lots\n", "swarm.target_batch_size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, content, fragment):
    root = tmp_path / "root"
    root.mkdir()
    if content is not None:
        (tmp_path / "c.yaml").write_text(content)
        args = [*args, "--config", str(tmp_path / "c.yaml")]
    result = run_cli("service", "install", "--root", str(root), *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (root / "etc").exists()  # nothing written


def test_a_root_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    result = run_cli("service", "install", "--root", str(tmp_path / "file"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "not a directory" in result.stderr
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "etc").write_text("")  # etc/ cannot be created under it
    result = run_cli("service", "install", "--root", str(tmp_path / "ro"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "cannot write" in result.stderr


def test_installing_on_the_system_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(InstallError, match="needs root: run it with sudo, or pass --root DIR"):
        install_service(config=None, name=None, root="/")


def test_paths_the_service_cannot_see_are_warned_about(tmp_path):
    (tmp_path / "c.yaml").write_text("task:\n  name: swin\n  data:\n    path: /home/me/imagenet\n")
    (tmp_path / "root").mkdir()
    result = run_cli("service", "install", "--root", str(tmp_path / "root"), "--config", str(tmp_path / "c.yaml"))
    assert result.returncode == 0, result.stderr
    assert "warning: task.data.path: /home/me/imagenet is not visible to the service" in result.stderr
