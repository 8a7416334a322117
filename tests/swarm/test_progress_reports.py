"""The throttled progress tracker publishes sample counts at a bounded rate, epochs at once, and never loses the newest.

A real DHT (with its p2pd) on 127.0.0.1; publications are counted by wrapping the tracker's DHT handle.
"""

import dataclasses
import threading
import time

import pytest

hivemind = pytest.importorskip("hivemind")

from hivemind.utils import get_dht_time  # noqa: E402

from swarmd.swarm.upstream.progress import ThrottledProgressTracker  # noqa: E402


class CountingDHT:
    """Delegates to a real DHT, recording (time, value) of every progress store."""

    def __init__(self, dht):
        self._dht = dht
        self.stores: list[tuple[float, dict]] = []
        self._lock = threading.Lock()

    def store(self, *args, **kwargs):
        with self._lock:
            self.stores.append((time.monotonic(), kwargs.get("value")))
        return self._dht.store(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._dht, name)


@pytest.fixture
def tracker_on_dht():
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    trackers = []

    def make(report_interval: float, epoch_ends_in: float = 1.0, prefix: str = "", dht=dht):
        tracker = ThrottledProgressTracker(
            dht=dht, prefix=prefix or f"throttle{len(trackers)}", target_batch_size=10**9,
            report_interval=report_interval, start=False,
        )
        # the swarm's estimate of the epoch's end, as a fetch would have left it; no fetch changes it during a test
        tracker.global_progress = dataclasses.replace(
            tracker.global_progress, eta_next_epoch=get_dht_time() + epoch_ends_in, next_fetch_time=get_dht_time() + 600
        )
        counting = CountingDHT(dht)
        tracker.dht = counting
        tracker.start()  # counting from the start: the reporter stores nothing until a step reports samples
        trackers.append(tracker)
        return tracker, counting

    make.dht, make.trackers = dht, trackers
    try:
        yield make
    finally:
        for tracker in trackers:
            tracker.shutdown(timeout=5)
        dht.shutdown()


def published_samples(counting: CountingDHT) -> list[int]:
    return [value["samples_accumulated"] for _, value in counting.stores if value]


