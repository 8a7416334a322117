"""A third-party task, pip-installed into a folder of its own, is found through its entry point and trains."""

from daemons import peer_config, run_cli


def test_an_installed_plugin_task_is_listed_and_trains(daemons, test_tasks_env, tmp_path):
    listed = run_cli("tasks", env=test_tasks_env)
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("toy-regression"))
    assert line.split()[1] == "swarmd-test-tasks" and "plug-in example" in line
    assert "toy-regression" not in run_cli("tasks").stdout  # only where the package is installed

    trace = tmp_path / "trace.txt"
    config = peer_config(
        task={"name": "toy-regression", "lr": 0.3, "trace_path": str(trace)},
        swarm={"target_batch_size": 64},
        training={"batch_size": 32, "max_epochs": 12},
    )
    peer = daemons("toy", config, env=test_tasks_env)
    assert peer.proc.wait(timeout=180) == 0, peer.tail()
    assert "Reached training.max_epochs=12" in peer.log
    losses = {}
    for line in trace.read_text().splitlines():
        epoch, loss = line.split()
        losses.setdefault(int(epoch), []).append(float(loss))
    assert sorted(losses) == list(range(12))  # the task was told every global epoch (set_epoch)
    first, last = sum(losses[0]) / len(losses[0]), sum(losses[11]) / len(losses[11])
    assert last < 0.5 * first, losses
