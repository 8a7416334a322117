"""The per-step protocol between rank 0 (which hosts hivemind) and the compute ranks, in lockstep.

Every local step, on every rank, the same collectives in the same order:

1. control: rank 0 broadcasts a small float64 tensor: the command (step / stop), whether its parameters changed
   since the ranks last got them (a global step, a state download, a NaN restore, local updates: rank 0 passes a
   version that changes with each), whether to verify the replicas this step, whether to zero gradients, the
   global epoch (tasks whose data follows it) and the fp16 loss scale (so every rank's gradients share a scale);
2. parameters (only when they changed): rank 0 broadcasts parameters and floating buffers, in flat buckets;
3. verify (every `verify_every` steps): every rank checksums its parameters; rank 0's checksum is broadcast and
   any mismatch (a change nobody announced) re-broadcasts the parameters; this is the replicas' proof of agreement;
4. each rank computes forward/backward on its own batch (not here);
5. stats: all_gather of (samples, loss x samples, compute seconds, CUDA memory) from every rank;
6. gradients: bucketed all_reduce of flattened gradients, each rank's weighted by its share of the samples, so
   every rank ends with the mean gradient over all the peer's samples in `.grad`. Rank 0 then hands hivemind
   that gradient and the peer's whole sample count.

Gradients are mirrored, not just averaged: after step 6 every rank holds the same `.grad`. A rank keeps it when
rank 0 keeps its own (hivemind's `reuse_grad_buffers` accumulates into `.grad` across local steps) and drops it
when rank 0's gradients are gone (the usual zero_grad after each step, or hivemind resetting the accumulators),
which rank 0 says in the control tensor. So averaging the mirrors averages exactly the new step's gradients.

A collective that fails (a rank died) or times out (a rank hangs) raises RankFailure: fatal, never retried.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from swarmd.errors import TrainingFailed

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "Command", "Control", "RankFailure", "RankStep", "StepTotals", "StepSync", "share_data_seed", "DEFAULT_BUCKET_BYTES",
]

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: large enough to amortise a collective's latency
DEFAULT_VERIFY_EVERY = 100  # steps between replica checksums (hivemind draft PR #475 used 100)
_FAILURE_GRACE_SECONDS = 3.0  # after a failed collective, how long to wait for the watcher to name the dead rank


class Command(enum.IntEnum):
    STEP = 0
    STOP = 1


class RankFailure(TrainingFailed):
    """Another rank of this peer died or stopped answering: the peer cannot go on (exit 1)."""


@dataclass(frozen=True)
class Control:
    command: Command
    broadcasts: int  # how many parameter broadcasts rank 0 has started, this one included
    sync_parameters: bool
    verify: bool
    zero_grads: bool
    epoch: int
    loss_scale: float

    _FIELDS = 7

    def encode(self, device) -> "torch.Tensor":
        import torch

        values = [self.command, self.broadcasts, self.sync_parameters, self.verify, self.zero_grads, self.epoch]
        return torch.tensor([float(v) for v in values] + [self.loss_scale], dtype=torch.float64, device=device)

    @classmethod
    def decode(cls, tensor: "torch.Tensor") -> "Control":
        command, broadcasts, sync, verify, zero, epoch, scale = tensor.tolist()
        return cls(Command(int(command)), int(broadcasts), bool(sync), bool(verify), bool(zero), int(epoch), scale)


@dataclass(frozen=True)
class RankStep:
    """One rank's part of one step, as rank 0 sees it after the stats all_gather."""

    rank: int
    samples: int
    compute_seconds: float  # from the end of the control phase to the start of gradient averaging
    cuda_allocated_bytes: int = 0
    cuda_reserved_bytes: int = 0


@dataclass(frozen=True)
class StepTotals:
    samples: int  # the peer's samples this step: what rank 0 reports to hivemind
    loss: float  # sample-weighted mean loss over all ranks (NaN if any rank's was)
    ranks: list[RankStep] = field(default_factory=list)