def wait_until(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_sample_counts_are_coalesced_and_the_newest_is_published(tracker_on_dht):
    tracker, counting = tracker_on_dht(report_interval=0.5)
    started = time.monotonic()
    for step in range(1, 61):  # 60 steps at ~30 steps/s, about 2 s
        tracker.report_local_progress(local_epoch=0, samples_accumulated=step * 32)
        time.sleep(1 / 30)
    elapsed = time.monotonic() - started
    # the last count is held back, then published by the timer although no step follows
    assert wait_until(lambda: published_samples(counting)[-1:] == [60 * 32], timeout=2.0), published_samples(counting)
    publications = len(published_samples(counting))
    assert 2 <= publications <= elapsed / 0.5 + 2, (publications, elapsed)
    times = [t for t, _ in counting.stores]
    assert all(b - a >= 0.3 for a, b in zip(times, times[1:])), times


def test_far_from_the_epoch_end_counts_go_out_every_quarter_of_the_time_left(tracker_on_dht):
    tracker, counting = tracker_on_dht(report_interval=0.5, epoch_ends_in=20.0)
    assert tracker.publication_interval() == pytest.approx(5.0, abs=0.1)
    started = time.monotonic()
    for step in range(1, 61):  # about 2 s of steps: only the first count goes out in them
        tracker.report_local_progress(local_epoch=0, samples_accumulated=step * 32)
        time.sleep(1 / 30)
    assert published_samples(counting) == [32]
    # the newest count is held back until the interval is up, then published though no step follows
    assert wait_until(lambda: published_samples(counting)[-1:] == [60 * 32], timeout=6.0), published_samples(counting)
    assert counting.stores[-1][0] - started >= 4.5


def test_the_interval_is_a_quarter_of_the_time_left_between_report_interval_and_max_refresh_period(tracker_on_dht):
    tracker, _ = tracker_on_dht(report_interval=0.5)
    for time_left, interval in ((0.4, 0.5), (1.0, 0.5), (8.0, 2.0), (30.0, 7.5), (600.0, 10.0), (-3.0, 0.5)):
        tracker.global_progress.eta_next_epoch = get_dht_time() + time_left
        assert tracker.publication_interval() == pytest.approx(interval, abs=0.05), time_left
    tracker.report_interval = 0.0
    assert tracker.publication_interval() == 0.0  # every step, as upstream


def test_a_new_epoch_is_published_at_once(tracker_on_dht):
    tracker, counting = tracker_on_dht(report_interval=5.0)
    tracker.report_local_progress(local_epoch=0, samples_accumulated=32)
    # upstream's reporter only publishes once it has seen this peer accumulate samples
    assert wait_until(lambda: published_samples(counting) == [32], timeout=1.0), counting.stores
    tracker.report_local_progress(local_epoch=0, samples_accumulated=64)  # within the interval: held back
    before = len(counting.stores)
    tracker.report_local_progress(local_epoch=1, samples_accumulated=0)
    assert wait_until(lambda: any(v and v["epoch"] == 1 for _, v in counting.stores[before:]), timeout=1.0), (
        counting.stores
    )


def test_interval_zero_publishes_every_step_as_upstream(tracker_on_dht):
    tracker, counting = tracker_on_dht(report_interval=0.0)
    for step in range(1, 11):
        tracker.report_local_progress(local_epoch=0, samples_accumulated=step)
        assert wait_until(lambda: published_samples(counting)[-1:] == [step], timeout=1.0), published_samples(counting)


def test_a_peer_whose_every_step_completes_an_epoch_keeps_publishing(tracker_on_dht):
    """Its count goes back to 0 before the reporter thread wakes; upstream then stopped publishing after two
    epochs, and its peers lost sight of it (the CI failure of 2026-12-01)."""
    tracker, counting = tracker_on_dht(report_interval=0.0)
    for epoch in range(8):
        tracker.report_local_progress(local_epoch=epoch, samples_accumulated=16)  # one step fills the epoch...
        with tracker.pause_updates():
            tracker.update_epoch(epoch + 1)  # ...and the optimizer moves on at once
        time.sleep(0.1)
    assert tracker.global_epoch == 8
    published_epochs = lambda: {value["epoch"] for _, value in counting.stores if value}  # noqa: E731
    assert wait_until(lambda: 8 in published_epochs(), timeout=2.0), sorted(published_epochs())


def test_a_fetch_that_shows_nobody_leaves_the_count_of_other_peers(tracker_on_dht):
    """A fetch that failed (a DHT slow under load answers None) shows nobody, not even this peer's own record: it
    says nothing about who else trains, and "alone" would end a catch-up before any state round evened it out."""
    from hivemind.optim.progress_tracker import LocalTrainingProgress
    from hivemind.utils import ValueWithExpiration

    tracker, _ = tracker_on_dht(report_interval=0.5)
    own_id = tracker.dht.peer_id.to_bytes()

    def record(peer_id: bytes):
        progress = LocalTrainingProgress(
            peer_id=peer_id, epoch=0, samples_accumulated=0, samples_per_second=1.0, time=get_dht_time(),
            client_mode=False,
        )
        return ValueWithExpiration(progress.dict(), get_dht_time() + 60)

    tracker._parse_swarm_progress_data({b"own": record(own_id), b"other": record(b"another peer")})
    assert tracker.other_peers == 1
    tracker._parse_swarm_progress_data(None)  # the fetch failed
    assert tracker.other_peers == 1
    tracker._parse_swarm_progress_data({})
    assert tracker.other_peers == 1
    tracker._parse_swarm_progress_data({b"other": record(b"another peer")})  # before its own record was stored
    assert tracker.other_peers == 1
    tracker._parse_swarm_progress_data({b"own": record(own_id)})  # the others' records expired: alone now
    assert tracker.other_peers == 0


def test_a_peer_at_the_last_epoch_sees_who_is_behind_when_it_asks(tracker_on_dht):
    """trainer.py _wait_for_peers_behind: at training.max_epochs a peer serves its state while others are at an earlier
    epoch. It learns their epochs from the progress records, fetched when it asks (`fetch_soon`), not at upstream's
    next fetch (600 s away here)."""
    second = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                          initial_peers=[str(a) for a in tracker_on_dht.dht.get_visible_maddrs()])
    try:
        finished, _ = tracker_on_dht(report_interval=0.5, prefix="finish")
        behind, _ = tracker_on_dht(report_interval=0.5, prefix="finish", dht=second)
        finished.report_local_progress(local_epoch=3, samples_accumulated=1)
        behind.report_local_progress(local_epoch=2, samples_accumulated=1)
        time.sleep(1.0)  # both stored
        assert finished.peers_behind(3) == 0, "fetched before anyone asked"
        finished.fetch_soon()
        assert wait_until(lambda: finished.peers_behind(3) == 1, timeout=20.0), finished.other_epochs
        assert finished.peers_behind(2) == 0
        behind.report_local_progress(local_epoch=3, samples_accumulated=0)  # took the last state
        time.sleep(1.0)
        finished.fetch_soon()
        assert wait_until(lambda: finished.peers_behind(3) == 0, timeout=20.0), finished.other_epochs
        assert finished.other_epochs == (3,)
    finally:
        for tracker in list(tracker_on_dht.trackers):
            if tracker.dht._dht is second:
                tracker.shutdown(timeout=5)
                tracker_on_dht.trackers.remove(tracker)
        second.shutdown()
