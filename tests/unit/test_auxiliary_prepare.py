"""An auxiliary peer builds the task's model without its data (Task.prepare_auxiliary): the shapes the data would
tell come from the settings, or a config error names the setting to add."""

import pytest
import torch

from swarmd.errors import ConfigError
from swarmd.tasks.albert import AlbertSettings, AlbertTask
from swarmd.tasks.base import TaskContext
from swarmd.tasks.swin import SwinConfig, SwinTask


def _context(tmp_path):
    return TaskContext(state_dir=tmp_path, device=torch.device("cpu"), precision="fp32", batch_size=4, seed=0)


def test_swin_on_an_absent_folder_needs_only_the_class_count(tmp_path):
    data = {"source": "folder", "path": str(tmp_path / "no-imagenet-here")}
    task = SwinTask(SwinConfig.model_validate({"data": data}), _context(tmp_path))
    with pytest.raises(ConfigError, match="task.model.num_classes"):
        task.prepare_auxiliary()
    task = SwinTask(SwinConfig.model_validate({"data": data, "model": {"num_classes": 7}}), _context(tmp_path))
    task.prepare_auxiliary()
    assert task.build_model().head.fc.out_features == 7
    assert not (tmp_path / "data").exists()  # nothing generated or read


def test_swin_generated_data_is_not_drawn_for_an_auxiliary_peer(tmp_path):
    task = SwinTask(SwinConfig.model_validate({"data": {"source": "generated"}}), _context(tmp_path))
    task.prepare_auxiliary()
    assert task.num_classes == 10 and not (tmp_path / "data").exists()


def test_albert_on_absent_prepared_data_needs_only_the_vocabulary_size(tmp_path):
    data = {"source": "prepared", "path": str(tmp_path / "no-wikitext-here")}
    task = AlbertTask(AlbertSettings.model_validate({"data": data}), _context(tmp_path))
    with pytest.raises(ConfigError, match="task.model.vocab_size"):
        task.prepare_auxiliary()
    task = AlbertTask(AlbertSettings.model_validate({"data": data, "model": {"vocab_size": 120}}), _context(tmp_path))
    task.prepare_auxiliary()
    assert task.build_model().config.vocab_size == 120
