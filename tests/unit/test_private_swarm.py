"""A private swarm (`network.allowed_peers`): the list and its errors, the identity that ties a signed record to a
peer id, the DHT record validator, the averagers' gate and what the status and /metrics show."""

import asyncio
import types

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MSGPackSerializer
from hivemind.utils.crypto import RSAPrivateKey
from prometheus_client import generate_latest

from daemons import run_cli
from fake_streams import RecordingWriter
from swarmd.config import load_config
from swarmd.config.peer_list import AllowListError, check_peer_id, parse_peer_list, read_allowed_peers
from swarmd.errors import ConfigError, ExitCode
from swarmd.metrics.collector import SwarmdMetrics
from swarmd.status.snapshot import Identity, build_snapshot
from swarmd.swarm.allowlist import AllowList
from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
from swarmd.swarm.upstream.parameter_refresh import ServesParameters
from swarmd.swarm.upstream.state_stream import DownloadsState
from swarmd.swarm.upstream.identity import load_or_create_identity, peer_id_of_owner
from swarmd.swarm.peer_records import RECORD_FIELD
from swarmd.swarm.private import PrivateSwarmInfo
from swarmd.swarm.upstream.record_gate import AllowListValidator

RSA_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
ED25519_ID = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


@pytest.fixture
def fresh_process_key():
    """load_or_create_identity sets hivemind's process-wide key: give it back afterwards."""
    saved = RSAPrivateKey._process_wide_key
    RSAPrivateKey._process_wide_key = None
    yield
    RSAPrivateKey._process_wide_key = saved


# --- the setting ---------------------------------------------------------------------------------------------


def test_peer_ids_of_both_key_kinds_are_accepted_and_garbage_is_not():
    assert check_peer_id(RSA_ID) == RSA_ID
    assert check_peer_id(ED25519_ID) == ED25519_ID
    for bad in ("", "xyz", "Qm0OIl", RSA_ID[:-3], "/p2p/" + RSA_ID):
        with pytest.raises(ValueError):
            check_peer_id(bad)


def test_a_list_file_has_comments_and_blank_lines_and_names_a_bad_line(tmp_path):
    text = f"# the run's peers\n{RSA_ID}  # alice\n\n   {ED25519_ID}\n"
    assert parse_peer_list(text, "peers.txt") == {RSA_ID, ED25519_ID}
    with pytest.raises(AllowListError, match=r"peers.txt, line 2: 'nope' is not a peer id"):
        parse_peer_list(f"{RSA_ID}\nnope\n", "peers.txt")
    path = tmp_path / "peers.txt"
    path.write_text(text)
    assert read_allowed_peers(str(path)) == {RSA_ID, ED25519_ID}
    assert read_allowed_peers([RSA_ID]) == {RSA_ID}


