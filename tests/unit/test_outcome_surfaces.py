"""Every averaging outcome reaches every surface: status JSON, the status view, /metrics, the peer record, the
systemd STATUS line and the progress log, the web page, and the README's metrics table. A new outcome in
swarm/outcomes.py that one surface drops fails here."""

import json
import re
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from daemons import REPO
from swarmd.daemon.systemd import status_line
from swarmd.metrics.collector import SwarmdMetrics
from swarmd.status.render import build_view
from swarmd.status.snapshot import Identity, build_snapshot, progress_line
from swarmd.swarm.averaging_log import AveragingLog
from swarmd.swarm.outcomes import FAILED_OUTCOMES, KINDS, OUTCOMES
from swarmd.swarm.peer_records import record_from_snapshot
from swarmd.web.views import round_rows

PEER_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
IDENTITY = Identity(
    run_id="outcomes", public_name="alpha", task="swin", precision="fp32", client_mode=False, auxiliary=False,
    target_batch_size=128, started_at=time.time(), peer_id=PEER_ID, device="cpu",
)


def one_round(kind: str, outcome: str):
    log = AveragingLog()
    log.record(kind, outcome, group_size=2 if outcome == "success" else 1, duration=0.5, epoch=3, error="why")
    return build_snapshot(IDENTITY, "training", averaging=log.summary())


def rendered(snapshot) -> str:
    console = Console(record=True, width=160, file=open("/dev/null", "w"))
    console.print(build_view(snapshot.to_dict()))
    return console.export_text()


def scraped(snapshot) -> dict:
    text = generate_latest(SwarmdMetrics(lambda: snapshot).registry).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    return families["swarmd_averaging_rounds"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("outcome", OUTCOMES)
def test_an_outcome_reaches_every_surface(kind, outcome):
    snapshot = one_round(kind, outcome)

    served = json.loads(json.dumps(snapshot.to_dict()))  # what the status socket sends
    assert served["averaging"][kind][outcome] == 1
    assert served["last_averaging"]["outcome"] == outcome and served["recent_averaging"][-1]["kind"] == kind

    assert f"{kind}: 1 {outcome}" in rendered(snapshot)  # the view's summary of rounds

    rounds = scraped(snapshot)
    values = {(s.labels["kind"], s.labels["outcome"]): s.value for s in rounds.samples if s.name.endswith("_total")}
    assert values[kind, outcome] == 1 and sum(values.values()) == 1
    assert f"{outcome}:" in rounds.documentation  # the help text explains it

    record = record_from_snapshot(snapshot)
    assert record["averaging_success"] == (outcome == "success")
    assert record["averaging_failed"] == (outcome in FAILED_OUTCOMES)

    assert f"last round: {kind} {outcome} with" in progress_line(snapshot)
    assert f"last round: {kind} {outcome} with" in status_line(snapshot)

    [row] = round_rows(snapshot.to_dict())  # the page's rounds table (swarmd/web/), failed ones marked
    assert (row.kind, row.outcome, row.failed) == (kind, outcome, outcome in FAILED_OUTCOMES)


def test_every_outcome_is_in_the_readme_metrics_table():
    readme = (REPO / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| `swarmd_averaging_rounds_total")]
    for name in OUTCOMES:
        assert re.search(rf"\b{name}\b", row), f"README's swarmd_averaging_rounds_total row does not name {name!r}"
