"""The command line: fast commands stay light, and every user error is one line with its exit code."""

import os
import sys
from pathlib import Path

import pytest

from daemons import run_cli


@pytest.fixture
def without_heavy_packages(tmp_path):
    """A PYTHONPATH where importing torch or hivemind fails loudly, to prove a command does not import them."""
    for name in ("torch", "hivemind", "timm", "transformers"):
        package = tmp_path / "blocked" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    repo = Path(__file__).resolve().parents[2]
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "blocked"), str(repo)])}


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
