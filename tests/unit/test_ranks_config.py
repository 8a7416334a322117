"""training.devices: one rank per entry; every mistake is one line naming training.devices, exit 2."""

import pytest
import yaml

from daemons import run_cli
from swarmd.config import load_config
from swarmd.errors import ConfigError, ExitCode
from swarmd.ranks.devices import backend_for, resolve_devices
from swarmd.ranks.group import COMPUTE_BOUND_SECONDS, rank_timeouts
from swarmd.ranks.layout import rank_data_seed, torchrun_device, torchrun_rank


def config(**training):
    return load_config(environ={}, flags={f"training.{key}": value for key, value in training.items()})


def test_devices_unset_means_one_rank_on_training_device():
    assert config().training.devices is None
    assert [str(d) for d in resolve_devices(config().training, cuda_count=0)] == ["cpu"]
    assert [str(d) for d in resolve_devices(config().training, cuda_count=2)] == ["cuda:0"]
    assert [str(d) for d in resolve_devices(config(device="cuda:1").training, cuda_count=2)] == ["cuda:1"]


def test_auto_takes_every_visible_gpu_else_one_cpu_rank():
    training = config(devices="auto").training
    assert [str(d) for d in resolve_devices(training, cuda_count=3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [str(d) for d in resolve_devices(training, cuda_count=0)] == ["cpu"]


@pytest.mark.parametrize(
    "given, expected",
    [
        (["cuda:0", "cuda:1"], ["cuda:0", "cuda:1"]),
        ("cuda:0,cuda:1", ["cuda:0", "cuda:1"]),  # --devices, SWARMD_TRAINING__DEVICES and --set
        ("cpu, cpu", ["cpu", "cpu"]),  # CPU ranks may repeat: that is how tests run ranks
        (["cuda", "cuda:1"], ["cuda:0", "cuda:1"]),
    ],
)
def test_lists_and_comma_strings(given, expected):
    training = config(devices=given).training
    assert training.devices == expected
    assert [str(d) for d in resolve_devices(training, cuda_count=2)] == expected


def test_the_flag_environment_and_set_all_reach_training_devices():
    assert load_config(environ={"SWARMD_TRAINING__DEVICES": "cpu,cpu"}).training.devices == ["cpu", "cpu"]
    assert load_config(environ={}, assignments=["training.devices=[cpu, cpu, cpu]"]).training.devices == ["cpu"] * 3
    from swarmd.cli.join import FLAG_KEYS

    assert FLAG_KEYS["devices"] == "training.devices"


@pytest.mark.parametrize(
    "training, expected",
    [
        ({"devices": ["cuda:0", "cuda:0"]}, "training.devices: cuda:0 is listed twice"),
        ({"devices": "cuda:1,cuda:01"}, "training.devices: cuda:1 is listed twice"),
        ({"devices": []}, "training.devices: needs at least one device"),
        ({"devices": ["gpu0"]}, "training.devices: 'gpu0' is not a rank's device"),
        ({"devices": ["cpu", "cuda:0"]}, "mixes cpu and cuda ranks"),
        ({"devices": ["cuda:0", "cuda:1"], "device": "cuda:1"}, "training.devices: training.device=cuda:1 is not the first entry"),
        ({"devices": "auto", "device": "cpu"}, "training.devices: auto conflicts with training.device=cpu"),
    ],
)
def test_mistakes_are_one_line_naming_training_devices(tmp_path, training, expected):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"training": training}))
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), environ={})
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_device_and_devices_agree_when_device_is_auto_or_rank_0s():
    assert config(devices=["cuda:2", "cuda:3"], device="cuda:2").training.devices == ["cuda:2", "cuda:3"]
    assert config(devices=["cpu", "cpu"], device="auto").training.devices == ["cpu", "cpu"]
    assert config(devices=["cpu", "cpu"], device="cpu").training.devices == ["cpu", "cpu"]


def test_an_auxiliary_peer_runs_one_rank():
    with pytest.raises(ConfigError, match="training.devices: an auxiliary peer does not train"):
        load_config(environ={}, flags={"swarm.auxiliary": True, "training.devices": ["cpu", "cpu"]})


