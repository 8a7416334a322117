"""Rank 0's side of a peer's process group: spawn the compute ranks, rendezvous, watch them, stop them.

The daemon is rank 0. `start()` spawns ranks 1..N-1 as `python -m swarmd.ranks.compute_rank` processes it owns:
each gets SIGKILL when the daemon dies (PR_SET_PDEATHSIG, as hivemind's children do: swarmd.swarm.children), lives
in its own process group (a Ctrl-C reaches only the daemon) and ignores SIGTERM (systemd signals the whole
cgroup; rank 0 stops the ranks in order instead). `connect()` waits for them on a FileStore in a private
directory of the state dir: no port, so two daemons on one box cannot collide, and nothing outside listens.

Faults: `dead_rank()` is cheap enough to poll every tick and returns one line naming the rank and its device
("rank 1 (cuda:1) was killed by SIGKILL"). Collectives have a timeout, so rank 0 is never stuck forever on a rank
that hangs; a rank that dies breaks rank 0's pending collective at once (gloo) and StepSync turns that into
RankFailure with this same line. `close()` waits a bounded time for the ranks to exit after rank 0 sent stop,
then kills what is left: no orphans.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from swarmd.ranks.step_sync import RankFailure, share_data_seed

__all__ = ["RankGroup", "TorchrunGroup", "rank_timeouts", "ready_key", "COMPUTE_BOUND_SECONDS"]

logger = logging.getLogger(__name__)

# How long rank 0 waits in one collective for the other ranks: one step's forward and backward of theirs (rank 0
# computes its own meanwhile). A rank slower than this is taken for hung.
COMPUTE_BOUND_SECONDS = 300.0
# Work rank 0 does between two steps that the compute ranks wait through (trainer.py's budgets for these).
_EVALUATION_SECONDS = 1800.0
_CHECKPOINT_SECONDS = 600.0
_POLL_SECONDS = 0.1


def ready_key(rank: int) -> str:
    """Set in the rendezvous store by a compute rank that built its model and is joining the group."""
    return f"swarmd/ready/{rank}"


def rank_timeouts(config) -> tuple[float, float]:
    """(rank 0's, the compute ranks') timeout for one collective, from the config.

    A compute rank waits in `follow()` while rank 0 does everything else between two steps: its hivemind step
    (matchmaking, averaging, maybe a state download: the worker's step budget), an evaluation, a checkpoint, and at
    training.max_epochs the wait for peers behind (trainer.py _wait_for_peers_behind)."""
    swarm = config.swarm
    download = swarm.load_state_attempts * swarm.load_state_timeout + swarm.averaging_timeout
    hivemind_step = swarm.matchmaking_time + 3 * swarm.averaging_timeout + download
    follower = COMPUTE_BOUND_SECONDS + hivemind_step + _EVALUATION_SECONDS + _CHECKPOINT_SECONDS
    follower += config.training.finish_wait_seconds
    return COMPUTE_BOUND_SECONDS, follower


class RankGroup:
    """Ranks 1..N-1 of this peer as child processes, and rank 0's membership of their process group."""

    def __init__(
        self,
        *,
        devices: Sequence[str],
        config_data: Mapping[str, Any],
        workdir: Path,
        init_seed: int,
        data_seed: int,
        leader_timeout: float = COMPUTE_BOUND_SECONDS,
        follower_timeout: float = COMPUTE_BOUND_SECONDS,
        threads: int = 0,
        env: Optional[Mapping[str, str]] = None,
    ):
        """`devices`: one per rank, rank 0's first. `config_data`: the validated config as plain data
        (SwarmdConfig.to_dict()), from which each rank builds the task and model itself. `workdir`: where the
        private rendezvous directory goes (the state dir). `env`: extra environment for the ranks."""
        if len(devices) < 2:
            raise ValueError("a RankGroup needs at least two devices (rank 0 and one compute rank)")
        self.devices = [str(d) for d in devices]
        self.world_size = len(self.devices)
        self.backend = "nccl" if self.devices[0].startswith("cuda") else "gloo"
        self.config_data = dict(config_data)
        self.workdir = Path(workdir)
        self.init_seed, self.data_seed = init_seed, data_seed
        self.leader_timeout, self.follower_timeout = leader_timeout, follower_timeout
        self.threads = threads
        self.env = dict(env or {})
        self._processes: dict[int, subprocess.Popen] = {}
        self._rendezvous: Optional[Path] = None
        self._stopping = False
        self.closed = False
        self._connected = False
        self._dead: Optional[str] = None

    # --- start ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the compute ranks. Call on the main thread: a child is tied to the THREAD that forked it."""
        if threading.current_thread() is not threading.main_thread():
            # PR_SET_PDEATHSIG fires when the forking thread ends: from a pool thread the ranks would be killed
            # whenever that thread retires
            raise RuntimeError("RankGroup.start() must run on the main thread")
        self._rendezvous = Path(tempfile.mkdtemp(prefix="ranks-", dir=self.workdir))
        config_path = self._rendezvous / "config.json"  # read back by compute_rank.load_rank_config
        config_path.write_text(json.dumps(self.config_data))
        spec = {
            "config_path": str(config_path),
            "devices": self.devices,
            "backend": self.backend,
            "store": str(self._rendezvous / "store"),
            "init_seed": self.init_seed,
            "timeout": self.follower_timeout,
            "threads": self.threads,
        }
        spec_path = self._rendezvous / "spec.json"
        spec_path.write_text(json.dumps(spec))
        from swarmd.swarm.children import die_with_parent

        env = {**os.environ, **self.env}
        for rank in range(1, self.world_size):
            self._processes[rank] = subprocess.Popen(
                [sys.executable, "-m", "swarmd.ranks.compute_rank", str(spec_path), str(rank)],
                env=env,
                stdin=subprocess.DEVNULL,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
                process_group=0,
            )
        logger.info(
            "Started %d compute rank(s) on %s (pids %s)",
            self.world_size - 1,
            ", ".join(self.devices[1:]),
            ", ".join(str(p.pid) for p in self._processes.values()),
        )

    def connect(self, timeout: float) -> None:
        """Join the process group as rank 0 once every rank has built its model; RankFailure if one dies first or
        they do not all arrive within `timeout` seconds. May run on any thread."""
        import torch
        import torch.distributed as dist

        if self._rendezvous is None:
            raise RuntimeError("RankGroup.connect() before start()")
        if self.backend == "nccl":
            torch.cuda.set_device(torch.device(self.devices[0]))
        deadline = time.monotonic() + timeout
        # Wait here, watching the children, until each has built its model and says so in the store: the process
        # group's own timeout is the (shorter) bound of one collective, not of a rank's start-up.
        store = dist.FileStore(str(self._rendezvous / "store"), self.world_size)
        waiting = {rank: ready_key(rank) for rank in self._processes}
        while waiting:
            self._check_start(deadline, timeout)
            for rank, key in list(waiting.items()):
                if store.check([key]):
                    del waiting[rank]
            time.sleep(_POLL_SECONDS)
        failure: list[BaseException] = []

        def init() -> None:
            try:
                dist.init_process_group(
                    self.backend,
                    store=store,
                    rank=0,
                    world_size=self.world_size,
                    timeout=timedelta(seconds=self.leader_timeout),
                )
                dist.barrier()  # gloo connects lazily; the barrier proves every rank is reachable
                share_data_seed(self.data_seed, rank=0, device=self.devices[0])
            except BaseException as e:  # noqa: BLE001 - reported by connect()
                failure.append(e)

        thread = threading.Thread(target=init, name="swarmd-ranks-connect", daemon=True)
        thread.start()
        while thread.is_alive():
            self._check_start(deadline, timeout)
            thread.join(_POLL_SECONDS)
        if failure:
            raise RankFailure(f"rank 0 ({self.devices[0]}) could not join the process group: {failure[0]}")
        self._connected = True
        logger.info("Process group of %d ranks ready (%s): %s", self.world_size, self.backend, ", ".join(self.devices))

    def _check_start(self, deadline: float, timeout: float) -> None:
        dead = self.dead_rank()
        if dead:
            raise RankFailure(f"{dead} before it joined the process group")
        if time.monotonic() > deadline:
            raise RankFailure(
                f"the compute ranks ({', '.join(self._describe(r) for r in self._processes)}) did not all "
                f"join the process group within {timeout:.0f} s"
            )

    # --- watch ---------------------------------------------------------------------------------------------

    def dead_rank(self) -> Optional[str]:
        """One line naming the first compute rank that exited without being told to, or None. Cheap: poll it."""
        if self._dead is None and not self._stopping:
            for rank, process in self._processes.items():
                code = process.poll()
                if code is not None:
                    self._dead = f"{self._describe(rank)} {_how_it_ended(code)}"
                    break
        return self._dead

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes.values()]

    def expect_exit(self) -> None:
        """Rank 0 is about to tell the ranks to stop: from now on an exit is not a death."""
        self._stopping = True

    # --- stop ----------------------------------------------------------------------------------------------

    def close(self, timeout: float) -> bool:
        """After rank 0 sent stop (StepSync.lead_stop), or when giving up: wait up to `timeout` s for the ranks
        to exit, kill the rest, leave the process group. True when every rank exited on its own with code 0."""
        self._stopping = self.closed = True
        deadline = time.monotonic() + timeout
        for process in self._processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        clean = True
        for rank, process in self._processes.items():
            if process.poll() is None:
                clean = False
                logger.warning("%s did not stop within %.0f s: killing it", self._describe(rank), timeout)
                process.kill()  # SIGKILL: the ranks ignore SIGTERM
                process.wait()
            elif process.returncode != 0:
                clean = False
        self._leave_process_group()
        if self._rendezvous is not None:
            shutil.rmtree(self._rendezvous, ignore_errors=True)
        return clean

    def _leave_process_group(self) -> None:
        if self._connected:
            self._connected = False
            _destroy_process_group_bounded()

    def __enter__(self) -> "RankGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close(timeout=0.0 if exc[0] is not None else 10.0)

    # --- helpers -------------------------------------------------------------------------------------------

    def _describe(self, rank: int) -> str:
        return f"rank {rank} ({self.devices[rank]})"


