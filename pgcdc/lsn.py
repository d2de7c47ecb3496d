"""Log sequence numbers: PostgreSQL's text form ``16/B374D848`` and the 64-bit integer."""

from __future__ import annotations

import re

_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
MAX_LSN = (1 << 64) - 1


def format_lsn(lsn: int) -> str:
    """An LSN as PostgreSQL prints it: ``format_lsn(0x16B374D848) == "16/B374D848"``."""
    if isinstance(lsn, bool) or not isinstance(lsn, int) or not 0 <= lsn <= MAX_LSN:
        raise ValueError(f"an LSN is an integer from 0 to 2**64-1, got {lsn!r}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str | int) -> int:
    """PostgreSQL's LSN text (``"16/B374D848"``) as an integer; integers pass through checked."""
    if isinstance(text, int) and not isinstance(text, bool):
        format_lsn(text)  # range check
        return text
    m = _LSN.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(
            f"not an LSN: {text!r} (expected PostgreSQL's form, two hex numbers like 16/B374D848)"
        )
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)
