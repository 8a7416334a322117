"""The monitor's web page without a swarm: its view model from fabricated peer records over two reads, the HTML
(every string a peer published escaped, the tables complete without JavaScript), /api/status, and a taken port."""

import json
import socket
import time
from types import SimpleNamespace

import pytest

from daemons import run_cli
from html_page import Page  # tests/html_page.py
from samples import HOSTILE_NAME
from swarmd.config import load_config
from swarmd.errors import ExitCode, StartupError
from swarmd.monitor.page import SwarmPage, check_listen, serve_page
from swarmd.monitor.runner import Monitor
from swarmd.monitor.totals import swarm_totals
from swarmd.web.render import render_monitor_page

PEER_IDS = ("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "QmcNFS8LmrN8bPVKQSBqWDaiy5RMnBUaqmvpQKjuDjiXwV",
            "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN")


def record(i: int, name: str, now: float, *, rate: float, ok: int, failed: int = 0, auxiliary=False) -> dict:
    """A peer's record as status/remote.py's snapshot holds it (swarm/peer_records.py fields)."""
    return {
        "peer_id": PEER_IDS[i], "public_name": name, "swarmd_version": "0.1.0", "task": "swin", "device": "cuda:0",
        "state": "training", "local_epoch": 4 + ok, "samples_per_second": rate, "samples_total": int(100 * rate * ok),
        "loss": 2.0 - 0.1 * ok, "averaging_success": ok, "averaging_failed": failed, "uptime_seconds": 600.0,
        "client_mode": False, "auxiliary": auxiliary, "target_batch_size": 256, "protocol": 3,
        "parameters": 28_300_000, "model_fingerprint": "f00d", "strategy": "sync", "inner_steps": 0,
        "start_values": "", "time": now - 2, "last_seen_seconds": 2.0, "self": False,
    }


def read(page: SwarmPage, peers, previous, now, epoch=5) -> dict:
    snapshot = {"mode": "remote", "run_id": "web-run", "state": "observing", "global_epoch": epoch, "num_peers": 3,
                "samples_accumulated": 120, "target_batch_size": 256, "eta_seconds": 2.5, "peers": peers}
    totals = swarm_totals(peers, previous, epoch)
    page.update(snapshot, totals, previous, now=now)
    return {p["peer_id"]: p for p in peers}


@pytest.fixture
def two_reads():
    """A swarm of three read twice, 30 s apart: between the reads alpha and the stranger each averaged once, beta
    failed once."""
    now = time.time()
    page = SwarmPage("web-run")
    first = [record(0, "alpha", now - 30, rate=90.0, ok=3), record(1, "beta", now - 30, rate=60.0, ok=3),
             record(2, HOSTILE_NAME, now - 30, rate=50.0, ok=3)]
    previous = read(page, first, {}, now - 30, epoch=7)
    second = [record(0, "alpha", now, rate=100.0, ok=4), record(1, "beta", now, rate=50.0, ok=3, failed=1),
              record(2, HOSTILE_NAME, now, rate=50.0, ok=4)]
    read(page, second, previous, now, epoch=8)
    return page, now


def test_the_view_model_keeps_the_curves_and_the_reports_of_each_read(two_reads):
    page, now = two_reads
    status = page.status(now=now + 1)
    assert status["mode"] == "monitor" and status["global_epoch"] == 8 and status["task"] == "swin"
    assert status["compatibility"]["strategy"] == "sync" and status["totals"]["samples_per_second"] == 200.0
    series = {s["label"]: s["points"] for s in status["throughput_over_time"]["series"]}
    assert [value for _t, value in series["swarm"]] == [200.0, 200.0]
    assert len(series) == 4 and [value for _t, value in series["alpha …Wjhx5N"]] == [90.0, 100.0]
    assert len(status["loss_over_time"]["series"][0]["points"]) == 2
    seen = [(r["peer"], r["outcome"], r["count"]) for r in status["seen_rounds"]]
    assert sorted(seen) == sorted([("alpha", "success", 1), ("beta", "failed", 1), (HOSTILE_NAME, "success", 1)])
    assert status["reports_succeeded"] == 2 and status["reports_failed"] == 1
    assert status["peers"][0]["last_seen_seconds"] == pytest.approx(3.0, abs=0.01)  # counted to now, not the read
    json.dumps(status, allow_nan=False)  # what /api/status serves


