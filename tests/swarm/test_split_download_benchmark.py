"""benchmarks/split_download.py end to end on a small state: three donors and a joiner in network namespaces, each
download mode runs, the honest modes bring the exact state, the split one with a liar too, and the table compares
each mode with one donor at a time. Needs root (network namespaces, veth, tc); skipped otherwise."""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import split_download  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="needs root and iproute2 (network namespaces, veth, tc)"),
    pytest.mark.timeout(240),
]


def test_each_mode_downloads_and_the_split_takes_the_honest_state_past_a_liar(capsys):
    assert split_download.main(["--megabytes", "4", "--donor-mbit", "100", "--repeats", "1"]) == 0
    rows = {re.split(r"\s{2,}", line.strip())[0]: re.split(r"\s{2,}", line.strip())
            for line in capsys.readouterr().out.splitlines()}
    assert set(split_download.MODES) <= set(rows)
    for mode in ("one at a time", "split across three", "split, one lies"):
        assert rows[mode][-1] == "1 of 1", rows[mode]  # exact: the split outvoted the liar
    assert rows["one at a time"][3] == "1.00x"
