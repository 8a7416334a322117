"""The sd_notify protocol as systemd reads it: one datagram of KEY=VALUE lines, to a path or an abstract socket."""

import logging
import os
import socket
import uuid

import pytest

from swarmd.daemon.sdnotify import Notifier, watchdog_settings


@pytest.fixture
def receiver(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(5)
    yield sock, str(tmp_path / "notify.sock")
    sock.close()


def test_one_datagram_of_lines_to_a_path_socket(receiver):
    sock, path = receiver
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path})
    assert notifier.send("READY=1", "STATUS=training: epoch 3")
    assert sock.recv(4096) == b"READY=1\nSTATUS=training: epoch 3"
    notifier.close()


def test_abstract_namespace_socket():
    name = f"swarmd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        assert notifier.send("WATCHDOG=1")
        assert sock.recv(4096) == b"WATCHDOG=1"
        notifier.close()


def test_no_socket_no_notifier_and_unsupported_addresses_are_ignored(caplog):
    assert Notifier.from_environment({}) is None
    with caplog.at_level(logging.WARNING):
        assert Notifier.from_environment({"NOTIFY_SOCKET": "vsock:2:1234"}) is None
    assert "vsock:2:1234" in caplog.text


def test_a_send_that_fails_returns_false_and_warns_once(tmp_path, caplog):
    notifier = Notifier(str(tmp_path / "nobody-listens.sock"))
    with caplog.at_level(logging.WARNING):
        assert not notifier.send("WATCHDOG=1")
        assert not notifier.send("WATCHDOG=1")
    assert caplog.text.count("Could not notify systemd") == 1
    notifier.close()


def test_watchdog_settings():
    assert watchdog_settings({}) is None
    settings = watchdog_settings({"WATCHDOG_USEC": "120000000"})
    assert settings.timeout == 120 and settings.interval == 60
    assert watchdog_settings({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}).interval == 1.5
    assert watchdog_settings({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    assert watchdog_settings({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_settings({"WATCHDOG_USEC": "0"}) is None
