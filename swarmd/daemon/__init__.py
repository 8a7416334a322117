"""The daemon process: lifecycle, checkpoints and state restore."""
