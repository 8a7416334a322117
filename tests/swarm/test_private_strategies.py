"""A private swarm holds under every strategy: each averager a strategy runs is behind the gate (no outsider in its
rounds), its DHT keys are guarded by the record validator, and a joiner never downloads the state FROM an outsider,
even when the outsider's offer reaches it (a DHT node that stored it before the list changed, or a DHT without the
gate, as here). Under DiLoCo the state averager's keys once went unguarded and an insider took an outsider's
state (issue 30).

Two in-process peers per strategy on two real DHTs: an outsider that offers its state, and an insider whose list
names only itself; then the list names the outsider too, and the same download goes through.
"""

import pytest
from hivemind.averaging import DecentralizedAverager
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from swarmd.config.schema import SwarmdConfig
from swarmd.swarm import allowlist, averager_keys
from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from swarmd.swarm.upstream.record_gate import AllowListValidator
from swarmd.swarm.strategies import strategy_of
from daemons import wait_for
from probe_task import ProbeTask, make_probe

BATCH = 8
SETTINGS = {  # swarm settings of each strategy (and variant) under test
    "sync": {},
    "sync, local updates": {"use_local_updates": True},
    "diloco": {"strategy": "diloco", "diloco": {"inner_steps": 2, "max_straggler_wait": 1.0}},
}


class _Probe(ProbeTask):
    name = "private-probe"


def insider_config(run_id: str, strategy: str) -> SwarmdConfig:
    return SwarmdConfig.model_validate({
        "run_id": run_id,
        "swarm": {"target_batch_size": 100 * BATCH, "matchmaking_time": 1.0, "averaging_timeout": 4.0,
                  "load_state_timeout": 5.0, "load_state_attempts": 1, **SETTINGS[strategy]},
        "training": {"batch_size": BATCH},
    })


def _optimizer(dht, tmp_path, run_id: str, strategy: str):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    config = insider_config(run_id, strategy)
    task = make_probe(_Probe, tmp_path, BATCH)
    return build_swarm_optimizer(dht=dht, config=config, model=task.build_model(), task=task, averaging_log=AveragingLog())


def _protocol_members() -> list[str]:
    from swarmd.swarm.strategies import SwarmStrategy

    defined = [name for name in vars(SwarmStrategy) if not name.startswith("_")]
    return sorted(set(SwarmStrategy.__annotations__) | set(defined))


def _averagers(optimizer) -> list:
    parts = (optimizer.__dict__.get(name) for name in optimizer._RUNNING_PARTS)
    return [part for part in parts if isinstance(part, DecentralizedAverager)]


def _record(key: str, peer_id) -> DHTRecord:
    subkey = MSGPackSerializer.dumps(peer_id.to_bytes())
    return DHTRecord(DHTID.generate(source=key).to_bytes(), subkey, MSGPackSerializer.dumps(1.0), 0.0)


@pytest.mark.parametrize("strategy", list(SETTINGS))
def test_insiders_neither_serve_nor_take_an_outsiders_state_nor_share_a_round(tmp_path, strategy):
    """The insider neither takes the outsider's state nor lets it into a round; the outsider, refused, is told why
    and what to do, with its own peer id (issue 32)."""
    from swarmd.swarm.initial_state import offered_states

    run_id = f"private-{strategy.replace(' ', '').replace(',', '-')}"
    insider_dht = ToleratesExitedCallers(start=True)
    outsider_dht = ToleratesExitedCallers(initial_peers=insider_dht.get_visible_maddrs(), start=True)
    allow_list = allowlist.AllowList(tmp_path / "allowed_peers.active", insider_dht.peer_id.to_base58())
    allow_list.start([])
    outsider = insider = None
    try:
        allowlist.install(None)  # the outsider runs an open swarm of its own and offers its state to anyone
        outsider = _optimizer(outsider_dht, tmp_path / "outsider", run_id, strategy)
        allowlist.install(allow_list)
        insider = _optimizer(insider_dht, tmp_path / "insider", run_id, strategy)

        # what the daemon, the worker and the snapshot use of a strategy, it has
        missing = [name for name in _protocol_members() if not hasattr(insider, name)]
        assert missing == [], f"{type(insider).__name__} lacks {missing} of SwarmStrategy"
        declared = strategy_of(insider_config(run_id, strategy)).averager_suffixes
        assert {averager.prefix[len(run_id):] for averager in _averagers(insider)} <= set(declared)

        # every averager of the strategy is gated, and every one of its DHT keys is guarded
        validator = AllowListValidator(run_id, allow_list)
        for averager in _averagers(insider):
            assert isinstance(averager, AdmitsAllowedPeers) and averager._allow_list is allow_list, averager
            suffix = averager.prefix[len(run_id):]
            matchmaking = f"{averager.prefix}.0b{averager_keys.group_bits(suffix, 5)}"  # as its round at step 5
            for key in (matchmaking, f"{averager.prefix}.all_averagers"):
                assert validator.validate(_record(key, insider_dht.peer_id)), key
                assert not validator.validate(_record(key, outsider_dht.peer_id)), f"{key} is not guarded"

        # the outsider's offer reaches the insider (its DHT has no gate here), and is not taken
        key = f"{insider.state_averager.prefix}.all_averagers"
        wait_for(lambda: _offers(insider_dht, key, outsider_dht.peer_id), "the outsider's offer of its state",
                 interval=0.2)
        assert offered_states(insider) == {}
        insider.state_averager.load_state_from_peers(timeout=5.0)
        assert insider.state_loads_total == 0
        assert allow_list.refusals()["state_source"] >= 1

        # the outsider, asking the insider for its state, is refused, and told why and what to do
        from swarmd.swarm.upstream.peer_parts import StateRefused

        wait_for(lambda: _offers(outsider_dht, key, insider_dht.peer_id), "the insider's offer of its state",
                 interval=0.2)
        expected = rf"this peer \({outsider_dht.peer_id}\) must be on network.allowed_peers"
        with pytest.raises(StateRefused, match=expected):
            outsider.downloads.download(outsider.state_averager)
        assert allow_list.refusals()["download_state"] >= 1

        # listed, the outsider is asked: the same download goes through
        allow_list.publish([outsider_dht.peer_id.to_base58()])
        assert outsider_dht.peer_id.to_base58() in offered_states(insider)
        insider.state_averager.load_state_from_peers(timeout=5.0)
        assert insider.state_loads_total == 1
    finally:
        allowlist.install(None)
        for optimizer in (insider, outsider):
            if optimizer is not None:
                optimizer.shutdown()
        outsider_dht.shutdown()
        insider_dht.shutdown()


def _offers(dht, key: str, peer_id) -> bool:
    """Whether `dht` sees `peer_id` offering its state under `key`."""
    found = dht.get(key, latest=True)
    return found is not None and isinstance(found.value, dict) and peer_id.to_bytes() in found.value
