import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/swarm/" in str(item.fspath):
            item.add_marker(pytest.mark.swarm)


@pytest.fixture(scope="module")
def dht():
    """One real DHT (and its p2pd) per test module, for the tests that build hivemind averagers in-process.
    A module that needs a fresh one per test defines its own `dht` fixture, which takes precedence.

    It is the daemon's DHT class: upstream's DHT process dies when an averager process exits right after sending
    it a request (swarmd/swarm/upstream/dht_process.py), and every later test of the module would then wait on a dead DHT
    until its timeout (five tests of test_precision.py did so in one CI run)."""
    from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers

    node = ToleratesExitedCallers(start=True)
    yield node
    node.shutdown()
