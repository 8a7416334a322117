"""benchmarks/join_time.py: the parts that need no swarm (issue 37: a benchmark that cannot flatter)."""

import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import join_time  # noqa: E402

LOG = """\
2026-12-03T21:21:59.710 INFO swarmd.swarm.upstream.optimizer: Downloaded the swarm's state from a peer (download #1)
2026-12-03T21:22:00.593 INFO swarmd.worker.trainer: Joined in 43.0 s: imports 10.9 s, model 2.6 s, DHT 6.5 s, \
optimizer 15.9 s, look-up 0.1 s, download 6.3 s (phases overlap)
"""


def run(total, load, **extra):
    return {"total": total, "load": load, **extra}


def test_the_joiners_own_line_is_read_phase_by_phase():
    assert join_time.joined_in(LOG) == {
        "joined_in": 43.0, "phase:imports": 10.9, "phase:model": 2.6, "phase:DHT": 6.5, "phase:optimizer": 15.9,
        "phase:look-up": 0.1, "phase:download": 6.3,
    }
    assert join_time.joined_in("an older swarmd's log, without the line") == {}


def test_every_row_has_a_cell_per_column_and_a_missing_reading_is_a_dash():
    runs = {"parameters again, cold": [run(30.0, 2.0, dht=9.0, **{"phase:DHT": 1.5})],
            "parameters again, warm": [run(12.0, 1.0, dht=4.0), run(14.0, 3.0, dht=5.0)]}
    rows = {row[0]: row[1:] for row in join_time.table_rows(runs)}
    assert all(len(cells) == 2 for cells in rows.values())
    assert rows["total"] == ["30 [30..30]", "13 [12..14]"]
    assert rows["machine load during the join (1-min loadavg)"] == ["2 [2..2]", "2 [1..3]"]
    assert rows["  its DHT (reachability probe, bootstrap)"] == ["1.5 [1.5..1.5]", "-"]


def test_cold_and_warm_are_columns_apart_only_with_cold():
    assert join_time.column_name("parameters again", "cold", cold=True) == "parameters again, cold"
    assert join_time.column_name("parameters again", "warm", cold=False) == "parameters again"


def test_each_join_is_listed_in_order_with_its_load():
    joins = [("a, cold", run(30.04, 2.345, joined_in=20.0)), ("a, warm", run(12.0, 1.0))]
    assert join_time.each_join_rows(joins) == [["1", "a, cold", "30.0", "2.35", "20.0"],
                                               ["2", "a, warm", "12.0", "1.00", "-"]]


def test_the_last_line_quotes_the_medians_with_the_command():
    runs = {"x, cold": [run(30.0, 2.0), run(20.0, 4.0), run(25.0, 3.0)], "x, warm": [run(10.0, 1.0)] * 3}
    line = join_time.latest_line(runs, "python benchmarks/join_time.py --cold")
    assert line == ("Median join, 3 join(s) each: x, cold 25.0 s (load 3.0), x, warm 10.0 s (load 1.0). "
                    "Command: python benchmarks/join_time.py --cold")


def test_five_joins_per_row_by_default_and_cold_is_opt_in():
    args = join_time.parse_args([], page_cache_check=lambda: pytest.fail("no --cold: the cache is left alone"))
    assert args.repeats == 5 and args.cold is False
    assert join_time.parse_args(["--cold", "--repeats", "1"], page_cache_check=lambda: "").cold is True


def test_cold_where_the_page_cache_cannot_be_dropped_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        join_time.parse_args(["--cold"], page_cache_check=lambda: "--cold drops the page cache, not permitted here")
    assert exit_info.value.code == 2
    assert "not permitted here" in capsys.readouterr().err


def test_cold_needs_a_page_cache_it_may_drop(tmp_path):
    assert "does not permit" in join_time.cannot_drop_page_cache(str(tmp_path / "missing" / "drop_caches"))
    writable = tmp_path / "drop_caches"
    assert join_time.cannot_drop_page_cache(str(writable)) == ""
    assert writable.read_text() == "3\n"


def test_the_load_is_sampled_while_the_join_runs():
    readings = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    sampler = join_time.LoadSampler(interval=0.05, read=lambda: next(readings)).start()
    time.sleep(0.18)
    mean = sampler.stop()
    assert len(sampler.samples) >= 2
    assert mean == sum(sampler.samples) / len(sampler.samples)
    assert join_time.LoadSampler(interval=60, read=lambda: 2.5).start().stop() == 2.5  # at least the first


def test_the_joiners_longest_stand_at_one_epoch_is_timed_between_its_changes():
    watch = join_time.EpochWatch()
    for epoch, now in [(5, 0.0), (5, 2.0), (6, 3.0), (6, 25.5), (7, 26.0), (7, 27.0)]:
        watch.see(epoch, now)
    assert watch.longest == 22.5  # epoch 6, from 3.0 to 25.5: the stand of a peer waiting on a state round
    assert join_time.EpochWatch().longest == 0.0


def test_the_epoch_watch_adds_up_the_time_behind_the_insider():
    watch = join_time.EpochWatch()
    looks = [(5, 0.0, 5), (5, 1.0, 6), (6, 3.0, 6), (6, 4.0, 7), (6, 4.5, 7), (7, 6.0, 7), (7, 7.0, 7)]
    for epoch, now, insiders in looks:
        watch.see(epoch, now, insiders)
    assert watch.behind == 2.0 + 2.0  # from 1.0 to 3.0, and from 4.0 to 6.0
    watch.see(8, 9.0)  # no insider's epoch: not counted as behind
    assert watch.behind == 4.0


def test_the_model_trains_at_a_rate_it_learns_at_and_the_old_rate_is_a_mode_of_its_own():
    """The widened model at AdamW 1e-4 (at the task's default 3e-3 it diverged); the mode that runs the old rate
    changes the task's optimizer only, and both configs load."""
    from swarmd.config.schema import SwarmdConfig

    default = SwarmdConfig.model_validate(join_time.config(64, 32, join_time.MODES["parameters again"]))
    diverging = SwarmdConfig.model_validate(
        join_time.config(64, 32, join_time.MODES["parameters again, lr 3e-3 (a diverging model)"]))
    assert default.task.model_dump()["optim"]["lr"] == 1e-4
    assert diverging.task.model_dump()["optim"]["lr"] == 3e-3
    assert diverging.swarm == default.swarm  # the mode's "task" is not passed on as a swarm setting
