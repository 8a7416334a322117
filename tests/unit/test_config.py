"""The layered config: precedence, and one clear line for every kind of mistake."""

import pytest
import yaml

from swarmd.config import load_config
from swarmd.config.schema import DEFAULT_PORT
from swarmd.errors import ConfigError, ExitCode

PEER = "/ip4/10.0.0.5/tcp/31337/p2p/QmTHaX7imb5woUpi9SPeMv2xryqqAscAruYiyV3SNkQxQN"


def write(tmp_path, data) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def test_embedded_default_is_a_cpu_swin_on_generated_data():
    config = load_config(environ={})
    assert config.task.name == "swin"
    assert config.task.settings.data.source == "generated"
    assert config.network.host_maddrs == [f"/ip4/0.0.0.0/tcp/{DEFAULT_PORT}"]
    assert config.network.initial_peers == []
    assert config.training.device == "auto"


def test_layers_file_then_environment_then_flags_then_set(tmp_path):
    path = write(tmp_path, {"run_id": "from-file", "swarm": {"target_batch_size": 10, "matchmaking_time": 7}})
    config = load_config(
        path,
        environ={"SWARMD_RUN_ID": "from-env", "SWARMD_SWARM__TARGET_BATCH_SIZE": "20"},
        flags={"run_id": "from-flag"},
        assignments=["swarm.target_batch_size=30"],
    )
    assert config.run_id == "from-flag"
    assert config.swarm.target_batch_size == 30
    assert config.swarm.matchmaking_time == 7  # untouched keys keep the file's value


def test_environment_names_the_file(tmp_path):
    path = write(tmp_path, {"run_id": "named-by-env"})
    assert load_config(environ={"SWARMD_CONFIG": path}).run_id == "named-by-env"


def test_the_ci_tool_switch_is_not_a_config_key():
    # .ci/run exports SWARMD_REQUIRE_TOOLS=1; every daemon a test starts inherits it
    assert load_config(environ={"SWARMD_REQUIRE_TOOLS": "1"}).run_id == "swin-micro"


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"swarm": {"target_batch_sie": 5}}, "unknown key swarm.target_batch_sie (did you mean swarm.target_batch_size?)"),
        ({"swarm": {"target_batch_size": "big"}}, "swarm.target_batch_size: Input should be a valid integer"),
        ({"swarm": {"target_batch_size": 0}}, "swarm.target_batch_size: Input should be greater than or equal to 1"),
        ({"training": {"precision": "fp8"}}, "training.precision: Input should be 'fp32', 'bf16' or 'fp16'"),
        ({"task": {"model": {"depth": 3}}}, "unknown key task.model.depth (did you mean task.model.depths?)"),
        ({"task": {"name": "nope"}}, "unknown task 'nope'"),
        ({"network": {"initial_peers": ["/ip4/1.2.3/tcp/5/p2p/x"]}}, "network.initial_peers: '/ip4/1.2.3/tcp/5/p2p/x' is not a multiaddr"),
        ({"network": {"initial_peers": ["/ip4/1.2.3.4/tcp/5"]}}, "has no peer id"),
        ({"network": {"announce_maddrs": ["/ip4/1.2.3.4/tcp/0"]}}, "need an explicit port"),
        ({"swarm": {"delay_grad_averaging": True, "delay_optimizer_step": False}}, "delay_grad_averaging needs delay_optimizer_step"),
        ({"network": {"client_mode": True}, "swarm": {"auxiliary": True}}, "cannot be in client_mode"),
        ({"metrics": {"listen": "localhost"}}, "metrics.listen: 'localhost' is not host:port"),
        ({"swarm": {"aggregation": {"method": "median"}}}, "swarm.aggregation.method: Input should be 'mean' or 'centered_clip'"),
    ],
)
def test_mistakes_name_the_dotted_field_in_one_line(tmp_path, data, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data), environ={})
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert caught.value.exit_code == ExitCode.USAGE


def test_errors_say_where_the_value_came_from(tmp_path):
    with pytest.raises(ConfigError, match=r"from environment SWARMD_SWARM__MATCHMAKING_TIME"):
        load_config(environ={"SWARMD_SWARM__MATCHMAKING_TIME": "soon"})
    with pytest.raises(ConfigError, match=r"from --set training.batch_size=-1"):
        load_config(environ={}, assignments=["training.batch_size=-1"])


@pytest.mark.parametrize(
    "content, expected",
    [
        ("swarm: [\n", "is not valid YAML at line 2"),
        ("- a\n- b\n", "must hold a mapping"),
    ],
)
def test_unreadable_files(tmp_path, content, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, content), environ={})


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_bad_set_syntax():
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(environ={}, assignments=["swarm.target_batch_size"])


def test_switching_task_drops_the_other_tasks_settings(tmp_path):
    path = write(tmp_path, {"task": {"name": "swin", "model": {"embed_dim": 32}}})
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={}, assignments=["task.name=nope"])
    assert "unknown task 'nope'" in str(caught.value)  # not "unknown key task.model"


def test_effective_config_round_trips(tmp_path):
    config = load_config(environ={}, assignments=["swarm.matchmaking_time=4", "task.optim.betas=[0.9, 0.95]"])
    dumped = config.to_dict()
    again = load_config(write(tmp_path, dumped), environ={})
    assert again.to_dict() == dumped
    assert dumped["task"]["optim"]["betas"] == [0.9, 0.95]


def test_the_task_comes_from_the_registered_resolver(monkeypatch):
    """config imports no task: load_config asks the resolver the process registered (tests/conftest.py, the CLI)."""
    from swarmd.config import task_resolver
    from swarmd.tasks.registry import resolve_task

    asked = []
    monkeypatch.setattr(task_resolver, "_resolver", lambda name: asked.append(name) or resolve_task(name))
    assert load_config(environ={}).task.settings is not None and asked == ["swin"]
    monkeypatch.setattr(task_resolver, "_resolver", None)
    with pytest.raises(RuntimeError, match="no task resolver registered"):
        load_config(environ={})
