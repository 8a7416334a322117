"""A state download split across the donors of the newest epoch, each part compared with the others' samples of it
(issues 37 and 34; the plan, the samples and the vote are swarm/state_parts.py, the wire state_stream.py).

The joiner asks up to MAX_DONORS donors of the newest epoch (or a lone one of it and two of the epoch before; suspects
never: they are asked last, alone) for one part each, at once, each with the values at positions of the other
parts drawn for it alone. Then:
- every pair of donors whose samples agree with each other's parts (and who both sent theirs) agrees;
- the largest group that agrees pairwise and is a majority is trusted: a part from a donor outside it (it failed,
  refused, sent what cannot be used, or was outvoted), or from one of an older epoch than the newest in it, is
  asked again of a donor of the newest epoch in it (the parts of one state all come from one epoch);
- of three donors, one still sending when it has taken twice as long as the two others that sent theirs is given
  up, as if it had failed: a slow or busy donor does not set the join time;
- two or more of three that disagree while a part did not come (a straggler given up, a donor that failed): the
  missing parts are asked of their donors again, waited for this time, and the vote taken again;
- no majority (two donors that disagree, or one of two that failed): the state is that of the donor that one donor
  at a time would ask first (state_stream.py `donor_order`), as before the split, but its part in hand is not asked
  again, only the rest; where that donor sent no part, fails now or stepped meanwhile, one donor at a time as before,
  which passes over a donor that fails.
What comes is checked as a whole as any download (finite, this peer's layout) before it is taken. The metadata is
that of the donor of the last part: it describes the tensors appended at the end (DiLoCo's inner optimizer state).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from typing import Optional

from hivemind.p2p import PeerID

from swarmd.swarm.state_parts import MAX_DONORS, Part, draw_positions, majority, plan_parts, samples_disagree
from swarmd.swarm.upstream.state_stream import DownloadsState, donor_order, unusable_state

__all__ = ["SplitsDownloads", "split_donors", "STRAGGLER_GRACE", "MIN_STRAGGLER_WAIT"]

STRAGGLER_GRACE = 2.0  # a part may take this many times as long as the others' before it is asked of another
MIN_STRAGGLER_WAIT = 2.0  # seconds: small states arrive in moments, and a moment's jitter is no straggler

logger = logging.getLogger(__name__)


def split_donors(offers: dict[PeerID, float], exclusions=None) -> list[PeerID]:
    """The donors a download is split across, none of them a suspect, ties in a random order (joiners spread over
    the donors): up to MAX_DONORS of the newest epoch where it has two or more; a lone donor of the newest epoch with
    up to two of the epoch just before it (one epoch moves the parameters little: they are compared, and the state
    taken is the newest that agrees); none otherwise. Never donors of older epochs: peers that just started offer
    epoch 0 and agree with each other, and two of them would outvote the one peer that holds the swarm's state."""
    trusted = {peer: priority for peer, priority in offers.items()
               if exclusions is None or not exclusions.suspected(peer.to_base58())}
    ties = {peer: random.random() for peer in trusted}
    newest_first = sorted(trusted, key=lambda peer: (trusted[peer], ties[peer]), reverse=True)
    epochs = sorted(set(trusted.values()), reverse=True)
    newest = [peer for peer in newest_first if trusted[peer] == epochs[0]] if epochs else []
    if len(newest) >= 2:
        return newest[:MAX_DONORS]
    if len(epochs) >= 2 and epochs[1] >= epochs[0] - 1:
        return newest + [peer for peer in newest_first if trusted[peer] == epochs[1]][:MAX_DONORS - 1]
    return []


