"""Errors raised by every generated codec.

DecodeError: the bytes break the format (the server, or the capture, sent something wrong).
EncodeError: the value cannot be put on the wire. Both carry the byte offset and the field
path, as attributes and in the message.
ProtocolViolation: a DecodeError for a message that decodes but may not arrive where it did
(a StreamDecoder's strict mode), with the message's index in the stream.
"""

from __future__ import annotations

from pgcdc.errors import DataError

__all__ = ["CodecError", "DecodeError", "EncodeError", "ProtocolViolation", "format_path"]


def format_path(path: tuple, root: str = "<message>") -> str:
    """A field path as one reads it (``columns[2].type_oid``); ``root`` when it is empty."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or root


class CodecError(DataError, ValueError):
    """Base class. `offset` is a byte offset into the message, `path` a tuple of field names."""

    kind = "codec error"

    def __init__(self, offset: int, path: tuple, reason: str):
        super().__init__(offset, tuple(path), reason)
        self.offset = offset
        self.path = tuple(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.kind} at byte {self.offset} in {format_path(self.path)}: {self.reason}"


class DecodeError(CodecError):
    """The message bytes do not follow the format."""

    kind = "cannot decode"


class EncodeError(CodecError):
    """The message value cannot be encoded (missing, extra or out-of-range field)."""

    kind = "cannot encode"


class ProtocolViolation(DecodeError):
    """A message arrived where the protocol does not allow it (e.g. a Stream Stop with no
    block open): the sequence is wrong, whatever its bytes. `index` is the message's position
    in the stream (from 0), `tag` its tag byte, `message` its name, `reason` the rule."""

    kind = "protocol violation"

    def __init__(self, index: int, tag: int, message: str, reason: str):
        super().__init__(0, (message,), reason)
        self.args = (index, tag, message, reason)
        self.index = index
        self.tag = tag
        self.message = message

    def __str__(self) -> str:
        return (
            f"{self.kind} at message {self.index} ({self.message}, tag {chr(self.tag)!r}):"
            f" {self.reason}"
        )
