"""The `swarmd status` frame, as rich records it: remote mode, and a live view that loses its daemon."""

import time

from rich.console import Console

from swarmd.errors import DaemonNotRunning
from swarmd.status.render import build_view, format_duration, render_live, sparkline
from samples import sample_snapshot


def text_of(renderable, width=120) -> str:
    console = Console(record=True, width=width, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


def test_remote_frame_names_the_observer_and_shows_the_swarm():
    local = sample_snapshot(time.time())
    remote = {
        "mode": "remote", "run_id": "unit-run", "state": "observing", "initial_peers": ["/ip4/10.0.0.1/tcp/31337/p2p/QmX"],
        "global_epoch": 7, "num_peers": 2, "num_clients": 0, "samples_accumulated": 64, "target_batch_size": 128,
        "eta_seconds": 1.0, "samples_per_second": 190.0, "peers": local["peers"], "peer_records_rejected_total": 1,
    }
    frame = text_of(build_view(remote))
    assert "light client" in frame and "not counted" in frame and "1 malformed ignored" in frame
    assert "64 / 128 samples (50%)" in frame and "190.0 samples/s in the swarm" in frame
    assert "alpha" in frame and "beta" in frame
    assert "recent averaging rounds" not in frame  # only a local daemon knows its rounds


def test_live_view_keeps_the_last_frame_and_says_the_daemon_is_gone():
    snapshot = sample_snapshot(time.time())
    reads = iter([snapshot, DaemonNotRunning("no swarmd daemon answers on /x/swarmd.sock"), KeyboardInterrupt()])

    def read():
        item = next(reads)
        if isinstance(item, BaseException):
            raise item
        return item

    console = Console(record=True, width=120, file=open("/dev/null", "w"))
    render_live(read, interval=0.01, console=console)  # returns on Ctrl-C
    frame = console.export_text()
    assert "no swarmd daemon answers on /x/swarmd.sock (retrying every 0 s)" in frame
    assert "global epoch 7" in frame  # the last good frame stays on screen


def test_formatting_helpers():
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁" and sparkline([1.0, 1.0]) == "▄▄" and sparkline([]) == ""
    assert format_duration(4.25) == "4.2 s" and format_duration(75) == "1m15s" and format_duration(7260) == "2h01m"
    assert format_duration(None) == "?"


def test_a_narrow_terminal_keeps_the_essential_peer_columns():
    snapshot = sample_snapshot(time.time())
    narrow, wide = text_of(build_view(snapshot), width=80), text_of(build_view(snapshot), width=120)
    for frame in (narrow, wide):
        assert "alpha *" in frame and "beta" in frame and "samples/s" in frame and "last seen" in frame
        assert "96 / 128 samples (75%)" in frame
    table = narrow.split("peers (2)")[1].split("recent averaging")[0]
    assert "QmYyQS…Wjhx5N" in wide and "…Wjhx5N" in table and "QmYyQS" not in table  # narrow: the id's tail
    assert "alpha *" in table and "training" in table and "1.7500" in table and "2.0 s ago" in table  # nothing cut


def test_two_peers_on_one_host_read_apart_at_80_columns():
    snapshot = sample_snapshot(time.time())
    for peer in snapshot["peers"]:
        peer["public_name"] = "gpu-box-17.lab"  # daemon.public_name defaults to the host name
    frame = text_of(build_view(snapshot), width=80)
    rows = [line for line in frame.splitlines() if "gpu-box-1" in line]
    assert len(rows) == 2 and rows[0] != rows[1]
    assert "…Wjhx5N" in rows[0] and "…DjiXwV" in rows[1]
    assert rows[0].split("│")[1].strip().endswith("*")  # this peer's mark survives a name cut to fit


def test_remote_mode_has_no_this_peer_legend():
    remote = {"mode": "remote", "run_id": "unit-run", "initial_peers": ["/ip4/10.0.0.1/tcp/31337/p2p/QmX"],
              "peers": [{**p, "self": False} for p in sample_snapshot(time.time())["peers"]]}
    frame = text_of(build_view(remote))
    assert "peers (2)" in frame and "this peer" not in frame
    assert "* this peer" in text_of(build_view(sample_snapshot(time.time())))  # a local daemon's frame has it


def test_the_last_frame_of_a_stopping_peer_does_not_say_training():
    snapshot = {**sample_snapshot(time.time()), "state": "stopping", "phase": "training"}
    frame = text_of(build_view(snapshot, problem="no swarmd daemon answers on /x/swarmd.sock (retrying every 1 s)"))
    state = next(line for line in frame.splitlines() if "state " in line and "up " in line)
    assert "stopping" in state and "training" not in state, state
    restarting = text_of(build_view({**sample_snapshot(time.time()), "phase": "restarting"}))
    assert "training / restarting" in restarting  # the worker's phase still shows while training


def test_the_local_frame_draws_loss_and_throughput_trends_and_reachability():
    snapshot = {**sample_snapshot(time.time()), "loss_history": [[5, 2.0], [6, 1.5], [7, 1.0]],
                "rate_history": [[5, 100.0], [6, 150.0], [7, 200.0]], "reachable": "no"}
    frame = text_of(build_view(snapshot))
    assert "loss trend  █▅▁  2 → 1  (epochs 5-7)" in frame
    assert "samples/s    ▁▅█  100.0 → 200.0  (epochs 5-7)" in frame
    assert "reachable: no (see the log for how to fix it)" in frame
    client = {**snapshot, "reachable": "unknown", "reachability": "client", "client_mode": True}  # behind NAT
    assert "reachable: as a client (it dials out; trains normally)" in text_of(build_view(client))


def test_worker_stats_keep_each_epochs_samples_per_second():
    from swarmd.worker.stats import WorkerStats

    now = [100.0]
    stats = WorkerStats(clock=lambda: now[0])
    for _ in range(4):  # epoch 0: 4 steps of 16 samples, 0.5 s each, 2 s in all
        now[0] += 0.5
        stats.record_step(samples=16, seconds=0.5, loss=1.0)
    stats.end_epoch(0)
    now[0] += 3.0  # epoch 1: one step after a 2.5 s wait on averaging: 16 samples in 3 s
    stats.record_step(samples=16, seconds=0.5, loss=1.0)
    stats.end_epoch(1)
    assert stats.report().rate_history == ((0, 32.0), (1, 16 / 3.0))


def test_an_overlapped_round_shows_how_long_the_training_still_waited_for_it():
    snapshot = sample_snapshot(time.time())
    snapshot["recent_averaging"].append({"kind": "outer", "outcome": "success", "group_size": 2,
                                         "duration_seconds": 11.2, "epoch": 7, "time": time.time(), "error": "",
                                         "waited_seconds": 0.0})
    frame = text_of(build_view(snapshot), width=140)
    assert "11.20 s (waited 0.00 s)" in frame
    assert "0.42 s" in frame and "0.42 s (waited" not in frame  # a round the training waited for whole


def test_a_round_that_waited_for_slower_peers_says_how_long():
    snapshot = sample_snapshot(time.time())
    snapshot["recent_averaging"].append({"kind": "outer", "outcome": "success", "group_size": 2,
                                         "duration_seconds": 6.1, "epoch": 7, "time": time.time(), "error": "",
                                         "waited_seconds": 0.0, "peer_wait_seconds": 1.25})
    frame = text_of(build_view(snapshot), width=140)
    assert "6.10 s (waited 0.00 s; 1.25 s for slower peers)" in frame
