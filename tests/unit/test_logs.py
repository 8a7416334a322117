"""Logs an operator reads in the journal: one line per record, no escape codes, priorities, no hivemind noise."""

import io
import json
import logging
import os
import re
import sys
import threading

import pytest

from swarmd.logs import configure_logging

PLAIN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL) [\w.]+: ")


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, sys.excepthook, threading.excepthook, logging.getLogger("hivemind").level)
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    sys.excepthook, threading.excepthook = saved[2], saved[3]
    logging.getLogger("hivemind").setLevel(saved[4])


def emit_everything():
    log = logging.getLogger("swarmd.test")
    log.info("plain \x1b[1;31mred\x1b[0m and \x1b]8;;http://x\x07link\x1b]8;;\x07 text")
    try:
        raise ValueError("first line\nsecond line")
    except ValueError:
        log.exception("A step failed")
    log.warning("a warning")


def test_plain_when_not_a_terminal(restore_logging, monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    stream = io.StringIO()  # not a TTY, like journald's stream or a file
    configure_logging("info", "auto", stream=stream)
    emit_everything()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines  # the traceback is folded onto its record's line
    assert "\x1b" not in stream.getvalue() and "\x07" not in stream.getvalue()
    assert all(PLAIN.match(line) for line in lines), lines
    assert "plain red and link text" in lines[0]
    assert " ERROR swarmd.test: A step failed | Traceback" in lines[1] and "first line | second line" in lines[1]


def test_journal_lines_carry_syslog_priorities(restore_logging, monkeypatch, tmp_path):
    with open(tmp_path / "journal", "w") as stream:
        stat = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
        configure_logging("info", "auto", stream=stream)
        emit_everything()
    lines = (tmp_path / "journal").read_text().splitlines()
    assert [line[:3] for line in lines] == ["<6>", "<3>", "<4>"]
    assert lines[0].startswith("<6>INFO swarmd.test: plain red")  # journald adds its own timestamp
    assert "\x1b" not in "".join(lines)


def test_journal_stream_of_another_file_is_not_the_journal(restore_logging, monkeypatch, tmp_path):
    other = os.stat(tmp_path)
    monkeypatch.setenv("JOURNAL_STREAM", f"{other.st_dev}:{other.st_ino}")  # e.g. inherited, then redirected
    with open(tmp_path / "log", "w") as stream:
        configure_logging("info", "plain", stream=stream)
        logging.getLogger("swarmd.test").info("hello")
    assert PLAIN.match((tmp_path / "log").read_text())


def test_json_records(restore_logging, monkeypatch, tmp_path):
    with open(tmp_path / "journal", "w") as stream:
        stat = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
        configure_logging("info", "json", stream=stream)
        emit_everything()
    lines = (tmp_path / "journal").read_text().splitlines()
    records = [json.loads(line[3:]) for line in lines]  # journald strips the <N> prefix
    assert [r["level"] for r in records] == ["info", "error", "warning"]
    assert records[0]["message"] == "plain red and link text"
    assert "ValueError: first line" in records[1]["exception"]


def test_hivemind_churn_and_shutdown_noise_is_not_an_error(restore_logging, monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    stream = io.StringIO()
    configure_logging("info", "plain", stream=stream)
    logging.getLogger("hivemind").setLevel(logging.WARNING)  # the default logging.hivemind_level
    averager = logging.getLogger("hivemind.averaging.averager")
    try:
        raise ConnectionResetError("Connection reset by peer")
    except ConnectionResetError:
        logging.getLogger("hivemind.dht.dht").exception("Caught an exception while serving")
    averager.error("Averaging step failed: could not find a group")
    logging.getLogger("hivemind.dht.dht").warning("DHT did not shut down within the grace period; terminating it the hard way")
    logging.getLogger("hivemind.averaging.partition").warning("Averaging: received 94.1% results")
    logging.getLogger("asyncio").error("Task was destroyed but it is pending!\ntask: <Task pending name='Task-6'>")
    averager.error("Averager failed to load its state: a real problem")  # not noise: still an error
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert " ERROR hivemind.averaging.averager: Averager failed to load its state: a real problem" in lines[0]

    # at hivemind_level=info, a partial average shows, as information
    logging.getLogger("hivemind").setLevel(logging.INFO)
    logging.getLogger("hivemind.averaging.partition").warning("Averaging: received 94.1% results")
    assert " INFO hivemind.averaging.partition: Averaging: received 94.1% results" in stream.getvalue()


def test_uncaught_exceptions_in_threads_are_one_record(restore_logging, monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    stream = io.StringIO()
    configure_logging("info", "plain", stream=stream)

    def crash():
        raise RuntimeError("boom\nwith detail")

    thread = threading.Thread(target=crash, name="crasher")
    thread.start()
    thread.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and " ERROR swarmd: Uncaught exception in crasher: boom | with detail" in lines[0]
    assert "RuntimeError: boom" in lines[0]


def test_the_join_line_stays_one_line_on_a_narrow_terminal(restore_logging, monkeypatch):
    """rich wraps records to the terminal; a wrapped `To join:` line, pasted, runs --initial-peers without its address."""
    from swarmd.logs import UNWRAPPED

    monkeypatch.setenv("COLUMNS", "80")
    stream = io.StringIO()
    configure_logging("info", "rich", stream=stream)
    command = ("swarmd join --config /home/someone/runs/a-config-with-a-long-name.yaml --run-id swin-micro "
               "--initial-peers /ip4/192.168.1.7/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")
    logging.getLogger("swarmd.daemon").info("To join: %s", command, extra=UNWRAPPED)
    logging.getLogger("swarmd.daemon").info("an ordinary record " * 8)
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if "To join:" in line][0].endswith("To join: " + command), lines
    assert len(lines) > 2  # other records still wrap to the terminal
