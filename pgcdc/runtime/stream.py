"""StreamDecoder: decodes one connection's messages in order, tracking per-message contexts
(pgoutput's in_stream) from the messages that open and close a block."""

from __future__ import annotations

__all__ = ["StreamDecoder"]


class StreamDecoder:
    """Decode the messages of one slot (or connection), in the order the server sent them.

    A generated codec subclasses this with its own constructor and sets `_decode` (its
    decode function taking the gate values) and `_sets` (tag byte -> ((gate index, value),
    ...) for the messages that open or close a block). A message that opens or closes a block
    is itself outside it; one that fails to decode still moves the context on by its tag, so
    the messages after it decode correctly.
    """

    __slots__ = ("_gates",)
    _decode = None
    _sets: dict = {}

    def __init__(self, gates: tuple):
        self._gates = gates

    def decode(self, payload):
        """Decode the next message."""
        gates = self._gates
        change = self._sets.get(payload[0]) if len(payload) else None
        if change is not None:
            outside = list(gates)
            for index, value in change:
                outside[index] = False
            after = list(gates)
            for index, value in change:
                after[index] = value
            self._gates = tuple(after)
            gates = tuple(outside)
        return type(self)._decode(payload, *gates)


def track_contexts(items, gates: tuple, sets: dict):
    """(lsn, payload, gates) for (lsn, payload) pairs in server order, the per-message
    contexts derived from the tags as StreamDecoder does."""
    for lsn, payload in items:
        payload = bytes(payload)
        change = sets.get(payload[0]) if payload else None
        if change is None:
            yield lsn, payload, gates
            continue
        outside = list(gates)
        after = list(gates)
        for index, value in change:
            outside[index] = False
            after[index] = value
        yield lsn, payload, tuple(outside)
        gates = tuple(after)