class SplitsDownloads(DownloadsState):
    """DownloadsState whose downloads are split across the donors of the newest epochs, where there are two or more
    and this peer knows the layout of the state it takes. Sits before DownloadsState in the MRO."""

    def compared_tensors(self, kind: str) -> int:
        """How many of the state's first tensors donors must agree on (the parameters); all the layout names here."""
        layout = self.state_layout(kind)
        return len(layout.shapes) if layout is not None else 0

    async def _download_in_parts(self, kind: str, offers: dict[PeerID, float], waits) -> Optional[tuple]:
        layout = self.state_layout(kind)
        donors = split_donors(offers, self._exclusions)
        if not self.download_by_stream or layout is None or len(donors) < 2:
            return None
        parts = plan_parts(layout.shapes, len(donors))
        donors = donors[:len(parts)]
        if len(donors) < 2:
            return None
        generator, compared = random.Random(), self.compared_tensors(kind)
        positions = [draw_positions(layout.shapes, compared, part, generator) for part in parts]
        began = time.perf_counter()
        sent = await _without_a_straggler(
            [self._fetch_part(donor, kind, part, drawn, waits()) for donor, part, drawn in zip(donors, parts, positions)],
            donors)
        trusted = majority(donors, _agreement(donors, offers, parts, positions, sent))
        if trusted is None and _a_missing_part_may_break_the_tie(sent):
            sent = await self._missing_parts_again(kind, donors, parts, positions, sent, waits)
            trusted = majority(donors, _agreement(donors, offers, parts, positions, sent))
        if trusted is None:
            logger.info("The donors of the %s (%s) did not agree on it, or one failed: taking one donor's, as one at "
                        "a time", kind, ", ".join(f"{donor} (epoch {offers[donor]:g})" for donor in donors))
            return await self._rest_of_the_first(kind, offers, donors, parts, sent, waits, began)
        # the comparison may span epochs, the state taken never does: its parts all come from the newest agreeing
        newest = max(offers[donor] for donor in trusted)
        sources = [donor for donor in trusted if offers[donor] == newest]
        senders = list(donors)
        for index, donor in enumerate(donors):
            if donor not in sources:
                why = "it is behind them" if donor in trusted else \
                    "it disagreed with the others" if sent[index] else "none came"
                # a lie is told at the epoch the others hold: a donor of another epoch may differ honestly
                lied = donor not in trusted and sent[index] is not None and offers[donor] >= newest
                logger.log(logging.WARNING if lied else logging.INFO,
                           "Peer %s's part of the %s (epoch %g) is asked of %s (epoch %g) instead: %s", donor, kind,
                           offers[donor], ", ".join(map(str, sources)), newest, why)
                senders[index], sent[index] = await self._part_again(sources, kind, parts[index], waits)
                if sent[index] is None:
                    return None
        return self._joined(kind, senders, sent, began,
                            f"samples of each part agreed among {', '.join(map(str, trusted))}")

    async def _missing_parts_again(self, kind: str, donors: list, parts: list, positions: list, sent: list,
                                   waits) -> list:
        """`sent`, with the parts that did not come (a straggler given up, a donor that failed) asked again of their
        donors, with the same samples, this time waited for (each chunk's wait bounds it): the donors that sent
        theirs disagree, and without a third word the state would be whichever one donor at a time asks first, a
        liar as likely as not (seen in CI: an honest donor given up as a straggler on a loaded machine, the liar's
        state taken)."""
        missing = [index for index, loaded in enumerate(sent) if loaded is None]
        logger.info("The donors that sent their parts of the %s disagree: asking %s for theirs again", kind,
                    ", ".join(str(donors[index]) for index in missing))
        again = await asyncio.gather(*(self._fetch_part(donors[index], kind, parts[index], positions[index], waits())
                                       for index in missing))
        sent = list(sent)
        for index, loaded in zip(missing, again):
            sent[index] = loaded
        return sent

    async def _rest_of_the_first(self, kind: str, offers, donors: list, parts: list, sent: list, waits,
                                 began: float) -> Optional[tuple]:
        """No majority: the state of the donor that one donor at a time asks first (passing over one that failed
        here), where its part is in hand: the rest is asked of it, not that part again. The same trust as one donor
        at a time (that donor's word alone), a part's time less: the join benchmark's honest donors, their parameters
        apart after a round that one of them stepped alone, disagreed in 2 of 5 joins, and each time the whole state
        came again after the split. None (one at a time) where that donor was asked for no part, fails now, or sent
        copies of two epochs (it stepped meanwhile: they would make a state of two epochs)."""
        for first in donor_order(offers, self._exclusions):  # a donor that failed in the split is passed over
            if first not in donors:
                return None  # one at a time asks a donor that sent no part next
            if sent[donors.index(first)] is not None:
                break
        else:
            return None
        in_hand = sent[donors.index(first)]
        pieces = [in_hand if donor == first else await self._fetch_part(first, kind, part, [], waits())
                  for donor, part in zip(donors, parts)]
        if any(piece is None or _copy_epoch(piece) != _copy_epoch(in_hand) for piece in pieces):
            return None
        return self._joined(kind, [first], pieces, began,
                            "one donor's state, not compared: no majority of the donors agreed")

    async def _fetch_part(self, donor: PeerID, kind: str, part: Part, positions: list, waits) -> Optional[tuple]:
        """(metadata, tensors, samples) of `donor`'s `part`, or None (why in the log)."""
        try:
            loaded = await self.download_part(donor, kind, part, positions, waits)
        except Exception as e:  # noqa: BLE001 - a donor that fails (or leaves, or has no stream) costs its part
            logger.info("Peer %s did not send tensors %s of its %s: %r", donor, part.words(), kind, e)
            return None
        unusable = "refused" if loaded is None else unusable_state(loaded[:2])
        if unusable:
            logger.info("Peer %s did not send tensors %s of its %s: %s", donor, part.words(), kind, unusable)
            return None
        return loaded

    async def _part_again(self, donors, kind: str, part: Part, waits) -> tuple[Optional[PeerID], Optional[tuple]]:
        """(the donor, what it sent) of `part` from the first of `donors` that sends it; (None, None): none did."""
        for donor in donors:
            loaded = await self._fetch_part(donor, kind, part, [], waits())
            if loaded is not None:
                return donor, loaded
        return None, None

    def _joined(self, kind: str, senders: list, sent: list, began: float, vouched: str) -> Optional[tuple]:
        """The parts as one (metadata, tensors), if it can be used as a whole; None otherwise. `vouched`: what
        checked them, for the log."""
        loaded = (sent[-1][0], [tensor for _, tensors, _ in sent for tensor in tensors])
        unusable = unusable_state(loaded) or self._misfit(kind, loaded)
        if unusable:
            logger.warning("The %s in parts from %s cannot be used (%s): asking one donor at a time",
                           kind, ", ".join(map(str, senders)), unusable)
            return None
        self.note_donors(dict.fromkeys(senders))
        megabytes = sum(t.numel() * t.element_size() for t in loaded[1]) / 1e6
        seconds = time.perf_counter() - began
        logger.info("Downloaded the %s in %d parts from %s: %.1f MB in %.2f s (%.0f MB/s); %s", kind, len(sent),
                    ", ".join(map(str, senders)), megabytes, seconds, megabytes / max(seconds, 1e-9), vouched)
        return loaded


