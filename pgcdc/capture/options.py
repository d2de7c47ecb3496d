"""The pgoutput options of one capture session, and PostgreSQL's clock."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US

STREAMING_MODES = ("off", "on", "parallel")


def pg_now_us() -> int:
    """Now, as the replication protocol counts time: microseconds since 2000-01-01 UTC."""
    return time.time_ns() // 1000 - PG_EPOCH_UNIX_US


def max_protocol_version(server_major: int) -> int:
    """The highest pgoutput protocol version a server speaks (4 since PostgreSQL 16)."""
    return 4 if server_major >= 16 else 3


@dataclass(frozen=True)
class PluginOptions:
    """What START_REPLICATION (or a SQL peek) passes to pgoutput."""

    publications: tuple[str, ...]
    protocol_version: int
    binary: bool = False
    streaming: str = "off"
    messages: bool = False
    origin: str | None = None  # "any" or "none"; None: not sent
    two_phase: bool = False

    def check(self, server_major: int) -> None:
        """Raise ValueError with the fix when the server cannot honour these options."""
        top = max_protocol_version(server_major)
        if not 1 <= self.protocol_version <= top:
            raise ValueError(
                f"protocol version {self.protocol_version} is not supported by PostgreSQL "
                f"{server_major} (1 to {top})"
            )
        if self.streaming not in STREAMING_MODES:
            raise ValueError(f"--streaming must be off, on or parallel, not {self.streaming!r}")
        need = {"on": 2, "parallel": 4}.get(self.streaming, 1)
        if self.protocol_version < need:
            raise ValueError(
                f"--streaming {self.streaming} needs protocol version {need} or later "
                f"(got {self.protocol_version})"
            )
        if self.two_phase and self.protocol_version < 3:
            raise ValueError("--two-phase needs protocol version 3 or later")
        if self.origin is not None and server_major < 16:
            raise ValueError(f"--origin needs PostgreSQL 16 or later (server is {server_major})")
        if self.origin not in (None, "any", "none"):
            raise ValueError(f"--origin must be any or none, not {self.origin!r}")
        if not self.publications or not all(self.publications):
            raise ValueError("--publication needs at least one publication name")

    def as_list(self) -> list[tuple[str, str]]:
        opts = [
            ("proto_version", str(self.protocol_version)),
            ("publication_names", ",".join(_quote_pub(p) for p in self.publications)),
        ]
        if self.binary:
            opts.append(("binary", "true"))
        if self.streaming != "off":
            opts.append(("streaming", "true" if self.streaming == "on" else "parallel"))
        if self.messages:
            opts.append(("messages", "true"))
        if self.two_phase:
            opts.append(("two_phase", "true"))
        if self.origin is not None:
            opts.append(("origin", self.origin))
        return opts

    @property
    def parallel(self) -> bool:
        return self.streaming == "parallel"


def _quote_pub(name: str) -> str:
    # publication_names is parsed as an identifier list: quote what would not survive that
    if name.isidentifier() and name == name.lower():
        return name
    return '"' + name.replace('"', '""') + '"'
