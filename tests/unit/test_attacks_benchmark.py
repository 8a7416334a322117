"""benchmarks/attacks.py: the table of repeated cells (issue 34: "within 10%" judged against the clean runs' own
spread), without a swarm."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import attacks  # noqa: E402


def run(loss, rate=100.0, excluded_at=(), wrongly_why=(), round_seconds=2.0, epochs=20, suspected=0, partial=0):
    return {"loss": loss, "samples_per_second": rate, "excluded_at": list(excluded_at), "wrongly": len(wrongly_why),
            "wrongly_why": list(wrongly_why), "round_seconds": round_seconds, "epochs": epochs,
            "suspected": suspected, "partial": partial}


def test_repeated_cells_give_a_median_a_range_and_one_entry_per_run():
    cells = {
        "clean": [run(0.010, rate=90.0), run(0.020, rate=100.0), run(0.030, rate=110.0)],
        "clean, undefended": [run(0.015, rate=200.0)] * 3,
        "sign flip": [run(0.040, excluded_at=(3, 4, 5)), run(0.020, excluded_at=(7,), suspected=2, partial=1),
                      run(0.060, wrongly_why=("clipped",), suspected=1)],
    }
    rows = {row[1]: row for row in attacks.table_rows("local", cells, honest=3)}
    clean, flip = rows["clean (defended)"], rows["sign flip"]
    assert clean[2] == "0.0200 [0.0100..0.0300]"
    assert clean[3] == "1.00 [0.50..1.50]"  # the clean runs' own spread, against their median
    assert clean[8] == "100.0 [90.0..110.0] (0.500x undefended)"
    assert flip[3] == "2.00 [1.00..3.00]"
    assert flip[4] == "3 (3 of 3); 7 (1 of 3); never"
    assert flip[5] == "0; 0; 1 (clipped)"
    assert flip[6:8] == ["0,2,1", "0,1,0"]  # honest peers suspected, partial rounds: one entry per run
    assert flip[10] == "20,20,20"
    assert rows["clean, undefended"][4:6] == ["—", "—"]


def test_one_run_per_cell_prints_plain_values():
    cells = {"clean": [run(0.02)], "clean, undefended": [run(0.03)], "x -1e6": [run(0.05, excluded_at=(2, 2))]}
    rows = {row[1]: row for row in attacks.table_rows("sync", cells, honest=3)}
    assert rows["x -1e6"][2:5] == ["0.0500", "2.50", "2 (2 of 3)"]
    assert rows["clean (defended)"][5] == "0"


def test_a_cell_without_a_defence_turns_only_that_one_off_and_its_config_loads():
    from swarmd.config.schema import SwarmdConfig

    defended = SwarmdConfig.model_validate(attacks.config("sync", attacks.ATTACKS["x -1e6"]))
    ablated = SwarmdConfig.model_validate(attacks.config("sync", attacks.ATTACKS["x -1e6"],
                                                         ablation="the far-sender drop"))
    assert defended.swarm.aggregation.far_ratio == 100.0 and ablated.swarm.aggregation.far_ratio == 0.0
    assert ablated.swarm.aggregation.method == "centered_clip" and ablated.swarm.exclusion.enabled
    for ablation, read in (("the step on a partial average", lambda c: c.swarm.step_on_partial_average),
                           ("the direction margin", lambda c: c.swarm.aggregation.direction_sigmas)):
        config = SwarmdConfig.model_validate(attacks.config("sync", {}, ablation=ablation))
        assert read(defended) and not read(config), ablation
