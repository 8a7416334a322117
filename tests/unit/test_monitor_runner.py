"""The monitor's loop without a swarm: Ctrl-C stops it (after hivemind's averager told SIGINT to be ignored) with
its model kept, and its log line counts what the records can tell: the peers' reports, not rounds."""

import logging
import os
import signal
from types import SimpleNamespace

import pytest

from swarmd.config import load_config
from swarmd.monitor.runner import Monitor


class _Swarm:
    """Answers the monitor's reads with `peers`; `on_read(n)` runs at the n-th read."""

    def __init__(self, peers=(), on_read=lambda n: None):
        self.peers, self.on_read, self.reads, self.dht = list(peers), on_read, 0, None

    def snapshot(self):
        self.reads += 1
        self.on_read(self.reads)
        return SimpleNamespace(peers=tuple(self.peers), global_epoch=3)


@pytest.fixture
def stop_handlers():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_ctrl_c_stops_the_monitor_with_exit_0_and_keeps_the_model(monkeypatch, stop_handlers):
    kept = []

    class _Keeper:  # what the real StateKeeper's hivemind averager does to the process: SIGINT ignored
        def __init__(self, config, dht):
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        def keep(self):
            kept.append("model")

        def close(self):
            pass

    monkeypatch.setattr("swarmd.monitor.keeper.StateKeeper", _Keeper)
    fallback = []

    def on_read(n):
        if n == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        if n == 20:  # SIGINT was ignored: stop it anyway, so that the test ends
            fallback.append(n)
            monitor.stop()

    monitor = Monitor(load_config(None, environ={}), _Swarm(on_read=on_read), interval=0.01, keep_every=3600,
                      metrics_listen=None)
    assert monitor.run() == 0
    assert not fallback, "SIGINT did not stop the monitor"
    assert kept == ["model"]  # the model kept once more on the way out


def test_the_log_counts_peer_reports_and_the_rounds_they_come_from(caplog):
    def peer(peer_id, ok):
        return {"peer_id": peer_id, "samples_total": 100 * ok, "samples_per_second": 10.0, "loss": 1.0,
                "averaging_success": ok, "averaging_failed": 0, "auxiliary": False}

    swarm = _Swarm([peer("a", 0), peer("b", 0)])
    monitor = Monitor(load_config(None, environ={}), swarm, interval=1, keep_every=0, metrics_listen=None)
    tracking = SimpleNamespace(log=lambda *args, **kwargs: None)
    monitor._read_once(tracking)
    swarm.peers = [peer("a", 1), peer("b", 1)]  # one round of the two peers: each reports it
    with caplog.at_level(logging.INFO, logger="swarmd.monitor"):
        monitor._read_once(tracking)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("swarm:")]
    assert "2 ok / 0 failed peer reports (from at least 1 round(s))" in line, line
    assert "rounds 2 ok" not in line

