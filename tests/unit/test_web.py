"""The peer's web page (swarmd/web/): what the server renders (complete without JavaScript, every string a peer
published escaped) and what the metrics port answers beside /metrics. The browser's view: test_web_page.py."""

import asyncio
import json
import re
import time
import urllib.error
import urllib.request

import pytest

from html_page import Page  # tests/html_page.py
from samples import HOSTILE_NAME, CannedView, three_peer_snapshot
from swarmd.metrics.extension import MetricsExtension
from swarmd.status.snapshot import Identity, build_snapshot
from swarmd.web.app import STATIC, STATIC_FILES, status_json
from swarmd.web.render import TEMPLATES, render_peer_page

REPO_ROOT = STATIC.parents[2]


def test_the_page_names_every_peer_and_round_without_javascript():
    now = time.time()
    snapshot = three_peer_snapshot(now).to_dict()
    page = Page(render_peer_page(snapshot, now=now))

    assert page.items["run"] == "web-run" and page.items["task"].startswith("swin")
    assert page.items["strategy"] == "sync" and "28.30M parameters" in page.items["task"]
    assert page.items["epoch"].startswith("12") and "swarm at 12" in page.items["epoch"]
    assert page.items["peers"].startswith("3") and page.items["throughput"].startswith("96.5 samples/s")
    assert page.items["loss"] == "1.62"

    peers = page.tables["peers"]
    assert [row[0].split(" (")[0].split(" client")[0] for row in peers] == ["alpha", "beta", HOSTILE_NAME]
    assert "(this peer)" in peers[0][0] and "client" in peers[2][0]
    assert [row[4] for row in peers] == ["96.5", "88.0", "51.2"] and peers[1][8] == "11 ok, 1 failed"

    rounds = page.tables["rounds"]
    assert len(rounds) == len(snapshot["recent_averaging"]) == 7
    newest = rounds[0]  # newest first: the failed state round, its error as text
    assert newest[1:6] == ["12", "state", "failed", "1", "30.00 s"]
    assert newest[6] == f"TimeoutError('{HOSTILE_NAME}')"
    assert [row[4] for row in rounds[1:]] == ["3"] * 6  # the group of three
    assert [row[1] for row in rounds[1:]] == [str(e) for e in range(11, 5, -1)]


def test_a_hostile_name_is_text_never_markup():
    now = time.time()
    snapshot = three_peer_snapshot(now).to_dict()
    snapshot["peers"][1]["public_name"] = '"><img src=x onerror=alert(2)>'
    snapshot["public_name"] = "</title><script>alert(3)</script>"
    html = render_peer_page(snapshot, now=now)

    assert "<script>alert" not in html and "<img" not in html and "</title><" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 2  # the peer's name and the round's error
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    # scripts come from the page's own files only: no inline script could carry a peer's string
    page = Page(html)
    assert [s.get("src") for s in page.scripts] == ["static/uPlot.iife.min.js", "static/swarmd-page.js"]
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)


def test_a_starting_peer_gets_a_page_too():
    config_snapshot = build_snapshot(
        Identity("starting-run", "gamma", "swin", "fp32", False, False, 128, started_at=time.time()), "starting")
    page = Page(render_peer_page(config_snapshot.to_dict()))
    assert page.items["run"] == "starting-run" and page.items["epoch"] == "—" and page.items["strategy"] == "—"
    assert page.tables == {}
    text = " ".join(page.text)
    assert "No peer records yet" in text and "No averaging round yet" in text


def test_status_json_is_the_snapshot_and_always_parses():
    snapshot = three_peer_snapshot(time.time())
    assert json.loads(status_json(snapshot.to_dict())) == json.loads(json.dumps(snapshot.to_dict(), default=str))
    broken = snapshot.with_fields({"loss": float("nan"), "loss_history": ((1, float("inf")), (2, 1.5))})
    assert json.loads(status_json(broken.to_dict()))["loss_history"] == [[1, None], [2, 1.5]]  # JSON.parse takes it


