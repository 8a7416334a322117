"""The daemon's whole life in one place: run -> startup -> main loop -> shutdown.

Threads and processes:
- the main thread runs the asyncio (uvloop) loop: signals, the status socket, the tick (the snapshot, events and
  the extensions' hooks); it also builds the DHT and hivemind.Optimizer, which hivemind requires on the main thread;
- at start-up the model is built while the DHT starts, forks wait until no other thread runs (daemon/parallel_start.py);
- one worker thread trains (swarmd.worker.trainer);
- hivemind's processes (DHT + p2pd, one per averager) are tied to this process and die with it.

Exit codes (swarmd.errors.ExitCode): 0 clean stop (signal or training.max_epochs), 1 failure while running or a
forced stop, 2 configuration error, 3 could not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from typing import Optional

from swarmd.daemon.guarded import bounded, guarded
from swarmd.daemon.join_phases import JoinPhases
from swarmd.daemon.parallel_start import ForkGate, together
from swarmd.daemon.startup_watch import StartupWatch
from swarmd.daemon.signals import ReloadSignal, StopSignals
from swarmd.daemon.runtime import Runtime
from swarmd.daemon.shared_memory import record_processes, remove_leftovers
from swarmd.daemon.state_dir import StateDirLock
from swarmd.daemon.view import LiveView
from swarmd.errors import ExitCode, SwarmdError
from swarmd.extension import AveragingRoundFinished, Extension, StepsFinished
from swarmd.logs import UNWRAPPED
from swarmd.status.snapshot import Identity, Snapshot, build_snapshot, read_swarm_progress
from swarmd.swarm.children import descendant_pids

__all__ = ["Daemon"]

logger = logging.getLogger("swarmd.daemon")


class Daemon:
    def __init__(self, config, *, extensions: list[Extension], config_path: Optional[str] = None):
        self.config = config
        self.config_path = config_path
        self.extensions = extensions  # assembled by the caller (daemon/assembly.py)
        self.state = "starting"
        self.identity = Identity.from_config(config, started_at=time.time())
        self.dht = None
        self.runtime: Optional[Runtime] = None
        self.checkpointer = None
        self.status_server = None
        self.view = LiveView(self)
        self._snapshot: Snapshot = build_snapshot(self.identity, self.state)
        self._lock = StateDirLock(config.state_path)
        self._signals: Optional[StopSignals] = None
        self._reload_signal = ReloadSignal(self._reload)
        self._exit_code = ExitCode.OK
        self._worker_threads = 0  # the worker's CPU threads, reserved before any torch work (_prepare_process)
        self.join_phases = JoinPhases()  # logged by the worker once it holds the swarm's state
        self._forks = ForkGate(self.join_phases)

    # --- run -----------------------------------------------------------------------------------------------

    async def run(self) -> int:
        self._signals = StopSignals(lambda: self.status_server.path if self.status_server is not None else None)
        self._signals.install()
        self._reload_signal.install()
        try:
            try:
                with StartupWatch(lambda: f"phases done: {self.join_phases.so_far()}"):
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
            self._signals.restore()
            self._reload_signal.restore()

    # --- startup: each phase returns what the next one needs ----------------------------------------------

    async def _startup(self) -> None:
        await self._open_state_dir()
        with self.join_phases.timing("imports"):
            self._prepare_process()
        # the model needs nothing of the swarm, and the DHT (with its reachability probe) nothing of the model
        (task, model, device, checkpoint), self.dht = await together(self._forks.model(self._build_model()),
                                                                     self._join_swarm())
        await self._check_compatibility()
        with self.join_phases.timing("optimizer"):
            await self._forks.before_averagers()
            self.runtime = self._build_optimizer(task, model, checkpoint)
        self.runtime.ranks = await self._start_ranks(task, model, device)
        record_processes(self.config.state_path, [os.getpid(), *descendant_pids()])  # for the next start's sweep
        self.runtime.worker = self._start_worker(device, checkpoint)
        self._set_state("training")
        for extension in self.extensions:
            guarded(extension.ready, self.view)

    async def _open_state_dir(self) -> None:
        """Lock the state dir, answer on the status socket ("starting") and start the extensions."""
        from swarmd.status.server import SOCKET_NAME, StatusServer

        self._lock.acquire()
        remove_leftovers(self.config.state_path)  # torch's shared memory of this state dir's killed processes
        self.status_server = StatusServer(self.config.state_path / SOCKET_NAME, lambda: self.snapshot.to_dict())
        await self.status_server.start()
        for extension in self.extensions:
            try:
                await extension.start(self.view)
            except SwarmdError:
                raise  # the operator's setting cannot work (e.g. a private swarm's list): never run without it
            except Exception:  # noqa: BLE001 - an observer must not stop the daemon
                logger.exception("%s failed to start; going on without it", type(extension).__name__)
        self._refresh_snapshot()

    def _prepare_process(self) -> None:
        """Heavy imports (torch, hivemind) after the socket answers "starting"; threads and ties before any fork."""
        from swarmd.logs import route_hivemind_logs
        from swarmd.swarm.children import tie_children_to_this_process
        from swarmd.worker.threads import reserve_threads_for_worker

        # Before any thread computes: one that ever runs torch with N threads keeps an OpenMP team of N for good,
        # and a team too many makes the worker's own team sleep between kernels (worker/threads.py).
        self._worker_threads = reserve_threads_for_worker(self.config.training.threads)
        route_hivemind_logs(self.config.logging.hivemind_level)
        tie_children_to_this_process()
        self._check_stop()

    async def _build_model(self):
        """The task, its model on the device, and the checkpoint it resumed from (or None)."""
        from swarmd.daemon.model_build import build_model

        built = await build_model(self.config, check_stop=self._check_stop)
        self._devices, self.checkpointer = built.devices, built.checkpointer
        self.identity = dataclasses.replace(self.identity, device=str(built.device), compatibility=built.compatibility,
                                            start_values=built.start_values)
        return built.task, built.model, built.device, built.checkpoint

    async def _join_swarm(self):
        from swarmd.swarm.dht import join_addresses, join_command, start_dht
        from swarmd.swarm.priority import background_priority

        self._set_state("joining")
        validators = [v for extension in self.extensions for v in guarded(extension.record_validators, self.view) or []]
        with self.join_phases.timing("DHT"), background_priority(self.config.daemon.background_priority):
            dht = await start_dht(self.config.network, self.config.state_path, record_validators=validators,
                                  forking=self._forks.dht_fork)  # the DHT process and its p2pd
        self.dht = dht
        maddrs = tuple(str(addr) for addr in dht.get_visible_maddrs())
        self.identity = dataclasses.replace(self.identity, peer_id=str(dht.peer_id), visible_maddrs=maddrs,
                                            client_mode=bool(dht.client_mode))  # the probe may have chosen it
        if self.checkpointer is not None:
            self.checkpointer.peer_id = self.identity.peer_id
        public = join_addresses(maddrs, dht.client_mode, self.config.network.initial_peers)
        logger.info("This peer (%s) announces: %s", self.identity.peer_id, ", ".join(maddrs) or "nothing (client mode)")
        # one line whatever the terminal's width: a wrapped one, pasted, runs --initial-peers without its address
        logger.info("To join: %s", join_command(public or list(maddrs), self.config.run_id, self.config_path),
                    extra=UNWRAPPED)
        self._check_stop()
        return dht

    async def _check_compatibility(self) -> None:
        """Before averaging anything: a peer whose model or must-agree settings differ from the swarm's stops here
        (a config error, exit 2; swarm/compatibility.py)."""
        from swarmd.swarm.compatibility import check_against_swarm

        await check_against_swarm(
            self.dht, self.config.run_id, self.identity.peer_id, self.identity.compatibility or {},
            retry=bool(self.config.network.initial_peers),
        )
        self._check_stop()

    def _build_optimizer(self, task, model, checkpoint) -> Runtime:
        """On the main thread, by hivemind's rule; it also resets SIGINT, so the handlers are installed again."""
        from swarmd.swarm.averaging_log import AveragingLog
        from swarmd.swarm.priority import background_priority
        from swarmd.swarm.strategies import build_swarm_optimizer, strategy_of
        from swarmd.worker.stats import WorkerStats

        averaging_log = AveragingLog()
        with background_priority(self.config.daemon.background_priority):  # the averager processes
            optimizer = build_swarm_optimizer(
                dht=self.dht, config=self.config, model=model, task=task, averaging_log=averaging_log
            )
        self.runtime = Runtime(task, model, optimizer, WorkerStats(), averaging_log)  # the shutdown stops it
        self._signals.install()
        if checkpoint is not None:
            self.checkpointer.load_into_optimizer(optimizer, checkpoint, model)
        swarm = self.config.swarm
        logger.info(
            "Joined run %r as %s: %s, %d per step, local epoch %d",
            self.config.run_id, "an auxiliary peer" if swarm.auxiliary else "a trainer",
            strategy_of(self.config).describe_round(swarm), self.config.training.batch_size, optimizer.local_epoch,
        )
        self._check_stop()
        return self.runtime

    async def _start_ranks(self, task, model, device):
        """Ranks 1..N-1 on the other devices (ranks/), connected before the first step; OneRank for one."""
        from swarmd.ranks.local import start_local_ranks
        from swarmd.seeds import peer_data_seed

        ranks = await start_local_ranks(
            self.config, devices=self._devices, model=model, init_seed=task.context.seed,
            data_seed=peer_data_seed(self.config.training.seed, self.identity.peer_id),
        )
        if len(ranks.devices) > 1:
            logger.info("Training on %d ranks: %s", len(ranks.devices), ", ".join(ranks.devices))
        self._check_stop()
        return ranks

    def _start_worker(self, device, checkpoint):
        from swarmd.seeds import peer_data_seed
        from swarmd.worker.trainer import TrainingWorker, WorkerSettings

        from swarmd.daemon.checkpointer import checkpoint_details

        runtime = self.runtime
        save = export = None
        if self.checkpointer is not None:
            save = lambda: self.checkpointer.save(  # noqa: E731
                runtime.model, runtime.optimizer, details=checkpoint_details(runtime.stats.report()),
                resume=runtime.worker.resume_point(),
            )
            if self.config.checkpoint.export_on_finish:  # at training.max_epochs, by the worker (trainer.py)
                export = lambda: self.checkpointer.export_latest(self.config)  # noqa: E731
        worker = TrainingWorker(
            task=runtime.task,
            model=runtime.model,
            optimizer=runtime.optimizer,
            settings=WorkerSettings.from_config(self.config),
            stats=runtime.stats,
            averaging_log=runtime.averaging_log,
            device=device,
            ranks=runtime.ranks,
            data_seed=peer_data_seed(self.config.training.seed, self.identity.peer_id),
            threads=self._worker_threads,
            save_checkpoint=save,
            export_model=export,
            resume=self.checkpointer.resume_point(checkpoint) if checkpoint is not None else None,
            start_values=self.identity.start_values,
            join_phases=self.join_phases,
        )
        worker.start()
        return worker

    # --- main loop: the tick -------------------------------------------------------------------------------

    async def _main_loop(self) -> None:
        tick = self.config.daemon.tick_interval
        worker = self.runtime.worker
        while not self._signals.requested.is_set():
            await self._tick()
            dead = self.runtime.ranks.dead_rank()
            if dead:
                logger.error("Stopping: %s", dead)
                self._exit_code = ExitCode.FAILURE
                break
            if not worker.alive:
                if worker.failure is not None:
                    logger.error("Stopping: the training worker failed (%s)", worker.failure)
                    self._exit_code = ExitCode.FAILURE
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._signals.requested.wait(), timeout=tick)

    async def _tick(self) -> None:
        """Rebuild the snapshot, deliver what happened since the last tick, then the extensions' tick hooks."""
        snapshot = self._refresh_snapshot()
        events = [AveragingRoundFinished(item) for item in self.runtime.averaging_log.take_new()]
        steps = self.runtime.stats.drain_step_seconds()
        if steps:
            events.append(StepsFinished(tuple(steps)))
        for extension in self.extensions:
            for event in events:
                guarded(extension.on_event, event)
            try:
                await extension.tick(self.view, snapshot)
            except Exception:  # noqa: BLE001 - an observer must not stop training
                logger.exception("%s failed during a tick", type(extension).__name__)

    def _refresh_snapshot(self) -> Snapshot:
        """The one place the snapshot is built (on the loop's thread); every reader gets this object."""
        runtime = self.runtime
        snapshot = build_snapshot(
            self.identity,
            self.state,
            progress=read_swarm_progress(runtime.optimizer) if runtime is not None else None,
            worker=runtime.stats.report() if runtime is not None else None,
            averaging=runtime.averaging_log.summary() if runtime is not None else None,
            checkpoint=self.checkpointer.info() if self.checkpointer is not None else None,
            ranks=runtime.ranks.report() if runtime is not None else None,
        )
        for extension in self.extensions:
            try:
                snapshot = snapshot.with_fields(extension.snapshot_fields())
            except Exception:  # noqa: BLE001 - a broken observer must not break the status
                logger.exception("%s failed to add to the status", type(extension).__name__)
        self._snapshot = snapshot
        return snapshot

    def _reload(self) -> None:
        """SIGHUP: each extension reads its changing settings again."""
        for extension in self.extensions:
            guarded(extension.reload, self.view)
        self._refresh_snapshot()

    @property
    def snapshot(self) -> Snapshot:
        """The latest snapshot (status socket, extensions, metrics scrapes all read this one object)."""
        return self._snapshot

    def _set_state(self, state: str) -> None:
        self.state = state
        self._refresh_snapshot()

    # --- shutdown ------------------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Bounded: stop the worker, save, say goodbye, stop hivemind; past the bound, kill what is left."""
        from swarmd.swarm.children import kill_leftovers

        self._set_state("stopping")
        for extension in self.extensions:
            guarded(extension.stopping, self.view)
        budget = self.config.daemon.shutdown_timeout
        deadline = time.monotonic() + budget
        remaining = lambda: max(0.0, deadline - time.monotonic())  # noqa: E731

        runtime = self.runtime
        if runtime is not None:
            await runtime.stop_training(remaining, final_save_needed=self._final_checkpoint_needed)
        if runtime is not None:
            await bounded("saying goodbye to the swarm", runtime.optimizer.shutdown, remaining)
        if self.dht is not None:
            await bounded("stopping the DHT", self._stop_dht, remaining)
        for extension in reversed(self.extensions):
            with contextlib.suppress(Exception):
                await extension.close()
        # a process finalized while the preload's thread is inside torch's imports can abort (daemon/parallel_start.py)
        await bounded("finishing the imports begun at start-up", self._forks.preload.join, remaining)
        if self.status_server is not None:
            await self.status_server.close()

        kill_leftovers()
        if remaining() <= 0:
            logger.error("The graceful stop took longer than daemon.shutdown_timeout=%.0f s", budget)
            self._exit_code = ExitCode.FAILURE
        self._lock.release()
        logger.info("Stopped (exit code %d)", int(self._exit_code))

    def _final_checkpoint_needed(self) -> bool:
        if self.checkpointer is None or not self.runtime.stats.report().steps_total:
            return False  # checkpoints off, or nothing trained since start (or since the checkpoint we resumed from)
        if self.config.swarm.use_local_updates:
            return True  # parameters move every step
        # otherwise parameters only change at global epochs: one saved at this epoch is already current
        return self.checkpointer.info().epoch != self.runtime.optimizer.local_epoch

    def _stop_dht(self) -> None:
        self.dht.shutdown()
        self.dht.join(timeout=10)

    def _check_stop(self) -> None:
        if self._signals.requested.is_set():
            raise _StopDuringStartup()


class _StopDuringStartup(Exception):
    pass
