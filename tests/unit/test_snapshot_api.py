"""The status socket's JSON (`Snapshot.to_dict()`, API_VERSION 1) keeps its keys and their shapes while the snapshot
is built from typed parts (worker/stats.py WorkerReport and WorkerReadings, ranks/local.py RanksReport,
swarm/averaging_log.py AveragingSummary, swarm/private.py PrivateSwarmInfo, swarm/manifest_update.py ManifestInfo,
swarm/exclusion.py's excluded peers, the extensions' fields).

EXPECTED is what `to_dict()` gave for the same inputs before the parts were typed (flat fields and bare dicts). A
key renamed or removed, or a value of another shape, breaks `swarmd status --json` readers: bump API_VERSION and
change EXPECTED with it. Added keys pass (adding keys keeps the version)."""

import json
import types

from swarmd import __version__
from swarmd.ranks.local import OneRank, RanksReport
from swarmd.ranks.rank_stats import RankReport
from swarmd.status.snapshot import (
    API_VERSION, CheckpointInfo, Identity, NetworkBytes, SwarmProgress, TrackingInfo, WatchdogInfo, build_snapshot,
)
from swarmd.swarm.averaging_log import AveragingRound, AveragingSummary, RoundTimeline
from swarmd.swarm.exclusion import ExclusionPolicy, Exclusions
from swarmd.swarm.manifest_update import ManifestInfo
from swarmd.swarm.outcomes import KINDS, OUTCOMES
from swarmd.swarm.private import PrivateSwarm
from swarmd.worker.stats import CudaMemory, WorkerReadings, WorkerReport

GRADIENTS_ROUND = {"kind": "gradients", "outcome": "success", "group_size": 3, "duration_seconds": 0.4, "epoch": 6,
                   "time": 1700000100.0, "error": "", "waited_seconds": None, "peer_wait_seconds": None,
                   "timeline": {"asked_at": 1700000098.5, "grouped_at": 1700000099.5, "reduced_at": 1700000099.75,
                                "ended_at": 1700000100.0, "peers": ("QmPeer", "QmOther0", "QmOther1"),
                                # added since (its all-reduce's bytes, none counted here): added keys keep API 1
                                "sent_bytes": None, "received_bytes": None}}
OUTER_ROUND = {"kind": "outer", "outcome": "partial", "group_size": 2, "duration_seconds": 11.0, "epoch": 7,
               "time": 1700000200.0, "error": "part lost", "waited_seconds": 0.5, "peer_wait_seconds": 1.5,
               "timeline": None}
