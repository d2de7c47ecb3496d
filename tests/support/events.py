"""Events made comparable across readers: a RelationInfo compares by identity (each reader has
its own loader) and carries the reader's cache epoch, so compare what it says instead."""

from __future__ import annotations


def described(ev):
    """``ev`` with its relation as what the Relation message said about the table."""
    r = ev.relation
    if r is None:  # a logical message
        return ev
    return ev._replace(relation=(r.oid, r.schema, r.table, r.replica_identity, r.names,
                                 r.type_oids, r.type_modifiers, r.key_indexes))  # fmt: skip
