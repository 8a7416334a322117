"""The daemon process: lifecycle, signals, the state dir, the checkpointer (over swarmd.checkpoints), extensions."""
