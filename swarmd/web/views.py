"""A snapshot (status/snapshot.py `Snapshot.to_dict()`) -> the cells of the page's components, as plain strings.

Each component takes rows, not a snapshot: the daemon's page passes one peer's rows, the monitor's will pass the
swarm's (a `peer` column on rounds, many series on the curves). Strings here are raw, as peers published them:
escaping is the template's job (Jinja2 autoescape), never done twice, never skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from swarmd.swarm.outcomes import FAILED_OUTCOMES

__all__ = ["Item", "PeerRow", "RoundRow", "Chart", "run_items", "peer_rows", "round_rows", "CHARTS", "page_title"]


@dataclass(frozen=True)
class Item:
    """One labelled value of the run's summary."""

    label: str
    value: str
    note: str = ""  # smaller text after the value


@dataclass(frozen=True)
class PeerRow:
    name: str
    peer_id: str
    short_id: str
    is_self: bool
    role: str  # "", "client", "auxiliary", "auxiliary, client"
    state: str
    epoch: str
    samples_per_second: str
    samples_total: str
    loss: str
    averaging: str  # "6 ok, 1 failed"
    any_failed: bool
    last_seen: str
    device: str
    version: str


@dataclass(frozen=True)
class RoundRow:
    age: str
    epoch: str
    kind: str
    outcome: str
    failed: bool  # the average was not used although one was due (swarm/outcomes.py FAILED_OUTCOMES)
    group_size: str
    duration: str
    error: str
    peer: str = ""  # the monitor's page names the peer that logged the round; the daemon's leaves it empty


@dataclass(frozen=True)
class Chart:
    """A curve of the page: the script fills it from /api/status (`key`: the snapshot's history, by epoch)."""

    id: str
    title: str
    unit: str
    key: str


CHARTS = (
    Chart("chart-rate", "Throughput", "samples/s", "rate_history"),
    Chart("chart-loss", "Loss", "mean loss", "loss_history"),
)


def page_title(s: Mapping[str, Any]) -> str:
    return f"{s.get('public_name') or s.get('peer_id') or 'swarmd'} · {s.get('run_id') or ''} · swarmd"


def run_items(s: Mapping[str, Any]) -> list[Item]:
    """The run and this peer's place in it, top to bottom as the operator asks: what, where, how fast."""
    compatibility = s.get("compatibility") or {}
    local, swarm = s.get("local_epoch"), s.get("global_epoch")
    items = [
        Item("run", str(s.get("run_id") or "")),
        Item("task", str(s.get("task") or ""), note=_model_note(compatibility)),
        Item("strategy", str(compatibility.get("strategy") or "—"),
             note=f"H = {compatibility['inner_steps']}" if compatibility.get("inner_steps") else ""),
        Item("state", str(s.get("phase") or s.get("state") or ""), note=_role(s)),
        Item("epoch", _count(local), note=f"swarm at {swarm}" if swarm is not None else ""),
        Item("peers", _count(s.get("num_peers")), note=_clients(s.get("num_clients"))),
        Item("next epoch", f"{_count(s.get('samples_accumulated'))} / {_count(s.get('target_batch_size'))} samples",
             note=f"in {format_duration(s['eta_seconds'])}" if s.get("eta_seconds") is not None else ""),
        Item("throughput", f"{_rate(s.get('samples_per_second'))} samples/s",
             note=f"{_count(s.get('samples_total'))} samples trained"),
        Item("loss", _loss(s.get("loss"))),
        Item("uptime", format_duration(s.get("uptime_seconds")), note=f"swarmd {s.get('swarmd_version') or ''}"),
    ]
    if s.get("last_error"):
        items.append(Item("last error", str(s["last_error"])))
    return items


def peer_rows(s: Mapping[str, Any]) -> list[PeerRow]:
    """The swarm's peers from their signed records (swarm/peer_records.py fields), in the snapshot's order."""
    rows = []
    for p in s.get("peers") or ():
        failed = int(p.get("averaging_failed") or 0)
        rows.append(PeerRow(
            name=str(p.get("public_name") or ""),
            peer_id=str(p.get("peer_id") or ""),
            short_id=short_id(p.get("peer_id")),
            is_self=bool(p.get("self")),
            role=_role(p),
            state=str(p.get("state") or ""),
            epoch=_count(p.get("local_epoch")),
            samples_per_second=_rate(p.get("samples_per_second")),
            samples_total=_count(p.get("samples_total")),
            loss=_loss(p.get("loss")),
            averaging=f"{_count(p.get('averaging_success'))} ok, {failed} failed",
            any_failed=failed > 0,
            last_seen=_age(p.get("last_seen_seconds")),
            device=str(p.get("device") or ""),
            version=str(p.get("swarmd_version") or ""),
        ))
    return rows


def round_rows(s: Mapping[str, Any], *, now: Optional[float] = None, peer: str = "") -> list[RoundRow]:
    """The recent averaging rounds, newest first."""
    now = time.time() if now is None else now
    rows = []
    for r in reversed(tuple(s.get("recent_averaging") or ())):
        rows.append(RoundRow(
            age=_age(now - r["time"]) if r.get("time") is not None else "",
            epoch=_count(r.get("epoch")),
            kind=str(r.get("kind") or ""),
            outcome=str(r.get("outcome") or ""),
            failed=r.get("outcome") in FAILED_OUTCOMES,
            group_size=_count(r.get("group_size")),
            duration=_round_duration(r),
            error=str(r.get("error") or ""),
            peer=peer,
        ))
    return rows


def short_id(peer_id) -> str:
    """The first and last characters of a peer id: what tells peers apart at a glance (the whole id is a title)."""
    text = str(peer_id or "")
    return text if len(text) <= 14 else f"{text[:6]}…{text[-6:]}"


def format_duration(seconds) -> str:
    if seconds is None:
        return "—"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours < 48 else f"{hours // 24} d {hours % 24} h"


def _round_duration(r: Mapping[str, Any]) -> str:
    text = f"{float(r.get('duration_seconds') or 0.0):.2f} s"
    if r.get("waited_seconds") is not None:
        text += f" (training waited {r['waited_seconds']:.2f} s)"
    if r.get("peer_wait_seconds"):
        text += f" ({r['peer_wait_seconds']:.2f} s for slower peers)"
    return text


def _model_note(compatibility: Mapping[str, Any]) -> str:
    parameters = compatibility.get("parameters")
    return f"{parameters / 1e6:.2f}M parameters" if parameters else ""


def _role(entity: Mapping[str, Any]) -> str:
    roles = [name for name, on in (("auxiliary", entity.get("auxiliary")), ("client", entity.get("client_mode"))) if on]
    return ", ".join(roles)


def _clients(count) -> str:
    return f"{count} in client mode" if count else ""


def _age(seconds) -> str:
    return "—" if seconds is None else f"{format_duration(seconds)} ago"


def _count(value) -> str:
    return "—" if value is None else f"{int(value):,}".replace(",", " ")


def _rate(value) -> str:
    return "—" if value is None else f"{float(value):.1f}"


def _loss(value) -> str:
    return "—" if value is None else f"{float(value):.4g}"
