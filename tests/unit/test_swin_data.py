"""The Swin task's image folder: a batch larger than the folder is a config error at start, not failed steps."""

import pytest
import torch

from swarmd.errors import ConfigError
from swarmd.tasks.base import TaskContext
from swarmd.tasks.swin import SwinConfig, SwinTask


def swin_task(tmp_path, batch_size: int) -> SwinTask:
    settings = SwinConfig.model_validate({"data": {"source": "folder", "path": str(tmp_path / "images")}})
    context = TaskContext(state_dir=tmp_path, device=torch.device("cpu"), precision="fp32", batch_size=batch_size, seed=0)
    return SwinTask(settings, context)


def make_folder(tmp_path, images_per_class: int) -> None:
    for name in ("circle", "square"):
        folder = tmp_path / "images" / "train" / name
        folder.mkdir(parents=True)
        for index in range(images_per_class):
            (folder / f"{index}.png").write_bytes(b"not decoded by prepare()")
        (folder / "notes.txt").write_text("not an image")


def test_a_batch_larger_than_the_training_images_is_a_config_error(tmp_path):
    make_folder(tmp_path, images_per_class=3)
    with pytest.raises(ConfigError, match=r"training\.batch_size: 7 is more than the 6 training images in .*train"):
        swin_task(tmp_path, batch_size=7).prepare()


def test_a_batch_that_fits_prepares(tmp_path):
    make_folder(tmp_path, images_per_class=3)
    task = swin_task(tmp_path, batch_size=6)
    task.prepare()
    assert task.num_classes == 2
