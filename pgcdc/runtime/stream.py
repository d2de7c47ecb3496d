"""StreamDecoder: decodes one connection's messages in order, tracking per-message contexts
(pgoutput's in_stream) from the messages that open and close a block, and checking that each
message arrives where the protocol allows it."""

from __future__ import annotations

from pgcdc.runtime.decoding import Retry, as_bytes, byte_table
from pgcdc.runtime.codec_errors import DecodeError, ProtocolViolation

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
    Dispatcher), `_sets` (tag byte -> ((gate index, value), ...) for the messages that open
    or close a block), `_requires` (tag byte -> ((gate index, value), ...): the per-message
    contexts a message needs when it arrives) and `_gate_names` (the name of each gate). A
    message that opens or closes a block is itself outside it; one that fails to decode still
    moves the context on by its tag, so the messages after it decode.

    A message that arrives where its rule forbids it (a Stream Stop with no block open, a
    nested Stream Start, a Commit inside a block) is a protocol violation:

    - strict (the default): decode() raises ProtocolViolation (a DecodeError) naming the
      message's index, tag and rule. The message is counted but not applied: the contexts stay
      as the messages before it left them, and the decoder goes on with the next message.
    - lenient (strict=False): the violation is appended to `violations` and the decoder
      resynchronises on the message: it takes the contexts the message needs as the truth (a
      Commit inside a block ends the block), decodes it with them and carries on.

    `received` counts the messages passed to decode() (a violation's index is its position).
    """

    __slots__ = (
        "_gates",
        "_table",
        "_fast",
        "_rules",
        "_version_name",
        "_strict",
        "received",
        "violations",
    )
    _dispatch = None
    _sets: dict = {}
    _requires: dict = {}
    _gate_names: tuple = ()
    # version -> (tag byte -> (requires, sets or None), or None): made once per codec
    _rules_by_version: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._dispatch is not None:
            cls._rules_by_version = {v: cls._rule_table(v) for v in cls._dispatch.versions}

    def __init__(self, gates: tuple, version_name: str = "version", strict: bool = True):
        if type(strict) is not bool:
            raise TypeError(f"strict is True or False, not {strict!r}")
        self._gates = gates
        self._table = self._dispatch.tables[gates[0]]
        self._rules = self._rules_by_version[gates[0]]
        # messages without a rule, decodable at this version: the path most messages take
        self._fast = self._dispatch.table(
            gates[0], frozenset(tag for tag, rule in enumerate(self._rules) if rule is not None)
        )
        self._version_name = version_name
        self._strict = strict
        self.received = 0
        self.violations: list[ProtocolViolation] = []

    @classmethod
    def _rule_table(cls, version: int) -> tuple:
        """Tag byte -> (requires, sets or None), or None: one index per message.

        A requirement on a context that this version never turns on (in_stream on protocol
        1) always holds, so it is left out; a tag with nothing left has no rule."""
        since = {i: info.since for i, info in enumerate(cls._dispatch.params.contexts, start=1)}
        rules = {}
        for tag in cls._requires.keys() | cls._sets.keys():
            need = tuple(
                (i, value)
                for i, value in cls._requires.get(tag, ())
                if value or since.get(i, 0) <= version
            )
            change = cls._sets.get(tag)
            if need or change is not None:
                rules[tag] = (need, change)
        return byte_table(rules)

    @property
    def strict(self) -> bool:
        """Whether a protocol violation raises (True) or is recorded in `violations`."""
        return self._strict

    def decode(self, payload):
        """Decode the next message."""
        # The codec's decode_tuple, inlined: this is the per-message hot path.
        if type(payload) is not bytes:
            payload = as_bytes(payload)
        self.received += 1
        try:
            fn = self._fast[payload[0]]
        except IndexError:
            raise DecodeError(0, (), "empty message: no tag byte") from None
        if fn is None:  # a message with a rule, or one this version does not know
            return self._decode_ruled(payload)
        try:
            return fn(payload, len(payload), self._gates)
        except Retry:  # the C accelerator declined: the Python decoder decides
            return self._dispatch.python_of[fn](payload, len(payload), self._gates)

    def _decode_ruled(self, payload: bytes):
        tag = payload[0]
        rule = self._rules[tag]
        gates = self._gates if rule is None else self._follow(tag, rule)
        fn = self._table[tag]
        if fn is None:
            raise self._dispatch.unknown_tag(tag, gates[0], self._version_name)
        try:
            return fn(payload, len(payload), gates)
        except Retry:
            return self._dispatch.python_of[fn](payload, len(payload), gates)

    def _follow(self, tag: int, rule: tuple) -> tuple:
        """The gates for a message with a rule: check what it needs, then move the contexts
        on if it opens or closes a block."""
        gates = self._gates
        need, change = rule
        for i, value in need:
            if gates[i] is not value:
                gates = self._gates = self._violation(self.received - 1, tag, gates, need)
                break
        if change is not None:
            gates, self._gates = _around(gates, change)
        return gates

    def _violation(self, index: int, tag: int, gates: tuple, need) -> tuple:
        """Raise the violation (strict), or record it and return the gates the message needs."""
        known = self._dispatch.messages.get(tag)
        name = known[0] if known else f"tag {chr(tag)!r}"
        names = self._gate_names or tuple(f"gate {i}" for i in range(len(gates)))
        wanted = " and ".join(f"{names[i]}={value}" for i, value in need)
        actual = " and ".join(f"{names[i]}={gates[i]}" for i, _ in need)
        err = ProtocolViolation(
            index,
            tag,
            name,
            f"{name} may only arrive when {wanted}; the stream so far has {actual}",
        )
        if self._strict:
            raise err
        self.violations.append(err)
        fixed = list(gates)
        for i, value in need:
            fixed[i] = value
        return tuple(fixed)


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
