"""`swarmd monitor` against two toy peers: it counts them, logs the swarm's totals to TensorBoard and /metrics,
keeps the swarm's model, and still has it, loadable and equal to the peers', after both peers are gone.

The peers train frozen (LR 0) from training.seed 0, so their parameters stay the seed's: the kept model must be
exactly that model, which a monitor building its own (randomly initialised) model only matches by downloading.
"""

import os
import signal
import subprocess
import sys

import torch

from daemons import REPO, peer_config, scrape
from tracking_readers import tensorboard_scalars

TASK = {"name": "toy-regression", "frozen_epochs": 10**6, "frozen_step_seconds": 0.2}


def config(tmp_path, name: str) -> dict:
    return peer_config(
        task=TASK,
        swarm={"target_batch_size": 32},
        training={"batch_size": 16, "seed": 0},
        checkpoint={"enabled": False},
        daemon={"public_name": name},
        tracking={"backends": ["tensorboard"]},
    )


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else float("nan")


def seed_model(env):
    site = env["PYTHONPATH"].split(os.pathsep)[0]
    if site not in sys.path:
        sys.path.append(site)
    from swarmd.tasks.base import TaskContext
    from swarmd_test_tasks.toy import ToyRegressionTask, ToySettings

    settings = ToySettings.model_validate({k: v for k, v in TASK.items() if k != "name"})
    task = ToyRegressionTask(settings, TaskContext(None, torch.device("cpu"), "fp32", 16, 0))
    task.prepare()
    torch.manual_seed(0)  # what the daemon does with training.seed 0
    return task.build_model()


def test_the_monitor_sees_the_swarm_and_keeps_its_model(daemons, test_tasks_env, tmp_path):
    first = daemons("first", config(tmp_path, "first"), env=test_tasks_env)
    second = daemons("second", config(tmp_path, "second"), env=test_tasks_env, extra_args=first.joining_args())
    for node in (first, second):
        node.wait_status(lambda s: s["state"] == "training", timeout=120, what="training")

    monitor_dir = tmp_path / "monitor"
    log = open(tmp_path / "monitor.log", "wb")
    command = [sys.executable, "-m", "swarmd", "monitor", "--config", str(first.config_path), "--state-dir",
               str(monitor_dir), "--interval", "2", "--keep-every", "0.05", "--metrics-addr", "127.0.0.1:0",
               *first.joining_args()]
    monitor = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                               env={**os.environ, **test_tasks_env, "PYTHONUNBUFFERED": "1"})
    try:
        address = first.wait_for(
            lambda: next((line.split("http://")[1].split("/")[0] for line in (tmp_path / "monitor.log").read_text()
                          .splitlines() if "Swarm metrics at http://" in line), None), 120, "the monitor's /metrics")

        def sees_the_swarm():
            text = scrape(address)
            return metric(text, "swarmd_monitor_peers") == 2 and metric(text, "swarmd_monitor_samples_per_second") > 0 \
                and metric(text, "swarmd_monitor_kept_epoch") >= 0

        first.wait_for(sees_the_swarm, 120, "the monitor to count 2 peers and keep a model")
        for node in (first, second):
            node.close()  # every peer gone (killed): the monitor still has the model
        monitor.send_signal(signal.SIGTERM)
        assert monitor.wait(90) == 0
    finally:
        if monitor.poll() is None:
            os.killpg(monitor.pid, signal.SIGKILL)
            monitor.wait(10)
        log.close()
    output = (tmp_path / "monitor.log").read_text()
    assert "swarm: epoch" in output and "2 peer(s) (2 training)" in output, output[-3000:]

    from safetensors.torch import load_file

    kept = load_file(monitor_dir / "model" / "model.safetensors")
    expected = seed_model(test_tasks_env).state_dict()
    assert kept.keys() == expected.keys()
    assert all(torch.equal(kept[name], expected[name]) for name in expected)

    runs = list((monitor_dir / "tracking" / "tensorboard").iterdir())
    scalars = tensorboard_scalars(runs[0])
    peers = next(points for tag, points in scalars.items() if tag.endswith("swarm/alive_peers"))
    assert 2.0 in peers.values(), scalars.keys()
    assert any(tag.endswith("swarm/samples_per_second") for tag in scalars)


def test_ctrl_c_stops_the_monitor_with_its_model_kept(daemons, test_tasks_env, tmp_path):
    """hivemind's averager (the one that downloads the model) sets SIGINT to be ignored; the monitor must take it
    back, or Ctrl-C does nothing and only kill -TERM stops it."""
    peer = daemons("peer", config(tmp_path, "peer"), env=test_tasks_env)
    peer.wait_status(lambda s: s["state"] == "training", timeout=120, what="training")
    monitor_dir = tmp_path / "monitor"
    log_path = tmp_path / "monitor.log"
    log = open(log_path, "wb")
    command = [sys.executable, "-m", "swarmd", "monitor", "--config", str(peer.config_path), "--state-dir",
               str(monitor_dir), "--interval", "2", "--keep-every", "0.05", "--metrics-addr", "", *peer.joining_args()]
    monitor = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                               env={**os.environ, **test_tasks_env, "PYTHONUNBUFFERED": "1"})
    try:
        peer.wait_for(lambda: "Kept the swarm's model" in log_path.read_text(), 120, "the monitor to keep the model")
        ignored = next(int(line.split()[1], 16) for line in open(f"/proc/{monitor.pid}/status") if line.startswith("SigIgn:"))
        assert not ignored & (1 << (signal.SIGINT - 1)), "SIGINT is ignored"
        monitor.send_signal(signal.SIGINT)  # Ctrl-C
        assert monitor.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if monitor.poll() is None:
            os.killpg(monitor.pid, signal.SIGKILL)
            monitor.wait(10)
        log.close()
    assert (monitor_dir / "model" / "model.safetensors").exists(), log_path.read_text()[-3000:]