class TorchrunGroup:
    """Rank 0's membership of a group torchrun started: the same surface as RankGroup, with nothing to spawn or
    watch (torchrun's agent owns the processes and stops every rank when one fails, so rank 0 dies with them; a
    rank on another node that stops answering ends rank 0's collective at the timeout)."""

    def __init__(self, place, *, device: str, data_seed: int, environ: Mapping[str, str],
                 leader_timeout: float = COMPUTE_BOUND_SECONDS):
        from swarmd.ranks.layout import torchrun_init_method

        if place.rank != 0:
            raise ValueError("TorchrunGroup is rank 0's side; other ranks run swarmd.ranks.compute_rank")
        self.place = place
        self.world_size = place.world_size
        self.devices = [str(device)]  # this node's other devices are not rank 0's to know
        self.backend = "nccl" if self.devices[0].startswith("cuda") else "gloo"
        self.data_seed = data_seed
        self.leader_timeout = leader_timeout
        self.init_method = torchrun_init_method(environ)
        self._connected = False
        self.closed = False

    def start(self) -> None:
        """Nothing to spawn: torchrun started every rank."""

    def connect(self, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        if self.backend == "nccl":
            torch.cuda.set_device(torch.device(self.devices[0]))
        try:
            dist.init_process_group(
                self.backend,
                init_method=self.init_method,
                rank=0,
                world_size=self.world_size,
                timeout=timedelta(seconds=max(timeout, self.leader_timeout)),
            )
            dist.barrier()
            share_data_seed(self.data_seed, rank=0, device=self.devices[0])
        except Exception as e:  # noqa: BLE001 - one line naming what failed
            raise RankFailure(f"rank 0 could not join torchrun's process group at {self.init_method}: {e}") from None
        self._connected = True

    def expect_exit(self) -> None:
        """Nothing to watch: torchrun's agent stops every rank when one fails."""

    def dead_rank(self) -> Optional[str]:
        return None

    @property
    def pids(self) -> list[int]:
        return []

    def close(self, timeout: float) -> bool:
        self.closed = True
        if self._connected:
            self._connected = False
            _destroy_process_group_bounded()
        return True


_DESTROY_SECONDS = 5.0


def _destroy_process_group_bounded() -> None:
    """Leave the process group without ever blocking the daemon's stop: a worker thread may still sit in a
    collective (a hung NCCL kernel), and tearing down under it can wait; the process exits soon anyway."""
    import torch.distributed as dist

    def destroy() -> None:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - the ranks are gone; nothing depends on a clean teardown
            logger.debug("Leaving the process group: %r", e)

    thread = threading.Thread(target=destroy, name="swarmd-ranks-destroy", daemon=True)
    thread.start()
    thread.join(_DESTROY_SECONDS)
    if thread.is_alive():
        logger.warning("Leaving the process group did not finish within %.0f s; going on", _DESTROY_SECONDS)


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    if code == 0:
        return "exited without being told to stop"
    return f"failed (exit code {code}; its log above says why)"
