"""The words for whether, and how, other peers reach a peer (swarm/reachability.py decides them): one list for the
snapshot, the metrics and the peer records. No import of hivemind or torch here."""

__all__ = ["REACHABILITY_STATES", "REACHABILITY_MODES"]

REACHABILITY_STATES = ("yes", "no", "unknown")  # can other peers dial this one
# how other peers reach this one (swarm/reachability.py reachability_mode): dialing it, over the connections it opens
# as a client, through a relay's address it announces; unreachable (no path from peers behind NAT); not known yet
REACHABILITY_MODES = ("direct", "client", "relay", "unreachable", "unknown")
