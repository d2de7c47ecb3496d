"""StreamDecoder: decodes one connection's messages in order, tracking per-message contexts
(pgoutput's in_stream) from the messages that open and close a block."""

from __future__ import annotations

from .decoding import Retry, as_bytes
from .errors import DecodeError

__all__ = ["StreamDecoder", "track_contexts"]


def _around(gates: tuple, change) -> tuple[tuple, tuple]:
    """The gates for a message that opens or closes a block (it is itself outside), and the
    gates after it."""
    outside = list(gates)
    after = list(gates)
    for index, value in change:
        outside[index] = False
        after[index] = value
    return tuple(outside), tuple(after)


class StreamDecoder:
    """Decode the messages of one slot (or connection), in the order the server sent them.

    A generated codec subclasses this with its own constructor and sets `_dispatch` (its
    Dispatcher) and `_sets` (tag byte -> ((gate index, value), ...) for the messages that open
    or close a block). A message that opens or closes a block is itself outside it; one that
    fails to decode still moves the context on by its tag, so the messages after it decode.
    """

    __slots__ = ("_gates", "_table", "_version_name")
    _dispatch = None
    _sets: dict = {}

    def __init__(self, gates: tuple, version_name: str = "version"):
        self._gates = gates
        self._table = self._dispatch.tables[gates[0]]
        self._version_name = version_name

    def decode(self, payload):
        """Decode the next message."""
        # The codec's decode_tuple, inlined: this is the per-message hot path.
        if type(payload) is not bytes:
            payload = as_bytes(payload)
        n = len(payload)
        if not n:
            raise DecodeError(0, (), "empty message: no tag byte")
        tag = payload[0]
        gates = self._gates
        change = self._sets.get(tag)
        if change is not None:
            gates, self._gates = _around(gates, change)
        fn = self._table[tag]
        if fn is None:
            raise self._dispatch.unknown_tag(tag, gates[0], self._version_name)
        try:
            return fn(payload, n, gates)
        except Retry:  # the C accelerator declined: the Python decoder decides
            return self._dispatch.python_of[fn](payload, n, gates)


def track_contexts(items, gates: tuple, sets: dict):
    """(lsn, payload, gates) for (lsn, payload) pairs in server order, the per-message
    contexts derived from the tags as StreamDecoder does."""
    for lsn, payload in items:
        payload = bytes(payload)
        change = sets.get(payload[0]) if payload else None
        if change is None:
            yield lsn, payload, gates
            continue
        outside, gates = _around(gates, change)
        yield lsn, payload, outside