@pytest.mark.parametrize(
    "value, expected",
    [
        (["not-a-peer"], "network.allowed_peers: 'not-a-peer' is not a peer id"),
        ("/nonexistent/peers.txt", "network.allowed_peers: the peer list file /nonexistent/peers.txt cannot be read"),
    ],
)
def test_bad_settings_are_one_line_config_errors_naming_the_key(value, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(environ={}, flags={"network.allowed_peers": value})
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_join_exits_2_with_the_key_named_when_the_list_file_is_unreadable(tmp_path):
    listed = tmp_path / "peers.d"  # a directory: unreadable as a file even for root (who reads a chmod 0 file)
    listed.mkdir()
    result = run_cli(
        "join", "--state-dir", str(tmp_path / "state"), "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
        "--metrics-addr", "127.0.0.1:0", "--set", f"network.allowed_peers={listed}", timeout=60,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "network.allowed_peers" in line and "cannot be read" in line


# --- who wrote a record --------------------------------------------------------------------------------------


def test_records_are_signed_with_the_identity_key_so_their_owner_names_the_peer(tmp_path, fresh_process_key):
    path = tmp_path / "identity.key"
    peer_id = load_or_create_identity(path)
    assert peer_id == PeerID.from_identity(path.read_bytes()).to_base58()
    assert load_or_create_identity(path) == peer_id  # the same key again, not a new one
    owner = RSASignatureValidator().local_public_key  # what the progress tracker and the announcer sign with
    assert peer_id_of_owner(owner[len(b"[owner:"):-1]) == peer_id


def test_a_foreign_signing_key_is_refused_rather_than_silently_kept(tmp_path, fresh_process_key):
    RSAPrivateKey.process_wide()
    with pytest.raises(RuntimeError, match="process-wide key"):
        load_or_create_identity(tmp_path / "identity.key")


# --- the record validator ------------------------------------------------------------------------------------


def started_list(tmp_path, peers, own=RSA_ID) -> AllowList:
    allow_list = AllowList(tmp_path / "allowed_peers.active", own)
    allow_list.start(peers)
    return allow_list


def owner_subkey(private_key: RSAPrivateKey) -> bytes:
    return MSGPackSerializer.dumps(RSASignatureValidator(private_key).local_public_key)


def record(key: str, subkey: bytes) -> DHTRecord:
    return DHTRecord(DHTID.generate(source=key).to_bytes(), subkey, MSGPackSerializer.dumps(1), 0.0)


def test_the_validator_ignores_outsiders_records_on_the_runs_keys_only(tmp_path):
    insider_key, outsider_key = RSAPrivateKey(), RSAPrivateKey()
    insider = peer_id_of_owner(insider_key.get_public_key().to_bytes())
    outsider = peer_id_of_owner(outsider_key.get_public_key().to_bytes())
    allow_list = started_list(tmp_path, [insider])
    validator = AllowListValidator("run", allow_list)

    for key in ("run_progress", f"run_{RECORD_FIELD}"):  # signed progress and peer records: by their owner
        assert validator.validate(record(key, owner_subkey(insider_key)))
        assert not validator.validate(record(key, owner_subkey(outsider_key)))
    for key in ("run_state_averager.0b", "run_diloco_state_averager.all_averagers", "run_diloco_outer.0b00000011"):
        assert validator.validate(record(key, MSGPackSerializer.dumps(PeerID.from_base58(insider).to_bytes())))
        assert not validator.validate(record(key, MSGPackSerializer.dumps(PeerID.from_base58(outsider).to_bytes())))
    assert not validator.validate(record("run_progress", MSGPackSerializer.dumps(b"no owner here")))
    assert validator.validate(record("other-run_progress", owner_subkey(outsider_key)))  # not this run's key
    assert allow_list.refusals()["dht_records"] == 5

    allow_list.publish([insider, outsider])  # what SIGHUP does: the DHT process sees the new file
    assert validator.validate(record("run_progress", owner_subkey(outsider_key)))


def test_the_list_reaches_spawned_processes_too(tmp_path):
    import multiprocessing as mp

    context = mp.get_context("spawn")
    allow_list = AllowList(tmp_path / "allowed_peers.active", RSA_ID)
    allow_list.start([ED25519_ID], context=context)
    process = context.Process(target=_admit_outsider_in_a_child, args=(allow_list,))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert allow_list.refusals()["join_group"] == 1


def _admit_outsider_in_a_child(allow_list):
    assert allow_list.allows(ED25519_ID)
    assert not allow_list.admit("QmOutsider", "join_group")


def test_the_list_reaches_forked_processes_through_its_file_and_counts_are_shared(tmp_path):
    import multiprocessing as mp

    allow_list = started_list(tmp_path, [ED25519_ID])
    assert allow_list.allows(RSA_ID)  # this peer is always on its own list
    child_saw = mp.Value("b", 0)

    def child():
        child_saw.value = allow_list.allows("QmOutsider") + 2 * allow_list.allows(ED25519_ID)
        allow_list.admit("QmOutsider", "download_state")

    process = mp.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    assert child_saw.value == 2
    assert allow_list.refusals()["download_state"] == 1
    allow_list.publish([])
    assert not allow_list.allows(ED25519_ID)


# --- the averagers' gate --------------------------------------------------------------------------------------


async def collect(generator):
    return [message async for message in generator]


def test_the_averagers_refuse_outsiders_by_their_authenticated_peer_id(tmp_path, caplog):
    allow_list = started_list(tmp_path, [])
    averager = types.SimpleNamespace(_allow_list=allow_list)  # what AdmitsAllowedPeers.__init__ takes from install()
    context = types.SimpleNamespace(remote_id=PeerID.from_base58(ED25519_ID))
    [answer] = asyncio.run(collect(AdmitsAllowedPeers.rpc_join_group(averager, averaging_pb2.JoinRequest(), context)))
    assert answer.code == averaging_pb2.NOT_LOOKING_FOR_GROUP
    [answer] = asyncio.run(collect(AdmitsAllowedPeers.rpc_aggregate_part(averager, None, context)))
    assert answer.code == averaging_pb2.BAD_GROUP_ID
    for _ in range(2):
        assert asyncio.run(collect(AdmitsAllowedPeers.rpc_download_state(averager, None, context))) == []
    # the parameters alone (swarm/upstream/parameter_refresh.py) are a state download too; refused before any state is read
    averager.allow_state_sharing = True
    assert asyncio.run(collect(ServesParameters.rpc_download_parameters(averager, None, context))) == []
    # and so is the state stream (swarm/upstream/state_stream.py): closed without a byte, by the id libp2p authenticated
    averager.request_timeout = 5.0
    averager._shares_state = lambda: True

    async def ask_by_stream(request: bytes) -> RecordingWriter:
        reader, writer = asyncio.StreamReader(), RecordingWriter()
        reader.feed_data(request)
        await DownloadsState._serve_state_stream(averager, types.SimpleNamespace(peer_id=context.remote_id), reader, writer)
        return writer

    for request in (b"state\n", b"parameters\n"):
        writer = asyncio.run(ask_by_stream(request))
        assert writer.closed and not writer.data
    assert allow_list.refusals() == {"dht_records": 0, "join_group": 1, "aggregate_part": 1, "download_state": 5, "state_source": 0, "reachability": 0}
    refused = [r for r in caplog.records if "Refused peer" in r.getMessage()]
    assert len(refused) == 3  # once per peer and place


def test_the_gated_averagers_keep_upstreams_rpc_names():
    from hivemind.averaging import DecentralizedAverager
    from hivemind.optim.grad_averager import GradientAverager

    from swarmd.swarm.upstream.outer_round import OuterAverager
    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager

    for gated, upstream in ((AdmittingGradientAverager, GradientAverager), (OuterAverager, DecentralizedAverager)):
        for rpc in ("rpc_join_group", "rpc_aggregate_part", "rpc_download_state"):
            assert gated._get_handle_name("ns", rpc) == upstream._get_handle_name("ns", rpc)


# --- status and metrics --------------------------------------------------------------------------------------


def test_metrics_show_the_list_and_the_refusals_only_in_a_private_swarm():
    config = load_config(None, environ={}, flags={"run_id": "private-run"})
    base = build_snapshot(Identity.from_config(config, started_at=0.0), "training")
    open_text = generate_latest(SwarmdMetrics(lambda: base).registry).decode()
    assert "swarmd_allowed_peers" not in open_text.replace("# HELP swarmd_allowed_peers", "").replace(
        "# TYPE swarmd_allowed_peers", "") and "swarmd_refused_total" not in open_text
    private = base.with_fields(
        {"private": PrivateSwarmInfo(allowed_peers=2, refusals={"join_group": 3, "dht_records": 1})}
    )
    text = generate_latest(SwarmdMetrics(lambda: private).registry).decode()
    assert "swarmd_allowed_peers 2.0" in text
    assert 'swarmd_refused_total{where="join_group"} 3.0' in text
