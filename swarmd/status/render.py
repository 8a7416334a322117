"""`swarmd status` views drawn with rich, from a snapshot (swarmd/status/snapshot.py) - the local daemon's, or
the one `swarmd status --initial-peers` builds from the DHT (swarmd/status/remote.py).

One frame: the run and this peer; the global epoch with a progress bar of samples towards the target batch and
its ETA; the swarm's peers from their DHT records; recent averaging rounds; the loss trend. rich only: no torch.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

__all__ = ["build_view", "render_once", "render_live", "progress_bar", "sparkline", "format_duration"]

_SPARK = "▁▂▃▄▅▆▇█"


def build_view(snapshot: dict[str, Any], *, now: Optional[float] = None, problem: Optional[str] = None):
    """The whole frame as one rich renderable. `problem`: a line shown on top (e.g. the daemon stopped answering)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    now = time.time() if now is None else now
    parts = []
    if problem:
        parts.append(Text(problem, style="bold red"))
    parts += [_header(snapshot), Text(""), _epoch(snapshot), Text(""), _peers(snapshot)]
    if snapshot.get("mode") != "remote":
        parts += [Text(""), _rounds(snapshot, now), Text(""), _loss(snapshot)]
    title = f"swarmd · run {snapshot.get('run_id')}"
    return Panel(Group(*parts), title=title, title_align="left", border_style="blue")


def render_once(snapshot: dict[str, Any], console=None) -> None:
    import os

    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console = Console(width=120)  # a pipe or a file has no width: do not squeeze the tables into 80
    console.print(build_view(snapshot))


def render_live(
    read: Callable[[], dict[str, Any]], interval: float = 1.0, console=None, first: Optional[dict[str, Any]] = None
) -> None:
    """Redraw every `interval` seconds until Ctrl-C. A failed read keeps the last frame, says why and retries."""
    from rich.console import Console
    from rich.live import Live

    from swarmd.errors import SwarmdError

    console = console or Console()
    snapshot = first if first is not None else read()
    with Live(build_view(snapshot), console=console, auto_refresh=False, transient=False) as live:
        try:
            while True:
                time.sleep(interval)
                try:
                    snapshot = read()
                    live.update(build_view(snapshot), refresh=True)
                except SwarmdError as e:
                    live.update(build_view(snapshot, problem=f"{e} (retrying every {interval:.0f} s)"), refresh=True)
        except KeyboardInterrupt:
            pass


# --- parts ---------------------------------------------------------------------------------------------------


def _header(s: dict[str, Any]):
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    if s.get("mode") == "remote":
        grid.add_row("observer", f"a light client of the DHT (not a peer: trains nothing, not counted) via {_first(s.get('initial_peers'))}")
        grid.add_row("records", f"{len(s.get('peers') or [])} peer record(s), {s.get('peer_records_rejected_total', 0)} malformed ignored")
        if s.get("manifest"):
            grid.add_row("manifest", manifest_line(s["manifest"]))
        if not s.get("peers") and not s.get("num_peers"):
            grid.add_row("", f"no peer of run {s.get('run_id')!r} found: is --run-id the run's id?")
        return grid
    name = s.get("public_name") or "?"
    grid.add_row("peer", f"{name} ({_short_id(s.get('peer_id'))})  {_role(s)}  ·  reachable: {_reachable(s)}")
    state = s.get("state") or "?"
    phase = s.get("phase")
    # the worker's phase says more only while training (assisting, restarting...) or when it failed: the last
    # frame of a peer that stopped must not read "stopping / training"
    shown = phase and phase != state and (state == "training" or phase == "failed")
    grid.add_row(
        "state",
        f"{state}{f' / {phase}' if shown else ''}  ·  up {format_duration(s.get('uptime_seconds'))}"
        f"  ·  {s.get('device') or 'no device yet'}  ·  task {s.get('task')}  ·  swarmd {s.get('swarmd_version')}",
    )
    if s.get("ranks"):
        grid.add_row("ranks", "  |  ".join(_rank_text(row) for row in s["ranks"]))
    if s.get("ranks_dead"):
        grid.add_row("rank down", str(s["ranks_dead"]))
    if s.get("learning_rates"):
        grid.add_row("lr", ", ".join(f"{lr:.3g}" for lr in s["learning_rates"]))
    if s.get("allowed_peers") is not None:
        refused = sum((s.get("refusals") or {}).values())
        grid.add_row("private", f"{s['allowed_peers']} other peer(s) allowed (network.allowed_peers)  ·  {refused} refused")
    if s.get("manifest"):
        grid.add_row("manifest", manifest_line(s["manifest"]))
    for entry in s.get("excluded_peers") or ():
        grid.add_row("excluded", excluded_line(entry, s.get("uptime_seconds"), s.get("started_at")))
    for entry in s.get("suspected_peers") or ():
        grid.add_row("suspected", suspected_line(entry))
    if s.get("parameter_drift") is not None:
        grid.add_row("drift", f"{s['parameter_drift']:.3g} of the parameters' norm from the swarm's last average")
    if s.get("metrics_address"):
        grid.add_row("metrics", f"http://{s['metrics_address']}/metrics")
    if s.get("last_error"):
        grid.add_row("last error", str(s["last_error"])[:200])
    return grid


