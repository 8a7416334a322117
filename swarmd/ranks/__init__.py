"""Data-parallel ranks inside one peer: one hivemind peer outside, torch.distributed inside.

Rank 0 is the daemon process: it hosts the DHT, hivemind.Optimizer, status, metrics and checkpoints. Ranks
1..N-1 are compute-only processes it owns (or, under torchrun, processes torchrun started): they hold a replica
of the model, compute gradients on their own shard of the data and average them with rank 0 before rank 0 hands
the mean to hivemind. See docs/RANKS.md for the protocol and how the daemon drives it.

- `devices`      which devices the ranks run on (training.devices / training.device), checked against the machine
- `layout`       who is which rank: spawned by the daemon or started by torchrun; per-rank data seeds
- `group`        rank 0's side of the process group: spawn, rendezvous, watch and stop the compute ranks
- `step_sync`    the per-step protocol every rank runs (control, parameter sync, gradient averaging, checksums)
- `compute_rank` the main loop of ranks >= 1 (`python -m swarmd.ranks.compute_rank`)
- `rank_stats`   per-rank samples/s and CUDA memory for status and metrics
- `precision`    autocast and fp16 loss scaling (the worker's and the compute ranks')
- `batches`      a batch moved to a rank's device

Every module here but `precision` imports torch only inside functions. The schema's device-name checks are
swarmd/config/devices.py.
"""
