"""A table's key (its directory in the lake): never two tables on one key, readable, and safe
for file systems, object-store URLs, Hadoop paths and Spark's globs.

The properties are checked on any identifier PostgreSQL accepts (any character but NUL, at
most 63 bytes), not on the key's own rules read back."""

from __future__ import annotations

import pytest

import glob
import string

from hypothesis import given
from hypothesis import strategies as st

from pgcdc.events.jsonlines import table_matches
from pgcdc.tablekey import MAX_BYTES, split_key, table_key

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm


def _fits(s: str) -> bool:
    return 0 < len(s.encode()) <= 63


# an identifier: any character but NUL, 1 to 63 bytes (NAMEDATALEN - 1)
identifier = st.text(
    st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1, max_size=63
).filter(_fits)
# mostly the characters real schemas trip on
odd = st.text(
    st.sampled_from(list('._-~ "`%/\\:*?[]{}#$=,;()\n\tAaZz09éñ列')), min_size=1, max_size=20
)
name = st.one_of(identifier, odd)

# what a key may hold: letters and digits of any script, '_', '-', the escape and the dot
UNSAFE = set(string.punctuation + string.whitespace) - set("_-~.")


@given(name, name)
def test_a_key_gives_its_names_back(schema, table):
    key = table_key(schema, table)
    assert split_key(key) in ((schema, table), None)
    if split_key(key) is None:  # only a key cut to its length
        assert "~~" in key and len(key.encode()) > MAX_BYTES - 20


@given(name, name, name, name)
def test_two_tables_never_share_a_key(s1, t1, s2, t2):
    if (s1, t1) != (s2, t2):
        assert table_key(s1, t1) != table_key(s2, t2)


@given(name, name)
def test_a_key_is_safe_as_a_path_a_url_and_a_glob(schema, table):
    key = table_key(schema, table)
    assert not set(key) & UNSAFE
    assert key == glob.escape(key)  # Spark's and Hadoop's paths are globs
    assert not key.startswith(("_", "."))  # pgcdc's own files; hidden to Spark
    assert key.count(".") <= 1
    assert len(key.encode()) <= MAX_BYTES
    assert all(c.isprintable() for c in key)


def test_the_collision_real_schemas_hit():
    assert table_key("public", "weird.name") != table_key("public.weird", "name")
    assert table_key("public", "orders") == "public.orders"  # ordinary names as they were
    assert table_key("Sales", "Order Items") == "Sales.Order~20Items"
    assert table_key("ñandú", "列") == "ñandú.列"


@given(name, name)
def test_the_table_option_matches_the_names_and_the_key(schema, table):
    key = table_key(schema, table)
    assert table_matches([glob.escape(key)], schema, table)
    assert table_matches([glob.escape(f"{schema}.{table}")], schema, table)
