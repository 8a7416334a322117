"""A downloaded state judged on this peer's own data (`swarm.guard_download_loss_ratio`).

A peer that falls behind (an outrun founder, a peer that lagged) downloads the state of whoever offers the newest,
and before any evidence is in, an attacker may be that peer. Seen in the attack benchmark's local-updates x -1e6 cell
(docs/FAULTS.md, "Parameters judged by their step"): the attacker took the founder's state, and its first steps after
the jump in its gradients' scale (Adam's second moments lag it: steps up to lr/sqrt(1 - beta2), ~30x lr) took that
state from loss 0.003 to ~7 within half a second; the outrun founder downloaded it then, with its momentum, and every
honest peer stepped uphill on that lineage for ~20 s. Nobody's step pointed away from the others': no evidence.

This peer's own steps say what a plausible state is: the first step after a download computes the loss of the state
that came on this peer's next batch, which is compared with the largest loss of this peer's own last steps (before
the download): the largest, not the median, because one batch's loss varies (a hard batch of a converged classifier
is many times the median one), and an honest state may meet such a batch first. A state more than `ratio` times
worse than that is refused (the worker puts its last good parameters back, the optimizer statistics start afresh
and the donors count as evidence: swarm/upstream/peer_parts.py refuse_state). An honest state of the same run is
within a few times this peer's own (the same model, the same data); the lying one above was over 1,000 times the
founder's own. A joiner has no steps of its own: its first download is not judged.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional

__all__ = ["DownloadJudge", "OWN_STEPS_KEPT", "OWN_STEPS_NEEDED"]

OWN_STEPS_KEPT = 16  # the last steps on this peer's own state whose largest loss is the reference
OWN_STEPS_NEEDED = 4  # fewer than this since the last state this peer took: nothing to judge by


class DownloadJudge:
    """Which loss comes from whose state: `record` each step's loss on this peer's state; once the downloads count
    (`loads`) changed, the next step's loss is the downloaded state's and goes to `judge` instead (`pending`)."""

    def __init__(self, ratio: float):
        self.ratio = ratio  # 0: off
        self._own: deque = deque(maxlen=OWN_STEPS_KEPT)
        self._loads_judged: Optional[int] = None  # None until the worker has joined (`begin`)

    def begin(self, loads: int) -> None:
        """The worker joined with `loads` downloads behind it: its state from now on is its own."""
        self._loads_judged = loads

    def pending(self, loads: int) -> bool:
        """Whether a state came since the last judged one (and judging is on): the next step's loss is the state's."""
        return bool(self.ratio) and self._loads_judged is not None and loads != self._loads_judged

    def record(self, loss: float) -> None:
        """A step's loss on this peer's own state (non-finite ones are another guard's)."""
        if math.isfinite(loss):
            self._own.append(loss)

    def judge(self, loss: float, loads: int) -> str:
        """Why the state that came (`loads` downloads so far) is refused on its first step's `loss`, or "": then it
        is this peer's own from now on, and its losses the reference."""
        self._loads_judged = loads
        own = list(self._own)
        if not math.isfinite(loss):
            return "its loss on this peer's next batch was not finite"
        if len(own) >= OWN_STEPS_NEEDED:
            reference = max(own)
            if reference > 0 and loss > self.ratio * reference:
                return (f"its loss on this peer's next batch was {loss:.4g}, {loss / reference:.3g}x the largest of "
                        f"this peer's own last {len(own)} steps ({reference:.4g}; swarm.guard_download_loss_ratio "
                        f"{self.ratio:g})")
        self._own.clear()
        self.record(loss)
        return ""