EXPECTED_FULL = {
    "run_id": "pin-run",
    "public_name": "alpha",
    "task": "swin",
    "precision": "fp16",
    "client_mode": False,
    "auxiliary": False,
    "started_at": 1700000000.0,
    "api_version": 1,
    "peer_id": "QmPeer",
    "device": "cuda:0",
    "devices": ("cuda:0", "cpu"),
    "visible_maddrs": ("/ip4/127.0.0.1/tcp/1",),
    "state": "training",
    "phase": "training",
    "local_epoch": 7,
    "global_epoch": 8,
    "num_peers": 3,
    "num_clients": 1,
    "samples_accumulated": 96,
    "target_batch_size": 128,
    "eta_seconds": 1.5,
    "state_loads_total": 2,
    "excluded_peers": (
        {"peer_id": "QmLiar", "reason": "clipped", "since": 1700000300.0, "until": 1700000360.0, "clipped_rounds": 3,
         "rounds_seen": 3, "capped_claims": 0, "exclusions": 1, "returned_rounds": 0, "refused_states": 0},
    ),
    "exclusions_total": {"clipped": 1, "returned": 0, "claims": 0, "state": 0},  # "state": added, API 1 kept
    "exclusion_refusals": {"join_group": 2, "aggregate_part": 0, "leader": 1, "state_source": 1},
    "parameter_drift": 0.01,
    "samples_per_second": 95.123,
    "samples_total": 3200,
    "steps_total": 100,
    "compute_seconds_total": 12.346,
    "optimizer_seconds_total": 3.457,
    "loss": 1.75,
    "loss_history": ((5, 2.0), (6, 1.8)),
    "rate_history": ((5, 90.123), (6, 95.0)),
    "step_metrics": {"acc": 0.25},
    "learning_rates": (0.1, 0.01),
    "readings_epoch": 7,
    "loss_scale": 65536.0,
    "grad_norm": 3.5,
    "cuda_memory": ({"device": "cuda:0", "allocated_bytes": 10, "reserved_bytes": 20},),
    "failures_total": 1,
    "nonfinite_steps_total": 2,
    "restores_total": 1,
    "last_error": "RuntimeError('x')",
    "evaluation": {"epoch": 6, "metrics": {"accuracy": 0.5}},
    "checkpoint": {"epoch": 6, "path": "ckpt/6", "time": 1700000050.0, "failures_total": 1},
    "ranks": (
        {"rank": 0, "device": "cuda:0", "samples_total": 2000, "samples_per_second": 60.0, "cuda_allocated_bytes": 10,
         "cuda_reserved_bytes": 20},
        {"rank": 1, "device": "cpu", "samples_total": 1200, "samples_per_second": 35.5},
    ),
    "ranks_dead": "rank 1 (cpu) was killed by SIGKILL",
    "ranks_repairs_total": 2,
    "last_averaging": OUTER_ROUND,
    "averaging": {
        "gradients": {"success": 5, "failed": 0, "skipped": 0, "rejected": 0, "local": 0, "partial": 0},
        "state": {"success": 0, "failed": 0, "skipped": 0, "rejected": 0, "local": 0, "partial": 0},
        "outer": {"success": 0, "failed": 0, "skipped": 0, "rejected": 0, "local": 0, "partial": 1},
    },
    "last_averaging_by_kind": {
        "gradients": GRADIENTS_ROUND,
        "outer": OUTER_ROUND,
    },
    "recent_averaging": (
        GRADIENTS_ROUND,
        OUTER_ROUND,
    ),
    "metrics_address": "127.0.0.1:9464",
    "peers": ({"peer_id": "QmPeer", "self": True, "last_seen_seconds": 1.0},),
    "peer_records_rejected_total": 1,
    "reachable": "yes",
    "reachability": "direct",
    "compatibility": {"protocol": 3, "task": "swin"},
    "start_values": "0:abcd",
    "incompatible_peers": ({"peer_id": "QmOther", "public_name": "beta", "difference": "task"},),
    "allowed_peers": 2,
    "refusals": {"dht_records": 1, "join_group": 0},
    "watchdog": {
        "timeout_seconds": 120.0,
        "activity": "computing",
        "activity_seconds": 1.0,
        "allowance_seconds": 60.0,
        "progressing": True,
    },
    "network": {"sent_bytes": 100, "received_bytes": 200},
    "tracking": {"backends": ("tensorboard",), "failed": (), "failures_total": 0, "dropped_total": 0},
    "manifest": {"version": 3, "key_fingerprint": "ab" * 32, "started_version": 2,
                 "restart_needed": ("swarm.target_batch_size",), "pending_version": None, "ignored_total": 1},
    "mode": "local",
    "initial_peers": (),
    "observer_peer_id": None,
}

