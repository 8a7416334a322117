"""benchmarks/state_transfer.py end to end on a few megabytes: every path carries the bytes, both downloads are
exact, and the table compares each row with the one above it and each download with the p2pd stream."""

import re
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import state_transfer  # noqa: E402


def test_the_four_paths_carry_the_state_and_the_table_compares_them(capsys):
    assert state_transfer.main(["--megabytes", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert {"raw TCP", "p2pd stream", "hivemind state download", "swarmd state download"} <= set(rows)
    assert re.split(r"\s{2,}", rows["raw TCP"].strip())[-2:] == ["-", "-"]  # nothing to compare with
    assert rows["p2pd stream"].count("x [") == 1  # with the row above only
    assert rows["hivemind state download"].count("x [") == 2 and rows["swarmd state download"].count("x [") == 2
