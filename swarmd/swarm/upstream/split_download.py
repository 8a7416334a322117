"""A state download split across the donors of the newest epoch, each part compared with the others' samples of it
(issues 37 and 34; the plan, the samples and the vote are swarm/state_parts.py, the wire state_stream.py).

The joiner asks the MAX_DONORS donors of the newest epochs (suspects never: they are asked last, alone) for one part
each, at once, each with the values at positions of the other parts drawn for it alone. Then:
- every pair of donors whose samples agree with each other's parts (and who both sent theirs) agrees;
- the largest group that agrees pairwise and is a majority is trusted: a part from a donor outside it (it failed,
  refused, sent what cannot be used, or was outvoted), or from one of an older epoch than the newest in it, is
  asked again of a donor of the newest epoch in it (the parts of one state all come from one epoch);
- no majority (two donors that disagree, or one of two that failed): nothing is taken from the parts, and the
  joiner asks one donor at a time as before (state_stream.py), which passes over a donor that fails.
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
from swarmd.swarm.upstream.state_stream import DownloadsState, unusable_state

__all__ = ["SplitsDownloads", "split_donors"]

logger = logging.getLogger(__name__)


def split_donors(offers: dict[PeerID, float], exclusions=None) -> list[PeerID]:
    """The donors a download is split across: the MAX_DONORS newest offers that are not suspects (ties in a random
    order, so that joiners spread over the donors). Not only the newest epoch's: a liar that claims a newer epoch
    than anyone is then still compared with two that hold the swarm's."""
    trusted = {peer: priority for peer, priority in offers.items()
               if exclusions is None or not exclusions.suspected(peer.to_base58())}
    ties = {peer: random.random() for peer in trusted}
    return sorted(trusted, key=lambda peer: (trusted[peer], ties[peer]), reverse=True)[:MAX_DONORS]


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
        sent = await asyncio.gather(*(
            self._fetch_part(donor, kind, part, drawn, waits()) for donor, part, drawn in zip(donors, parts, positions)))
        trusted = majority(donors, _agreement(donors, parts, positions, sent))
        if trusted is None:
            logger.warning("The donors of the %s (%s) did not agree on it, or one failed: asking one at a time",
                           kind, ", ".join(map(str, donors)))
            return None
        # the comparison may span epochs, the state taken never does: its parts all come from the newest agreeing
        newest = max(offers[donor] for donor in trusted)
        sources = [donor for donor in trusted if offers[donor] == newest]
        senders = list(donors)
        for index, donor in enumerate(donors):
            if donor not in sources:
                why = "it is behind them" if donor in trusted else \
                    "it disagreed with the others" if sent[index] else "none came"
                logger.log(logging.INFO if donor in trusted else logging.WARNING,
                           "Peer %s's part of the %s is asked of %s instead: %s", donor, kind,
                           ", ".join(map(str, sources)), why)
                senders[index], sent[index] = await self._part_again(sources, kind, parts[index], waits)
                if sent[index] is None:
                    return None
        return self._joined(kind, senders, trusted, sent, began)

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

    def _joined(self, kind: str, senders: list, agreed, sent: list, began: float) -> Optional[tuple]:
        """The parts as one (metadata, tensors), if it can be used as a whole; None otherwise."""
        loaded = (sent[-1][0], [tensor for _, tensors, _ in sent for tensor in tensors])
        unusable = unusable_state(loaded) or self._misfit(kind, loaded)
        if unusable:
            logger.warning("The %s in parts from %s cannot be used (%s): asking one donor at a time",
                           kind, ", ".join(map(str, senders)), unusable)
            return None
        megabytes = sum(t.numel() * t.element_size() for t in loaded[1]) / 1e6
        seconds = time.perf_counter() - began
        logger.info("Downloaded the %s in %d parts from %s: %.1f MB in %.2f s (%.0f MB/s); samples of each part "
                    "agreed among %s", kind, len(sent), ", ".join(map(str, senders)), megabytes, seconds,
                    megabytes / max(seconds, 1e-9), ", ".join(map(str, agreed)))
        return loaded


def _agreement(donors: list, parts: list[Part], positions: list, sent: list) -> dict[frozenset, bool]:
    """Whether each pair of donors agrees: both sent their parts, and each one's samples of the other's part agree."""
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
            logger.warning("Donors %s and %s disagree on the state: %s", donors[a], donors[b], why)
        agree[frozenset((donors[a], donors[b]))] = not why
    return agree
