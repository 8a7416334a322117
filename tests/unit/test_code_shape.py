"""The shape issue 30 gave the code, kept: a short lifecycle, short functions, the averagers' DHT suffixes written in
one module, and no daemon import from the swarm layer (tests/unit/test_layers.py has the whole layer table)."""

import ast
import re
from pathlib import Path

import swarmd
from swarmd.swarm import averager_keys

PACKAGE = Path(swarmd.__file__).resolve().parent
MAX_FUNCTION_LINES = 60
MAX_LIFECYCLE_LINES = 400


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_is_longer_than_a_screen():
    long = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in _functions(path)
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_lifecycle_reads_in_one_sitting():
    lines = len((PACKAGE / "daemon" / "lifecycle.py").read_text().splitlines())
    assert lines < MAX_LIFECYCLE_LINES, f"daemon/lifecycle.py has {lines} lines"


def test_the_averagers_suffixes_are_written_in_one_module():
    spelled = re.compile("|".join(re.escape(f'"{suffix}') for suffix in averager_keys.ALL_SUFFIXES))
    elsewhere = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "averager_keys.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert elsewhere == [], "use swarm/averager_keys.py:\n" + "\n".join(elsewhere)