EXPECTED_STARTING = {
    "run_id": "pin-run",
    "public_name": "alpha",
    "task": "swin",
    "precision": "fp32",
    "client_mode": False,
    "auxiliary": False,
    "started_at": 1700000000.0,
    "api_version": 1,
    "peer_id": None,
    "device": "cpu",
    "devices": ("cpu",),
    "visible_maddrs": (),
    "state": "starting",
    "phase": "starting",
    "local_epoch": None,
    "global_epoch": None,
    "num_peers": None,
    "num_clients": None,
    "samples_accumulated": None,
    "target_batch_size": 256,
    "eta_seconds": None,
    "state_loads_total": 0,
    "excluded_peers": (),
    "exclusions_total": {"clipped": 0, "returned": 0, "claims": 0, "state": 0},
    "exclusion_refusals": {"join_group": 0, "aggregate_part": 0, "leader": 0, "state_source": 0},
    "parameter_drift": None,
    "samples_per_second": 0.0,
    "samples_total": 0,
    "steps_total": 0,
    "compute_seconds_total": 0.0,
    "optimizer_seconds_total": 0.0,
    "loss": None,
    "loss_history": (),
    "rate_history": (),
    "step_metrics": {},
    "learning_rates": (),
    "readings_epoch": None,
    "loss_scale": None,
    "grad_norm": None,
    "cuda_memory": (),
    "failures_total": 0,
    "nonfinite_steps_total": 0,
    "restores_total": 0,
    "last_error": "",
    "evaluation": None,
    "checkpoint": None,
    "ranks": (),
    "ranks_dead": None,
    "ranks_repairs_total": 0,
    "last_averaging": None,
    "averaging": {
        "gradients": {"success": 0, "failed": 0, "skipped": 0, "rejected": 0, "local": 0, "partial": 0},
        "state": {"success": 0, "failed": 0, "skipped": 0, "rejected": 0, "local": 0, "partial": 0},
        "outer": {"success": 0, "failed": 0, "skipped": 0, "rejected": 0, "local": 0, "partial": 0},
    },
    "last_averaging_by_kind": {},
    "recent_averaging": (),
    "metrics_address": None,
    "peers": (),
    "peer_records_rejected_total": 0,
    "reachable": "unknown",
    "reachability": "unknown",
    "compatibility": None,
    "start_values": "",
    "incompatible_peers": (),
    "allowed_peers": None,
    "refusals": {},
    "watchdog": None,
    "network": None,
    "tracking": None,
    "manifest": None,
    "mode": "local",
    "initial_peers": (),
    "observer_peer_id": None,
}


def identity(**changes) -> Identity:
    fields = dict(run_id="pin-run", public_name="alpha", task="swin", precision="fp16", client_mode=False,
                  auxiliary=False, target_batch_size=256, started_at=1_700_000_000.0)
    return Identity(**{**fields, **changes})


def private_swarm(allowed: int, refusals: dict) -> PrivateSwarm:
    """The extension as it is once started, with a list of `allowed` other peers."""
    extension = PrivateSwarm(["QmPeer"])
    extension.allow_list = types.SimpleNamespace(
        own_peer_id="QmPeer", peers=frozenset({"QmPeer", *(f"QmOther{i}" for i in range(allowed))}),
        refusals=lambda: dict(refusals),
    )
    return extension


def exclusions_with_one_liar() -> Exclusions:
    """The extension as it is once started, having excluded one peer after three clipped rounds."""
    extension = Exclusions(ExclusionPolicy(), clock=lambda: 1_700_000_310.0)
    extension.list = types.SimpleNamespace(
        refusals=lambda: {"join_group": 2, "aggregate_part": 0, "leader": 1, "state_source": 1}
    )
    for offset in (298.0, 299.0, 300.0):
        extension.table.observe_round("QmLiar", True, 1_700_000_000.0 + offset)
    return extension


