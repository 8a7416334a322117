"""A snapshot (status/snapshot.py `Snapshot.to_dict()`) -> the cells of the page's components, as plain strings.

Each component takes rows, not a snapshot: the daemon's page passes one peer's rows, the monitor's passes the
swarm's (a `peer` column on rounds, many series on the curves). Strings here are raw, as peers published them:
escaping is the template's job (Jinja2 autoescape), never done twice, never skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from swarmd.swarm.outcomes import FAILED_OUTCOMES, traffic_words

__all__ = [
    "Item", "PeerRow", "RoundRow", "Chart", "run_items", "peer_rows", "round_rows", "CHARTS", "page_title",
    "MONITOR_CHARTS", "monitor_items", "seen_round_rows", "round_timeline", "RoundTimelineView", "Lane",
    "LaneSegment",
]


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
    share: str = ""  # of the swarm's samples/s: "41%" ("—" for an auxiliary peer)
    reachability: str = ""  # can peers dial it: yes, no, unknown (swarm/reachability.py); "" where not published
    excluded: str = ""  # "by 2 peers (this one: clipped)": who excludes it on evidence (swarm/exclusion.py); "" nobody


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
    """A curve of the page: the script fills it from /api/status (`key`: a history of [x, value] pairs, or
    {"series": [{"label", "points"}]} for several curves; `x`: "epoch", or "time" for Unix seconds)."""

    id: str
    title: str
    unit: str
    key: str
    x: str = "epoch"


CHARTS = (
    Chart("chart-rate", "Throughput", "samples/s", "rate_history"),
    Chart("chart-loss", "Loss", "mean loss", "loss_history"),
)
MONITOR_CHARTS = (  # the monitor's reads (monitor/page.py): the swarm's total and each peer's, over time
    Chart("chart-rate", "Throughput", "samples/s", "throughput_over_time", x="time"),
    Chart("chart-loss", "Loss", "sample-weighted mean loss", "loss_over_time", x="time"),
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
    if s.get("manifest"):
        items.append(_manifest_item(s["manifest"]))
    if s.get("last_error"):
        items.append(Item("last error", str(s["last_error"])))
    return items


def peer_rows(s: Mapping[str, Any]) -> list[PeerRow]:
    """The swarm's peers from their signed records (swarm/peer_records.py fields), in the snapshot's order."""
    rows = []
    peers = tuple(s.get("peers") or ())
    swarm_rate = sum(float(p.get("samples_per_second") or 0.0) for p in peers if not p.get("auxiliary"))
    for p in peers:
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
            share=_share(p, swarm_rate),
            reachability=str(p.get("reachable") or (s.get("reachable") if p.get("self") else "") or ""),
            excluded=_excluded_by(p, peers, s.get("excluded_peers") or ()),
        ))
    return rows


def monitor_items(s: Mapping[str, Any]) -> list[Item]:
    """The run as the monitor sees it (monitor/page.py `SwarmPage.status()`): a snapshot in remote mode, plus the
    task and strategy the peers' records agree on and the swarm's totals (monitor/totals.py) of the last read."""
    compatibility = s.get("compatibility") or {}
    totals = s.get("totals") or {}
    manifest = [_manifest_item(s["manifest"])] if s.get("manifest") else []
    return [
        Item("run", str(s.get("run_id") or "")),
        *manifest,
        Item("task", str(s.get("task") or "—"), note=_model_note(compatibility)),
        Item("strategy", str(compatibility.get("strategy") or "—"),
             note=f"H = {compatibility['inner_steps']}" if compatibility.get("inner_steps") else ""),
        Item("target batch", f"{_count(s.get('target_batch_size'))} samples"),
        Item("global epoch", _count(s.get("global_epoch"))),
        Item("next epoch", f"{_count(s.get('samples_accumulated'))} / {_count(s.get('target_batch_size'))} samples",
             note=f"in {format_duration(s['eta_seconds'])}" if s.get("eta_seconds") is not None else ""),
        Item("peers", _count(totals.get("alive_peers")),
             note=f"{_count(totals.get('trainers'))} training" if totals else ""),
        Item("throughput", f"{_rate(totals.get('samples_per_second'))} samples/s", note="the training peers' sum"),
        Item("loss", _loss(totals.get("loss")), note="weighted by the samples each peer trained"),
        Item("averaging", f"{_count(s.get('reports_succeeded'))} ok, {_count(s.get('reports_failed'))} failed",
             note="the peers' reports since the monitor started"),
        Item("watching", format_duration(s.get("uptime_seconds")), note=f"swarmd {s.get('swarmd_version') or ''}"),
    ]


def _manifest_item(m: Mapping[str, Any]) -> Item:
    """The run's signed manifest: its version and the run key's fingerprint (and a restart the peer waits for)."""
    note = f"run key {str(m.get('key_fingerprint') or '')[:16]}"
    if m.get("restart_needed"):
        note += f" · restart needed for {', '.join(m['restart_needed'])}"
    return Item("manifest", f"v{m.get('version')}", note=note)


def seen_round_rows(s: Mapping[str, Any], *, now: Optional[float] = None) -> list[RoundRow]:
    """The averaging rounds the monitor saw in the peers' records (monitor/page.py `seen_rounds`, newest first):
    a peer's success and failure counters moved between two reads. Which round, its group and its duration are not
    in the records: those rows say who reported what, at which epoch."""
    now = time.time() if now is None else now
    rows = []
    for r in s.get("seen_rounds") or ():
        count = int(r.get("count") or 1)
        rows.append(RoundRow(
            age=_age(now - r["time"]) if r.get("time") is not None else "",
            epoch=_count(r.get("epoch")),
            kind="",
            outcome=str(r.get("outcome") or "") + (f" ×{count}" if count > 1 else ""),
            failed=r.get("outcome") in FAILED_OUTCOMES,
            group_size="",
            duration="",
            error="",
            peer=str(r.get("peer") or ""),
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


def _share(peer: Mapping[str, Any], swarm_rate: float) -> str:
    if peer.get("auxiliary") or peer.get("samples_per_second") is None:
        return "—"
    return f"{100.0 * float(peer['samples_per_second']) / swarm_rate:.0f}%" if swarm_rate > 0 else "0%"


def _excluded_by(peer: Mapping[str, Any], peers, own_exclusions) -> str:
    """Who excludes `peer` on evidence: the records that name it (each writer's word, swarm/peer_records.py
    `excluding`) and, on a peer's own page, this peer's exclusion with its reason (fresher than its record)."""
    peer_id = peer.get("peer_id")
    by = {str(q.get("peer_id")) for q in peers if peer_id in (q.get("excluding") or ())}
    mine = next((e for e in own_exclusions if isinstance(e, Mapping) and e.get("peer_id") == peer_id), None)
    own_id = next((str(q.get("peer_id")) for q in peers if q.get("self")), "")
    if mine is not None:
        by.add(own_id)
    if not by:
        return ""
    text = f"by {len(by)} peer{'s' if len(by) != 1 else ''}"
    return f"{text} (this one: {mine.get('reason')})" if mine is not None else text


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


# --- the flight recorder: one round across the peers that published it (swarm/round_records.py) -------------------

PHASES = (("matchmaking", "asked_at", "grouped_at"), ("all-reduce", "grouped_at", "reduced_at"),
          ("applying", "reduced_at", "ended_at"))


@dataclass(frozen=True)
class LaneSegment:
    phase: str  # matchmaking, all-reduce, applying
    left: float  # % of the round's span from its left edge
    width: float  # % of the span
    seconds: str


@dataclass(frozen=True)
class Lane:
    name: str
    short_id: str
    outcome: str
    failed: bool
    segments: tuple  # LaneSegment, ...
    took: str  # "1.84 s" from its ask to its apply
    traffic: str = ""  # "sent 1.20 MB · received 1.19 MB" by its all-reduce; "" where its record has no bytes


@dataclass(frozen=True)
class RoundTimelineView:
    title: str  # "gradients round of epoch 12"
    note: str  # the span, and how many peers' clocks it rests on
    lanes: tuple  # Lane, one per peer that published the round
    unpublished: tuple  # names of group members that published no record of it (yet)


def _unpublished(entries: list) -> set:
    """The members of a round's group (as its publishers name them) that published no record of it."""
    members = {peer for _, item in entries for peer in item.get("peers") or () if isinstance(peer, str)}
    return members - {peer_id for peer_id, _ in entries}