class StepSync:
    """One rank's end of the protocol. Rank 0 calls `lead` (and `lead_stop`), the others `follow`; all call
    `average_gradients` after their backward. Every call is a collective: all ranks must make it."""

    def __init__(
        self,
        model: "torch.nn.Module",
        *,
        rank: int,
        world_size: int,
        device: "torch.device",
        verify_every: int = DEFAULT_VERIFY_EVERY,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        describe_failure: Optional[Callable[[], Optional[str]]] = None,
        group=None,
    ):
        import torch

        if verify_every < 1:
            raise ValueError("verify_every must be >= 1")
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.group = group
        self.verify_every = verify_every
        self.bucket_bytes = bucket_bytes
        self.describe_failure = describe_failure
        self._params = [p for p in model.parameters()]
        self._trained = [p for p in self._params if p.requires_grad]
        # floating buffers (e.g. BatchNorm statistics) travel with the parameters but are not checksummed: they
        # legitimately drift between broadcasts, as with DDP's broadcast_buffers=False
        self._synced = self._params + [b for b in model.buffers() if b.is_floating_point()]
        self._last_version: object = _NEVER
        self._steps = 0
        self._in_step = False
        self._compute_started = 0.0
        self.broadcasts_total = 0
        self.repairs_total = 0  # checksum mismatches repaired by a broadcast
        self.last_control: Optional[Control] = None

    # --- rank 0 --------------------------------------------------------------------------------------------

    def lead(self, *, params_version: object, epoch: int = 0, loss_scale: float = 1.0) -> None:
        """Before rank 0's forward: tell the ranks to step; send the parameters when `params_version` changed."""
        self._require(self.rank == 0, "lead")
        sync = params_version != self._last_version
        self._steps += 1
        control = Control(
            command=Command.STEP,
            broadcasts=self.broadcasts_total + int(sync),
            sync_parameters=sync,
            verify=self._steps % self.verify_every == 0,
            zero_grads=self._grads_are_empty(),
            epoch=epoch,
            loss_scale=float(loss_scale),
        )
        self._collective("sending the step's control", lambda: self._broadcast(control.encode(self.device)))
        self._apply(control)
        self._last_version = params_version

    def lead_stop(self) -> None:
        """Tell the ranks to exit (their loop ends; rank 0's RankGroup then reaps them)."""
        self._require(self.rank == 0, "lead_stop")
        stop = Control(Command.STOP, self.broadcasts_total, False, False, False, 0, 1.0)
        self._collective("sending stop", lambda: self._broadcast(stop.encode(self.device)))

    def abandon_step(self) -> None:
        """Rank 0's step failed between `lead` and `average_gradients`: finish the collectives the ranks are in,
        contributing nothing (the worker drops this step's gradients anyway). No-op outside a step."""
        if self._in_step:
            self.average_gradients(samples=0, loss=0.0)

    @property
    def in_step(self) -> bool:
        return self._in_step

    # --- ranks >= 1 ----------------------------------------------------------------------------------------

    def follow(self) -> Optional[Control]:
        """Wait for rank 0's next command and carry out its parameter phase; None means stop."""
        self._require(self.rank != 0, "follow")
        import torch

        tensor = torch.empty(Control._FIELDS, dtype=torch.float64, device=self.device)
        self._collective("waiting for rank 0", lambda: self._broadcast(tensor))
        control = Control.decode(tensor)
        if control.command == Command.STOP:
            return None
        if control.zero_grads:
            for param in self._trained:
                param.grad = None
        self._apply(control)
        return control

    # --- every rank ----------------------------------------------------------------------------------------

    def average_gradients(self, *, samples: int, loss: float) -> StepTotals:
        """After backward: every rank's `.grad` becomes the sample-weighted mean over ranks; returns the totals."""
        import torch

        compute_seconds = time.perf_counter() - self._compute_started if self._in_step else 0.0
        self._in_step = False
        allocated = reserved = 0
        if self.device.type == "cuda":
            allocated, reserved = torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device)
        mine = torch.tensor(
            [samples, loss * samples if samples else 0.0, compute_seconds, allocated, reserved],
            dtype=torch.float64,
            device=self.device,
        )
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._collective("gathering step stats", lambda: self._all_gather(gathered, mine))
        rows = torch.stack(gathered).cpu().tolist()
        total = sum(row[0] for row in rows)
        weight = samples / total if total else 0.0  # no samples anywhere: nothing to average
        self._all_reduce_grads(weight)
        return StepTotals(
            samples=int(total),
            loss=sum(row[1] for row in rows) / total if total else float("nan"),
            ranks=[RankStep(r, int(row[0]), row[2], int(row[3]), int(row[4])) for r, row in enumerate(rows)],
        )

    @property
    def steps_total(self) -> int:
        return self._steps

    # --- the phases ----------------------------------------------------------------------------------------

    def _apply(self, control: Control) -> None:
        """The parameter phase both sides run after the control broadcast."""
        self.last_control = control
        if self.rank != 0:
            self._steps += 1
        if control.sync_parameters:
            self._broadcast_parameters()
        if control.verify and not self._replicas_agree():
            self.repairs_total += 1
            logger.warning(
                "rank %d: parameters differed from rank 0's at step %d (a change that was not announced); "
                "re-broadcasting them",
                self.rank,
                self._steps,
            )
            self._broadcast_parameters()
        self._in_step = True
        self._compute_started = time.perf_counter()

    def _broadcast_parameters(self) -> None:
        import torch
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        self.broadcasts_total += 1
        with torch.no_grad():
            for bucket in _buckets(self._synced, self.bucket_bytes):
                tensors = [t.detach() for t in bucket]
                if self.rank == 0:
                    flat = _flatten_dense_tensors(tensors)
                else:
                    flat = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
                self._collective("broadcasting parameters", lambda: self._broadcast(flat))
                if self.rank != 0:
                    for tensor, value in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                        tensor.copy_(value)

    def _replicas_agree(self) -> bool:
        import torch

        mine = self.checksum()
        reference = mine.clone()
        self._collective("comparing checksums", lambda: self._broadcast(reference))
        differs = torch.tensor([float(not torch.equal(mine, reference))], dtype=torch.float64, device=self.device)
        self._collective("comparing checksums", lambda: self._all_reduce(differs, "max"))
        return differs.item() == 0.0

    def checksum(self) -> "torch.Tensor":
        """Per parameter tensor: its sum and its sum of squares, in float64 (bit-identical replicas agree exactly)."""
        import torch

        with torch.no_grad():
            values = []
            for param in self._params:
                p = param.detach()
                values.append(p.sum(dtype=torch.float64))
                values.append(p.double().square().sum() if p.dtype != torch.float64 else p.square().sum())
            return torch.stack(values).to(self.device) if values else torch.zeros(1, dtype=torch.float64, device=self.device)

    def _all_reduce_grads(self, weight: float) -> None:
        import torch
        from torch._utils import _unflatten_dense_tensors

        with torch.no_grad():
            for bucket in _buckets(self._trained, self.bucket_bytes):
                flat = torch.empty(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
                offset = 0
                for param in bucket:
                    part = flat[offset : offset + param.numel()].view_as(param)
                    if param.grad is None or weight == 0.0:  # weight 0: a NaN times 0 is still NaN
                        part.zero_()
                    else:
                        torch.mul(param.grad, weight, out=part)
                    offset += param.numel()
                self._collective("averaging gradients", lambda: self._all_reduce(flat, "sum"))
                for param, value in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    if param.grad is None:
                        param.grad = value.clone()
                    else:
                        param.grad.copy_(value)

    # --- collectives -----------------------------------------------------------------------------------------

    def _broadcast(self, tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(tensor, src=0, group=self.group)

    def _all_gather(self, out: list, tensor) -> None:
        import torch.distributed as dist

        dist.all_gather(out, tensor, group=self.group)

    def _all_reduce(self, tensor, op: str) -> None:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.group)

    def _collective(self, what: str, run: Callable[[], None]) -> None:
        try:
            run()
        except RankFailure:
            raise
        except Exception as e:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses with long texts
            self._in_step = False
            raise RankFailure(self._why(what, e)) from e

    def _why(self, what: str, error: Exception) -> str:
        """The dead rank's line when the watcher can name it (it may notice the exit a moment after the socket)."""
        if self.describe_failure is not None:
            deadline = time.monotonic() + _FAILURE_GRACE_SECONDS
            while True:
                line = self.describe_failure()
                if line or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if line:
                return line
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"rank {self.rank}: {what} with the other ranks failed: {first_line[:300]}"

    # --- helpers ---------------------------------------------------------------------------------------------

    def _grads_are_empty(self) -> bool:
        import torch

        grads = [p.grad for p in self._trained if p.grad is not None]
        if not grads:
            return True
        return bool(torch.stack(torch._foreach_norm(grads)).max().item() == 0.0)

    def _require(self, condition: bool, method: str) -> None:
        if not condition:
            raise RuntimeError(f"StepSync.{method} is not for rank {self.rank}")


def share_data_seed(seed: Optional[int], *, rank: int, device) -> int:
    """Right after joining: rank 0's data seed (derived from the peer id) to every rank, which derives its own from
    it. Under torchrun no other rank can know the peer id."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([seed if rank == 0 else 0], dtype=torch.int64, device=device)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())


class _Never:
    def __repr__(self) -> str:
        return "<never>"


_NEVER = _Never()  # rank 0 has sent no parameters yet: the first lead() always sends them


def _buckets(tensors: Sequence["torch.Tensor"], bucket_bytes: int) -> list[list["torch.Tensor"]]:
    """Consecutive runs of one dtype and device, each at most `bucket_bytes` (a larger tensor gets its own)."""
    buckets: list[list] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        current = buckets[-1] if buckets else None
        if (
            current is None
            or current[0].dtype != tensor.dtype
            or current[0].device != tensor.device
            or size + nbytes > bucket_bytes
        ):
            buckets.append([tensor])
            size = nbytes
        else:
            current.append(tensor)
            size += nbytes
    return buckets
