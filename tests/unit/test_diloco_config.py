"""swarm.strategy: diloco: defaults, and one clear line for settings that contradict it."""

import pytest

from swarmd.config import load_config
from swarmd.errors import ConfigError, ExitCode


def test_sync_is_the_default_and_diloco_has_the_papers_settings():
    config = load_config(environ={})
    assert config.swarm.strategy == "sync"
    diloco = load_config(environ={}, assignments=["swarm.strategy=diloco"]).swarm.diloco
    assert (diloco.inner_steps, diloco.outer_lr, diloco.outer_momentum, diloco.nesterov) == (500, 0.7, 0.9, True)
    assert diloco.average_state_every == 0  # parameter averaging off unless asked
    assert diloco.overlap_steps == 0  # the round runs after the H-th step unless overlap is asked


@pytest.mark.parametrize(
    "assignments, expected",
    [
        (["swarm.use_local_updates=true"], "swarm: use_local_updates does not apply to strategy: diloco"),
        (["swarm.reuse_grad_buffers=true"], "reuse_grad_buffers does not apply to strategy: diloco"),
        (["swarm.delay_grad_averaging=true", "swarm.delay_optimizer_step=true", "swarm.offload_optimizer=true"],
         "delay_grad_averaging does not apply to strategy: diloco"),
        (["swarm.offload_optimizer=false"], "offload_optimizer does not apply to strategy: diloco"),
        (["swarm.auxiliary=true"], "auxiliary does not apply to strategy: diloco"),
        (["swarm.average_opt_statistics=[exp_avg_sq]"], "average_opt_statistics does not apply to strategy: diloco"),
        (["swarm.diloco.max_straggler_wait=100"], "diloco.max_straggler_wait 100 exceeds 2 x averaging_timeout"),
        (["swarm.diloco.outer_momentum=0"], "swarm.diloco: nesterov needs outer_momentum above 0"),
        (["swarm.diloco.inner_steps=0"], "swarm.diloco.inner_steps: Input should be greater than or equal to 1"),
        (["swarm.diloco.outer_momentum=1"], "swarm.diloco.outer_momentum: Input should be less than 1"),
        (["swarm.diloco.inner_steps=16", "swarm.diloco.overlap_steps=16"],
         "swarm.diloco: overlap_steps 16 must be below inner_steps 16"),
        (["swarm.diloco.overlap_mixing=1.5"], "swarm.diloco.overlap_mixing: Input should be less than or equal to 1"),
    ],
)
def test_contradictions_are_one_line_errors(assignments, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(environ={}, assignments=["swarm.strategy=diloco", *assignments])
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert caught.value.exit_code == ExitCode.USAGE


def test_the_sync_flags_keep_their_meaning_under_sync():
    config = load_config(environ={}, assignments=["swarm.use_local_updates=true", "swarm.diloco.outer_momentum=0.5"])
    assert config.swarm.strategy == "sync" and config.swarm.use_local_updates
