import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/swarm/" in str(item.fspath):
            item.add_marker(pytest.mark.swarm)


@pytest.fixture(scope="module")
def dht():
    """One real DHT (and its p2pd) per test module, for the tests that build hivemind averagers in-process.
    A module that needs a fresh one per test defines its own `dht` fixture, which takes precedence."""
    import hivemind

    node = hivemind.DHT(start=True)
    yield node
    node.shutdown()