def _published_by_its_group(entries: list) -> bool:
    """Two or more peers published this round, and every member of its group did."""
    return len(entries) >= 2 and not _unpublished(entries)


def round_timeline(s: Mapping[str, Any]) -> Optional[RoundTimelineView]:
    """The newest round its whole group published (kind and epoch alike), as lanes per peer on one time axis; None
    before any peer published one. Values are strangers' words, already bounded by the records' schema."""
    names = {p.get("peer_id"): str(p.get("public_name") or short_id(p.get("peer_id")))
             for p in s.get("peers") or () if isinstance(p, Mapping)}
    rounds: dict[tuple, list] = {}
    for record in s.get("swarm_rounds") or ():
        if not isinstance(record, Mapping):
            continue
        for item in record.get("rounds") or ():
            if isinstance(item, Mapping) and _number(item.get("ended_at")) is not None:
                rounds.setdefault((item.get("kind"), item.get("epoch")), []).append((record.get("peer_id"), item))
    if not rounds:
        return None
    # the newest round that every peer of its group published; else the newest that two or more did (peers publish
    # every few seconds, so the newest rounds miss lanes: the page names who has not published); else the newest
    (kind, epoch), entries = max(rounds.items(), key=lambda kv: (
        _published_by_its_group(kv[1]), len(kv[1]) >= 2, max(_number(item["ended_at"]) for _, item in kv[1])))
    starts = [_number(item.get(mark)) for _, item in entries for mark in ("asked_at", "grouped_at", "ended_at")]
    begin = min(t for t in starts if t is not None)
    end = max(_number(item["ended_at"]) for _, item in entries)
    span = max(end - begin, 1e-6)
    def first_mark(entry) -> float:  # lanes in the order the peers asked: a late one is at the bottom
        item = entry[1]
        return next(t for t in (_number(item.get(m)) for m in ("asked_at", "grouped_at", "ended_at")) if t is not None)

    lanes = []
    for peer_id, item in sorted(entries, key=first_mark):
        segments = []
        for phase, start_mark, end_mark in PHASES:
            start, stop = _number(item.get(start_mark)), _number(item.get(end_mark))
            if start is None or stop is None or stop < start:
                continue
            segments.append(LaneSegment(phase, round(100 * (start - begin) / span, 2),
                                        round(max(0.5, 100 * (stop - start) / span), 2), f"{stop - start:.2f} s"))
        first = first_mark((peer_id, item))
        outcome = str(item.get("outcome") or "")
        lanes.append(Lane(names.get(peer_id, short_id(peer_id)), short_id(peer_id), outcome,
                          outcome in FAILED_OUTCOMES, tuple(segments), f"{_number(item['ended_at']) - first:.2f} s",
                          traffic_words(item.get("sent_bytes"), item.get("received_bytes"))))
    unpublished = tuple(sorted(names.get(peer, short_id(peer)) for peer in _unpublished(entries)))
    return RoundTimelineView(
        title=f"{kind} round of epoch {epoch}",
        note=f"{span:.2f} s from the first ask to the last apply, on {len(lanes)} peer clock(s)",
        lanes=tuple(lanes),
        unpublished=unpublished,
    )


def _number(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
