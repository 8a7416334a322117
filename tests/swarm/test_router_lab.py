"""Home peers behind masquerading routers (benchmarks/routerlab.py), started with nothing but `--initial-peers`.

A public peer on the lab's "internet" and home peers behind routers that drop every unsolicited inbound connection
(one router, or a router behind the carrier's NAT: two layers): nobody can dial the home peers back, so they join as
clients and train in the public peer's groups (sync, local updates, DiLoCo, or with an auxiliary public peer), under
sync and DiLoCo ending with its model, saying how they are reached in one line (docs/NAT.md). A home peer whose
router forwards swarmd's port, announcing the router's address, is reached directly instead. The toy task at LR 0
(but in the test of the model the peers end with), paced, so that three peers fit on two cores; all start at
epoch 0 together (a start file), to be in step.

Needs root, iproute2 and nftables: skipped with the reason otherwise; a missing tool fails it under
SWARMD_REQUIRE_TOOLS=1 (as .ci/run runs, which installs nftables).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import routerlab  # noqa: E402
from daemons import DaemonProcess, peer_config  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _tools():
    missing = routerlab.missing_tools()
    if "root" in missing:  # as tests/swarm/test_netlab.py: namespaces need CAP_NET_ADMIN
        pytest.skip("the router lab needs root to make network namespaces")
    if missing:
        message = f"the router lab needs {', '.join(missing)}: apt-get install iproute2 nftables"
        if os.environ.get("SWARMD_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{message} (required: SWARMD_REQUIRE_TOOLS=1)")
        pytest.skip(message)


def config(tmp_path: Path) -> dict:
    """A peer as a user at home runs it: default network settings (all interfaces, TCP 31337), no relay flags."""
    cfg = peer_config(
        task={"name": "toy-regression", "frozen_epochs": 1_000_000, "frozen_step_seconds": 0.5,
              "start_file": str(tmp_path / "start")},
        swarm={"target_batch_size": 384, "matchmaking_time": 3.0, "averaging_timeout": 15.0, "load_state_timeout": 15.0,
               "average_state_every": 1_000_000,
               "tracker_opts": {"min_refresh_period": 0.2, "default_refresh_period": 0.5}},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )
    cfg["network"] = {"bootstrap_attempts": 4, "bootstrap_retry_delay": 1.0}
    return cfg


@pytest.fixture
def lab_peers(tmp_path, test_tasks_env):
    """Start `swarmd join` inside a lab namespace; every peer is killed at teardown (before the lab goes)."""
    started: list[DaemonProcess] = []

    def start(namespace: str, name: str, extra_args=()) -> DaemonProcess:
        peer = DaemonProcess(tmp_path / name, config(tmp_path), extra_args=extra_args, env=test_tasks_env, name=name)
        peer.args = ["ip", "netns", "exec", namespace, *peer.args]  # exec: the pid stays the peer's own
        started.append(peer)
        return peer.start()

    yield start
    for peer in started:
        peer.close()
        print(f"----- last lines of {peer.name} ({peer.log_path}) -----\n{peer.tail(60)}")


@pytest.fixture
def lab(request):
    """One public host and two homes; a test marked `@pytest.mark.parametrize("lab", [{...}], indirect=True)` gets
    another layout (RouterLab's fields)."""
    built = routerlab.RouterLab(**{"public": 1, "homes": 2, **getattr(request, "param", {})})
    with built:
        yield built
    assert routerlab.leftovers(built.prefix) == [], "the lab left namespaces or links behind"


def groups(status: dict, kind: str = "gradients") -> list[int]:
    return [r["group_size"] for r in status["recent_averaging"] if r["kind"] == kind and r["outcome"] == "success"]


def assert_joined_as_a_client(home: DaemonProcess) -> None:
    """The probe before joining found it unreachable: a client, saying so once, in one line, without a warning."""
    status = home.status()
    assert status["reachability"] == "client" and status["client_mode"], (status["reachability"], status["client_mode"])
    lines = [line for line in home.log.splitlines() if "swarmd.reachability" in line or "swarmd.swarm.dht" in line]
    assert [line for line in lines if "joins as a client" in line and "trains normally" in line], lines
    assert not [line for line in lines if "WARNING" in line or "NOT reachable" in line], lines


def start_swarm(lab, lab_peers, tmp_path, homes: int, peer_args=(), public_args=(), home_args=()):
    public = lab_peers(lab.public_namespace(0), "public", extra_args=[*peer_args, *public_args])
    joining = public.joining_args(timeout=60)
    assert all(lab.public_address(0) in arg for arg in joining[1::2]), joining
    home = [lab_peers(lab.home_namespace(i), f"home{i}", extra_args=[*joining, *peer_args, *home_args])
            for i in range(homes)]
    for peer in (public, *home):
        peer.wait_status(lambda s: s["state"] == "training" or s["phase"] == "assisting", timeout=60, what="training")
    (tmp_path / "start").touch()
    return public, home


def test_the_routers_let_home_hosts_out_and_nothing_in(lab):
    reaches = routerlab.reachability_matrix(lab)
    assert reaches["home0->public0"] and reaches["home1->public0"], reaches
    blocked = {pair for pair, ok in reaches.items() if not ok}
    assert blocked == {pair for pair in reaches if not pair.endswith("->public0")}, reaches
    assert lab.dropped(0) > 0 and lab.dropped(1) > 0, "unsolicited connections to a router's WAN side were not dropped"


@pytest.mark.parametrize("lab", [{"carrier": True}], indirect=True)
def test_behind_a_carrier_nat_too_a_home_host_gets_out_and_nothing_gets_in(lab):
    reaches = routerlab.reachability_matrix(lab)
    assert reaches["home0->public0"] and reaches["home1->public0"], reaches
    assert {pair for pair, ok in reaches.items() if ok} == {"home0->public0", "home1->public0"}, reaches
    assert lab.dropped(None) > 0, "unsolicited connections to the carrier's address were not dropped"


@pytest.mark.parametrize("lab", [{"homes": 1, "forward_port": 40123}], indirect=True)
def test_a_port_forward_lets_the_internet_in_to_that_port_only(lab):
    assert routerlab.reachability_matrix(lab, port=40123) == {
        "public0->home0": True, "public0->home0@lan": False, "home0->public0": True}
    assert not routerlab.reachability_matrix(lab, port=40124)["public0->home0"]


# one home behind its router, and behind its router and the carrier's NAT (two layers): a client either way
HOME_LAYOUTS = [{"homes": 1}, {"homes": 1, "carrier": True}]


@pytest.mark.parametrize("lab", HOME_LAYOUTS, indirect=True, ids=["one-router", "two-nat-layers"])
def test_a_home_peer_behind_a_router_averages_with_a_public_one(lab, lab_peers, tmp_path):
    started = time.monotonic()
    public, (home,) = start_swarm(lab, lab_peers, tmp_path, homes=1)
    for peer in (public, home):
        peer.wait_status(lambda s: 2 in groups(s), timeout=60, what="a gradient round with 2 peers")
    assert_joined_as_a_client(home)
    public.wait_status(lambda s: s["reachability"] == "direct", timeout=30, what="the public peer dialed back")
    print(f"home peer averaged with the public one {time.monotonic() - started:.0f} s after start")


@pytest.mark.parametrize("lab", [{"homes": 1, "forward_port": 31337}], indirect=True)
def test_a_home_peer_with_a_port_forward_and_announce_maddrs_is_reached_directly(lab, lab_peers, tmp_path):
    """The user forwarded TCP 31337 (swarmd's default port) to the home box and announces the router's address:
    no probe, no client mode; the public peer dials it there, and it serves and reduces like a public peer."""
    announced = f"/ip4/{lab.router_address(0)}/tcp/31337"
    public, (home,) = start_swarm(lab, lab_peers, tmp_path, homes=1, home_args=("--announce-maddrs", announced))
    for peer in (public, home):
        peer.wait_status(lambda s: 2 in groups(s), timeout=60, what="a gradient round with 2 peers")
    status = home.wait_status(lambda s: s["reachability"] == "direct", timeout=30, what="dialed back at its forward")
    assert not status["client_mode"], status["client_mode"]
    assert "joins as a client" not in home.log
    assert f"{announced}/p2p/{status['peer_id']}" in home.log  # the join line names the forwarded address


# (arguments of every peer, of the public one, the averaging kind, how many peers train)
SWARMS = {
    "sync": ((), (), "gradients", 3),
    "diloco": (("--set", "swarm.strategy=diloco", "--set", "swarm.diloco.inner_steps=8"), (), "outer", 3),
    # parameters averaged at every epoch's end: state rounds, the clients' parts reduced by the public peer
    "local-updates": (
        ("--set", "swarm.use_local_updates=true", "--set", "swarm.average_state_every=1"), (), "state", 3,
    ),
    # the only reachable peer does not train: it reduces for the two clients all the same
    "auxiliary-contact": ((), ("--auxiliary",), "gradients", 2),
}


@pytest.mark.parametrize("swarm", SWARMS)
def test_two_home_peers_behind_different_routers_average_in_one_group_of_three(lab, lab_peers, tmp_path, swarm):
    peer_args, public_args, kind, trainers = SWARMS[swarm]
    started = time.monotonic()
    public, homes = start_swarm(lab, lab_peers, tmp_path, homes=2, peer_args=peer_args, public_args=public_args)
    for peer in (public, *homes):
        peer.wait_status(lambda s: s["num_peers"] == trainers and 3 in groups(s, kind), timeout=75, what="a group of 3")
    for home in homes:
        assert_joined_as_a_client(home)
    print(f"three peers averaged in one group {time.monotonic() - started:.0f} s after start")


@pytest.mark.parametrize("lab", [{"homes": 3}], indirect=True)
def test_a_late_home_peer_takes_the_state_of_a_home_peer_through_an_auxiliary_contact(lab, lab_peers, tmp_path):
    """The swarm's only reachable peer does not train and holds no state (`--auxiliary`); the trainers are clients
    behind two routers. A third home peer joining later cannot dial them: it takes one's state through the
    auxiliary peer, which forwards it (swarm/upstream/state_forward.py) and counts the bytes."""
    public, homes = start_swarm(lab, lab_peers, tmp_path, homes=2, public_args=("--auxiliary",))
    for home in homes:
        home.wait_status(lambda s: (s["local_epoch"] or 0) >= 2, timeout=90, what="two epochs of the first homes")
    late = lab_peers(lab.home_namespace(2), "home2", extra_args=public.joining_args(timeout=10))
    status = late.wait_status(lambda s: s["state_loads_total"] >= 1, timeout=90, what="the late peer's download")
    assert status["local_epoch"] >= 2, status["local_epoch"]
    assert_joined_as_a_client(late)
    donors = {home.status()["peer_id"] for home in homes}
    downloads = [line for line in late.log.splitlines() if "Downloaded the state of" in line]
    assert downloads and any(f"of {donor} through {public.status()['peer_id']}" in downloads[0] for donor in donors), \
        downloads
    public.wait_status(lambda s: s["state_forwarded_bytes_total"] > 0, timeout=10, what="the forwarded bytes counted")


@pytest.mark.parametrize("lab", [{"public": 2, "homes": 1}], indirect=True)
def test_a_home_peer_reaches_every_public_peer_not_only_its_initial_one(lab, lab_peers, tmp_path):
    """p2pd did not find the second public peer for the home peer (`routing: not found`), whose parts for it were
    lost: its rounds returned about half of the average. The reachable peers' address records
    (swarm/address_records.py) let it dial them: its rounds of three succeed."""
    public = lab_peers(lab.public_namespace(0), "public0")
    joining = public.joining_args(timeout=60)
    second = lab_peers(lab.public_namespace(1), "public1", extra_args=joining)
    home = lab_peers(lab.home_namespace(0), "home0", extra_args=joining)
    for peer in (public, second, home):
        peer.wait_status(lambda s: s["state"] == "training", timeout=60, what="training")
    (tmp_path / "start").touch()
    home.wait_status(lambda s: 3 in groups(s), timeout=90, what="a whole gradient round with both public peers")
    assert_joined_as_a_client(home)
    assert f"Dialed peer {second.status()['peer_id']}" in home.log


# what each strategy averages before a checkpoint: every gradient (sync), the pseudo-gradients at each outer step
# (DiLoCo). Not local updates: there the public peer's epochs end a round later than the home peers' (the rounds
# themselves are shared), so each stops with its own local steps since the last shared state round (2 of 12 runs:
# 0.12-0.15 apart, an epoch's move 0.13-0.16; docs/NAT.md)
ONE_MODEL_SWARMS = {
    "sync": (),
    "diloco": ("--set", "swarm.strategy=diloco", "--set", "swarm.diloco.inner_steps=8"),
}


@pytest.mark.parametrize("swarm", ONE_MODEL_SWARMS)
def test_two_home_peers_and_a_public_one_end_holding_one_model(lab, lab_peers, tmp_path, swarm):
    """Not only rounds of three: the model itself. The toy task trains here (SGD at LR 0.2 from the first epoch,
    each peer in its own data order, paced as the frozen steps are), and every peer stops at global epoch 3
    (`training.max_epochs`) with a checkpoint. Peers that averaged at every epoch hold one model up to the fp16
    deltas of the all-reduce; a home peer that had trained apart would differ from the public one by about as much
    as an epoch moves the model."""
    from swarmd.checkpoints.store import CheckpointStore

    trains = ("--set", "task.frozen_epochs=0", "--set", "task.step_seconds=0.5", "--set", "training.max_epochs=3",
              "--set", "checkpoint.enabled=true", "--set", "checkpoint.every_epochs=1", "--set", "checkpoint.keep=3",
              *ONE_MODEL_SWARMS[swarm])
    public, homes = start_swarm(lab, lab_peers, tmp_path, homes=2, peer_args=trains)
    for peer in (public, *homes):
        assert peer.proc.wait(timeout=120) == 0, peer.tail()  # stopped at epoch 3
    newest, before = {}, None
    for peer in (public, *homes):
        store = CheckpointStore(peer.state_dir / "checkpoints", keep=3)
        checkpoints = [store.load(path) for path in store.list()]  # newest first (DiLoCo's stop writes epoch 3 again)
        assert checkpoints and checkpoints[0].epoch == 3, (peer.name, [c.epoch for c in checkpoints])
        newest[peer.name] = checkpoints[0].model_state
        if peer is public:
            before = next((c.model_state for c in checkpoints if c.epoch == 2), None)
            assert before is not None, [c.epoch for c in checkpoints]
    moved = _distance(newest["public"], before)
    assert moved > 0, "the public peer's model did not move in its last epoch: nothing trained"
    for name in ("home0", "home1"):
        apart = _distance(newest[name], newest["public"])
        print(f"{name} ends {apart:.3g} from the public peer's model; the last epoch moved it {moved:.3g}")
        assert apart <= 0.05 * moved, f"{name} ends {apart:.3g} from the public peer's model (an epoch: {moved:.3g})"


def _distance(a: dict, b: dict) -> float:
    import torch

    return float(torch.sqrt(sum(((a[key].double() - b[key].double()) ** 2).sum() for key in a)))
