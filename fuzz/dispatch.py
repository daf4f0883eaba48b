"""atheris harness of the Python side of frame handling: whatever bytes a
peer sends, the connection's frame dispatch (the C frame reader, then
``protocol.decode`` and the handlers) raises a ``StreamError`` or nothing,
never another exception.

    .venv/bin/python fuzz/dispatch.py -max_total_time=60 CORPUS_DIR
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from pystream import protocol as P
    from pystream.connection import Connection
    from pystream.errors import StreamError
    from pystream.uri import parse_uri

ADDRESS = parse_uri("rabbitmq-stream://fuzz/")


class Sink:
    """A subscription that takes whatever it is given."""

    def __init__(self) -> None:
        self.stream = "fuzz"

    def admit(self, chunk) -> bool:
        return True

    def on_chunks(self, chunks) -> None:
        for chunk in chunks:
            chunk.batch.validate(full=True)

    def on_chunk_error(self, error) -> None:
        pass

    def on_consumer_update(self, correlation_id, active) -> None:
        pass

    def on_metadata_update(self, code) -> None:
        pass

    def on_connection_closed(self, error) -> None:
        pass


def test_one_input(data: bytes) -> None:
    # Every frame also goes through the generic decoder directly.
    try:
        P.decode(data[4:])
    except StreamError:
        pass
    connection = Connection(ADDRESS, frame_max=1 << 16, max_deliver_size=1 << 20)
    connection.send_bytes = lambda frame: None  # answers go nowhere
    connection.add_subscription(Sink())
    reader = connection._reader
    try:
        # Fed in two pieces, so frames also straddle reads.
        cut = len(data) // 2
        for piece in (data[:cut], data[cut:]):
            reader.feed(piece)
            connection._drain(reader)
    except StreamError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
