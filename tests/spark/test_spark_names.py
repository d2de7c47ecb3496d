"""pgcdc.spark.names without Spark: any list of PostgreSQL column names gets stored names
that Delta takes (none equal but for case, none with a character Delta keeps out), each
decoding to its own name; a table keeps the stored names it gave; quoting makes one Spark
identifier of any name (checked against Spark's own parser in tests/apply/test_columns.py's runs)."""

from __future__ import annotations

from urllib.parse import unquote

from hypothesis import given
from hypothesis import strategies as st

from pgcdc.spark.names import DELTA_REFUSED, quoted, stored_names

# a PostgreSQL identifier: any character but NUL (and surrogates: no UTF-8), up to 63 bytes
NAME = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=63,
).filter(lambda s: len(s.encode()) <= 63)
# names that collide by case and hold the characters that are encoded
NEAR = st.sampled_from(["id", "Id", "ID", "iD", "a b", "A b", "%41", "%2541", "ñ", "Ñ", "_pg_text"])
NAMES = st.lists(st.one_of(NAME, NEAR), unique=True, max_size=12)
RESERVED = ("_pg_text", "_commit_lsn", "_tx_ordinal")


def _taken_by_delta(stored: dict) -> None:
    lower = [s.lower() for s in [*stored.values(), *RESERVED]]
    assert len(set(lower)) == len(lower), stored
    for name, s in stored.items():
        assert not set(s) & set(DELTA_REFUSED), s
        assert unquote(s) == name


@given(NAMES)
def test_stored_names_decode_and_do_not_collide(names):
    _taken_by_delta(stored_names(names, reserved=RESERVED))


@given(NAMES, NAMES, st.data())
def test_a_table_keeps_its_stored_names(before, added, data):
    """Columns added (and some dropped) later: the ones kept keep their names."""
    first = stored_names(before, reserved=RESERVED)
    kept = data.draw(st.lists(st.sampled_from(before), unique=True)) if before else []
    now = kept + [c for c in added if c not in kept]
    second = stored_names(now, {c: first[c] for c in kept}, reserved=RESERVED)
    assert {c: second[c] for c in kept} == {c: first[c] for c in kept}
    _taken_by_delta(second)


def test_examples():
    got = stored_names(["note.text", "a b", "Id", "id", "%41", "tab\tx", "w,;{}()=", "列"])
    assert got == {
        "note.text": "note.text", "a b": "a%20b", "Id": "Id", "id": "%69d", "%41": "%2541",
        "tab\tx": "tab%09x", "w,;{}()=": "w%2C%3B%7B%7D%28%29%3D", "列": "列",
    }  # fmt: skip
    assert stored_names(["id", "Id"], {"Id": "Id"}) == {"Id": "Id", "id": "%69d"}
    assert stored_names(["_PG_TEXT"], reserved=RESERVED) == {"_PG_TEXT": "_%50G_TEXT"}
    assert quoted("x`y.z") == "`x``y.z`"
