"""swarm/upstream/dht_process.py: a request whose caller's process has exited is dropped; any other reads as sent."""

import multiprocessing as mp

import pytest

from swarmd.swarm.upstream.dht_process import _RequestPipe


def _raise(error_type):
    raise error_type("the caller's resource sharer is gone")


class _FromAnExitedCaller:
    """Unpickles the way a request carrying a dead process's reply pipe does: it fails while being rebuilt."""

    def __init__(self, error_type):
        self.error_type = error_type

    def __reduce__(self):
        return _raise, (self.error_type,)


@pytest.mark.parametrize("error_type", [EOFError, ConnectionRefusedError, FileNotFoundError, ConnectionResetError])
def test_a_request_from_an_exited_caller_reads_as_dropped(error_type):
    inner, outer = mp.Pipe(duplex=False)
    pipe = _RequestPipe(inner)
    outer.send(("get", [_FromAnExitedCaller(error_type)], {}))
    outer.send(("store", ["key", 1], {"expiration_time": 5.0}))
    assert pipe.poll(1.0)
    assert pipe.recv() == ("_drop_request", [], {})
    assert pipe.recv() == ("store", ["key", 1], {"expiration_time": 5.0})  # the next request is untouched
    assert pipe.fileno() == inner.fileno()


def test_other_failures_still_raise():
    inner, outer = mp.Pipe(duplex=False)
    pipe = _RequestPipe(inner)
    outer.send(("get", [_FromAnExitedCaller(ValueError)], {}))
    with pytest.raises(ValueError):
        pipe.recv()
    outer.close()
    with pytest.raises(EOFError):  # the pipe itself closing still ends upstream's loop, as before
        pipe.recv()
