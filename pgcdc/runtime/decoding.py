"""Decoding support for generated codecs: error builders, object builders and the dispatcher
that picks a message decoder by tag, in C when the accelerator is built, else in Python."""

from __future__ import annotations

import os
import warnings

from pgcdc.runtime.codec_errors import DecodeError

__all__ = [
    "Dispatcher",
    "Retry",
    "bad_choice",
    "bad_literal",
    "builder",
    "byte_table",
    "short",
    "trailing",
    "truncated",
    "unterminated",
]


class Retry(Exception):
    """Raised by the C accelerator on anything it does not handle: the Python decoder (or
    encoder) of the same message then runs and returns the value or the precise error.

    Always raised as a fresh instance: re-raising one shared instance would chain every
    traceback onto it and keep the frames alive."""


def byte_table(choices: dict) -> tuple:
    """A 256-entry tuple indexed by a byte: the value stored for it, or None (not allowed)."""
    return tuple(choices.get(i) for i in range(256))


def builder(cls: type) -> type:
    """A mutable subclass of a frozen message or part class: the same slots, nothing else.

    Decoders fill one of these with plain attribute stores and then give it the public class
    (`obj.__class__ = cls`): the frozen dataclass __init__ (or a slot descriptor's __set__)
    costs a call per field, and wide rows (an element per column) were dominated by it.
    """
    return type(
        "_Build" + cls.__name__,
        (cls,),
        {
            "__slots__": (),
            "__init__": object.__init__,
            "__setattr__": object.__setattr__,
            "__delattr__": object.__delattr__,
        },
    )


# -- error builders (only run when something is wrong) ----------------------------------------
def truncated(offset: int, n: int, layout, path) -> DecodeError:
    """A fixed-width run of (name, size) fields does not fit: name the first field cut off."""
    for name, size in layout:
        if offset + size > n:
            return DecodeError(
                offset,
                (*path, name),
                f"message ends after {n} bytes; {name} needs {size} more from here",
            )
        offset += size
    return DecodeError(offset, path, "message truncated")  # pragma: no cover


def short(offset: int, n: int, need: int, path) -> DecodeError:
    return DecodeError(offset, path, f"message ends after {n} bytes; {need} more needed here")


def unterminated(offset: int, n: int, path) -> DecodeError:
    return DecodeError(offset, path, f"string has no NUL terminator before the end ({n} bytes)")


def bad_literal(offset: int, path, expected: int, got: int) -> DecodeError:
    return DecodeError(offset, path, f"expected {chr(expected)!r}, got {chr(got)!r} (0x{got:02x})")


def bad_choice(offset: int, path, got: int, table) -> DecodeError:
    allowed = ", ".join(repr(c) for c in table if c is not None)
    return DecodeError(
        offset, path, f"unknown value {chr(got)!r} (0x{got:02x}); expected one of {allowed}"
    )


def trailing(offset: int, n: int, path) -> DecodeError:
    return DecodeError(offset, path, f"{n - offset} unexpected trailing byte(s) after the message")


def as_bytes(data) -> bytes:
    """The message as bytes; anything that is not bytes-like is a caller's error."""
    if type(data) is bytes:
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"a message is bytes, bytearray or memoryview, not {type(data).__name__}")


class Dispatcher:
    """Message decoders by (version, tag byte), Python or C, and the accelerator switch.

    `messages` maps a tag byte to (class name, first version, Python decoder). The C
    accelerator, when it is built from the same generated source (matching `accel_id`) and
    `env_var` is not set, provides `decode_<func>` for each and raises Retry on anything
    unusual; the Python decoder then gives the value or the precise DecodeError.
    """

    def __init__(self, package: str, env_var: str, accel_id: str, messages: dict, namespace):
        self.package = package
        self.env_var = env_var
        self.accel_id = accel_id
        self.messages = messages
        self.speedups = self._load_speedups(namespace)
        self.c_decoders = {}
        self.python_of = {}
        if self.speedups is not None:
            for tag, (_name, _since, fn) in messages.items():
                c_fn = getattr(self.speedups, fn.__name__.lstrip("_"))  # _decode_x -> decode_x
                self.c_decoders[tag] = c_fn
                self.python_of[c_fn] = fn
        self.params = namespace["PARAMS"]
        self.versions = self.params.versions
        # (version, tags left out) -> decoder by tag byte, None for a tag left out or unknown
        # at that version; filled in place by use_speedups. Stream decoders leave out the
        # messages with a rule (Stream Start, Commit), which take a slower path.
        self._tables: dict = {}
        self.accelerated = False
        self.tables = {v: self.table(v) for v in self.versions}  # every tag
        self.use_speedups(True)

    def _load_speedups(self, namespace):
        if os.environ.get(self.env_var):
            return None
        if namespace.get("__name__") != self.package + "._decoder":
            # Another copy of the codec (e.g. rendered and imported under another name): the
            # compiled module binds to one set of classes, the installed package's.
            return None
        try:
            module = __import__(self.package + "._speedups", fromlist=["_speedups"])
        except ImportError:
            return None
        if getattr(module, "ACCEL_ID", None) != self.accel_id:
            warnings.warn(
                f"{self.package}: the compiled accelerator was built from other generated code;"
                " using pure Python (rebuild it: pip install -e . or make generate)",
                RuntimeWarning,
                stacklevel=4,
            )
            return None
        module._init(namespace)
        return module

    def use_speedups(self, enabled: bool) -> bool:
        """Switch between the C accelerator and pure Python; the tables change in place, so
        stream decoders made earlier switch too. Returns whether the accelerator is in use."""
        self.accelerated = bool(enabled) and self.speedups is not None
        for (version, left_out), table in self._tables.items():
            self._fill(table, version, left_out)
        return self.accelerated

    def _fill(self, table: list, version: int, left_out: frozenset) -> None:
        table[:] = [None] * 256
        for tag, (_name, since, fn) in self.messages.items():
            if version >= since and tag not in left_out:
                table[tag] = self.c_decoders[tag] if self.accelerated else fn

    def table(self, version: int, left_out: frozenset = frozenset()) -> list:
        """The version's decoders by tag byte, without the tags in `left_out` (None there);
        one shared list per (version, left_out), kept in step with use_speedups."""
        key = (version, left_out)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = [None] * 256
            self._fill(table, version, left_out)
        return table

    def unknown_tag(self, tag: int, version: int, version_name: str) -> DecodeError:
        known = self.messages.get(tag)
        if known:
            name, since = known[0], known[1]
            return DecodeError(0, (name,), f"{name} needs {version_name} {since}, not {version}")
        return DecodeError(0, (), f"unknown message tag {chr(tag)!r} (0x{tag:02x})")