def full_snapshot():
    """A training peer of two ranks in a private swarm with every extension on: every field set."""
    worker = WorkerReport(
        phase="training", steps_total=100, samples_total=3200, samples_per_second=95.12345, loss=1.75,
        loss_history=((5, 2.0), (6, 1.8)), rate_history=((5, 90.12345), (6, 95.0)), compute_seconds_total=12.34567,
        optimizer_seconds_total=3.45678, failures_total=1, nonfinite_steps_total=2, restores_total=1,
        last_error="RuntimeError('x')", evaluation=(6, {"accuracy": 0.5}), step_metrics={"acc": 0.25},
        readings=WorkerReadings(epoch=7, learning_rates=(0.1, 0.01), loss_scale=65536.0, grad_norm=3.5,
                                cuda_memory=(CudaMemory("cuda:0", allocated_bytes=10, reserved_bytes=20),)),
    )
    gradients = AveragingRound("gradients", "success", 3, 0.4, 6, 1_700_000_100.0, timeline=RoundTimeline(
        1_700_000_098.5, 1_700_000_099.5, 1_700_000_099.75, 1_700_000_100.0, ("QmPeer", "QmOther0", "QmOther1")))
    outer = AveragingRound("outer", "partial", 2, 11.0, 7, 1_700_000_200.0, error="part lost", waited_seconds=0.5,
                           peer_wait_seconds=1.5)
    counts = {(kind, outcome): 0 for kind in KINDS for outcome in OUTCOMES}
    counts[("gradients", "success")], counts[("outer", "partial")] = 5, 1
    ranks = RanksReport(
        devices=("cuda:0", "cpu"),
        ranks=(RankReport(0, "cuda:0", 2000, 60.0, cuda_allocated_bytes=10, cuda_reserved_bytes=20),
               RankReport(1, "cpu", 1200, 35.5)),
        dead="rank 1 (cpu) was killed by SIGKILL",
        repairs_total=2,
    )
    snapshot = build_snapshot(
        identity(peer_id="QmPeer", visible_maddrs=["/ip4/127.0.0.1/tcp/1"], device="cuda:0",
                 compatibility={"protocol": 3, "task": "swin"}, start_values="0:abcd"),
        "training",
        progress=SwarmProgress(local_epoch=7, global_epoch=8, num_peers=3, num_clients=1, samples_accumulated=96,
                               target_batch_size=128, eta_seconds=1.5, state_loads_total=2, parameter_drift=0.01),
        worker=worker,
        averaging=AveragingSummary(counts=counts, last=outer, last_by_kind={"gradients": gradients, "outer": outer},
                                   recent=(gradients, outer)),
        checkpoint=CheckpointInfo(epoch=6, path="ckpt/6", time=1_700_000_050.0, failures_total=1),
        ranks=ranks,
    )
    for fields in (
        {"metrics_address": "127.0.0.1:9464", "network": NetworkBytes(100, 200)},
        {"peers": ({"peer_id": "QmPeer", "self": True, "last_seen_seconds": 1.0},), "peer_records_rejected_total": 1,
         "incompatible_peers": ({"peer_id": "QmOther", "public_name": "beta", "difference": "task"},)},
        {"reachable": "yes", "reachability": "direct"},
        private_swarm(2, {"dht_records": 1, "join_group": 0}).snapshot_fields(),
        {"watchdog": WatchdogInfo(120.0, "computing", 1.0, 60.0, True)},
        {"tracking": TrackingInfo(("tensorboard",), (), 0, 0)},
        exclusions_with_one_liar().snapshot_fields(),
        {"manifest": ManifestInfo(3, "ab" * 32, 2, restart_needed=("swarm.target_batch_size",), ignored_total=1)},
    ):
        snapshot = snapshot.with_fields(fields)
    return snapshot


def served(snapshot) -> dict:
    """What the status socket serves, less the two values that depend on when and which swarmd."""
    data = snapshot.to_dict()
    json.dumps(data)  # plain JSON: no dataclass or other object left in it
    assert isinstance(data.pop("uptime_seconds"), float) and data.pop("swarmd_version") == __version__
    return data


def same_keys_and_shapes(data: dict, expected: dict) -> None:
    assert API_VERSION == 1
    missing = [key for key in expected if key not in data]
    assert not missing, f"keys gone from the status JSON (bump API_VERSION): {missing}"
    changed = [key for key in expected if data[key] != expected[key]]
    assert not changed, "values changed: " + "; ".join(f"{key}: {data[key]!r} != {expected[key]!r}" for key in changed)
    assert [key for key in data if key in expected] == list(expected)  # the order `swarmd status --json` prints


def test_a_fully_populated_snapshot_serves_api_1s_json():
    same_keys_and_shapes(served(full_snapshot()), EXPECTED_FULL)


def test_a_starting_one_rank_peer_of_an_open_swarm_serves_api_1s_json():
    snapshot = build_snapshot(identity(precision="fp32", device="cpu"), "starting", ranks=OneRank().report())
    same_keys_and_shapes(served(snapshot), EXPECTED_STARTING)


def test_the_typed_parts_are_what_the_snapshot_holds():
    """Readers in the daemon's process (metrics, tracking) read attributes; only the socket's JSON is plain."""
    snapshot = full_snapshot()
    assert snapshot.cuda_memory == (CudaMemory("cuda:0", 10, 20),) and snapshot.ranks[1].cuda_reserved_bytes is None
    assert snapshot.private.allowed_peers == 2 and snapshot.private.refusals["dht_records"] == 1
    assert snapshot.evaluation.metrics == {"accuracy": 0.5} and snapshot.last_averaging.outcome == "partial"
    assert private_swarm(0, {}).snapshot_fields()["private"].allowed_peers == 0
    assert PrivateSwarm(["QmPeer"]).snapshot_fields() == {}  # not started: nothing to show yet
