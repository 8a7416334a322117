"""The epochs a gradient round's members sent (swarm/round_epochs.py): what makes a peer take the swarm's
parameters again after a round whose group was ahead of it, and what it ignores."""

from swarmd.swarm.round_epochs import (
    MAX_ROUND_EPOCH, behind_as_told, epoch_the_others_averaged, gathered_epoch, round_epoch,
)


def test_an_epoch_is_a_plain_int_in_range():
    assert gathered_epoch(7) == 7 and gathered_epoch(0) == 0
    for value in (None, -1, MAX_ROUND_EPOCH, True, 3.0, "4", [4], {"epoch": 4}):
        assert gathered_epoch(value) is None, value


def test_a_peer_one_behind_learns_the_swarms_epoch():
    assert epoch_the_others_averaged({"me": 9, "a": 10}, "me") == 10
    assert epoch_the_others_averaged({"me": 9, "a": 10, "b": 10}, "me") == 10


def test_a_group_at_this_peers_epoch_or_behind_it_says_nothing():
    assert epoch_the_others_averaged({"me": 10, "a": 10, "b": 10}, "me") is None
    assert epoch_the_others_averaged({"me": 10, "a": 9}, "me") is None
    assert epoch_the_others_averaged({"me": 10}, "me") is None


def test_one_member_of_several_cannot_move_this_peer():
    assert epoch_the_others_averaged({"me": 10, "liar": 10**6, "a": 10}, "me") is None
    # most are ahead: their lower median, whatever the largest claims
    assert epoch_the_others_averaged({"me": 10, "liar": 10**6, "a": 11, "b": 11}, "me") == 11
    assert epoch_the_others_averaged({"me": 10, "liar": 10**6, "a": 11}, "me") == 11


def test_members_that_sent_no_epoch_are_not_counted():
    # plain hivemind peers gather None; what is not an epoch is ignored, not taken as a claim
    assert epoch_the_others_averaged({"me": 9, "plain": None, "a": 10}, "me") == 10
    assert epoch_the_others_averaged({"me": 9, "plain": None, "odd": "x"}, "me") is None


def test_without_its_own_epoch_a_peer_compares_nothing():
    assert epoch_the_others_averaged({"me": None, "a": 10}, "me") is None
    assert epoch_the_others_averaged({"a": 10}, "me") is None


def test_the_rounds_word_is_taken_once_the_progress_records_agree():
    assert behind_as_told(told=10, local_epoch=9, records_epoch=10)
    assert not behind_as_told(told=10, local_epoch=9, records_epoch=9)  # a claim alone: nothing yet
    assert not behind_as_told(told=None, local_epoch=9, records_epoch=10)  # upstream's own check decides that
    assert not behind_as_told(told=10, local_epoch=10, records_epoch=11)  # caught up with what the round said


def test_the_rounds_epoch_is_most_members_and_a_minority_cannot_move_it():
    assert round_epoch([10, 10, 9]) == 10 and round_epoch([9, 10]) == 10
    assert round_epoch([10, 10, 2**39, 0]) == 10  # one liar up and one down: the upper median stays
    assert round_epoch([None, "x", True, 10]) == 10  # plain peers and what is no epoch are not counted
    assert round_epoch([None, -1]) is None and round_epoch([]) is None
