"""The peer's page in a real browser: headless Chromium (Debian's `chromium`) loads it from the metrics port of a
MetricsExtension over fabricated snapshots (three peers, one named `<script>alert(1)</script>`), runs its script,
and the test reads the DOM it left, with JavaScript and without, and saves a screenshot under the test's tmp_path.

`SWARMD_WEB_SCREENSHOT=docs/web-page.png` also writes the screenshot there (README's). Skips without Chromium,
fails instead under SWARMD_REQUIRE_TOOLS=1 (as .ci/run runs).
"""

import asyncio
import os
import shutil
import time

import pytest

from browser import chromium, chromium_binary, dom_without_javascript  # tests/browser.py
from html_page import Page  # tests/html_page.py
from samples import HOSTILE_NAME, CannedView, three_peer_snapshot
from swarmd.metrics.extension import MetricsExtension

LATER_ERROR = "AllreduceException('a peer left the group')"  # only the later snapshot has it

@pytest.fixture
def served(tmp_path):
    """The page of a peer whose snapshot moves on after the first load: the first two requests for it (the page,
    then its script's first api/status) get epoch 12, every later one epoch 13 with one more round."""
    chromium_binary()  # skip (or fail) before starting anything
    now = time.time()
    later = three_peer_snapshot(now + 3, rounds=7, epoch=13)
    later = later.with_fields({"recent_averaging": later.recent_averaging[:-1] + (
        later.recent_averaging[-1].__class__("state", "failed", 1, 30.0, 13, now, error=LATER_ERROR),)})
    view = CannedView(three_peer_snapshot(now), three_peer_snapshot(now), later)
    extension = MetricsExtension("127.0.0.1:0")
    asyncio.run(extension.start(view))
    try:
        assert extension.address, extension.error
        yield f"http://{extension.address}/", view
    finally:
        asyncio.run(extension.close())


def test_the_page_in_a_browser_updates_live_and_shows_a_hostile_name_as_text(served, tmp_path):
    url, view = served
    dom = chromium(tmp_path / "profile", "--virtual-time-budget=8000", "--dump-dom", url)
    page = Page(dom)

    assert page.html_class == "js"  # the script ran
    assert dom.count('class="u-wrap"') == 2  # uPlot drew both curves
    # the live update swapped in the later snapshot: epoch 13 and its new round, without a reload
    assert view.calls >= 4 and page.items["epoch"].startswith("13")
    assert page.tables["rounds"][0][6] == LATER_ERROR
    names = [row[0] for row in page.tables["peers"]]
    assert len(names) == 3 and names[2].startswith(HOSTILE_NAME)  # as text, in its cell
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert all(script.get("src") for script in page.scripts)  # no script element came from a peer's name

    screenshot = tmp_path / "web-page.png"
    chromium(tmp_path / "profile", "--hide-scrollbars", "--window-size=1280,1000", "--virtual-time-budget=5000",
             f"--screenshot={screenshot}", url)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    if os.environ.get("SWARMD_WEB_SCREENSHOT"):
        shutil.copyfile(screenshot, os.environ["SWARMD_WEB_SCREENSHOT"])


def test_without_javascript_the_tables_are_all_there(served, tmp_path):
    url, _view = served
    dom = dom_without_javascript(tmp_path / "profile", url)
    page = Page(dom)
    assert page.html_class == "" and "u-wrap" not in dom
    assert len(page.tables["peers"]) == 3 and len(page.tables["rounds"]) == 7
    assert page.items["epoch"].startswith("12") and "The curves need JavaScript" in dom
