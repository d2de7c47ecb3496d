"""PostgreSQL's text output of a binary (send format) value, for the built-in types psycopg
has no binary loader for. Each function takes the value's bytes and returns the string the
server would have sent in a text slot (server settings: lc_monetary C, UTF8 encoding)."""

from __future__ import annotations

import struct

from pgcdc.lsn import format_lsn
from pgcdc.values._pgtext import pg_float_text

_u16, _i16 = struct.Struct("!H"), struct.Struct("!h")
_u32, _i32 = struct.Struct("!I"), struct.Struct("!i")
_u64, _i64 = struct.Struct("!Q"), struct.Struct("!q")
_f8 = struct.Struct("!d")
_point = struct.Struct("!dd")


def _f(x: float) -> str:
    return pg_float_text(x)


def _points(data, offset: int, n: int) -> str:
    return ",".join(
        "(%s,%s)" % tuple(map(_f, _point.unpack_from(data, offset + 16 * i))) for i in range(n)
    )


def char(data) -> str:
    """``"char"``: one byte. charout (PostgreSQL 15+) prints a byte above 0x7F as a backslash
    and three octal digits, the zero byte as the empty string, any other byte as itself."""
    if not data or data[0] == 0:
        return ""
    b = data[0]
    return chr(b) if b < 0x80 else f"\\{b:03o}"


def point(data) -> str:
    return "(%s,%s)" % tuple(map(_f, _point.unpack(data)))


def lseg(data) -> str:
    return f"[{_points(data, 0, 2)}]"


def box(data) -> str:
    return _points(data, 0, 2)


def line(data) -> str:
    return "{%s,%s,%s}" % tuple(map(_f, struct.unpack("!ddd", data)))


def circle(data) -> str:
    x, y, r = struct.unpack("!ddd", data)
    return f"<({_f(x)},{_f(y)}),{_f(r)}>"


def path(data) -> str:
    closed = data[0]
    (n,) = _i32.unpack_from(data, 1)
    inner = _points(data, 5, n)
    return f"({inner})" if closed else f"[{inner}]"


def polygon(data) -> str:
    (n,) = _i32.unpack_from(data, 0)
    return f"({_points(data, 4, n)})"


def money(data) -> str:
    # cash_out with lc_monetary C: '$', ',' every 3 digits, 2 decimals, '-' in front
    (cents,) = _i64.unpack(data)
    whole, frac = divmod(abs(cents), 100)
    return f"{'-' if cents < 0 else ''}${whole:,}.{frac:02d}"


def bits(data) -> str:
    (n,) = _i32.unpack_from(data, 0)
    body = int.from_bytes(bytes(data[4:]), "big") if n else 0
    nbytes = len(data) - 4
    return format(body, f"0{nbytes * 8}b")[:n] if n else ""


def macaddr(data) -> str:
    return ":".join(f"{b:02x}" for b in bytes(data))


def tid(data) -> str:
    block, off = struct.unpack("!IH", data)
    return f"({block},{off})"


def uint32(data) -> str:
    return str(_u32.unpack(data)[0])


def uint64(data) -> str:
    return str(_u64.unpack(data)[0])


def pg_lsn(data) -> str:
    return format_lsn(_u64.unpack(data)[0])


def utf8(data) -> str:
    return bytes(data).decode()


def jsonpath(data) -> str:
    # jsonpath_send: a version byte (1), then the text
    if data[0] != 1:
        raise ValueError(f"unsupported jsonpath binary version {data[0]}")
    return bytes(data[1:]).decode()


def snapshot(data) -> str:
    # txid_snapshot_send / pg_snapshot_send: nxip, xmin, xmax, xip[]
    (nxip,) = _i32.unpack_from(data, 0)
    xmin, xmax = struct.unpack_from("!QQ", data, 4)
    xips = struct.unpack_from(f"!{nxip}Q", data, 20)
    return f"{xmin}:{xmax}:" + ",".join(map(str, xips))


