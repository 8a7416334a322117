"""The flight recorder: a peer's round timelines into its signed round record (swarm/round_records.py), the record's
bounds against what strangers store, and one round across peers drawn as lanes on the pages (web/views.py)."""

import time

import pytest

from samples import HOSTILE_NAME, three_peer_snapshot
from swarmd.swarm.averaging_log import AveragingRound, RoundTimeline
from swarmd.swarm.round_records import ROUNDS, RoundsRecord, parse_round_records, rounds_record_from_snapshot
from swarmd.web.render import render_monitor_page, render_peer_page
from swarmd.web.views import round_timeline

ALPHA, BETA, HOSTILE = ("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "QmcNFS8LmrN8bPVKQSBqWDaiy5RMnBUaqmvpQKjuDjiXwV",
                        "QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN")  # tests/samples.py's three peers


def _published(peer_id, asked, grouped, reduced, ended, *, epoch=11, outcome="success", kind="gradients",
               sent=1_200_000, received=1_190_000):
    return {"kind": kind, "outcome": outcome, "epoch": epoch, "group_size": 3, "asked_at": asked,
            "grouped_at": grouped, "reduced_at": reduced, "ended_at": ended, "peers": [ALPHA, BETA, HOSTILE],
            "sent_bytes": sent, "received_bytes": received}


def _swarm_rounds(t):
    """Three peers' records of the round of epoch 11: the hostile peer came late to matchmaking (the group waited
    for it), and beta published only an older round; plus a newer round only alpha has published yet."""
    return (
        {"peer_id": ALPHA, "time": t, "rounds": [_published(ALPHA, t, t + 2.0, t + 2.5, t + 2.75),
                                                 _published(ALPHA, t + 10, t + 11, t + 11.5, t + 12, epoch=12)]},
        {"peer_id": HOSTILE, "time": t, "rounds": [_published(HOSTILE, t + 1.5, t + 2.0, t + 2.5, t + 2.6)]},
        {"peer_id": BETA, "time": t, "rounds": [_published(BETA, t - 10, t - 9, t - 8.5, t - 8, epoch=10)]},
    )


def test_a_snapshots_rounds_with_a_timeline_make_its_record_bounded_to_the_last_few():
    now = time.time()
    base = three_peer_snapshot(now)
    rounds = tuple(
        AveragingRound("gradients", "success", 3, 0.5, epoch, now, timeline=RoundTimeline(
            now - 2, now - 1, now - 0.5, now, (ALPHA, BETA, HOSTILE), sent_bytes=2**60, received_bytes=4096))
        for epoch in range(ROUNDS + 3)
    ) + (AveragingRound("gradients", "skipped", 1, 0.0, 99, now),)  # no timeline: not published
    record = rounds_record_from_snapshot(base.with_fields({"recent_averaging": rounds}), now=now)
    assert record["peer_id"] == ALPHA and len(record["rounds"]) == ROUNDS
    assert [r["epoch"] for r in record["rounds"]] == list(range(3, ROUNDS + 3))  # the newest ROUNDS
    assert record["rounds"][0]["peers"] == [ALPHA, BETA, HOSTILE] and record["rounds"][0]["ended_at"] == now
    # its bytes, bounded to what the schema takes (a petabyte)
    assert (record["rounds"][0]["sent_bytes"], record["rounds"][0]["received_bytes"]) == (2**50, 4096)
    RoundsRecord.parse_obj(record)
    assert rounds_record_from_snapshot(base, now=now) is None  # nothing with a timeline yet: nothing to publish


class _Found:
    def __init__(self, value):
        self.value = value


class _Item:
    def __init__(self, value):
        self.value = value


OWNER = b"[owner:ssh-rsa AAAA]"


@pytest.mark.parametrize("change", [
    {"kind": "<script>"}, {"outcome": "won"}, {"epoch": -1}, {"ended_at": float("nan")}, {"asked_at": "soon"},
    {"peers": ["not a peer id!"]}, {"peers": [ALPHA] * 17}, {"extra": 1},
    {"sent_bytes": -1}, {"received_bytes": 2**51}, {"sent_bytes": 1.5}, {"received_bytes": "1 MB"},
])
def test_a_reader_skips_and_counts_a_round_record_a_stranger_malformed(change):
    t = time.time()
    good = {"peer_id": ALPHA, "time": t, "rounds": [_published(ALPHA, t, t + 1, t + 2, t + 3)]}
    bad = {"peer_id": BETA, "time": t, "rounds": [{**_published(BETA, t, t + 1, t + 2, t + 3), **change}]}
    found = _Found({OWNER: _Item(good), b"[owner:ssh-rsa BBBB]": _Item(bad), b"no owner": _Item(good)})
    records, rejected = parse_round_records(found)
    assert [r["peer_id"] for r in records] == [ALPHA] and rejected == 2
    too_many = {**good, "rounds": good["rounds"] * (ROUNDS + 1)}
    assert parse_round_records(_Found({OWNER: _Item(too_many)})) == ([], 1)
    assert parse_round_records(None) == ([], 0)


