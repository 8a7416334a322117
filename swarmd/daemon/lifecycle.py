"""The daemon's whole life in one place: run -> startup -> main loop -> shutdown.

Threads and processes:
- the main thread runs the asyncio (uvloop) loop: signals, the status socket, the metrics endpoint, the tick;
  it also builds the DHT and hivemind.Optimizer, which hivemind requires on the main thread;
- one worker thread trains (swarmd.worker.trainer);
- hivemind's processes (DHT + p2pd, one per averager) are tied to this process and die with it.

Exit codes (swarmd.errors.ExitCode): 0 clean stop (signal or training.max_epochs), 1 failure while running or a
forced stop, 2 configuration error, 3 could not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

from swarmd.errors import ExitCode, StartupError, SwarmdError

__all__ = ["Daemon"]

logger = logging.getLogger("swarmd.daemon")

LOCK_NAME = "swarmd.lock"


class Daemon:
    def __init__(self, config, *, config_path: Optional[str] = None):
        self.config = config
        self.config_path = config_path
        self.state = "starting"
        self.started_at = time.time()
        self.state_dir: Path = config.state_path
        self.peer_id: Optional[str] = None
        self.visible_maddrs: list[str] = []
        self.device: Optional[str] = None
        self.dht = None
        self.optimizer = None
        self.worker = None
        self.task = None
        self.model = None
        self.checkpoints = None
        self.stats = None
        self.averaging_log = None
        self.status_server = None
        from swarmd.daemon.extensions import build_extensions

        self.extensions = build_extensions(config)  # metrics, systemd notification, peer records, ...
        self._stop_requested: Optional[asyncio.Event] = None
        self._signals_received = 0
        self._lock_file = None
        self._exit_code = ExitCode.OK

    # --- run -----------------------------------------------------------------------------------------------

    async def run(self) -> int:
        self._stop_requested = asyncio.Event()
        self._install_signal_handlers()
        try:
            try:
                await self._startup()
            except SwarmdError as e:
                logger.error("%s", e)
                self._exit_code = e.exit_code
                return int(self._exit_code)
            except _StopDuringStartup:
                logger.info("Stop requested during start-up")
                return int(self._exit_code)
            except Exception:  # a bug, not bad input: keep the traceback for the report
                logger.exception("swarmd failed during start-up")
                self._exit_code = ExitCode.FAILURE
                return int(self._exit_code)
            await self._main_loop()
            return int(self._exit_code)
        finally:
            await self._shutdown()
            self._restore_signal_handlers()

    # --- startup -------------------------------------------------------------------------------------------

    async def _startup(self) -> None:
        from swarmd.status.server import SOCKET_NAME, StatusServer

        self._prepare_state_dir()
        self.status_server = StatusServer(self.state_dir / SOCKET_NAME, self.snapshot)
        await self.status_server.start()
        for extension in self.extensions:
            try:
                await extension.start(self)
            except Exception:  # noqa: BLE001 - an observer must not stop the daemon
                logger.exception("%s failed to start; going on without it", type(extension).__name__)

        # Heavy imports happen here, after the socket answers "starting".
        import torch

        from swarmd.logs import route_hivemind_logs
        from swarmd.swarm.averaging_log import AveragingLog
        from swarmd.swarm.children import tie_children_to_this_process
        from swarmd.tasks.base import TaskContext
        from swarmd.tasks.registry import resolve_task
        from swarmd.worker.stats import WorkerStats
        from swarmd.worker.trainer import resolve_device

        route_hivemind_logs(self.config.logging.hivemind_level)
        tie_children_to_this_process()
        self._check_stop()

        training = self.config.training
        from swarmd.worker.threads import reserve_threads_for_worker

        worker_threads = reserve_threads_for_worker(training.threads)
        device = resolve_device(training.device)
        self.device = str(device)
        init_seed = training.seed if training.seed is not None else int.from_bytes(os.urandom(4), "little")
        task_cls = resolve_task(self.config.task.name)
        self.task = task_cls(
            self.config.task.settings,
            TaskContext(
                state_dir=self.state_dir,
                device=device,
                precision=training.precision,
                batch_size=training.batch_size,
                seed=init_seed,
            ),
        )
        logger.info("Preparing task %s (%s)", self.config.task.name, task_cls.description)
        await asyncio.to_thread(self.task.prepare)
        self._check_stop()
        torch.manual_seed(init_seed)
        self.model = await asyncio.to_thread(self.task.build_model)
        n_params = sum(p.numel() for p in self.model.parameters())
        logger.info("Model: %.2fM parameters, device %s, precision %s", n_params / 1e6, device, training.precision)

        checkpoint = await asyncio.to_thread(self._load_checkpoint_into_model)
        self.model.to(device)
        self._check_stop()

        from swarmd.swarm.dht import start_dht

        self.state = "joining"
        validators = [v for extension in self.extensions for v in _guarded(extension.record_validators, self, [])]
        self.dht = await start_dht(self.config.network, self.state_dir, record_validators=validators)
        self.peer_id = str(self.dht.peer_id)
        self.visible_maddrs = [str(addr) for addr in self.dht.get_visible_maddrs()]
        self._announce_addresses()
        self._check_stop()

        from swarmd.swarm.optimizer import build_swarm_optimizer

        self.averaging_log = AveragingLog()
        self.stats = WorkerStats()
        # On the main thread, by hivemind's rule; it also resets SIGINT, so the handlers are installed again.
        self.optimizer = build_swarm_optimizer(
            dht=self.dht, config=self.config, model=self.model, task=self.task, averaging_log=self.averaging_log
        )
        self._install_signal_handlers()
        if checkpoint is not None:
            self._load_checkpoint_into_optimizer(checkpoint)
        logger.info(
            "Joined run %r as %s: target batch %d, %d per step, local epoch %d",
            self.config.run_id,
            "an auxiliary peer" if self.config.swarm.auxiliary else "a trainer",
            self.config.swarm.target_batch_size,
            training.batch_size,
            self.optimizer.local_epoch,
        )
        self._check_stop()

        from swarmd.worker.trainer import TrainingWorker

        self.worker = TrainingWorker(
            task=self.task,
            model=self.model,
            optimizer=self.optimizer,
            config=self.config,
            stats=self.stats,
            data_seed=_data_seed(training.seed, self.peer_id),
            threads=worker_threads,
            save_checkpoint=self.save_checkpoint if self.config.checkpoint.enabled else None,
        )
        self.worker.start()
        self.state = "training"
        for extension in self.extensions:
            _guarded(extension.ready, self, None)

    def _prepare_state_dir(self) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = self.state_dir / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StartupError(
                f"the state dir {self.state_dir} is not usable ({e.strerror}); pass a writable --state-dir"
            ) from None
        self._lock_file = open(self.state_dir / LOCK_NAME, "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "unknown"
            self._lock_file.close()
            self._lock_file = None
            raise StartupError(
                f"another swarmd (pid {holder}) is running with state dir {self.state_dir}; "
                "stop it or give this peer its own --state-dir"
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def _announce_addresses(self) -> None:
        from swarmd.swarm.dht import join_command

        public = [addr for addr in self.visible_maddrs if "/ip4/127." not in addr and "/ip6/::1/" not in addr]
        logger.info("This peer (%s) is reachable at: %s", self.peer_id, ", ".join(self.visible_maddrs) or "nowhere")
        logger.info("To join: %s", join_command(public or self.visible_maddrs, self.config.run_id, self.config_path))

    # --- checkpoints ---------------------------------------------------------------------------------------

    def _checkpoint_store(self):
        if self.checkpoints is None:
            from swarmd.daemon.checkpoint import CheckpointStore

            self.checkpoints = CheckpointStore(self.state_dir / "checkpoints", keep=self.config.checkpoint.keep)
        return self.checkpoints

    def _load_checkpoint_into_model(self):
        """Runs in a thread before the optimizer exists: the optimizer state is applied once it is built."""
        if not self.config.checkpoint.enabled:
            return None
        store = self._checkpoint_store()
        store.remove_partials()
        checkpoint = store.load_latest()
        if checkpoint is None:
            return None
        if checkpoint.meta.get("run_id") not in (None, self.config.run_id):
            logger.warning(
                "Checkpoint %s belongs to run %r, not %r: ignoring it",
                checkpoint.path.name,
                checkpoint.meta.get("run_id"),
                self.config.run_id,
            )
            return None
        from swarmd.daemon.restore import load_model_state

        load_model_state(self.model, checkpoint)
        logger.info("Resuming from checkpoint %s (epoch %d)", checkpoint.path.name, checkpoint.epoch)
        return checkpoint

    def _load_checkpoint_into_optimizer(self, checkpoint) -> None:
        from swarmd.daemon.restore import load_optimizer_state

        load_optimizer_state(self.optimizer, checkpoint)

    def save_checkpoint(self) -> None:
        """Capture and write a checkpoint. Called from the worker thread between steps, or after it stopped."""
        from swarmd.daemon.checkpoint import CheckpointError
        from swarmd.daemon.restore import capture_state

        model_state, optimizer_state, epoch = capture_state(self.model, self.optimizer)
        info = {"run_id": self.config.run_id, "task": self.config.task.name, "peer_id": self.peer_id}
        from swarmd import __version__

        info["swarmd_version"] = __version__
        try:
            path = self._checkpoint_store().save(
                model_state=model_state, optimizer_state=optimizer_state, epoch=epoch, info=info
            )
        except CheckpointError as e:
            self.stats.checkpoint_failures_total += 1
            logger.error("%s; the previous checkpoint is kept and training goes on", e)
            return
        self.stats.checkpoint_epoch, self.stats.checkpoint_path, self.stats.checkpoint_time = epoch, str(path), time.time()

    # --- main loop -----------------------------------------------------------------------------------------

    async def _main_loop(self) -> None:
        tick = self.config.daemon.tick_interval
        while not self._stop_requested.is_set():
            await self._tick()
            if not self.worker.alive:
                if self.worker.failure is not None:
                    logger.error("Stopping: the training worker failed (%s)", self.worker.failure)
                    self._exit_code = ExitCode.FAILURE
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop_requested.wait(), timeout=tick)

    async def _tick(self) -> None:
        if not self.extensions:
            return
        snapshot = self.snapshot()
        for extension in self.extensions:
            try:
                await extension.tick(self, snapshot)
            except Exception:  # noqa: BLE001 - an observer must not stop training
                logger.exception("%s failed during a tick", type(extension).__name__)

    def snapshot(self) -> dict[str, Any]:
        from swarmd.status.snapshot import build_snapshot

        snapshot = build_snapshot(
            config=self.config,
            state=self.state,
            started_at=self.started_at,
            peer_id=self.peer_id,
            visible_maddrs=self.visible_maddrs,
            device=self.device,
            optimizer=self.optimizer,
            stats=self.stats,
            averaging_log=self.averaging_log,
        )
        for extension in self.extensions:
            try:
                snapshot.update(extension.snapshot_fields(self))
            except Exception:  # noqa: BLE001 - a broken observer must not break the status
                logger.exception("%s failed to add to the status", type(extension).__name__)
        return snapshot

    # --- shutdown ------------------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Bounded: stop the worker, save, say goodbye, stop hivemind; past the bound, kill what is left."""
        from swarmd.swarm.children import descendant_pids, kill_descendants

        self.state = "stopping"
        for extension in self.extensions:
            with contextlib.suppress(Exception):
                extension.stopping(self)
        budget = self.config.daemon.shutdown_timeout
        deadline = time.monotonic() + budget
        remaining = lambda: max(0.0, deadline - time.monotonic())  # noqa: E731

        worker_stopped = True
        if self.worker is not None:
            self.worker.request_stop()
            worker_stopped = await asyncio.to_thread(self.worker.join, remaining() * 0.6)
            if not worker_stopped:
                logger.warning("The training step in progress did not finish in time: abandoning it")
        clean = self.worker is not None and worker_stopped and self.worker.failure is None
        if clean and self.config.checkpoint.enabled and self.optimizer is not None:
            if self._final_checkpoint_needed():
                await self._bounded("saving the final checkpoint", self.save_checkpoint, remaining)
        if self.optimizer is not None:
            await self._bounded("saying goodbye to the swarm", self.optimizer.shutdown, remaining)
        if self.dht is not None:
            await self._bounded("stopping the DHT", self._stop_dht, remaining)
        for extension in reversed(self.extensions):
            with contextlib.suppress(Exception):
                await extension.close(self)
        if self.status_server is not None:
            await self.status_server.close()

        leftovers = descendant_pids()
        if leftovers:
            logger.info("Killing %d leftover child process(es): %s", len(leftovers), _describe_pids(leftovers))
            kill_descendants()
        if remaining() <= 0:
            logger.error("The graceful stop took longer than daemon.shutdown_timeout=%.0f s", budget)
            self._exit_code = ExitCode.FAILURE
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        logger.info("Stopped (exit code %d)", int(self._exit_code))

    def _final_checkpoint_needed(self) -> bool:
        if not self.stats.steps_total:
            return False  # nothing trained since start (or since the checkpoint we resumed from)
        if self.config.swarm.use_local_updates:
            return True  # parameters move every step
        # otherwise parameters only change at global epochs: one saved at this epoch is already current
        return self.stats.checkpoint_epoch != self.optimizer.local_epoch

    async def _bounded(self, what: str, function, remaining) -> None:
        timeout = remaining()
        if timeout <= 0:
            logger.warning("No time left for %s", what)
            return
        try:
            await asyncio.wait_for(asyncio.to_thread(function), timeout)
        except asyncio.TimeoutError:
            logger.warning("Gave up %s after %.0f s", what, timeout)
        except Exception as e:  # noqa: BLE001 - shutdown goes on whatever one step does
            logger.warning("Error while %s: %r", what, e)

    def _stop_dht(self) -> None:
        self.dht.shutdown()
        self.dht.join(timeout=10)

    # --- signals -------------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _restore_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self._signals_received += 1
        if self._signals_received == 1:
            logger.info("Received %s: stopping gracefully (send it again to force)", signal.Signals(sig).name)
            self._stop_requested.set()
            return
        from swarmd.swarm.children import kill_descendants

        logger.error("Received %s again: forcing exit", signal.Signals(sig).name)
        kill_descendants()
        if self.status_server is not None:
            with contextlib.suppress(OSError):
                self.status_server.path.unlink()
        os._exit(int(ExitCode.FAILURE))

    def _check_stop(self) -> None:
        if self._stop_requested.is_set():
            raise _StopDuringStartup()


def _guarded(hook, daemon, fallback):
    """Call an extension hook; a failing observer is logged and skipped, never fatal."""
    try:
        return hook(daemon)
    except Exception:  # noqa: BLE001
        logger.exception("%s failed", getattr(hook, "__qualname__", hook))
        return fallback


class _StopDuringStartup(Exception):
    pass


def _data_seed(seed: Optional[int], peer_id: str) -> int:
    """Each peer shuffles its data its own way (derived from its persistent peer id), reproducibly given `seed`."""
    digest = hashlib.sha256(f"{seed}:{peer_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _describe_pids(pids: list[int]) -> str:
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                names.append(f"{f.read().strip()}[{pid}]")
        except OSError:
            names.append(str(pid))
    return ", ".join(names)
