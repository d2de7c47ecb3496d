"""Encoding support for generated codecs: value checks and errors that name the field.

Every wrong type or value raises EncodeError with the field path and the output offset; a bool
is not an int, and a sequence field must be a tuple or list.
"""

from __future__ import annotations

from .errors import EncodeError

__all__ = [
    "ONE_BYTE",
    "as_bytes",
    "as_seq",
    "bad_choice",
    "bad_run",
    "check_type",
    "missing",
    "not_sent",
    "offset_of",
    "string",
]

# Every single byte, so a choice or literal byte is written without a struct call.
ONE_BYTE = tuple(bytes((i,)) for i in range(256))


def offset_of(out: list) -> int:
    return sum(map(len, out))


def bad_run(out, path, names, values, bounds) -> EncodeError:
    """struct.pack refused a run of integers: say which field and why."""
    for name, value in zip(names, values):
        lo, hi = bounds.get(name, (0, 255))
        if type(value) is not int:
            got = type(value).__name__
            return EncodeError(offset_of(out), (*path, name), f"expected an int, got {got}")
        if not lo <= value <= hi:
            return EncodeError(offset_of(out), (*path, name), f"{value} is outside {lo}..{hi}")
    return EncodeError(offset_of(out), path, "cannot pack values")  # pragma: no cover


def check_run(out, path, names, values, bounds) -> None:
    """Reject bools (struct.pack takes them as ints) in a run that packed."""
    for name, value in zip(names, values):
        if type(value) is bool:
            raise EncodeError(offset_of(out), (*path, name), "expected an int, got bool")


def missing(out, path, gate: str) -> EncodeError:
    return EncodeError(offset_of(out), path, f"missing: this field is sent when {gate}")


def not_sent(out, path, gate: str) -> EncodeError:
    return EncodeError(offset_of(out), path, f"must be None: this field is sent only when {gate}")


def bad_choice(out, path, value, table) -> EncodeError:
    choices = ", ".join(map(repr, table))
    return EncodeError(offset_of(out), path, f"{value!r} is not one of {choices}")


def as_bytes(value, out, path) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise EncodeError(offset_of(out), path, f"expected bytes, got {type(value).__name__}")


def as_seq(value, out, path):
    if isinstance(value, (tuple, list)):
        return value
    raise EncodeError(offset_of(out), path, f"expected a tuple, got {type(value).__name__}")


def string(value, out, path) -> bytes:
    if type(value) is not str:
        raise EncodeError(offset_of(out), path, f"expected a str, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise EncodeError(offset_of(out), path, f"cannot encode the str: {exc}") from None
    if b"\x00" in raw:
        raise EncodeError(offset_of(out), path, "a String cannot contain NUL")
    return raw + b"\x00"


def check_type(value, cls, out, path) -> None:
    if type(value) is not cls:
        raise EncodeError(
            offset_of(out), path, f"expected {cls.__name__}, got {type(value).__name__}"
        )
