"""Faults inside one peer: failing steps, NaN/Inf, hard kills, damaged checkpoints. Training goes on; nothing is lost."""

import time

from daemons import peer_config


def faulty(**task):
    return peer_config(
        task={"name": "faulty", **task},
        swarm={"target_batch_size": 64, "matchmaking_time": 2.0, "averaging_timeout": 10.0},
        training={"batch_size": 16, "threads": 1, "seed": 0, "max_consecutive_failures": 3},
        checkpoint={"every_epochs": 2, "keep": 5},
    )


def test_a_failing_step_is_survived_and_repeated_failures_end_with_exit_1(daemons, test_tasks_env):
    peer = daemons("flaky", faulty(fail_at_steps=[5]), env=test_tasks_env)
    status = peer.wait_status(lambda s: s["failures_total"] == 1 and s["local_epoch"] >= 3, 120, "recovery after a failure")
    first_id = status["peer_id"]
    assert status["restores_total"] >= 1 and "injected failure at step 5" in status["last_error"]
    assert "A training step failed (1/3 in a row)" in peer.log
    assert peer.terminate() == 0

    doomed = daemons("doomed", faulty(fail_from_step=3), env=test_tasks_env, state_dir=peer.state_dir)
    started = time.monotonic()
    assert doomed.proc.wait(120) == 1, doomed.tail()
    assert time.monotonic() - started < 120
    assert "3 training steps failed in a row" in doomed.log
    assert "A training step failed (2/3 in a row); restoring the last good state and retrying in 2 s" in doomed.log
    assert doomed.leftover_processes() == []
    # the identity survives the failures: the same peer id as before
    assert first_id in doomed.log


def test_nan_steps_are_not_contributed_and_nan_parameters_are_restored(daemons, test_tasks_env):
    peer = daemons("nan", faulty(nan_loss_at_steps=[3, 4], nan_params_at_step=12), env=test_tasks_env)
    status = peer.wait_status(
        lambda s: s["restores_total"] >= 1 and s["local_epoch"] >= 6, 120, "NaN parameters restored and training on"
    )
    assert status["nonfinite_steps_total"] >= 3  # two NaN losses + the step that met NaN parameters
    assert status["loss"] is not None and status["loss"] == status["loss"]  # finite again
    assert "this step is not contributed" in peer.log and "restoring the last good state" in peer.log
    assert peer.terminate() == 0