def test_the_newest_round_two_peers_published_is_drawn_as_lanes_on_one_axis():
    t = time.time() - 60
    snapshot = three_peer_snapshot(t + 60).to_dict()
    snapshot["swarm_rounds"] = _swarm_rounds(t)
    view = round_timeline(snapshot)
    assert view.title == "gradients round of epoch 11"  # not epoch 12: only alpha has published that one yet
    assert [lane.name for lane in view.lanes] == ["alpha", HOSTILE_NAME]  # in the order they asked; not beta
    alpha, hostile = view.lanes
    # the axis runs from alpha's ask (t) to alpha's apply (t + 2.75): alpha matched for 2 s, the hostile peer 0.5 s
    assert [(s.phase, s.left, s.width) for s in alpha.segments] == [
        ("matchmaking", 0.0, 72.73), ("all-reduce", 72.73, 18.18), ("applying", 90.91, 9.09)]
    assert hostile.segments[0].left == 54.55 and hostile.segments[0].seconds == "0.50 s"
    assert (alpha.took, hostile.took, alpha.failed) == ("2.75 s", "1.10 s", False)
    assert alpha.traffic == "sent 1.20 MB · received 1.19 MB"
    assert view.unpublished == ("beta",)  # in the group, no record of this round


def test_an_older_round_its_whole_group_published_is_drawn_before_a_newer_one_missing_a_lane():
    t = time.time() - 60
    snapshot = three_peer_snapshot(t + 60).to_dict()
    alpha, hostile, beta = _swarm_rounds(t)
    beta = {**beta, "rounds": [_published(BETA, t - 10, t - 9, t - 8.5, t - 8, epoch=10)]}
    complete = [{**record, "rounds": [*record["rounds"], _published(record["peer_id"], t - 10, t - 9, t - 8.5,
                                                                       t - 8, epoch=10)]}
                for record in (alpha, hostile)]
    snapshot["swarm_rounds"] = (*complete, beta)
    view = round_timeline(snapshot)
    assert view.title == "gradients round of epoch 10" and len(view.lanes) == 3 and view.unpublished == ()


def test_both_pages_draw_the_lanes_and_a_hostile_name_in_them_stays_text():
    t = time.time() - 60
    snapshot = three_peer_snapshot(t + 60).to_dict()
    snapshot["swarm_rounds"] = _swarm_rounds(t)
    for html in (render_peer_page(snapshot, now=t + 60),
                 render_monitor_page({**snapshot, "read_at": t + 60}, now=t + 60)):
        assert html.count('class="lane"') == 2 and html.count('class="phase all-reduce" style=') == 2
        assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "gradients round of epoch 11" in html
    empty = render_peer_page(three_peer_snapshot(t).to_dict(), now=t)
    assert "No round timeline yet" in empty


def test_garbage_in_the_snapshots_rounds_draws_nothing_rather_than_failing():
    snapshot = three_peer_snapshot(time.time()).to_dict()
    snapshot["swarm_rounds"] = ("x", {"rounds": "y"}, {"rounds": [{"ended_at": "z"}, 5]})
    assert round_timeline(snapshot) is None


def test_dht_nodes_store_a_round_record_only_from_its_signer_and_only_well_formed():
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import CompositeValidator, DHTRecord
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmd.swarm.round_records import RoundRecords

    records = RoundRecords("unit-run")
    validator = CompositeValidator(records.validators)
    key = DHTID.generate(source=records.key).to_bytes()

    def accepts(value, signer) -> bool:
        record = DHTRecord(key, DHTProtocol.serializer.dumps(signer.local_public_key),
                           DHTProtocol.serializer.dumps(value), time.time() + 30)
        return validator.validate(DHTRecord(record.key, record.subkey, signer.sign_value(record),
                                            record.expiration_time))

    t = time.time()
    record = {"peer_id": ALPHA, "time": t, "rounds": [_published(ALPHA, t, t + 1, t + 2, t + 3)]}
    assert accepts(record, records.signature) and accepts(None, records.signature)
    stranger = RSASignatureValidator(RSAPrivateKey())
    assert accepts(record, stranger)  # under its own key: its word, bounded
    assert not accepts({**record, "rounds": [{**record["rounds"][0], "epoch": "11"}]}, stranger)
    assert not accepts({**record, "rounds": record["rounds"] * (ROUNDS + 1)}, stranger)