def int_vector(data) -> str:
    # int2vector/oidvector send an array: ndim, hasnull, elemtype, (dim, lbound), elements
    ndim, _flags, elemtype = struct.unpack_from("!iiI", data, 0)
    if ndim == 0:
        return ""
    (n,) = _i32.unpack_from(data, 12)
    out, pos = [], 20
    for _ in range(n):
        (size,) = _i32.unpack_from(data, pos)
        pos += 4
        out.append(int.from_bytes(bytes(data[pos : pos + size]), "big", signed=elemtype == 21))
        pos += size
    return " ".join(map(str, out))


def _lexeme(word: str) -> str:
    return "'" + word.replace("'", "''").replace("\\", "\\\\") + "'"


def tsvector(data) -> str:
    (count,) = _i32.unpack_from(data, 0)
    pos, out = 4, []
    raw = bytes(data)
    for _ in range(count):
        end = raw.index(b"\0", pos)
        word = raw[pos:end].decode()
        (npos,) = _u16.unpack_from(raw, end + 1)
        pos = end + 3
        entries = []
        for _ in range(npos):
            (wp,) = _u16.unpack_from(raw, pos)
            pos += 2
            weight = "DCBA"[wp >> 14]
            entries.append(f"{wp & 0x3FFF}{'' if weight == 'D' else weight}")
        out.append(_lexeme(word) + (":" + ",".join(entries) if entries else ""))
    return " ".join(out)


# tsquery operators: code -> (text, priority); PostgreSQL's tsearch_op_priority
_TSQ_OPS = {1: ("!", 4), 2: (" & ", 2), 3: (" | ", 1), 4: (" <-> ", 3)}


def tsquery(data) -> str:
    """tsquerysend's items are in prefix order (operator, right operand, left operand); the
    text is PostgreSQL's infix() with its parenthesisation rules."""
    raw = bytes(data)
    (count,) = _i32.unpack_from(raw, 0)
    if count == 0:
        return ""
    items, pos = [], 4
    for _ in range(count):
        kind = raw[pos]
        pos += 1
        if kind == 1:  # operand: weight, prefix, NUL-terminated text
            weight, prefix = raw[pos], raw[pos + 1]
            end = raw.index(b"\0", pos + 2)
            items.append(("v", raw[pos + 2 : end].decode(), weight, prefix))
            pos = end + 1
        elif kind == 2:  # operator (+ distance for phrase)
            op = raw[pos]
            pos += 1
            dist = 0
            if op == 4:
                (dist,) = _i16.unpack_from(raw, pos)
                pos += 2
            items.append(("o", op, dist))
        else:
            raise ValueError(f"unknown tsquery item type {kind}")
    it = iter(items)

    def infix(parent: int, right_phrase: bool) -> str:
        item = next(it)
        if item[0] == "v":
            _, word, weight, prefix = item
            text = _lexeme(word)
            if weight or prefix:
                text += ":" + ("*" if prefix else "")
                text += "".join(
                    c for bit, c in ((8, "A"), (4, "B"), (2, "C"), (1, "D")) if weight & bit
                )
            return text
        _, op, dist = item
        sym, prio = _TSQ_OPS[op]
        if op == 1:
            inner = "!" + infix(prio, False)
            return f"( {inner} )" if prio < parent else inner
        right = infix(prio, op == 4)
        left = infix(prio, False)
        if op == 4 and dist != 1:
            sym = f" <{dist}> "
        text = left + sym + right
        return f"( {text} )" if prio < parent or (op == 4 and right_phrase) else text

    return infix(-1, False)


# type oid -> converter
CONVERTERS = {
    18: char,
    600: point,
    601: lseg,
    602: path,
    603: box,
    604: polygon,
    628: line,
    718: circle,
    790: money,
    1560: bits,
    1562: bits,
    829: macaddr,
    774: macaddr,
    27: tid,
    28: uint32,
    29: uint32,
    5069: uint64,
    3220: pg_lsn,
    142: utf8,  # xml
    1790: utf8,  # refcursor
    4072: jsonpath,
    2970: snapshot,
    5038: snapshot,
    22: int_vector,
    30: int_vector,
    3614: tsvector,
    3615: tsquery,
}
# reg* types send their OID; the name needs the catalog, so the binary value is the OID's text
REG_TYPES = (24, 2202, 2203, 2204, 2205, 2206, 3734, 3769, 4089, 4096, 4191)
for _oid in REG_TYPES:
    CONVERTERS[_oid] = uint32
