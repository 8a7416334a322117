"""What peers of a run must agree on: the model's fingerprint, the settings, the one line naming a difference, the
swarm's majority, the signed record that carries it, and a running peer leaving out the records that disagree."""

import logging

import pytest
import torch

from swarmd.config import load_config
from swarmd.status.snapshot import Snapshot
from swarmd.swarm.announcer import PeerAnnouncer
from swarmd.swarm.compatibility import (
    PROTOCOL_VERSION,
    compatibility_of,
    compatibility_of_record,
    difference,
    model_fingerprint,
    swarm_reference,
)
from swarmd.swarm.peer_records import parse_records, record_from_snapshot


def mlp(hidden=32, dtype=torch.float32, name="hidden"):
    model = torch.nn.Sequential()
    model.add_module(name, torch.nn.Linear(16, hidden))
    model.add_module("out", torch.nn.Linear(hidden, 1))
    return model.to(dtype)


def ours(**changes):
    base = {"protocol": PROTOCOL_VERSION, "task": "toy-regression", "parameters": 577,
            "model_fingerprint": "f" * 32, "target_batch_size": 128, "strategy": "sync", "inner_steps": 0}
    return {**base, **changes}


def test_the_fingerprint_follows_names_shapes_and_dtypes_and_counts_the_parameters():
    fingerprint, count = model_fingerprint(mlp())
    assert count == 16 * 32 + 32 + 32 + 1
    assert model_fingerprint(mlp()) == (fingerprint, count)  # not the values: two seeds, one fingerprint
    assert model_fingerprint(mlp(hidden=64))[1] != count
    assert model_fingerprint(mlp(name="renamed")) [0] != fingerprint
    assert model_fingerprint(mlp(name="renamed"))[1] == count
    assert model_fingerprint(mlp(dtype=torch.float16))[0] != fingerprint


@pytest.mark.parametrize(
    "swarm, expected",
    [
        (ours(parameters=28_300_000), "the swarm trains 28.3M parameters, this config builds 577: use the run's config"),
        (ours(model_fingerprint="e" * 32), "the swarm's model has other parameter names, shapes or dtypes"),
        (ours(target_batch_size=4096),
         "the swarm's target_batch_size is 4096, this config's is 128: set swarm.target_batch_size: 4096"),
        (ours(strategy="diloco", inner_steps=500, target_batch_size=0), "the swarm's strategy is diloco, this config's is sync"),
        (ours(task="swin"), "the swarm trains task swin, this config's task is toy-regression"),
        (ours(protocol=PROTOCOL_VERSION + 1), f"the swarm speaks swarmd protocol {PROTOCOL_VERSION + 1}"),
    ],
)
def test_a_difference_is_one_line_that_names_it(swarm, expected):
    line = difference(swarm, ours())
    assert expected in line and "\n" not in line


def test_large_models_are_counted_in_millions():
    assert "this config builds 0.54M" in difference(ours(parameters=28_300_000), ours(parameters=540_000))


def test_no_difference_when_equal_or_when_a_record_does_not_say():
    assert difference(ours(), ours()) == ""
    assert difference(ours(parameters=0, model_fingerprint=""), ours()) == ""  # a peer still building its model
    assert difference({"task": "swin"}, ours()) == ""


def test_diloco_compares_h_and_not_the_target_batch():
    config = load_config(None, environ={}, assignments=["swarm.strategy=diloco", "swarm.diloco.inner_steps=50"])
    fields = compatibility_of(config, mlp())
    assert fields["strategy"] == "diloco" and fields["inner_steps"] == 50 and fields["target_batch_size"] == 0
    other = {**fields, "inner_steps": 500}
    assert difference(other, fields).startswith("the swarm's inner_steps is 500, this config's is 50: "
                                                "set swarm.diloco.inner_steps: 500")


def test_the_swarm_is_what_most_peers_say():
    records = [ours(), ours(), ours(target_batch_size=64), ours(parameters=0, model_fingerprint="")]
    assert swarm_reference(records) == ours()
    assert swarm_reference([]) is None


def snapshot(compatibility, peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", **changes):
    return Snapshot(run_id="r", peer_id=peer_id, public_name="p", task=compatibility["task"], state="training",
                    target_batch_size=compatibility["target_batch_size"] or 64, compatibility=compatibility, **changes)


class Parsed:
    def __init__(self, records):
        self.value = {subkey: type("V", (), {"value": record})() for subkey, record in records.items()}


def test_the_signed_record_carries_the_compatibility_and_gives_it_back():
    record = record_from_snapshot(snapshot(ours()))
    [peer], rejected = parse_records(Parsed({b"[owner:ssh-rsa AAAA]": record}))
    assert rejected == 0
    assert compatibility_of_record(peer) == ours()
    starting = record_from_snapshot(Snapshot(run_id="r", peer_id=peer["peer_id"]))  # no model yet: says nothing
    assert starting["parameters"] == 0 and starting["model_fingerprint"] == ""


def test_a_running_peer_leaves_out_peers_that_disagree_and_says_so_once(caplog):
    announcer = PeerAnnouncer("r")
    other = ours(target_batch_size=4096)
    peers = [
        {**record_from_snapshot(snapshot(ours())), "self": True, "last_seen_seconds": 0.0},
        {**record_from_snapshot(snapshot(ours(), peer_id="QmSame1111111111111111111")), "self": False},
        {**record_from_snapshot(snapshot(other, peer_id="QmDiffer22222222222222222")), "self": False},
    ]
    with caplog.at_level(logging.WARNING, logger="swarmd.peers"):
        for _ in range(2):
            kept, left_out = announcer._leave_out_incompatible(peers, ours())
    assert [peer["peer_id"] for peer in kept] == [peers[0]["peer_id"], "QmSame1111111111111111111"]
    assert left_out == [{"peer_id": "QmDiffer22222222222222222", "public_name": "p",
                         "difference": "that peer's target_batch_size is 4096, this config's is 128: "
                                       "set swarm.target_batch_size: 4096 or use the run's config: the --config "
                                       "of the `To join:` line its peers print, or no --config (the embedded "
                                       "default) if that line has none"}]
    assert len([r for r in caplog.records if "Ignoring peer QmDiffer" in r.getMessage()]) == 1


def test_the_status_view_says_which_peers_are_ignored_and_that_the_swarm_is_private():
    import time

    from rich.console import Console

    from samples import sample_snapshot
    from swarmd.status.render import build_view

    status = {**sample_snapshot(time.time()), "allowed_peers": 2, "refusals": {"join_group": 3, "dht_records": 4},
              "incompatible_peers": [{"peer_id": "QmDiffer22222222222222222", "public_name": "gamma",
                                      "difference": "that peer's target_batch_size is 4096, this config's is 128"}]}
    console = Console(record=True, width=160, file=open("/dev/null", "w"))
    console.print(build_view(status))
    frame = console.export_text()
    assert "ignored gamma" in frame and "that peer's target_batch_size is 4096" in frame
    assert "2 other peer(s) allowed (network.allowed_peers)  ·  7 refused" in frame


def test_the_advice_says_what_the_runs_config_is_whether_the_run_used_a_file_or_none():
    for swarm in (ours(parameters=28_300_000), ours(task="swin"), ours(target_batch_size=4096)):
        line = difference(swarm, ours())
        assert "the --config of the `To join:` line" in line and "no --config (the embedded default)" in line, line
