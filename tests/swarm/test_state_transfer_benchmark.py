"""benchmarks/state_transfer.py end to end on a few megabytes: every path carries the bytes, the download is exact,
and the table compares each row with the one above it."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import state_transfer  # noqa: E402


def test_the_three_paths_carry_the_state_and_the_table_compares_them(capsys):
    assert state_transfer.main(["--megabytes", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert {"raw TCP", "p2pd stream", "hivemind state download"} <= set(rows)
    assert rows["raw TCP"].rstrip().endswith("-")  # nothing above it to compare with
    assert "x [" in rows["p2pd stream"] and "x [" in rows["hivemind state download"]