def excluded_line(entry: dict[str, Any], uptime, started_at) -> str:
    """A peer this one excluded on evidence (swarm/exclusion.py): who, why, the evidence, for how much longer."""
    now = (started_at or 0.0) + (uptime or 0.0)
    evidence = {
        "clipped": f"clipped in {entry.get('clipped_rounds')} of {entry.get('rounds_seen')} rounds",
        "returned": f"its returned averages refused in {entry.get('returned_rounds')} rounds",
        "state": f"{entry.get('refused_states')} states it served refused",
    }.get(entry.get("reason"), f"claims capped in {entry.get('capped_claims')} epochs")
    left = max(0.0, float(entry.get("until") or 0.0) - now)
    return (f"{_short_id(entry.get('peer_id'))}  ·  {evidence}  ·  {format_duration(left)} left  ·  "
            f"exclusion {entry.get('exclusions')}")


def suspected_line(entry: dict[str, Any]) -> str:
    """A peer with evidence against it, not enough to exclude it (swarm/exclusion.py): who, and the evidence."""
    evidence = []
    if entry.get("clipped_rounds"):
        evidence.append(f"clipped in {entry['clipped_rounds']} of {entry.get('rounds_seen')} rounds")
    if entry.get("returned_rounds"):
        evidence.append(f"its returned averages refused in {entry['returned_rounds']} rounds")
    if entry.get("capped_claims"):
        evidence.append(f"claims capped in {entry['capped_claims']} epochs")
    if entry.get("refused_states"):
        evidence.append(f"{entry['refused_states']} states it served refused")
    return f"{_short_id(entry.get('peer_id'))}  ·  {', '.join(evidence)}  ·  asked last for the state"


def manifest_line(m: dict[str, Any]) -> str:
    """The run's manifest in one line: version, the run key's fingerprint, and what waits for a restart."""
    text = f"v{m.get('version')}  ·  run key {str(m.get('key_fingerprint') or '')[:16]}"
    if m.get("pending_version"):
        text += f"  ·  v{m['pending_version']} at the next epoch"
    if m.get("restart_needed"):
        text += f"  ·  restart needed for {', '.join(m['restart_needed'])}"
    if m.get("ignored_total"):
        text += f"  ·  {m['ignored_total']} ignored"
    return text


def _reachable(s: dict[str, Any]) -> str:
    """yes / no (the advice is in the log) / unknown (no peer answered yet); a client (by choice, or because its
    initial peers could not dial it back) is reached over the connections it opens, and trains normally."""
    forwarded = s.get("state_forwarded_bytes_total") or 0
    relayed = f"  ·  forwarded {forwarded / 1e6:.1f} MB of clients' state" if forwarded else ""
    return _how_reached(s) + relayed


