"""swarmd as systemd runs it: notifications on a fake $NOTIFY_SOCKET, a watchdog that stops for a hung step, and
logs an operator can read in the journal, also while two peers stop."""

import re
import statistics
import time
from pathlib import Path


from daemons import peer_config
from notify_receiver import NotifyReceiver

WATCHDOG_SECONDS = 3.0  # systemd's WatchdogSec; swarmd pings every half of it
INTERVAL = WATCHDOG_SECONDS / 2
SHUTDOWN_TIMEOUT = 20.0
JOURNAL_LINE = re.compile(r"^<(?P<priority>[0-7])>(?P<level>DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL) [\w.]+: ")
PLAIN_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (?P<level>DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL) (?P<logger>[\w.]+): ")
PRIORITY = {"DEBUG": "7", "INFO": "6", "WARN": "4", "WARNING": "4", "ERROR": "3", "CRITICAL": "2"}


def hang_config(hang_file: Path, **sections):
    config = peer_config(
        task={"name": "hang-test", "hang_file": str(hang_file)},
        swarm={"matchmaking_time": 1.0, "averaging_timeout": 2.0, "load_state_timeout": 2.0, "load_state_attempts": 1},
        checkpoint={"enabled": False},
        daemon={"shutdown_timeout": SHUTDOWN_TIMEOUT, "tick_interval": 0.5},
    )
    for section, values in sections.items():
        config[section] = {**config[section], **values}
    return config


def test_notify_watchdog_and_journal_logs(daemons, test_tasks_env, tmp_path):
    receiver = NotifyReceiver(str(tmp_path / "notify.sock"))
    hang_file = tmp_path / "hang"
    log_path = tmp_path / "peer.log"  # DaemonProcess appends the daemon's stderr here: our "journal"
    log_path.touch()
    stat = log_path.stat()
    env = {
        "NOTIFY_SOCKET": receiver.address,
        "WATCHDOG_USEC": str(int(WATCHDOG_SECONDS * 1e6)),
        "JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}",
        "PYTHONPATH": test_tasks_env["PYTHONPATH"],
    }
    started = time.time()
    peer = daemons("peer", hang_config(hang_file, logging={"format": "auto"}), env=env)
    try:
        ready = receiver.wait_for("READY=1", timeout=120)
        assert receiver.with_field("STATUS=", started, ready), "no start-up STATUS before READY=1"
        assert receiver.pings(0, ready - 0.01) == []  # systemd arms the watchdog at READY=1
        assert "MAINPID=" in receiver.with_field("READY=1")[0][1]

        # training: a ping every half of WATCHDOG_USEC, and a status line on each tick
        peer.wait_for(lambda: len(receiver.pings(ready)) >= 6, 60, "6 watchdog pings")
        pings = receiver.pings(ready)
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert max(gaps) < WATCHDOG_SECONDS, gaps  # systemd would never have fired
        assert INTERVAL - 0.05 <= statistics.median(gaps) <= INTERVAL + 0.5, gaps
        statuses = [m for _, m in receiver.with_field("STATUS=", ready)]
        assert len(statuses) >= 6
        # status/snapshot.py progress_line, the log's line too: the last averaging round once there is one
        assert re.fullmatch(
            r"STATUS=training: epoch \d+, \d+ peers?, [\d.]+ samples/s, loss [\d.]+(, last round: \w+ \w+ with \d+)?",
            statuses[-1],
        ), statuses[-1]
        assert peer.status()["watchdog"]["progressing"] is True

        # a training step that hangs: the pings stop once its allowance (one interval) is spent
        hang_file.touch()
        hanging = peer.wait_for(lambda: (hang_file.parent / "hang.hanging").read_text(), 30, "the step to hang")
        hung_at = float(hanging)
        peer.wait_for(lambda: time.time() > hung_at + 2 * WATCHDOG_SECONDS, 30, "two watchdog timeouts")
        assert receiver.pings(hung_at + INTERVAL + 0.2) == [], "pings went on while the step hung"
        assert receiver.pings(hung_at - INTERVAL - 0.5, hung_at + INTERVAL + 0.2), "no ping right before the hang"
        status = peer.status()["watchdog"]
        assert status["progressing"] is False and status["activity"] == "computing", status
        assert receiver.with_field("STATUS=stalled (computing for", hung_at)
        assert "The training worker has stopped progressing (computing for" in peer.log

        # it recovers: the pings resume
        hang_file.unlink()
        released = time.time()
        peer.wait_for(lambda: receiver.pings(released), 20, "pings after the step returned")
        assert "The training worker is progressing again" in peer.log

        # SIGTERM: STOPPING=1 at once, with the stop bound; a clean exit
        signalled = time.time()
        assert peer.terminate(timeout=SHUTDOWN_TIMEOUT + 30) == 0, peer.tail()
        stopping = receiver.with_field("STOPPING=1", signalled)
        assert len(stopping) == 1 and stopping[0][0] - signalled < 5, receiver.messages[-5:]
        assert f"EXTEND_TIMEOUT_USEC={int((SHUTDOWN_TIMEOUT + 30) * 1e6)}" in stopping[0][1]
        assert receiver.pings(stopping[0][0]) == []
        assert peer.leftover_processes() == [], peer.tail()
    finally:
        receiver.close()

    # the journal: one record per line, its syslog priority first, no escape codes (stderr is not a terminal)
    text = log_path.read_text()
    assert "\x1b" not in text
    for line in text.splitlines():
        match = JOURNAL_LINE.match(line)
        assert match, f"not a journal record: {line!r}"
        assert match["priority"] == PRIORITY[match["level"]], line


def test_two_peers_stop_without_errors_in_their_logs(daemons, test_tasks_env, tmp_path):
    """Peers leave and stop all the time: hivemind's complaints about it are not the operator's errors."""
    env = {"PYTHONPATH": test_tasks_env["PYTHONPATH"]}
    config = hang_config(tmp_path / "never", swarm={"matchmaking_time": 2.0, "averaging_timeout": 5.0, "target_batch_size": 256})
    first = daemons("first", config, env=env)
    second = daemons("second", config, extra_args=first.join_line()[2:], env=env)
    for peer in (first, second):
        peer.wait_status(
            lambda s: s["num_peers"] == 2 and s["averaging"].get("gradients", {}).get("success", 0) >= 2,
            timeout=180,
            what="two peers averaging gradients",
        )
    before = {peer.name: len(peer.log) for peer in (first, second)}
    for peer in (second, first):
        assert peer.terminate(timeout=SHUTDOWN_TIMEOUT + 30) == 0, peer.tail()
        assert peer.leftover_processes() == [], peer.tail()
    for peer in (first, second):
        during_stop = peer.log[before[peer.name]:]
        assert "Stopped (exit code 0)" in during_stop
        assert "Traceback" not in during_stop and "\x1b" not in during_stop, during_stop
        for line in during_stop.splitlines():
            match = PLAIN_LINE.match(line)
            assert match, f"{peer.name}: not a log record: {line!r}"
            assert match["level"] not in ("ERROR", "CRITICAL"), f"{peer.name}: {line}"
            noisy = match["logger"].startswith(("hivemind", "asyncio"))
            assert not (noisy and match["level"] in ("WARN", "WARNING")), f"{peer.name}: {line}"
