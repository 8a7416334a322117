"""The DHT prefixes of every averager a swarmd peer runs: `run_id + suffix`, written here and nowhere else.

An averager's prefix names its DHT keys (`{prefix}.0b` for matchmaking, `{prefix}.all_averagers` for who offers its
state) and its RPC and stream handlers. The strategies build their averagers with these suffixes, and the private
swarm's gates (swarm/upstream/record_gate.py) guard every one of them: a suffix spelled in two places drifted once, and a
private DiLoCo swarm's state averager went unguarded (issue 30).

No torch or hivemind import: the monitor and the config side read this too.
"""

from __future__ import annotations

__all__ = [
    "ALL_SUFFIXES", "CLIENT_DONORS", "DILOCO_OUTER", "DILOCO_STATE", "GRADIENTS", "STATE", "averager_prefix", "group_bits",
    "peer_keyed_names",
]

# hivemind.Optimizer's own suffixes (optim/optimizer.py): plain hivemind peers of the run meet swarmd's sync peers here
STATE = "_state_averager"
GRADIENTS = "_grad_averager"
# DiLoCo's own: a sync peer of the same run_id must never take a DiLoCo peer's state or round for its own
DILOCO_STATE = "_diloco_state_averager"
DILOCO_OUTER = "_diloco_outer"

ALL_SUFFIXES = (STATE, GRADIENTS, DILOCO_STATE, DILOCO_OUTER)

# `{prefix}.client_donors`: clients (behind NAT) that offer their state through forwarders (swarm/upstream/state_forward.py)
CLIENT_DONORS = "client_donors"


def averager_prefix(run_id: str, suffix: str) -> str:
    if suffix not in ALL_SUFFIXES:
        raise ValueError(f"unknown averager suffix {suffix!r}: add it to swarm/averager_keys.py")
    return f"{run_id}{suffix}"


# DiLoCo's outer rounds matchmake under group bits of their outer step (swarm/strategies/diloco_optimizer.py), so that peers of different
# steps never form a group: their matchmaking key is `{prefix}.0b` followed by this many bits. The others use none.
GROUP_BITS = {DILOCO_OUTER: 8}


def group_bits(suffix: str, step: int) -> str:
    """The group bits of an averager's round at `step` ("" for an averager without them)."""
    width = GROUP_BITS.get(suffix, 0)
    return format(step % (1 << width), f"0{width}b") if width else ""


def peer_keyed_names(run_id: str, suffix: str) -> list[str]:
    """Every DHT key of an averager whose subkeys are peer ids: its matchmaking keys, one per group bits
    (`{prefix}.0b{bits}`: who may lead a group), `{prefix}.all_averagers` (who offers its state) and
    `{prefix}.client_donors` (which clients offer theirs through forwarders)."""
    prefix = averager_prefix(run_id, suffix)
    width = GROUP_BITS.get(suffix, 0)
    bits = [format(value, f"0{width}b") for value in range(1 << width)] if width else [""]
    return [f"{prefix}.0b{b}" for b in bits] + [f"{prefix}.all_averagers", f"{prefix}.{CLIENT_DONORS}"]
