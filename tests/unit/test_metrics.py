"""The Prometheus surface: what a scrape shows as the daemon's records move, its lint, and the endpoint itself."""

import asyncio
import json
import os
import re
import socket
import time
import types
import urllib.request

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from daemons import REPO, promtool, promtool_check
from swarmd.config import load_config
from swarmd.metrics.collector import SwarmdMetrics
from swarmd.metrics.extension import MetricsExtension, split_listen_address
from swarmd.metrics.netstat import TcpTraffic
from swarmd.status.snapshot import CheckpointInfo, Identity, NetworkBytes, build_snapshot, read_swarm_progress
from swarmd.swarm.averaging_log import AveragingLog
from swarmd.worker.stats import CudaMemory, WorkerReadings, WorkerStats


def samples(text: str) -> dict:
    """{(sample name, sorted label items): value} of a scrape."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class FakeProgress:
    def __init__(self):
        self.epoch, self.samples_accumulated, self.target_batch_size = 3, 40, 128
        self.num_peers, self.num_clients, self.eta_next_epoch = 2, 0, time.time() + 5


class FakeOptimizer:
    def __init__(self):
        self.local_epoch = 3
        self.state_loads_total = 1
        self.tracker = types.SimpleNamespace(global_progress=FakeProgress())
        self.state_averager = types.SimpleNamespace(last_parameter_drift=None)  # no state averaging yet


def make_metrics(traffic=None):
    """Metrics reading a snapshot rebuilt from fake parts, as the daemon's tick would; `deliver()` is the tick's
    event channel (new rounds and step durations)."""
    config = load_config(None, flags={"run_id": "metrics-run"})
    identity = Identity.from_config(config, started_at=time.time() - 10)
    identity = types.SimpleNamespace(**{**identity.__dict__, "peer_id": "QmPeer", "device": "cpu"})
    parts = types.SimpleNamespace(
        optimizer=FakeOptimizer(), stats=WorkerStats(), log=AveragingLog(), state="training", checkpoint=CheckpointInfo()
    )

    def read():
        snapshot = build_snapshot(
            identity, parts.state, progress=read_swarm_progress(parts.optimizer), worker=parts.stats.report(),
            averaging=parts.log.summary(), checkpoint=parts.checkpoint,
        )
        if traffic is not None:  # as the metrics extension adds it at each tick
            snapshot = snapshot.with_fields({"network": NetworkBytes(*traffic.read())})
        return snapshot

    metrics = SwarmdMetrics(read)

    def deliver():
        for item in parts.log.take_new():
            metrics.observe_round(item)
        metrics.observe_steps(parts.stats.drain_step_seconds())

    parts.deliver = deliver
    return metrics, parts


def test_scrape_follows_training():
    metrics, parts = make_metrics()
    parts.log.record("gradients", "success", group_size=2, duration=0.3, epoch=2)
    parts.deliver()
    before = samples(generate_latest(metrics.registry).decode())
    [(info, value)] = [(dict(labels), value) for (name, labels), value in before.items() if name == "swarmd_info"]
    assert value == 1 and info["peer_id"] == "QmPeer" and info["run_id"] == "metrics-run" and info["task"] == "swin"
    assert info["version"] and info["public_name"] and info["device"] == "cpu"
    assert before[("swarmd_state", (("swarmd_state", "training"),))] == 1
    assert before[("swarmd_reachability", (("swarmd_reachability", "unknown"),))] == 1  # not checked yet
    assert before[("swarmd_reachability", (("swarmd_reachability", "client"),))] == 0
    assert before[("swarmd_global_epoch", ())] == 3 and before[("swarmd_swarm_peers", ())] == 2
    assert before[("swarmd_epoch_samples_accumulated", ())] == 40 and before[("swarmd_target_batch_size", ())] == 128
    assert before[("swarmd_samples_total", ())] == 0
    assert ("swarmd_loss", ()) not in before  # no step yet: no value rather than a made-up one
    assert before[("swarmd_averaging_rounds_total", (("kind", "gradients"), ("outcome", "success")))] == 1
    assert before[("swarmd_averaging_rounds_total", (("kind", "state"), ("outcome", "failed")))] == 0
    assert before[("swarmd_state_loads_total", ())] == 1
    assert ("swarmd_parameter_drift_ratio", ()) not in before

    for _ in range(3):
        parts.stats.record_step(samples=16, seconds=0.02, loss=2.0, metrics={"accuracy": 0.25})
    memory = CudaMemory("cuda:0", allocated_bytes=10, reserved_bytes=20)
    parts.stats.record_readings(WorkerReadings(learning_rates=(0.1, 0.01), loss_scale=None, grad_norm=3.5,
                                               cuda_memory=(memory,)))
    parts.log.record("gradients", "success", group_size=3, duration=1.5, epoch=3)
    parts.log.record("state", "failed", group_size=1, duration=30.0, epoch=3, error="TimeoutError()")
    parts.log.record("gradients", "skipped", group_size=1, duration=0.0, epoch=4)
    parts.log.record("outer", "success", group_size=2, duration=11.0, epoch=4, waited=0.5, peer_wait=1.5)  # diloco
    parts.optimizer.local_epoch = parts.optimizer.tracker.global_progress.epoch = 4
    parts.checkpoint = CheckpointInfo(epoch=4, time=1_700_000_000.0)
    parts.optimizer.state_averager.last_parameter_drift = 0.02  # measured when a state averaging was applied
    parts.deliver()
    after = samples(generate_latest(metrics.registry).decode())

    assert after[("swarmd_global_epoch", ())] == 4 and after[("swarmd_local_epoch", ())] == 4
    assert after[("swarmd_samples_total", ())] == 48 and after[("swarmd_steps_total", ())] == 3
    assert after[("swarmd_loss", ())] == 2.0
    assert after[("swarmd_learning_rate", (("group", "1"),))] == 0.01 and after[("swarmd_grad_norm", ())] == 3.5
    assert ("swarmd_loss_scale", ()) not in after  # not fp16: no value
    assert after[("swarmd_task_metric", (("name", "accuracy"),))] == 0.25
    assert after[("swarmd_cuda_memory_bytes", (("device", "cuda:0"), ("kind", "reserved")))] == 20
    assert after[("swarmd_parameter_drift_ratio", ())] == 0.02
    assert after[("swarmd_averaging_rounds_total", (("kind", "gradients"), ("outcome", "success")))] == 2
    assert after[("swarmd_averaging_rounds_total", (("kind", "gradients"), ("outcome", "skipped")))] == 1
    assert after[("swarmd_averaging_rounds_total", (("kind", "state"), ("outcome", "failed")))] == 1
    # every round that ran reaches the histogram through the tick's events (the first one too)
    assert after[("swarmd_averaging_duration_seconds_count", (("kind", "gradients"), ("outcome", "success")))] == 2
    assert after[("swarmd_averaging_duration_seconds_sum", (("kind", "state"), ("outcome", "failed")))] == 30.0
    assert after[("swarmd_averaging_group_size", (("kind", "gradients"),))] == 1  # the last round was skipped
    assert after[("swarmd_averaging_group_size", (("kind", "state"),))] == 1
    # only the overlapped round says how long the training still waited for it
    assert after[("swarmd_averaging_overlapped_wait_seconds_sum", (("kind", "outer"),))] == 0.5
    assert after[("swarmd_averaging_overlapped_wait_seconds_count", (("kind", "outer"),))] == 1
    assert ("swarmd_averaging_overlapped_wait_seconds_count", (("kind", "gradients"),)) not in after
    assert after[("swarmd_averaging_peer_wait_seconds_sum", (("kind", "outer"),))] == 1.5
    assert ("swarmd_averaging_peer_wait_seconds_count", (("kind", "gradients"),)) not in after
    assert after[("swarmd_step_duration_seconds_count", ())] == 3
    assert after[("swarmd_checkpoint_last_success_timestamp_seconds", ())] == 1_700_000_000.0
    parts.deliver()  # drained: the same steps are not observed twice
    assert samples(generate_latest(metrics.registry).decode())[("swarmd_step_duration_seconds_count", ())] == 3


def test_scrape_passes_promtool():
    metrics, parts = make_metrics(TcpTraffic(lambda: [os.getpid()]))
    parts.stats.record_step(samples=16, seconds=0.02, loss=2.0)
    parts.log.record("state", "success", group_size=2, duration=0.5, epoch=3)
    parts.deliver()
    result = promtool_check(generate_latest(metrics.registry).decode())
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_tcp_traffic_counts_a_process_sockets_and_keeps_closed_ones():
    traffic = TcpTraffic(lambda: [os.getpid()])
    start_sent, start_received = traffic.read()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    client.sendall(b"x" * 50_000)
    received = 0
    while received < 50_000:
        received += len(server.recv(65536))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the ACK may land a moment after recv()
        sent, got = traffic.read()
        if sent - start_sent >= 50_000:
            break
        time.sleep(0.05)
    # both ends are this process: each byte is sent once and received once
    assert 50_000 <= sent - start_sent < 50_100 and 50_000 <= got - start_received < 50_100
    client.close(), server.close(), listener.close()
    assert traffic.read() == (sent, got)  # closed sockets stay counted


def test_other_processes_traffic_is_not_counted():
    traffic = TcpTraffic(lambda: [])
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    client.sendall(b"y" * 10_000)
    server.recv(65536)
    assert traffic.read() == (0, 0)
    client.close(), server.close(), listener.close()


class FakeView:
    """What an extension sees of a daemon that is still starting (swarmd/extension.py DaemonView)."""

    def __init__(self):
        self.config = load_config(None, flags={"run_id": "endpoint-run"})
        self.dht = None
        self._snapshot = build_snapshot(Identity.from_config(self.config, started_at=time.time()), "starting")

    def snapshot(self):
        return self._snapshot

    def worker_activity(self):
        return None


def test_endpoint_answers_while_starting_and_reports_its_port():
    asyncio.run(_endpoint_answers_while_starting_and_reports_its_port())


async def _endpoint_answers_while_starting_and_reports_its_port():
    view = FakeView()
    extension = MetricsExtension("127.0.0.1:0")
    await extension.start(view)
    try:
        address = extension.snapshot_fields()["metrics_address"]
        host, port = split_listen_address(address)
        assert host == "127.0.0.1" and port > 0
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read())
        scrape = samples(body.decode())
        assert scrape[("swarmd_state", (("swarmd_state", "starting"),))] == 1
        assert ("swarmd_global_epoch", ()) not in scrape  # unknown until the optimizer exists

        # a second daemon on the same address: metrics off with a warning, nothing raised
        taken = MetricsExtension(address)
        await taken.start(view)
        assert taken.snapshot_fields()["metrics_address"] is None and "cannot listen" in taken.error
    finally:
        await extension.close()
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server does (TIME_WAIT)
        probe.bind(("127.0.0.1", port))  # the listener is gone after close()
        probe.listen()


def test_grafana_dashboard_queries_parse_and_use_exported_metrics(tmp_path):
    dashboard = json.loads((REPO / "configs" / "grafana-swarmd.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("swarm size", "epoch progress", "eta", "throughput", "loss", "success rate", "averaging duration"):
        assert wanted in titles, wanted

    metrics, parts = make_metrics(TcpTraffic(lambda: [os.getpid()]))
    parts.stats.record_step(samples=16, seconds=0.02, loss=2.0)
    parts.checkpoint = CheckpointInfo(epoch=1, time=time.time())
    parts.log.record("state", "success", group_size=2, duration=0.5, epoch=3)
    parts.deliver()
    exported = {name for name, _ in samples(generate_latest(metrics.registry).decode())}
    used = {name for expr in exprs for name in re.findall(r"\bswarmd_[a-z_]+\b", expr)} - {"swarmd_state"}
    assert used <= exported, used - exported

    # promtool parses PromQL in rule files: every query as a recording rule ($run_id as Grafana would fill it)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": expr.replace("$run_id", ".*")} for i, expr in enumerate(exprs)
    ]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