def _how_reached(s: dict[str, Any]) -> str:
    reachable = s.get("reachable") or "unknown"
    if s.get("reachability") == "client" or (reachable == "unknown" and s.get("client_mode")):
        return "as a client (it dials out; trains normally)"
    if s.get("reachability") == "relay":
        return "through a relay"
    if reachable == "no":
        return "[red]no[/red] (see the log for how to fix it)"
    return reachable


def _epoch(s: dict[str, Any]):
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    epoch = s.get("global_epoch")
    local = s.get("local_epoch")
    peers = s.get("num_peers")
    clients = s.get("num_clients")
    where = f"global epoch {epoch if epoch is not None else '?'}"
    if local is not None:
        where += f" (this peer: {local})"
    swarm = f"{peers} peer{'s' if peers != 1 else ''}" if peers is not None else "? peers"
    if clients:
        swarm += f" ({clients} in client mode)"
    grid.add_row("epoch", f"{where}  ·  {swarm}")
    target = s.get("target_batch_size") or 0
    samples = s.get("samples_accumulated")
    percent = f"{100 * (samples or 0) / target:.0f}%" if target else "?"
    eta = s.get("eta_seconds")
    line = progress_bar(samples or 0, target)
    line.append(f"  {_count(samples)} / {_count(target)} samples ({percent})")
    line.append(f"  ·  ETA {format_duration(eta) if eta is not None else '?'}")
    grid.add_row("progress", line)
    rate = s.get("samples_per_second")
    loss = s.get("loss")
    if s.get("mode") == "remote":
        grid.add_row("throughput", f"{_rate(rate)} samples/s in the swarm (as the peers report it)")
    else:
        grid.add_row(
            "throughput",
            f"{_rate(rate)} samples/s  ·  {_count(s.get('samples_total'))} samples trained  ·  loss {_loss_text(loss)}",
        )
    return grid


def _peers(s: dict[str, Any]):
    from rich.console import Group
    from rich.text import Text

    peers = s.get("peers") or []
    legend = "; * this peer" if any(p.get("self") for p in peers) else ""  # none in remote mode
    title = Text.assemble((f"peers ({len(peers)})", "bold"), f"  from their signed records in the DHT{legend}")
    ignored = [Text(f"  ignored {p.get('public_name')} ({_short_id(p.get('peer_id'))}): {p.get('difference')}", style="yellow")
               for p in s.get("incompatible_peers") or []]
    if not peers:
        return Group(title, Text("  no records yet (peers publish theirs every few seconds)"), *ignored)
    return Group(title, _PeersTable(peers), *ignored)


# (header, justify, cell, essential): the essential columns are all that is drawn where the full table does not
# fit; the peer id is one of them (two peers on one host share its name), as its last characters there
_PEER_COLUMNS = (
    ("name", "left", lambda p: _name(p), True),
    ("peer id", "left", lambda p: _short_id(p.get("peer_id")), True),
    ("role", "left", lambda p: _role(p), False),
    ("state", "left", lambda p: str(p.get("state", "")), True),
    ("epoch", "right", lambda p: str(p.get("local_epoch", "")), True),
    ("samples/s", "right", lambda p: _rate(p.get("samples_per_second")), True),
    ("loss", "right", lambda p: _loss_text(p.get("loss")), True),
    ("avg ok/failed", "right", lambda p: f"{p.get('averaging_success', 0)}/{p.get('averaging_failed', 0)}", False),
    ("up", "right", lambda p: format_duration(p.get("uptime_seconds")), False),
    ("last seen", "right", lambda p: f"{format_duration(p.get('last_seen_seconds'))} ago", True),
)
_NARROW_CELLS = {"peer id": lambda p: _id_tail(p.get("peer_id"))}
_NAME_WIDTHS = (12, 24)  # a name is cut to fit, never below the first; the full table drops no column above it


