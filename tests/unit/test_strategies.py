"""The strategies behind one table (swarm/strategies/): each owns its compatibility fields and its averager keys, the
private swarm's gate guards every averager of every strategy, and nothing outside the strategies and the config's
validation asks which strategy a peer runs (tests/swarm/test_private_strategies.py checks the built ones against
the SwarmStrategy protocol)."""

import ast
from pathlib import Path

import pytest

import swarmd
from swarmd.config import load_config
from swarmd.swarm import averager_keys
from swarmd.swarm.compatibility import compatibility_of_record
from swarmd.swarm.strategies import STRATEGIES, STRATEGY_FIELDS, strategy_of

PACKAGE = Path(swarmd.__file__).resolve().parent
# where a strategy's name may be tested: the strategies themselves and the config's validation
MAY_NAME_STRATEGIES = {"swarm/strategies/", "config/schema.py"}


def test_the_config_admits_exactly_the_strategies_of_the_table():
    from typing import get_args

    from swarmd.config.schema import SwarmConfig

    assert set(get_args(SwarmConfig.model_fields["strategy"].annotation)) == set(STRATEGIES)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_strategy_owns_its_compatibility_fields(name):
    config = load_config(None, environ={}, assignments=[f"swarm.strategy={name}", "swarm.target_batch_size=96",
                                                         "swarm.diloco.inner_steps=7"])
    strategy = strategy_of(config)
    fields = strategy.compatibility(config.swarm)
    assert set(fields) == set(STRATEGY_FIELDS)
    assert {key for key, value in fields.items() if value} == set(strategy.owns)
    # a record of that strategy keeps what its strategy owns and nothing else that depends on a strategy
    record = {"strategy": name, "target_batch_size": 96, "inner_steps": 7}
    kept = compatibility_of_record(record)
    assert {key for key in STRATEGY_FIELDS if kept[key]} == set(strategy.owns)


def test_every_averager_of_every_strategy_has_a_key_the_gate_guards():
    from swarmd.swarm.upstream.record_gate import guarded_keys

    suffixes = {suffix for strategy in STRATEGIES.values() for suffix in strategy.averager_suffixes}
    assert suffixes == set(averager_keys.ALL_SUFFIXES)
    _, by_peer = guarded_keys("run")
    guarded = set(by_peer.values())
    for strategy in STRATEGIES.values():
        assert strategy.state_suffix in strategy.averager_suffixes
        for suffix in strategy.averager_suffixes:
            for step in (0, 5, 255, 256):  # DiLoCo's outer rounds matchmake under their step's group bits
                assert f"run{suffix}.0b{averager_keys.group_bits(suffix, step)}" in guarded
            assert f"run{suffix}.all_averagers" in guarded
    assert "run_diloco_outer.0b00000101" in guarded and "run_state_averager.0b" in guarded
    with pytest.raises(ValueError, match="averager_keys.py"):
        averager_keys.averager_prefix("run", "_a_new_averager")


def _strategy_name_tests(path: Path, root: Path = PACKAGE) -> list[str]:
    """Comparisons of something named like a strategy with a strategy's name ("sync", "diloco")."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = {operand.value for operand in operands if isinstance(operand, ast.Constant)}
        sources = " ".join(ast.unparse(operand) for operand in operands)
        if names & set(STRATEGIES) and "strateg" in sources:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_strategy_name_test_outside_the_strategies_and_the_config():
    found = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE)) not in MAY_NAME_STRATEGIES
        for line in _strategy_name_tests(path)
    ]
    assert found == [], "ask swarm/strategies/ instead:\n" + "\n".join(found)


def test_the_scan_finds_a_strategy_name_test(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('if config.swarm.strategy == "diloco":\n    pass\nif mode == "sync":\n    pass\n')
    assert _strategy_name_tests(sample, tmp_path) == ["sample.py:1: config.swarm.strategy == 'diloco'"]


def test_the_joined_line_says_what_a_round_is_under_each_strategy():
    """DiLoCo has no target batch: its round is H inner steps of each peer's batch."""
    sync = load_config(None, environ={}, assignments=["swarm.target_batch_size=1024"])
    diloco = load_config(None, environ={}, assignments=["swarm.strategy=diloco", "swarm.diloco.inner_steps=50",
                                                        "swarm.target_batch_size=1024"])
    assert strategy_of(sync).describe_round(sync.swarm) == "target batch 1024"
    assert strategy_of(diloco).describe_round(diloco.swarm) == "a round of 50 inner steps x the batch"