@pytest.mark.parametrize(
    "devices, cuda_count, expected",
    [
        (["cuda:0", "cuda:2"], 2, "training.devices: cuda:2 does not exist; this machine has 2 CUDA GPU(s): cuda:0, cuda:1"),
        (["cuda:0"], 0, "training.devices: cuda:0 was asked for but CUDA is not available here"),
    ],
)
def test_a_gpu_that_is_not_there_is_a_config_error(devices, cuda_count, expected):
    with pytest.raises(ConfigError) as caught:
        resolve_devices(config(devices=devices).training, cuda_count=cuda_count)
    assert expected in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_the_effective_config_round_trips_for_the_compute_ranks(tmp_path):
    # the daemon hands its ranks config.to_dict() as JSON; it must validate again to the same settings
    import json

    from swarmd.ranks.compute_rank import load_rank_config

    original = load_config(environ={}, flags={"training.devices": ["cpu", "cpu"], "training.batch_size": 4})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(original.to_dict()))
    again = load_rank_config(str(path))
    assert again.to_dict() == original.to_dict()


def test_backend_follows_the_devices():
    import torch

    assert backend_for([torch.device("cpu"), torch.device("cpu")]) == "gloo"
    assert backend_for([torch.device("cuda:0"), torch.device("cuda:1")]) == "nccl"


def test_join_rejects_a_gpu_listed_twice_before_starting(tmp_path):
    result = run_cli("join", "--devices", "cuda:0,cuda:0", "--state-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "training.devices: cuda:0 is listed twice" in result.stderr
    assert result.stderr.count("\n") == 1


# --- layout: torchrun and data seeds ----------------------------------------------------------------------


def test_torchrun_is_detected_from_its_environment():
    assert torchrun_rank({}) is None
    place = torchrun_rank({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size) == (3, 8, 1, 4)
    assert not place.hosts_hivemind
    assert torchrun_rank({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}).hosts_hivemind


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "set but not LOCAL_RANK"),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "not numeric"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "inconsistent"),
    ],
)
def test_a_broken_torchrun_environment_is_one_line(environ, expected):
    with pytest.raises(ConfigError, match=expected):
        torchrun_rank(environ)


def test_a_torchrun_process_trains_on_its_local_ranks_device():
    place = torchrun_rank({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert torchrun_device(config().training, place, cuda_count=4) == "cuda:1"
    assert torchrun_device(config().training, place, cuda_count=0) == "cpu"
    assert torchrun_device(config(devices=["cuda:2", "cuda:3"]).training, place, cuda_count=4) == "cuda:3"
    with pytest.raises(ConfigError, match="training.devices: 1 entries, but torchrun started local rank 1"):
        torchrun_device(config(devices=["cuda:2"]).training, place, cuda_count=4)


def test_rank_0_keeps_the_peers_data_seed_and_the_others_get_their_own():
    assert rank_data_seed(1234, 0) == 1234
    seeds = {rank_data_seed(1234, rank) for rank in range(8)}
    assert len(seeds) == 8
    assert rank_data_seed(1234, 1) == rank_data_seed(1234, 1)
    assert rank_data_seed(1234, 1) != rank_data_seed(1235, 1)


def test_timeouts_cover_what_each_side_waits_through():
    cfg = load_config(environ={})
    leader, follower = rank_timeouts(cfg)
    assert leader == COMPUTE_BOUND_SECONDS
    swarm = cfg.swarm
    hivemind_step = swarm.matchmaking_time + 3 * swarm.averaging_timeout + (
        swarm.load_state_attempts * swarm.load_state_timeout + swarm.averaging_timeout
    )
    # a compute rank waits through rank 0's hivemind step, an evaluation (1800 s) and a checkpoint (600 s), and at
    # training.max_epochs rank 0's wait for peers behind
    assert follower == leader + hivemind_step + 1800 + 600 + cfg.training.finish_wait_seconds
    assert rank_timeouts(load_config(environ={}, assignments=["training.finish_wait_seconds=0"]))[1] == follower - 60
