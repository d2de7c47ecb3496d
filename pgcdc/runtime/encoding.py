"""Encoding support for generated codecs: value checks and errors that name the field.

Every wrong type or value raises EncodeError with the field path and the output offset; a bool
is not an int, and a sequence field must be a tuple or list.
"""

from __future__ import annotations

from operator import index

from pgcdc.runtime.codec_errors import EncodeError

__all__ = [
    "ONE_BYTE",
    "as_bytes",
    "as_seq",
    "bad_choice",
    "bad_item",
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


def _not_int(value) -> str | None:
    """Why `value` is not an integer for the wire, or None: a bool is not an int; other int
    subclasses and objects with __index__ are (struct.pack takes them)."""
    if type(value) is int:
        return None
    if isinstance(value, bool):
        return "expected an int, got bool"
    try:
        index(value)
    except TypeError:
        return f"expected an int, got {type(value).__name__}"
    return None


def bad_run(out, path, names, values, bounds) -> EncodeError:
    """struct.pack refused a run of integers (or one holds a bool): say which field and why."""
    for name, value in zip(names, values):
        lo, hi = bounds.get(name, (0, 255))
        why = _not_int(value)
        if why is None and not lo <= index(value) <= hi:
            why = f"{value!r} is outside {lo}..{hi}"
        if why is not None:
            return EncodeError(offset_of(out), (*path, name), why)
    return EncodeError(offset_of(out), path, "cannot pack values")  # pragma: no cover


def bad_item(out, path, values, bounds, type_name: str) -> EncodeError:
    """struct.pack refused a sequence of integers (or it holds a bool): name the element."""
    lo, hi = bounds
    for i, value in enumerate(values):
        why = _not_int(value)
        if why is None and not lo <= index(value) <= hi:
            why = f"{value!r} is outside {lo}..{hi}"
        if why is not None:
            return EncodeError(offset_of(out), (*path, i), f"not a valid {type_name}: {why}")
    return EncodeError(offset_of(out), path, "cannot pack values")  # pragma: no cover


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
