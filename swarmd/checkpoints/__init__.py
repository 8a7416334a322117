"""Checkpoints on disk and the state they hold, for the daemon and for what reads them without a daemon.

- `store`    atomic, verified safetensors checkpoints (model, optimizer, resume point) in the state dir; pruning;
             falling back past corrupt ones; the tied-weights rule (one name per shared storage)
- `restore`  a consistent capture of model+optimizer state, and loading it back into a live model/optimizer

Below the daemon: `swarmd/daemon/checkpointer.py` is the daemon's user of both; `swarmd export` and
`swarmd monitor` read and write checkpoints through this package without importing swarmd.daemon. Importing the
package imports neither submodule (restore imports torch).
"""
