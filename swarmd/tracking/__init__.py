"""Experiment tracking: this peer's curves in TensorBoard and/or Weights & Biases (docs/TRACKING.md).

  base.py         the BaseLogger interface (does nothing) and the fan-out thread that feeds the backends
  tensorboard.py  event files (torch's SummaryWriter; `pip install 'swarmd[tensorboard]'`)
  wandb.py        Weights & Biases, imported lazily (`pip install 'swarmd[wandb]'`; WANDB_* honoured)
  backends.py     the builder (names -> packages, checked at config validation, are config/optional_packages.py)
  extension.py    the DaemonExtension: status snapshot -> scalars, logged once per epoch

Importing this package imports nothing heavy.
"""
