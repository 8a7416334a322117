"""A stand-in for the asyncio.StreamWriter of a p2pd stream, for the tests of swarm/upstream/state_stream.py."""


class RecordingWriter:
    """Keeps what was written; `closed` once the handler closed it."""

    def __init__(self):
        self.data, self.closed = bytearray(), False

    def write(self, data):
        self.data += bytes(data)

    async def drain(self):
        pass

    def close(self):
        self.closed = True