def _a_missing_part_may_break_the_tie(sent: list) -> bool:
    """No majority among three or more donors, two or more of which sent their parts (so these disagree) and one or
    more did not: those may yet tell which side is the majority."""
    came = sum(loaded is not None for loaded in sent)
    return len(sent) >= 3 and 2 <= came < len(sent)


def _copy_epoch(loaded: tuple):
    """The epoch a donor's metadata gives its copy (a peer's word: any value; None where it gives none)."""
    metadata = loaded[0]
    return metadata.get("epoch") if isinstance(metadata, dict) else None


async def _without_a_straggler(fetches: list, donors: list) -> list:
    """What each fetch brought; with three donors or more, the last one still sending when it has taken
    STRAGGLER_GRACE times as long as the others (and MIN_STRAGGLER_WAIT seconds more than they) is given up (None),
    where the others sent theirs: a slow or busy donor does not set the download's time, the others still make a
    majority, and its part is asked again of one of them."""
    tasks = [asyncio.ensure_future(fetch) for fetch in fetches]
    if len(tasks) < 3:
        return list(await asyncio.gather(*tasks))
    began = time.perf_counter()
    while sum(not task.done() for task in tasks) > 1:
        await asyncio.wait([task for task in tasks if not task.done()], return_when=asyncio.FIRST_COMPLETED)
    others_took = time.perf_counter() - began
    last = [task for task in tasks if not task.done()]
    if last and sum(task.result() is not None for task in tasks if task.done()) >= 2:  # a majority without it
        await asyncio.wait(last, timeout=max(MIN_STRAGGLER_WAIT, (STRAGGLER_GRACE - 1) * others_took))
    elif last:
        await asyncio.wait(last)
    results = []
    for donor, task in zip(donors, tasks):
        if not task.done():
            task.cancel()
            logger.info("Peer %s is still sending its part after %.1f s, the others took %.1f s: asking another",
                        donor, time.perf_counter() - began, others_took)
        results.append(task.result() if task.done() and not task.cancelled() else None)
    return results


def _agreement(donors: list, offers: dict, parts: list[Part], positions: list, sent: list) -> dict[frozenset, bool]:
    """Whether each pair of donors agrees: both sent their parts, and each one's samples of the other's part agree.
    Said as a warning where the two offered one epoch (one of them lies or is broken), else in the info log (an
    outer step or a few early in training move the parameters by more than the tolerance)."""
    received = [None if loaded is None else {part.first + i: t for i, t in enumerate(loaded[1])}
                for part, loaded in zip(parts, sent)]
    agree = {}
    for a, b in itertools.combinations(range(len(donors)), 2):
        if sent[a] is None or sent[b] is None:
            agree[frozenset((donors[a], donors[b]))] = False
            continue
        why = samples_disagree(positions[a], sent[a][2], received[b]) or \
            samples_disagree(positions[b], sent[b][2], received[a])
        if why:
            one_epoch = offers[donors[a]] == offers[donors[b]]
            logger.log(logging.WARNING if one_epoch else logging.INFO, "Donors %s and %s (epochs %g and %g) disagree "
                       "on the state: %s", donors[a], donors[b], offers[donors[a]], offers[donors[b]], why)
        agree[frozenset((donors[a], donors[b]))] = not why
    return agree