def test_sigkill_leaves_no_process_and_a_restart_skips_a_corrupt_checkpoint(daemons, test_tasks_env):
    peer = daemons("killed", faulty(), env=test_tasks_env)
    status = peer.wait_status(lambda s: s["local_epoch"] >= 6, 120, "a few epochs and checkpoints")
    peer_id = status["peer_id"]
    children = peer.descendants()
    assert len(children) >= 3  # DHT, p2pd, averagers
    peer.kill()
    assert peer.leftover_processes(grace=10) == []
    assert (peer.state_dir / "swarmd.sock").exists()  # stale: the next start must cope

    checkpoints = sorted((peer.state_dir / "checkpoints").glob("epoch-*"))
    assert len(checkpoints) >= 2
    newest, previous = checkpoints[-1], checkpoints[-2]
    data = bytearray((newest / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "model.safetensors").write_bytes(bytes(data))

    again = daemons("killed-again", faulty(), env=test_tasks_env, state_dir=peer.state_dir)
    status = again.wait_status(lambda s: s["state"] == "training" and s["local_epoch"] is not None, 120, "restart")
    assert status["peer_id"] == peer_id
    assert f"checkpoint {newest.name} is corrupt" in again.log
    previous_epoch = int(previous.name.split("-")[1])
    assert f"Resuming from checkpoint {previous.name} (epoch {previous_epoch})" in again.log
    assert status["local_epoch"] >= previous_epoch
    assert again.terminate() == 0
    assert again.leftover_processes() == []


def test_checkpoint_write_errors_do_not_stop_training(daemons, test_tasks_env, tmp_path):
    state_dir = tmp_path / "nosave"
    state_dir.mkdir()
    (state_dir / "checkpoints").write_text("a file where the checkpoint folder should be")
    peer = daemons("nosave", faulty(), env=test_tasks_env, state_dir=state_dir)
    status = peer.wait_status(
        lambda s: (s["checkpoint"] or {}).get("failures_total", 0) >= 2 and s["local_epoch"] >= 5, 120, "failed saves"
    )
    assert status["state"] == "training"
    assert "the previous checkpoint is kept and training goes on" in peer.log
    assert peer.terminate() == 0


def test_a_hung_step_does_not_hold_up_the_stop(daemons, test_tasks_env):
    config = faulty(hang_at_step=8)
    config["daemon"]["shutdown_timeout"] = 12.0
    peer = daemons("hung", config, env=test_tasks_env)
    peer.wait_for(lambda: "faulty: hanging at step 8" in peer.log, 120, "training up to the hang")
    started = time.monotonic()
    assert peer.terminate(timeout=60) == 0
    assert time.monotonic() - started < 12.0 + 5.0  # the documented bound, plus process exit
    assert "did not finish in time: abandoning it" in peer.log
    assert peer.leftover_processes() == []


def test_a_native_crash_prints_every_threads_stack_and_leaves_no_process(daemons, test_tasks_env):
    # what a segfault in torch or in a hivemind process looks like to the operator: the stacks in the log, no orphans
    import signal

    peer = daemons("crashing", faulty(), env=test_tasks_env)
    peer.wait_status(lambda s: s["local_epoch"] >= 1, 120, "training")
    assert len(peer.descendants()) >= 3  # DHT, p2pd, averagers
    peer.proc.send_signal(signal.SIGSEGV)
    assert peer.proc.wait(30) == -signal.SIGSEGV
    log = peer.log
    assert "Fatal Python error: Segmentation fault" in log, peer.tail()
    # every thread's stack, with its frames ("Current thread 0x..." only when the signal landed on a Python thread)
    assert "(most recent call first)" in log and 'File "' in log, peer.tail()
    assert peer.leftover_processes(grace=10) == []


def test_only_the_worker_computes_with_several_threads(daemons, test_tasks_env):
    """A thread that ran torch with N threads keeps an OpenMP team of N; one team too many on a 2-core peer made the
    worker's team sleep between kernels (swarmd/worker/threads.py). So the threads are reserved before the model is
    built: the build thread computes with one, the worker with `training.threads`."""
    config = faulty(log_threads=True)
    config["training"]["threads"] = 2
    # the tests run with OMP_NUM_THREADS=1 (conftest); a machine without it gives every thread one per core
    peer = daemons("threads", config, env={**test_tasks_env, "OMP_NUM_THREADS": "2"})
    peer.wait_for(lambda: "step 1 computes with" in peer.log, 120, "the first step")
    assert "faulty: the model is built with 1 CPU threads" in peer.log
    assert "faulty: step 1 computes with 2 CPU threads" in peer.log
    assert peer.terminate() == 0


def test_a_killed_process_tree_leaves_no_shared_memory_once_the_peer_starts_again(daemons, test_tasks_env):
    """systemd's final SIGKILL of the unit (or the OOM killer on the group) kills torch's shared-memory manager with
    the peer, and the manager's files stay in /dev/shm; the next start of the same state dir removes them."""
    import os
    import signal
    from pathlib import Path

    peer = daemons("shm", faulty(), env=test_tasks_env)
    peer.wait_status(lambda s: s["local_epoch"] >= 2, 120, "a few epochs of averagers sharing tensors")
    pids = [peer.proc.pid, *peer.descendants()]
    for pid in pids:  # the whole tree at once, torch_shm_manager included, as the unit's cgroup is killed
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    peer.proc.wait(10)

    def files_of_the_killed():
        return [path for pid in pids for path in Path("/dev/shm").glob(f"torch_{pid}_*")]

    assert files_of_the_killed(), "the kill left no shared memory: this test no longer reproduces the leak"
    again = daemons("shm-again", faulty(), env=test_tasks_env, state_dir=peer.state_dir)
    again.wait_status(lambda s: s["state"] == "training", 120, "the restart")
    assert files_of_the_killed() == []
    assert "shared-memory file(s)" in again.log and "left in /dev/shm by this peer's previous processes" in again.log
    assert again.terminate() == 0


def test_a_daemon_whose_starter_is_killed_stops_with_its_processes(test_tasks_env, tmp_path):
    """A test run or benchmark killed outright (SIGKILL, a CI timeout) cannot close its daemons: they are sent SIGTERM
    when their starter dies (tests/daemons.py DIE_WITH_STARTER) and stop, p2pd and all, instead of training on as
    orphans (seen: an attack benchmark stopped with SIGTERM left four daemons running)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from daemons import DIE_WITH_STARTER, _alive, wait_for

    if not DIE_WITH_STARTER:
        import pytest

        pytest.skip("util-linux's setpriv is missing: the daemons are stopped by close() alone")
    tests = Path(__file__).resolve().parents[1]
    starter_code = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(tests)!r})\n"
        "from daemons import DaemonProcess, peer_config\n"
        f"config = json.loads({json.dumps(json.dumps(faulty()))})\n"
        f"env = json.loads({json.dumps(json.dumps(test_tasks_env))})\n"
        f"peer = DaemonProcess({str(tmp_path / 'orphan')!r}, config, env=env, name='orphan').start()\n"
        "peer.wait_status(lambda s: s['state'] == 'training', 120, 'training')\n"
        "print(json.dumps([peer.proc.pid, *peer.descendants()]), flush=True)\n"
        "time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", starter_code], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    pids = []
    try:
        pids = json.loads(starter.stdout.readline() or "[]")
        assert len(pids) >= 3, "the starter's daemon never trained (its log: orphan.log)"  # daemon, DHT, p2pd...
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(10)
        wait_for(lambda: not any(_alive(pid) for pid in pids), "the orphaned daemon and its processes to stop", 60)
        log = (tmp_path / "orphan.log").read_text()
        assert "Received SIGTERM: stopping gracefully" in log and "Stopped (exit code 0)" in log, log[-3000:]
    finally:
        if starter.poll() is None:
            starter.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