def test_static_files_are_shipped_and_uplot_is_named_with_its_license():
    for name in STATIC_FILES:
        assert (STATIC / name).stat().st_size > 0, name
    assert (STATIC / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "MIT License" in (STATIC / "uPlot.LICENSE").read_text()
    assert "1.6.32" in (STATIC / "README.md").read_text() and "MIT" in (STATIC / "README.md").read_text()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["swarmd.web"]
    package = STATIC.parent
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    needed = {STATIC / name for name in STATIC_FILES} | set(TEMPLATES.glob("*.html")) | {STATIC / "uPlot.LICENSE"}
    assert needed <= shipped, needed - shipped


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_the_metrics_port_serves_the_page_its_json_and_its_files():
    asyncio.run(_serves_the_page())


async def _serves_the_page():
    snapshot = three_peer_snapshot(time.time())
    extension = MetricsExtension("127.0.0.1:0")
    await extension.start(CannedView(snapshot))
    try:
        base = f"http://{extension.address}"
        status, headers, body = await asyncio.to_thread(get, base + "/")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in headers["Content-Security-Policy"]  # no inline script runs, whatever a name says
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert len(Page(body.decode()).tables["peers"]) == 3

        status, headers, body = await asyncio.to_thread(get, base + "/api/status")
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert json.loads(body) == json.loads(json.dumps(snapshot.to_dict(), default=str))  # the status socket's data

        status, headers, body = await asyncio.to_thread(get, base + "/static/uPlot.iife.min.js")
        assert status == 200 and "javascript" in headers["Content-Type"]
        assert body.startswith(b"/*! https://github.com/leeoniya/uPlot")

        status, _, body = await asyncio.to_thread(get, base + "/metrics")
        assert status == 200 and b'swarmd_info{' in body and b'run_id="web-run"' in body

        for path in ("/static/../app.py", "/static/README.md", "/nothing", "/metrics/extra"):
            assert (await asyncio.to_thread(get, base + path))[0] == 404, path
        request = urllib.request.Request(base + "/", data=b"x", method="POST")
        assert (await asyncio.to_thread(get, request))[0] == 405
    finally:
        await extension.close()


def test_a_failing_page_is_a_500_and_one_log_record_while_metrics_go_on(caplog):
    from swarmd.web.app import PeerApp

    def broken():
        raise RuntimeError("no snapshot")

    caplog.set_level("DEBUG", logger="swarmd.web")
    app = PeerApp(broken, metrics_app=lambda environ, start_response: start_response("200 OK", []) or [b"metrics"])
    answers = []
    for path in ("/", "/api/status", "/metrics"):
        body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda status, headers: answers.append(status)))
    assert answers == ["500 Internal Server Error", "500 Internal Server Error", "200 OK"] and body == b"metrics"
    assert [r.levelname for r in caplog.records if r.name == "swarmd.web"] == ["ERROR", "DEBUG"]


def test_the_peers_table_says_who_excludes_a_peer_and_why():
    """The excluded column: the records that name a peer in `excluding` (each writer's word), and on a peer's own
    page its own exclusion with the reason."""
    now = time.time()
    snapshot = three_peer_snapshot(now).to_dict()
    alpha, beta, liar = snapshot["peers"]
    beta["excluding"] = [liar["peer_id"]]
    snapshot["excluded_peers"] = [{"peer_id": liar["peer_id"], "reason": "clipped", "since": now - 5,
                                   "until": now + 55, "clipped_rounds": 3, "rounds_seen": 3, "capped_claims": 0,
                                   "exclusions": 1}]
    page = Page(render_peer_page(snapshot, now=now))
    column = page.tables["peers"][0].index("—", 10)  # alpha's row: nobody excludes it
    assert [row[column] for row in page.tables["peers"]] == ["—", "—", "by 2 peers (this one: clipped)"]

    del snapshot["excluded_peers"]  # the monitor's view: the records only
    page = Page(render_peer_page(snapshot, now=now))
    assert [row[column] for row in page.tables["peers"]] == ["—", "—", "by 1 peer"]
