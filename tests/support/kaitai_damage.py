"""The damage done to encoded messages (truncations, bad tags) and the Kaitai target languages,
for tests/kaitai/test_kaitai.py and test_kaitai_replication.py."""

from __future__ import annotations

from hypothesis import strategies as st


# Every language of ksc 0.11 but nim, whose translator has no `_io` expressions yet
# (NotImplementedError in NimTranslator.doInternalName; needed for the read-ahead of Update).
LANGUAGES = [
    "python",
    "javascript",
    "java",
    "cpp_stl",
    "csharp",
    "go",
    "rust",
    "ruby",
    "php",
    "perl",
    "lua",
]


def damage(wire: bytes, op: str, pos: int, byte: int) -> bytes:
    pos %= len(wire) + 1
    if op == "cut":
        return wire[:pos]
    if op == "append":
        return wire + bytes([byte])
    if op == "insert":
        return wire[:pos] + bytes([byte]) + wire[pos:]
    if pos == len(wire):
        pos -= 1
    return wire[:pos] + bytes([byte]) + wire[pos + 1 :]


DAMAGE = st.tuples(
    st.sampled_from(["cut", "append", "insert", "replace"]),
    st.integers(0, 1 << 16),
    st.integers(0, 255),
)