def test_the_page_lists_every_peer_with_its_share_and_escapes_what_strangers_publish(two_reads):
    page, now = two_reads
    html = render_monitor_page(page.status(now=now + 1), now=now + 1)
    view = Page(html)
    peers = view.tables["peers"]
    assert [row[0] for row in peers] == ["alpha", "beta", HOSTILE_NAME]  # as text, in its cell
    assert [row[4] for row in peers] == ["100.0", "50.0", "50.0"] and [row[5] for row in peers] == ["50%", "25%", "25%"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and all(s.get("src") for s in view.scripts)
    rounds = view.tables["rounds"]
    assert len(rounds) == 3 and {row[0] for row in rounds} == {"alpha", "beta", HOSTILE_NAME}
    assert any(row[3] == "failed" for row in rounds if row[0] == "beta")
    assert 'class="failed"' in html
    items = view.items
    assert items["global epoch"] == "8" and items["task"].startswith("swin") and items["strategy"].startswith("sync")
    assert items["target batch"] == "256 samples" and items["next epoch"].startswith("120 / 256")
    assert "in 2.5 s" in items["next epoch"] and items["throughput"].startswith("200.0")
    assert items["peers"].startswith("3") and "The curves need JavaScript" in html
    assert html.count('data-x="time"') == 2 and 'data-source="api/status"' in html


def test_before_the_first_read_the_page_says_so():
    html = render_monitor_page(SwarmPage("web-run").status())
    assert "no read of the swarm yet" in html and "No peer records yet" in html and "No averaging round yet" in html


def test_the_monitor_serves_its_page_api_and_metrics_on_one_port(two_reads):
    import urllib.request

    page, _now = two_reads
    monitor = Monitor(load_config(None, environ={}), None, interval=1, keep_every=0, metrics_listen=None)
    server = serve_page(page, monitor.metrics.registry, "127.0.0.1:0")
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        body = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert len(Page(body).tables["peers"]) == 3
        data = json.loads(urllib.request.urlopen(base + "/api/status", timeout=10).read())
        assert data["mode"] == "monitor" and len(data["peers"]) == 3 and data["seen_rounds"]
        assert b"swarmd_monitor_peers" in urllib.request.urlopen(base + "/metrics", timeout=10).read()
    finally:
        server.shutdown()
        server.server_close()


def test_each_read_of_the_monitor_feeds_its_page():
    now = time.time()
    swarm = SimpleNamespace(snapshot=lambda: SimpleNamespace(
        run_id="web-run", global_epoch=3, peers=(record(0, "alpha", now, rate=10.0, ok=1),)))
    monitor = Monitor(load_config(None, environ={}), swarm, interval=1, keep_every=0, metrics_listen=None)
    monitor._read_once(SimpleNamespace(log=lambda *args, **kwargs: None))
    status = monitor.page.status()
    assert [p["public_name"] for p in status["peers"]] == ["alpha"] and status["totals"]["alive_peers"] == 1


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_port_is_a_start_failure(taken_port):
    with pytest.raises(StartupError, match="already in use.*--metrics-addr"):
        check_listen(f"127.0.0.1:{taken_port}")
    assert StartupError.exit_code == ExitCode.START_FAILED == 3


def test_the_command_exits_3_with_one_line_on_a_taken_port(taken_port, tmp_path):
    result = run_cli("monitor", "--initial-peers", f"/ip4/127.0.0.1/tcp/9/p2p/{PEER_IDS[0]}", "--run-id", "web-run",
                     "--state-dir", str(tmp_path / "monitor"), "--metrics-addr", f"127.0.0.1:{taken_port}", timeout=90)
    assert result.returncode == 3, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0] and "--metrics-addr" in lines[0], result.stderr


def test_a_read_without_new_samples_keeps_the_last_loss_on_the_page():
    now = time.time()
    page = SwarmPage("web-run")
    peers = [record(0, "alpha", now - 10, rate=90.0, ok=3)]
    previous = read(page, peers, {}, now - 10)
    read(page, peers, previous, now)  # the same record again: no sample trained since, so no loss of its own
    status = page.status(now=now)
    assert status["totals"]["loss"] == pytest.approx(1.7) and len(status["loss_over_time"]["series"][0]["points"]) == 1


def test_a_peers_own_page_has_the_same_columns_share_and_its_own_reachability():
    from samples import three_peer_snapshot
    from swarmd.web.render import render_peer_page

    snapshot = three_peer_snapshot(time.time()).with_fields({"reachable": "yes"}).to_dict()
    peers = Page(render_peer_page(snapshot)).tables["peers"]
    assert [row[5] for row in peers] == ["41%", "37%", "22%"]  # 96.5, 88.0 and 51.25 of 235.75 samples/s
    assert [row[9] for row in peers] == ["yes", "—", "—"]  # its own from its check; the others' records have none
