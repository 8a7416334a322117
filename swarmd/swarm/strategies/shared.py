"""What every strategy passes to its optimizer alike, from the config and the task."""

from __future__ import annotations

from swarmd.swarm.averaging_log import AveragingLog
from swarmd.swarm.compression import make_compression
from swarmd.swarm.upstream.robust_aggregation import Aggregation

__all__ = ["shared_optimizer_options"]


def shared_optimizer_options(*, dht, config, model, task, averaging_log: AveragingLog) -> dict:
    """What every strategy passes to its hivemind-based optimizer alike: the swarm, its timeouts, wire formats,
    guards and the model's tensors (sync.py and diloco.py add their own)."""
    swarm = config.swarm
    averager_opts = dict(swarm.averager_opts)
    # hivemind warns (and risks matchmaking deadlocks) when an RPC may outlast the matchmaking window
    averager_opts.setdefault("request_timeout", min(3.0, swarm.matchmaking_time / 2))
    # every averager (state, gradients, DiLoCo's outer) reduces its share this way (swarm/upstream/robust_aggregation.py)
    averager_opts.setdefault("aggregation", Aggregation(**swarm.aggregation.model_dump()))
    return dict(
        averaging_log=averaging_log,
        load_state_attempts=swarm.load_state_attempts,
        guard_gradient_norm_ratio=swarm.guard_gradient_norm_ratio,
        dht=dht,
        run_id=config.run_id,
        params=task.parameter_groups(model),
        matchmaking_time=swarm.matchmaking_time,
        averaging_timeout=swarm.averaging_timeout,
        allreduce_timeout=swarm.allreduce_timeout,
        next_chunk_timeout=swarm.next_chunk_timeout,  # None: hivemind's matchmaking_time
        load_state_timeout=swarm.load_state_timeout,
        # hivemind 1.1.12 inverts this flag (optimizer.py l.205): only the DHT's own value is used correctly.
        client_mode=dht.client_mode,
        grad_compression=make_compression(swarm.grad_compression, "swarm.grad_compression"),
        state_averaging_compression=make_compression(
            swarm.state_averaging_compression, "swarm.state_averaging_compression"
        ),
        load_state_compression=make_compression(swarm.load_state_compression, "swarm.load_state_compression"),
        state_stream=swarm.state_stream,
        extra_tensors=tuple(task.extra_tensors(model)),
        averager_opts=averager_opts,
        tracker_opts=dict(swarm.tracker_opts),
        verbose=False,
    )