class _PeersTable:
    """The peers table: every column where it fits with names of 12 characters, else the essential ones. A long
    name is cut to the room left (its "*" kept), so that rich never cuts another cell short."""

    def __init__(self, peers: list[dict[str, Any]]):
        self.peers = peers

    def __rich_console__(self, console, options):
        from rich.cells import cell_len
        from rich.table import Table

        for narrow in (False, True):
            columns = [(header, justify, _NARROW_CELLS.get(header, cell) if narrow else cell)
                       for header, justify, cell, essential in _PEER_COLUMNS if essential or not narrow]
            rows = [[cell(peer) for _header, _justify, cell in columns] for peer in self.peers]
            widths = [max(cell_len(header), *(cell_len(row[i]) for row in rows)) for i, (header, _, _) in
                      enumerate(columns)]
            # without edges a column takes its width + 2 of padding, and a separator stands between two columns
            room = options.max_width - (sum(widths) - widths[0]) - 3 * len(columns) + 1  # for the names (column 0)
            if room >= min(widths[0], _NAME_WIDTHS[0]):
                break
        name_width = max(_NAME_WIDTHS[0], min(room, _NAME_WIDTHS[1]))
        table = Table(show_edge=False)
        for header, justify, _cell in columns:
            table.add_column(header, justify=justify, no_wrap=True)
        for peer, row in zip(self.peers, rows):
            table.add_row(_name(peer, name_width), *row[1:])
        yield table


def _rounds(s: dict[str, Any], now: float):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rounds = list(reversed(s.get("recent_averaging") or []))[:8]
    counts = s.get("averaging") or {}
    summary = "; ".join(f"{kind}: {_outcome_counts(c)}" for kind, c in sorted(counts.items()) if any(c.values()))
    table = Table(show_edge=False)
    for header, justify in (("when", "right"), ("kind", "left"), ("outcome", "left"), ("group", "right"),
                            ("duration", "right"), ("phases", "left"), ("epoch", "right")):
        table.add_column(header, justify=justify, no_wrap=True)
    styles = {"success": "green", "skipped": "yellow"}  # any other outcome: the average was not used
    for item in rounds:
        outcome = item.get("outcome", "")
        table.add_row(
            f"{format_duration(max(0.0, now - item.get('time', now)))} ago",
            item.get("kind", ""),
            f"[{styles.get(outcome, 'red')}]{outcome}[/]",
            str(item.get("group_size", "")),
            _round_duration(item),
            round_phases(item),
            str(item.get("epoch", "")),
        )
    title = Text.assemble(("recent averaging rounds", "bold"), f"  ({summary})" if summary else "")
    if not rounds:
        return Group(title, Text("  none yet"))
    return Group(title, table)


PHASE_NAMES = {"matchmaking": "match", "all-reduce": "reduce", "applying": "apply"}


def round_phases(item: dict[str, Any]) -> str:
    """Where a round's time went on this peer (its timeline, swarm/averaging_log.py), and what its all-reduce
    moved: "match 1.20 s · reduce 0.31 s · apply 0.05 s · sent 1.20 MB · received 1.19 MB"; "" for a round
    without one (skipped, or from a peer before it recorded them)."""
    from swarmd.swarm.averaging_log import timeline_phases
    from swarmd.swarm.outcomes import traffic_words

    timeline = item.get("timeline")
    if not isinstance(timeline, dict):
        return ""
    phases = timeline_phases(*(timeline.get(mark) for mark in ("asked_at", "grouped_at", "reduced_at", "ended_at")))
    words = [f"{PHASE_NAMES[name]} {seconds:.2f} s" for name, seconds in phases.items()]
    traffic = traffic_words(timeline.get("sent_bytes"), timeline.get("received_bytes"))
    return " · ".join(words + ([traffic] if traffic else []))


def _round_duration(item: dict[str, Any]) -> str:
    """The round's wall time; for a round overlapped with the training, also what the training still waited; for
    a round this peer waited for slower peers to begin, that wait."""
    text = f"{item.get('duration_seconds', 0.0):.2f} s"
    waits = []
    if item.get("waited_seconds") is not None:
        waits.append(f"waited {item['waited_seconds']:.2f} s")
    if item.get("peer_wait_seconds"):
        waits.append(f"{item['peer_wait_seconds']:.2f} s for slower peers")
    return f"{text} ({'; '.join(waits)})" if waits else text


