"""An auxiliary peer only helps average: it never reads data, so it starts where the task's dataset is absent.

The toy task's `dataset_file` stands for a dataset: a trainer's `prepare()` without it is a config error; an
auxiliary peer with the same setting runs Task.prepare_auxiliary instead, joins and assists.
"""

import os
import sys

import pytest
import torch

from daemons import peer_config


def config(tmp_path) -> dict:
    return peer_config(
        task={"name": "toy-regression", "dataset_file": str(tmp_path / "absent-dataset")},
        swarm={"auxiliary": True},
        checkpoint={"enabled": False},
    )


def test_an_auxiliary_peer_starts_without_the_dataset(daemons, test_tasks_env, tmp_path):
    auxiliary = daemons("auxiliary", config(tmp_path), env=test_tasks_env)
    _trainer_prepare_fails(test_tasks_env, config(tmp_path)["task"])  # what a trainer would meet at start-up
    auxiliary.wait_status(lambda s: s["phase"] == "assisting", timeout=90, what="assisting")


def _trainer_prepare_fails(env, task_section):
    site = env["PYTHONPATH"].split(os.pathsep)[0]
    if site not in sys.path:
        sys.path.append(site)
    from swarmd.errors import ConfigError
    from swarmd.tasks.base import TaskContext
    from swarmd_test_tasks.toy import ToyRegressionTask, ToySettings

    settings = ToySettings.model_validate({k: v for k, v in task_section.items() if k != "name"})
    with pytest.raises(ConfigError, match="task.dataset_file"):
        ToyRegressionTask(settings, TaskContext(None, torch.device("cpu"), "fp32", 16, 0)).prepare()
