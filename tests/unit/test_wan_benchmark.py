"""benchmarks/wan.py and benchmarks/netlab.py: the parts that need neither root nor namespaces."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import netlab  # noqa: E402
import wan  # noqa: E402


def test_defaults_are_three_rates_and_every_strategy_this_build_has():
    args = wan.parse_args([])
    assert args.rates == [1000.0, 100.0, 20.0]
    assert args.strategies == ["sync", "dpu", "local", "hivemind-defaults", "hivemind-tuned"]
    assert (args.epochs, args.repeats, args.quick) == (12, 1, False)


def test_quick_is_one_rate_and_a_short_budget():
    args = wan.parse_args(["--quick", "--rates", "1000", "100", "--epochs", "20"])
    assert args.rates == [20.0]
    assert args.epochs == 2 and args.repeats == 1


def test_diloco_is_a_row_only_where_the_build_has_the_strategy(capsys):
    with pytest.raises(SystemExit) as exit_info:
        wan.parse_args(["--strategies", "sync", "diloco"], with_diloco=False)
    assert exit_info.value.code == 2
    assert "no swarm.strategy" in capsys.readouterr().err
    args = wan.parse_args(["--strategies", "sync", "diloco"], with_diloco=True)
    assert args.strategies == ["sync", "diloco"]
    assert "diloco" in wan.parse_args([], with_diloco=True).strategies


def test_diloco_detection_reads_the_swarm_config_schema():
    from swarmd.config.schema import SwarmConfig

    assert wan.diloco_available() == ("strategy" in SwarmConfig.model_fields)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--strategies", "gossip"], "unknown strategies"),
        (["--rates", "0"], "positive"),
        (["--epochs", "1"], "at least 2"),
        (["--target-batch-size", "1000"], "multiple of 64"),
    ],
)
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        wan.parse_args(argv)
    assert message in capsys.readouterr().err


def test_diloco_budget_is_counted_in_samples_not_outer_steps():
    args = wan.parse_args(["--epochs", "12", "--diloco-inner-steps", "64"], with_diloco=True)
    # 12 x 1024 samples; an outer step is 64 steps x 32 x 2 peers = 4096 samples
    assert wan.budget_epochs("diloco", args) == 3
    assert wan.budget_epochs("sync", args) == 12
    section = wan.swarm_section("diloco", args)
    assert section["strategy"] == "diloco" and section["diloco"] == {"inner_steps": 64}
    assert section["target_batch_size"] == 4096


def test_the_overlap_row_is_diloco_with_overlap_steps_below_h(capsys):
    from swarmd.config.schema import SwarmConfig

    args = wan.parse_args(["--diloco-inner-steps", "64", "--diloco-overlap-steps", "24"], with_diloco=True)
    section = wan.swarm_section("diloco-overlap", args)
    assert section["diloco"] == {"inner_steps": 64, "overlap_steps": 24, "overlap_mixing": 0.5}
    assert wan.budget_epochs("diloco-overlap", args) == wan.budget_epochs("diloco", args)
    SwarmConfig.model_validate(section)  # what the peers are started with is a valid config
    with pytest.raises(SystemExit):
        wan.parse_args(["--strategies", "diloco-overlap", "--diloco-inner-steps", "16", "--diloco-overlap-steps", "16"],
                       with_diloco=True)
    assert "--diloco-overlap-steps must be between 1" in capsys.readouterr().err


def test_the_8bit_overlap_row_differs_from_the_overlap_row_only_in_its_wire_format():
    from swarmd.config.schema import SwarmConfig

    args = wan.parse_args(["--diloco-inner-steps", "64", "--diloco-overlap-steps", "24"], with_diloco=True)
    fp16, eight_bit = wan.swarm_section("diloco-overlap", args), wan.swarm_section("diloco-overlap-8bit", args)
    assert eight_bit.pop("grad_compression") == "blockwise8" and "grad_compression" not in fp16
    assert eight_bit == fp16
    assert fp16["next_chunk_timeout"] == 10.0  # not hivemind's matchmaking_time (2 s): it cut rounds short at 20 Mbit/s
    SwarmConfig.model_validate(wan.swarm_section("diloco-overlap-8bit", args))


def test_the_nice_row_is_the_8bit_row_with_hiveminds_processes_at_a_lower_priority():
    from swarmd.config.schema import SwarmdConfig

    args = wan.parse_args(["--diloco-inner-steps", "64", "--diloco-overlap-steps", "24"], with_diloco=True)
    eight_bit, nice = (wan.config(strategy, "198.18.0.1", 31401, "/tmp/data", args)
                       for strategy in ("diloco-overlap-8bit", "diloco-overlap-8bit-nice"))
    assert eight_bit["swarm"] == nice["swarm"]
    assert (eight_bit["daemon"]["background_priority"], nice["daemon"]["background_priority"]) == ("normal", "nice")
    SwarmdConfig.model_validate(nice)


def test_diloco_rows_warm_up_and_decay_over_the_samples_the_sync_rows_do(capsys):
    from swarmd.tasks.optim import OptimConfig

    args = wan.parse_args(["--target-batch-size", "1024"], with_diloco=True)
    sync = wan.config("sync", "198.18.0.1", 31401, "/tmp/data", args)["task"]["optim"]
    pair = wan.config("diloco-overlap-8bit", "198.18.0.1", 31401, "/tmp/data", args)["task"]["optim"]
    alone = wan.config("diloco", "198.18.0.1", 31401, "/tmp/data", args, peers=1)["task"]["optim"]
    # a 1024-sample epoch is 16 inner steps of a pair (2 x 32 per step) and 32 of a lone peer
    assert (sync["warmup_epochs"], sync["total_epochs"]) == (2, 200)
    assert (pair["warmup_epochs"], pair["total_epochs"]) == (32, 3200)
    assert (alone["warmup_epochs"], alone["total_epochs"]) == (64, 6400)
    assert {k: v for k, v in pair.items() if "epochs" not in k} == {k: v for k, v in sync.items() if "epochs" not in k}
    OptimConfig.model_validate(pair)
    args = wan.parse_args(["--diloco-inner-lr", "3.5e-4"], with_diloco=True)
    assert wan.optim_section("diloco", args)["lr"] == 3.5e-4 and wan.optim_section("sync", args)["lr"] == 2e-3
    args = wan.parse_args(["--rates", "1000", "20", "--only", "1000/sync", "20/diloco"], with_diloco=True)
    assert args.only == ["1000/sync", "20/diloco"] and args.rows == [(1000.0, "sync"), (20.0, "diloco")]
    with pytest.raises(SystemExit):
        wan.parse_args(["--rates", "20", "--only", "100/sync"], with_diloco=True)
    assert "--only 100/sync: not among" in capsys.readouterr().err


def test_hivemind_rows_train_the_sync_strategy_and_the_solo_peer_the_same_model():
    args = wan.parse_args([])
    assert wan.swarm_section("hivemind-tuned", args)["average_state_every"] == 10
    cfg = wan.config("sync", "198.18.0.1", 31401, "/tmp/data", args)
    assert cfg["network"]["host_maddrs"] == ["/ip4/198.18.0.1/tcp/31401"]
    assert cfg["task"]["model"] == wan.MODEL and cfg["task"]["eval_every_epochs"] == 12


def test_the_model_has_the_parameters_the_arithmetic_uses():
    from swarmd.config import load_config

    timm = pytest.importorskip("timm")
    settings = load_config(environ={}).task.settings.model.model_copy(update={
        "embed_dim": 64, "depths": [2, 2, 2, 2], "num_heads": [2, 4, 8, 16]})
    model = timm.create_model(settings.name, num_classes=10, **settings.overrides())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(wan.MODEL_PARAMETERS, rel=0.01)


def test_round_estimate_is_model_bytes_over_the_link():
    # 9.08M fp16 values = 18.16 MB each way per peer with two peers; 20 Mbit/s = 2.5 MB/s
    assert wan.round_seconds_estimate(20) == pytest.approx(7.264, rel=1e-3)
    assert wan.round_seconds_estimate(1000) == pytest.approx(0.1453, rel=1e-3)
    # four peers send 1.5x the vector each
    assert wan.round_seconds_estimate(20, peers=4) == pytest.approx(1.5 * 7.264, rel=1e-3)


@pytest.mark.parametrize(
    "rate, burst",
    [(1000, 500_000), (100, 65_536), (20, 65_536), (8, 65_536), (400, 200_000)],
)
def test_tbf_burst_covers_a_timer_tick_and_a_gso_packet(rate, burst):
    assert netlab.tbf_settings(rate) == (burst, 50)


def test_tbf_arguments_name_the_rate_in_kbit():
    assert netlab.tbf_args(20) == ["tbf", "rate", "20000kbit", "burst", "65536", "latency", "50ms"]
    assert netlab.tbf_args(1000)[2] == "1000000kbit"
    with pytest.raises(ValueError):
        netlab.tbf_settings(0)


def test_lab_names_fit_linux_interface_names_and_the_benchmark_subnet():
    lab = netlab.Lab(2, 20, prefix="swd-4194304-")
    assert lab.namespace(1) == "swd-4194304-1" and lab.bridge_namespace == "swd-4194304-br"
    assert lab.address(0) == "198.18.0.1" and lab.address(1) == "198.18.0.2"
    assert lab.exec_prefix(1) == ["ip", "netns", "exec", "swd-4194304-1"]
    assert max(len(lab._veth(i, side)) for i in range(2) for side in "pb") <= 15
    with pytest.raises(ValueError, match="15 characters"):
        netlab.Lab(2, 20, prefix="swd-a-very-long-prefix-")


def test_leftover_names_carry_the_pid_of_their_run():
    match = netlab._LEFTOVER.match("swd-12345-br")
    assert match and match.group(1) == "12345"
    assert netlab._LEFTOVER.match("swd-x-br") is None and netlab._LEFTOVER.match("eth0") is None


def test_round_seconds_take_the_kind_the_peer_averages_most():
    status = {"recent_averaging": [
        {"kind": "gradients", "outcome": "success", "duration_seconds": 2.0},
        {"kind": "gradients", "outcome": "success", "duration_seconds": 4.0},
        {"kind": "gradients", "outcome": "failed", "duration_seconds": 60.0},
        {"kind": "state", "outcome": "success", "duration_seconds": 9.0},
    ]}
    assert wan.round_seconds(status) == 3.0
    assert wan.round_seconds({"recent_averaging": []}) is None
    assert wan.round_counts({"averaging": {"gradients": {"success": 5, "failed": 1}, "state": {"success": 1}}}) == (6, 1)


def _run(rate, round_s=None, loss=2.0, **extra):
    return {"rate": rate, "round_s": round_s, "rounds": "4/0", "epochs_per_min": 6.0, "bytes_per_epoch": 18.2e6,
            "val_loss": loss, "samples": 12288, "wall_s": 120.0, **extra}


def test_a_diloco_peers_waits_are_its_wait_for_slower_peers_and_for_the_rounds_result():
    status = {"local_epoch": 6, "recent_averaging": [
        {"kind": "outer", "epoch": 3, "duration_seconds": 6.0, "waited_seconds": 0.5, "peer_wait_seconds": 1.0},
        {"kind": "outer", "epoch": 4, "duration_seconds": 6.0, "waited_seconds": 0.0, "peer_wait_seconds": 0.25},
        {"kind": "outer", "epoch": 5, "duration_seconds": 2.0, "waited_seconds": None, "peer_wait_seconds": None},
        {"kind": "state", "epoch": 5, "duration_seconds": 30.0},
    ]}
    # from epoch 4 on: 0.25 s for slower peers, then a round overlapped in full and one not overlapped (2 s)
    assert wan.outer_round_waits(status, since_epoch=4) == 2.25
    assert wan.outer_round_waits(status, since_epoch=6) is None
    # the status lists the newest rounds only: with outer steps 6 and 7 taken since, steps 4 and 5 are not all
    assert wan.outer_round_waits({**status, "local_epoch": 8}, since_epoch=4) is None


def test_the_table_divides_by_the_solo_rate_measured_in_the_same_run():
    results = {
        "solo": [_run(200.0), _run(100.0)],
        "20/sync": [_run(75.0, 7.5), _run(60.0, 8.5), _run(90.0, 7.0)],
        "1000/local": [_run(150.0, 0.4, loss=1.5)],
    }
    rows = wan.table_rows(results, solo_rate=150.0)
    assert [row[:2] for row in rows] == [["-", "solo"], ["20", "sync"], ["1000", "local"]]
    assert rows[0][3] == "1.00" and rows[0][6] == "-" and rows[0][9] == "-"
    assert rows[1][2] == "75.0 [60..90]" and rows[1][3] == "0.50" and rows[1][4] == "0.50" and rows[1][6] == "7.50"
    assert rows[1][5] == "-"  # "vs 2 solos" is for DiLoCo rows
    assert rows[1][9] == "18.2" and rows[2][10] == "1.500"
    assert all(len(row) == len(wan.HEADER) for row in rows)


def test_diloco_rows_are_also_divided_by_a_lone_diloco_peers_rate():
    results = {"solo": [_run(200.0)], "solo-diloco": [_run(160.0)], "20/diloco-overlap": [_run(120.0, 11.0)],
               "20/sync": [_run(100.0, 9.0)]}
    rows = wan.table_rows(results, solo_rate=200.0)
    assert [row[:2] for row in rows] == [["-", "solo"], ["-", "solo diloco"], ["20", "diloco-overlap"], ["20", "sync"]]
    assert [row[3:5] for row in rows] == [["1.00", "1.00"], ["0.80", "1.00"], ["0.60", "0.75"], ["0.50", "0.50"]]


def test_with_two_lone_diloco_peers_side_by_side_the_diloco_rows_are_divided_by_their_rate_too():
    results = {"solo": [_run(200.0)], "solo-diloco": [_run(160.0)], "solo-diloco-x2": [_run(140.0)],
               "20/diloco-overlap-8bit": [_run(133.0, 6.0)], "1000/sync": [_run(100.0, 0.5)]}
    rows = wan.table_rows(results, solo_rate=200.0)
    assert rows[2][:2] == ["-", "solo diloco x2"]
    assert [row[3:6] for row in rows] == [["1.00", "1.00", "-"], ["0.80", "1.00", "1.14"], ["0.70", "0.88", "1.00"],
                                         ["0.67", "0.83", "0.95"], ["0.50", "0.50", "-"]]
    assert wan.parse_args(["--side-by-side"], with_diloco=True).side_by_side


def test_a_pair_row_shows_each_peers_rate_the_share_of_time_it_waited_and_hiveminds_cpu():
    results = {"solo": [_run(200.0)], "20/diloco-overlap-8bit": [
        _run(130.0, 6.0, peer_rates=[140.0, 120.0], wait_share=0.04, helper_cores=0.06),
        _run(100.0, 6.0, peer_rates=[101.0, 99.0], wait_share=0.10, helper_cores=0.09),
        _run(120.0, 6.0, peer_rates=[125.0, 115.0], wait_share=0.02, helper_cores=0.05)]}
    rows = wan.table_rows(results, solo_rate=200.0)
    assert wan.HEADER[-3:] == ["each peer", "waited %", "hivemind CPU %"]
    assert rows[1][-3:] == ["125/115", "4.0", "6.0"]  # the median run's peers; the median shares
    assert rows[0][-3:] == ["-", "-", "-"]


def test_the_report_says_when_diloco_is_left_out(capsys):
    args = wan.parse_args(["--quick"])
    wan.print_report({"solo": [_run(100.0)], "20/sync": [_run(50.0, 9.0)]}, args, with_diloco=False,
                     command="sudo python benchmarks/wan.py --quick")
    out = capsys.readouterr().out
    assert "[quick]" in out and "sudo python benchmarks/wan.py --quick" in out
    assert "diloco: not in this build" in out
    assert "7.26 s per round on the wire" in out


def test_without_root_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(netlab.os, "geteuid", lambda: 1000)
    assert wan.main(["--quick"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "needs root" in captured.err


def test_the_hivemind_peer_keeps_hiveminds_defaults_or_passes_swarmds_settings():
    import hivemind_peer

    from swarmd.config import load_config

    config = load_config(environ={}, assignments=["swarm.matchmaking_time=2.0", "swarm.average_state_every=10"])
    assert hivemind_peer.optimizer_options(config, "defaults") == {}
    tuned = hivemind_peer.optimizer_options(config, "tuned")
    assert tuned["matchmaking_time"] == 2.0 and tuned["average_state_every"] == 10
    assert type(tuned["grad_compression"]).__name__ == "Float16Compression"
    assert tuned["averager_opts"] == {"request_timeout": 1.0}
    with pytest.raises(ValueError):
        hivemind_peer.optimizer_options(config, "fast")


def test_each_child_process_cpu_is_read_under_its_role():
    import os
    import subprocess

    child = subprocess.Popen(["sleep", "5"])

    class Peer:
        @staticmethod
        def descendants():
            return [os.getpid(), child.pid]  # a Python process first, as the DHT process is forked first

    try:
        seconds = wan.helper_cpu_seconds(Peer(), wan.DILOCO_CHILDREN)
    finally:
        child.kill()
        child.wait()
    assert set(seconds) == {"DHT process", "sleep"}
    assert seconds["DHT process"] > 0 and seconds["sleep"] >= 0
