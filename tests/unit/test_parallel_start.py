"""The start-up's overlap (daemon/parallel_start.py) and its phase line (daemon/join_phases.py): what runs at once,
what a failure cancels, and that no fork happens while another thread works."""

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from swarmd.daemon.join_phases import PHASES, JoinPhases, process_start_time
from swarmd.daemon.parallel_start import ForkGate, Preload, together


def run(coroutine):
    return asyncio.run(coroutine)


def test_together_runs_at_once_and_keeps_the_order_of_results():
    async def after(seconds, value):
        await asyncio.sleep(seconds)
        return value

    async def main():
        began = time.monotonic()
        results = await together(after(2.0, "model"), after(2.0, "dht"))
        return results, time.monotonic() - began

    results, took = run(main())
    assert results == ["model", "dht"]
    assert took < 3.5  # not 4.0: at once (a wide margin: a loaded machine delays the loop's wake-ups)


def test_the_first_failure_cancels_the_others_and_waits_for_their_cleanup():
    cleaned = []

    async def starting_a_dht():
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # e.g. stopping the DHT process it had started
            cleaned.append("dht stopped")

    async def bad_config():
        await asyncio.sleep(0.05)
        raise ValueError("task.name: no such task")

    async def main():
        with pytest.raises(ValueError, match="no such task"):
            await together(bad_config(), starting_a_dht())

    run(main())
    assert cleaned == ["dht stopped"]


def test_the_dht_forks_after_the_model_is_built_and_the_preload_starts_after_the_fork():
    events = []
    phases = JoinPhases(started=time.time())
    preload = Preload(modules=())
    gate = ForkGate(phases, preload)

    async def build_model():
        await asyncio.sleep(2.0)
        events.append("model built")
        return "model"

    async def start_dht():
        await asyncio.sleep(0.05)  # the probe, shorter than the model's build
        async with gate.dht_fork():
            events.append("fork")
            assert not preload.running
        events.append("preload started" if preload._thread is not None else "no preload")
        await asyncio.sleep(0.1)  # the bootstrap
        return "dht"

    async def main():
        return await together(gate.model(build_model()), phases_timed(phases, start_dht()))

    assert run(main()) == ["model", "dht"]
    assert events == ["model built", "fork", "preload started"]
    assert phases.seconds["model"] >= 2.0
    # about 0.15 s: the probe and the bootstrap, without the 2 s wait for the model (wide: a loaded machine)
    assert phases.seconds["DHT"] < 1.0


async def phases_timed(phases, coroutine):
    with phases.timing("DHT"):
        return await coroutine


def test_nothing_forks_while_the_preload_imports():
    release = threading.Event()
    preload = Preload(modules=())
    preload._run = lambda: release.wait(5)  # an import that takes a while
    preload.start()
    gate = ForkGate(JoinPhases(started=time.time()), preload)

    async def main():
        waiting = asyncio.ensure_future(gate.before_averagers())
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the averagers' fork waits for the import
        release.set()
        await asyncio.wait_for(waiting, 5)

    run(main())


def test_the_preload_imports_once_and_a_failing_module_is_no_error():
    preload = Preload(modules=("json", "no_such_module_for_swarmd"))
    preload.start()
    preload.start()  # once
    run(preload.wait())
    assert not preload.running and preload.seconds is not None
    assert "json" in sys.modules


def test_the_preload_covers_what_torchs_first_optimizer_imports():
    assert Preload().modules == ("torch._dynamo",)


def test_the_phase_line_names_each_phase_in_order_and_the_total_from_the_start():
    phases = JoinPhases(started=100.0)
    phases.add("download", 3.44)
    phases.add("DHT", 1.5)
    phases.add("DHT", -0.25)  # a wait inside the phase that it does not count
    phases.add("imports", 4.0)
    assert phases.summary(now=112.3) == "Joined in 12.3 s: imports 4.0 s, DHT 1.2 s, download 3.4 s (phases overlap)"
    assert list(PHASES)[:4] == ["imports", "model", "DHT", "optimizer"]


def test_an_unknown_phase_is_a_bug():
    with pytest.raises(ValueError, match="unknown join phase"):
        JoinPhases(started=0.0).add("compile", 1.0)


def test_the_process_start_time_is_when_the_process_started():
    """/proc's start time of a process started now (this one may be as old as the test session)."""
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "from swarmd.daemon.join_phases import process_start_time; "
                          "print(process_start_time())"], capture_output=True, text=True, check=True)
    after = time.time()
    assert before - 1.0 <= float(out.stdout) <= after  # /proc counts in clock ticks: 10 ms
    assert process_start_time() <= time.time()


def test_the_daemon_stops_only_once_the_preload_is_done(tmp_path, monkeypatch):
    # seen in CI: a peer stopped (exit code 2) right after its DHT came up, while the preload was inside torch's
    # imports, was finalized under that thread and aborted (exit -6)
    from swarmd.config import load_config
    from swarmd.daemon.lifecycle import Daemon

    (tmp_path / "slow_import_for_swarmd.py").write_text("import time\ntime.sleep(1.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    daemon = Daemon(load_config(None, environ={}, flags={"state_dir": str(tmp_path / "state")}),
                    extensions=[])
    daemon._forks.preload = Preload(modules=("slow_import_for_swarmd",))
    daemon._forks.preload.start()
    run(daemon._shutdown())
    assert not daemon._forks.preload.running and "slow_import_for_swarmd" in sys.modules
