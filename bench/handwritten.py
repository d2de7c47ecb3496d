"""A careful hand-written `struct` decoder for the benchmark corpus: the yardstick the issue
names ("close to hand-tuned"). It reads only what the corpus holds (Begin, Relation, Insert,
Update, Delete, Commit at protocol 1), returns plain tuples and checks nothing, so it is an
upper bound for pure Python rather than a usable decoder.
"""

from __future__ import annotations

from struct import Struct

_QQI = Struct(">QqI").unpack_from
_BQQq = Struct(">BQQq").unpack_from
_I = Struct(">I").unpack_from
_H = Struct(">H").unpack_from
_IB = Struct(">IB").unpack_from
_Ii = Struct(">Ii").unpack_from


def _tuple(d, o):
    (n,) = _H(d, o)
    o += 2
    cols = []
    add = cols.append
    for _ in range(n):
        k = d[o]
        if k == 116 or k == 98:
            (size,) = _I(d, o + 1)
            o += 5
            add((k, d[o : o + size]))
            o += size
        else:
            add((k, None))
            o += 1
    return cols, o


def _begin(d):
    return ("B", *_QQI(d, 1))


def _commit(d):
    return ("C", *_BQQq(d, 1))


def _relation(d):
    (oid,) = _I(d, 1)
    e = d.index(0, 5)
    ns = d[5:e].decode()
    o = e + 1
    e = d.index(0, o)
    name = d[o:e].decode()
    o = e + 1
    ident = d[o]
    (n,) = _H(d, o + 1)
    o += 3
    cols = []
    for _ in range(n):
        flags = d[o]
        e = d.index(0, o + 1)
        col = d[o + 1 : e].decode()
        typ, mod = _Ii(d, e + 1)
        cols.append((flags, col, typ, mod))
        o = e + 9
    return ("R", oid, ns, name, ident, cols)


def _insert(d):
    oid, _ = _IB(d, 1)
    cols, _ = _tuple(d, 6)
    return ("I", oid, cols)


def _update(d):
    (oid,) = _I(d, 1)
    o = 5
    old = None
    if d[o] in (75, 79):
        old, o = _tuple(d, o + 1)
    new, _ = _tuple(d, o + 1)
    return ("U", oid, old, new)


def _delete(d):
    (oid,) = _I(d, 1)
    old, _ = _tuple(d, 6)
    return ("D", oid, d[5], old)


_BY_TAG = [None] * 256
for _tag, _fn in {
    "B": _begin,
    "C": _commit,
    "R": _relation,
    "I": _insert,
    "U": _update,
    "D": _delete,
}.items():
    _BY_TAG[ord(_tag)] = _fn


def decode(d: bytes):
    return _BY_TAG[d[0]](d)