def _loss(s: dict[str, Any]):
    from rich.console import Group

    return Group(
        _trend("loss trend", s.get("loss_history"), "cyan", "{:.4g}"),
        _trend("samples/s  ", s.get("rate_history"), "green", "{:.1f}"),
    )


def _trend(label: str, history, style: str, number: str):
    """A sparkline of the last 40 epochs of ((epoch, value), ...), with the first and last values."""
    from rich.text import Text

    recent = [(epoch, value) for epoch, value in history or [] if value is not None][-40:]
    if not recent:
        return Text.assemble((f"{label}  ", "bold"), "(no finished epoch yet)")
    values = [value for _, value in recent]
    return Text.assemble(
        (f"{label}  ", "bold"),
        (sparkline(values), style),
        f"  {number.format(values[0])} → {number.format(values[-1])}  (epochs {recent[0][0]}-{recent[-1][0]})",
    )


# --- formatting ----------------------------------------------------------------------------------------------


def _rank_text(row: dict[str, Any]) -> str:
    """"cuda:1 409.2/s 10.2/12.0 GiB": a rank's device, compute rate and (CUDA) allocated/reserved memory."""
    text = f"{row.get('device')} {_rate(row.get('samples_per_second'))}/s"
    if row.get("cuda_reserved_bytes") is not None:
        text += f" {row.get('cuda_allocated_bytes', 0) / 2**30:.1f}/{row['cuda_reserved_bytes'] / 2**30:.1f} GiB"
    return text


def _outcome_counts(counts: dict[str, int]) -> str:
    """"3 success, 1 rejected": every outcome that happened, in swarm/outcomes.py's order (unknown ones last)."""
    from swarmd.swarm.outcomes import OUTCOMES

    order = list(OUTCOMES) + sorted(set(counts) - set(OUTCOMES))
    return ", ".join(f"{counts[name]} {name}" for name in order if counts.get(name))


def progress_bar(done: float, total: float, width: int = 40):
    """A bar that reads without colour too: ━ for samples accumulated, ─ for those still missing."""
    from rich.text import Text

    filled = int(width * min(1.0, done / total)) if total else 0
    return Text.assemble(("━" * filled, "green"), ("─" * (width - filled), "grey42"))


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    if high - low < 1e-12:
        return _SPARK[3] * len(values)
    return "".join(_SPARK[min(len(_SPARK) - 1, int((v - low) / (high - low) * len(_SPARK)))] for v in values)


def format_duration(seconds) -> str:
    if seconds is None:
        return "?"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def _role(entity: dict[str, Any]) -> str:
    if entity.get("auxiliary"):
        return "auxiliary"
    return "client" if entity.get("client_mode") else "trainer"


def _short_id(peer_id) -> str:
    if not peer_id:
        return "?"
    peer_id = str(peer_id)
    return peer_id if len(peer_id) <= 14 else f"{peer_id[:6]}…{peer_id[-6:]}"


def _name(peer: dict[str, Any], width: int = 10**6) -> str:
    """The peer's public name within `width` characters, and " *" for this peer (kept when the name is cut)."""
    mark = " *" if peer.get("self") else ""
    name = str(peer.get("public_name") or "?")
    room = width - len(mark)
    return (name if len(name) <= room else name[:room - 1] + "…") + mark


def _id_tail(peer_id) -> str:
    """The last characters of a peer id: what tells two peers apart where the short id does not fit."""
    if not peer_id:
        return "?"
    peer_id = str(peer_id)
    return peer_id if len(peer_id) <= 7 else f"…{peer_id[-6:]}"


def _count(value) -> str:
    return "?" if value is None else f"{int(value):,}"


def _rate(value) -> str:
    return "?" if value is None else f"{float(value):.1f}"


def _loss_text(value) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def _first(items) -> str:
    items = list(items or [])
    if not items:
        return "?"
    return items[0] + (f" (+{len(items) - 1})" if len(items) > 1 else "")
