"""The parameters a caller passes to decode/encode, and the contexts that follow from them.

A spec declares one version parameter, any number of mode parameters (each value lists the
contexts it turns on) and contexts (booleans that gate fields). Per-message contexts, such as
pgoutput's in_stream, are passed per call or tracked by a StreamDecoder; the others are derived
from the modes. A generated codec builds one ParamSpec from its spec and asks it to resolve
each call's arguments into the gate values its decoders take: (version, context, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mode", "ContextInfo", "ParamSpec"]


@dataclass(frozen=True)
class Mode:
    name: str
    default: str
    enables: dict  # value -> tuple of context names


@dataclass(frozen=True)
class ContextInfo:
    name: str
    since: int  # 0: every version
    per_message: bool


class ParamSpec:
    """Checks call arguments against the spec and maps them to gate values (cached)."""

    def __init__(self, version: str, versions: tuple, modes: tuple, contexts: tuple):
        self.version = version
        self.versions = tuple(versions)
        self.modes = tuple(modes)
        self.contexts = tuple(contexts)
        self.per_message = tuple(c for c in self.contexts if c.per_message)
        self._cache: dict = {}
        for args in self._all_args():
            try:
                self._cache[args] = self._resolve(args)
            except ValueError:
                pass

    def _all_args(self):
        combos = [(v,) for v in self.versions]
        for mode in self.modes:
            combos = [c + (value,) for c in combos for value in mode.enables]
        for _ in self.per_message:
            combos = [c + (flag,) for c in combos for flag in (False, True)]
        return combos

    def _resolve(self, args: tuple) -> tuple:
        version, rest = args[0], args[1:]
        if type(version) is not int or version not in self.versions:
            raise ValueError(
                f"{self.version} must be one of {list(self.versions)}, not {version!r}"
            )
        on: set = set()
        for mode, value in zip(self.modes, rest):
            if value not in mode.enables:
                raise ValueError(f"{mode.name} must be one of {tuple(mode.enables)}, not {value!r}")
            for name in mode.enables[value]:
                since = self._since(name)
                if version < since:
                    raise ValueError(f"{mode.name}={value!r} needs {self.version} >= {since}")
                on.add(name)
        flags = rest[len(self.modes) :]
        for ctx, flag in zip(self.per_message, flags):
            if type(flag) is not bool:
                raise ValueError(f"{ctx.name} must be True or False, not {flag!r}")
            if flag and version < ctx.since:
                raise ValueError(f"{ctx.name} needs {self.version} >= {ctx.since}")
        given = dict(zip((c.name for c in self.per_message), flags))
        return (version, *(given[c.name] if c.per_message else c.name in on for c in self.contexts))

    def _since(self, name: str) -> int:
        return next(c.since for c in self.contexts if c.name == name)

    def resolve(self, *args) -> tuple:
        """(version, modes..., per-message contexts...) -> (version, every context...).

        Raises ValueError for combinations no server produces (programming errors, not data
        errors)."""
        try:
            gates = self._cache[args]
        except (KeyError, TypeError):  # unknown or unhashable: _resolve says what is wrong
            return self._resolve(args)
        if type(args[0]) is not int:  # True == 1 finds the cache entry of 1: a bool is no version
            return self._resolve(args)
        return gates
