"""Loading a row's TupleData columns into Python values."""

from __future__ import annotations

import copy
import struct
from collections.abc import Sequence
from operator import itemgetter

from psycopg import pq
from psycopg.adapt import AdaptersMap, Loader, Transformer

from pgcdc.errors import DataError
from pgcdc.values._catalog import REG_ARRAY_ELEMENTS, REG_TYPES, Catalog
from pgcdc.values._loaders import ADAPTERS, ARRAY_OIDS, FAST_ADAPTERS, AdaptContext
from pgcdc.values._special import UNCHANGED, RawValue, ValueLoadError

TEXT, BINARY = pq.Format.TEXT, pq.Format.BINARY

# Send-format sizes of fixed-size built-in types. psycopg's C loaders trust the length, so a
# short value would be read past its end: it is checked here first.
BINARY_SIZES = {
    16: 1, 18: 1, 20: 8, 21: 2, 23: 4, 26: 4, 27: 6, 28: 4, 29: 4, 700: 4, 701: 8,
    600: 16, 601: 32, 603: 32, 628: 24, 718: 24, 774: 8, 790: 8, 829: 6,
    1082: 4, 1083: 8, 1114: 8, 1184: 8, 1186: 16, 1266: 12, 2950: 16, 3220: 8, 5069: 8,
}  # fmt: skip
for _oid in (24, 2202, 2203, 2204, 2205, 2206, 3734, 3769, 4089, 4096, 4191):  # reg*: an OID
    BINARY_SIZES[_oid] = 4
_ARRAY_HEAD, _I32 = struct.Struct("!iiI"), struct.Struct("!i")


def check_binary_array(data) -> None:
    """Raise ValueError unless ``data`` is a well-formed array_send value: psycopg's C array
    loader trusts the lengths inside and would read past the end of a truncated one."""
    size = len(data)
    if size < 12:
        raise ValueError(f"a binary array is at least 12 bytes, got {size}")
    ndim, _flags, elem = _ARRAY_HEAD.unpack_from(data, 0)
    if not 0 <= ndim <= 6 or size < 12 + 8 * ndim:
        raise ValueError(f"binary array header: {ndim} dimensions in {size} bytes")
    count = 1 if ndim else 0
    for d in range(ndim):
        count *= _I32.unpack_from(data, 12 + 8 * d)[0]
    fixed = BINARY_SIZES.get(elem)
    pos = 12 + 8 * ndim
    for i in range(count):
        if pos + 4 > size:
            raise ValueError(f"binary array truncated at element {i} of {count}")
        n = _I32.unpack_from(data, pos)[0]
        pos += 4
        if n < 0:
            continue  # NULL
        if fixed is not None and n != fixed:
            raise ValueError(f"binary array element {i} is {n} bytes, its type has {fixed}")
        pos += n
    if pos != size:
        raise ValueError(f"binary array: {count} elements end at byte {pos} of {size}")


FIRST_NORMAL_OID = 16384  # types made by initdb (built in) have smaller OIDs


class UntypedValue(DataError, ValueError):
    """A value of a type that is not built in and that no catalog describes: its text or
    bytes would be passed off as something it is not (an enum's bytes as hex, a composite's
    text as a string)."""


def _untyped_loader(fmt):
    class _Untyped(Loader):
        format = fmt

        def load(self, data):
            raise UntypedValue(
                f"type OID {self.oid} is not built in and the capture's catalog does not "
                "describe it: capture with pgcdc capture (it records catalog.jsonl) or "
                "read with lenient mode to get the raw value"
            )

    return _Untyped


_UNTYPED = (_untyped_loader(TEXT), _untyped_loader(BINARY))
# (id of the base map, oids, regs) -> (the base map, the refusing map): the base is kept
# with it, so its id cannot be reused by another map while the entry stands
_refusing_maps: dict[tuple, tuple[AdaptersMap, AdaptersMap]] = {}


_REG_TYPES = frozenset(REG_TYPES)


class _UnnamedReg(Loader):
    format = BINARY

    def load(self, data):
        raise UntypedValue(
            f"a binary slot sends a reg* value (type OID {self.oid}) as the OID "
            f"{int.from_bytes(data, 'big')}, and there is no catalog to name it: capture with "
            "pgcdc capture (it records the names) or read with lenient mode"
        )


def _refusing(adapters: AdaptersMap, oids: frozenset[int], regs=frozenset()) -> AdaptersMap:
    """``adapters`` with loaders that raise :class:`UntypedValue` for ``oids`` (and for the
    binary values of the reg* types ``regs``)."""
    key = (id(adapters), oids, regs)
    hit = _refusing_maps.get(key)
    if hit is not None and hit[0] is adapters:
        return hit[1]
    out = AdaptersMap(adapters)
    for oid in oids:
        for loader in _UNTYPED:
            out.register_loader(oid, loader)
    for oid in regs:
        out.register_loader(oid, _UnnamedReg)
    if len(_refusing_maps) > 1000:
        _refusing_maps.clear()
    _refusing_maps[key] = (adapters, out)
    return out


def untyped_oids(type_oids, catalog: Catalog | None) -> frozenset[int]:
    """The OIDs among ``type_oids`` whose values cannot be typed: not built in, and not
    described by ``catalog``."""
    return frozenset(
        o
        for o in type_oids
        if o >= FIRST_NORMAL_OID and (catalog is None or not catalog.describes(o))
    )


class RowLoader:
    """Built once per (relation, column types); reused for every row of that relation.

    :meth:`load` gives one Python value per column: ``None`` for SQL NULL ('n'),
    :data:`UNCHANGED` for an unchanged TOAST value ('u'), else the value loaded from its text
    ('t') or binary ('b') form. Each column's kind decides, so mixed rows are fine."""

    __slots__ = (
        "type_oids",
        "columns",
        "_n",
        "_text",
        "_binary",
        "_text_loads",
        "_binary_loads",
        "_sizes",
        "_arrays",
        "_all_text",
        "_all_binary",
        "_fixed_values",
        "_fixed_sizes",
        "_columns",
    )

    def __init__(self, type_oids: Sequence[int], *, catalog: Catalog | None = None):
        self.type_oids = tuple(type_oids)
        self.columns = None  # ((name, type name), ...) for errors: see named()
        self._n = len(self.type_oids)
        careful, fast = catalog.adapters if catalog is not None else (ADAPTERS, FAST_ADAPTERS)
        untyped = untyped_oids(self.type_oids, catalog)
        # reg* values (or arrays of them, which load their elements through these): without
        # a catalog a binary one is an OID nobody can name
        regs = _REG_TYPES if catalog is None and not _REG_TYPES.isdisjoint(
            REG_ARRAY_ELEMENTS.get(o, o) for o in self.type_oids
        ) else frozenset()  # fmt: skip
        if untyped or regs:
            careful = _refusing(careful, untyped, regs)
            fast = _refusing(fast, untyped, regs)
        # whole rows go through psycopg's batch call on the fast map; a row where it raises
        # (infinity dates, corrupt values) is loaded again column by column, carefully
        self._text = Transformer(AdaptContext(fast))
        self._text.set_loader_types(self.type_oids, TEXT)
        self._binary = Transformer(AdaptContext(fast))
        self._binary.set_loader_types(self.type_oids, BINARY)
        one = Transformer(AdaptContext(careful))
        self._text_loads = [one.get_loader(o, TEXT).load for o in self.type_oids]
        self._binary_loads = [one.get_loader(o, BINARY).load for o in self.type_oids]
        base = catalog.base_type if catalog is not None else int
        self._sizes = tuple(
            (i, BINARY_SIZES[base(o)])
            for i, o in enumerate(self.type_oids)
            if base(o) in BINARY_SIZES
        )
        for i, size in self._sizes:
            self._binary_loads[i] = _sized(self._binary_loads[i], size)
        arrays = ARRAY_OIDS if catalog is None else ARRAY_OIDS | catalog.array_oids
        self._arrays = tuple(i for i, o in enumerate(self.type_oids) if base(o) in arrays)
        for i in self._arrays:
            self._binary_loads[i] = _checked_array(self._binary_loads[i])
        # The common rows, recognised by one list comparison: every column text, or every
        # column binary (a slot sends one format for all columns, NULLs and TOAST aside).
        self._all_text = ["t"] * self._n
        self._all_binary = ["b"] * self._n
        # the fixed-size columns' values, picked in one C call, and the lengths they must have
        idx = [i for i, _ in self._sizes]
        self._fixed_values = _picker(idx)
        self._fixed_sizes = tuple(size for _, size in self._sizes)
        self._columns = None  # load_rows' per-column loaders, made on first use

    def named(self, names: Sequence[str], type_names: Sequence[str]) -> RowLoader:
        """This loader (sharing everything, a shallow copy) with errors that name each column
        and its type."""
        other = copy.copy(self)
        other.columns = tuple(zip(names, type_names))
        return other

    def _error(self, i: int, oid: int, kind: str, message: str) -> ValueLoadError:
        if self.columns is not None and i < len(self.columns):
            name, type_name = self.columns[i]
            return ValueLoadError(i, oid, kind, message, name, type_name)
        return ValueLoadError(i, oid, kind, message)

    def load_rows(self, kinds: list, values: list, count: int) -> list[tuple] | None:
        """``count`` rows at once from their columns' kinds and values, flattened row after
        row (``count * columns`` of each): one C-level pass per column through the loaders
        :meth:`load` uses, then the columns zipped into rows. None when a column holds
        what only :meth:`load` handles (unchanged TOAST, text and binary mixed, a binary
        value of the wrong size); raises on a value that does not load, without saying
        which: the caller loads those rows with :meth:`load`, which does."""
        n = self._n
        if not n or len(values) != n * count:
            return None
        if self._columns is None:
            text = [self._text.get_loader(o, TEXT).load for o in self.type_oids]
            binary = [self._binary.get_loader(o, BINARY).load for o in self.type_oids]
            sizes = dict(self._sizes)
            self._columns = tuple(
                (text[i], binary[i], sizes.get(i), i in self._arrays) for i in range(n)
            )
        columns = []
        for j, (text, binary, size, array) in enumerate(self._columns):
            k = kinds[j::n]
            v = values[j::n]
            texts = k.count("t")
            if texts == count:
                columns.append(list(map(text, v)))
                continue
            nulls = k.count("n")
            if nulls == count:
                columns.append(v)  # None for every NULL
                continue
            if texts:
                if texts + nulls != count:
                    return None
                columns.append([None if x is None else text(x) for x in v])
                continue
            if k.count("b") + nulls != count:
                return None  # unchanged TOAST
            present = [x for x in v if x is not None] if nulls else v
            if size is not None and list(map(len, present)).count(size) != len(present):
                return None  # psycopg's C loaders trust the length
            if array:
                for x in present:
                    check_binary_array(x)
            if nulls:
                columns.append([None if x is None else binary(x) for x in v])
            else:
                columns.append(list(map(binary, v)))
        return list(zip(*columns))

    def load(self, columns: Sequence) -> tuple:
        """Raises :class:`ValueLoadError` (column, type OID, kind) for a value that does not
        load, ``ValueError`` when the row has another number of columns."""
        if len(columns) != self._n:
            raise ValueError(
                f"the row has {len(columns)} columns, the relation {self._n}: the Relation "
                "message for this table is missing or out of date"
            )
        kinds = [c.kind for c in columns]
        values = [c.value for c in columns]
        if kinds == self._all_text:
            try:
                return self._text.load_sequence(values)
            except Exception:  # find the column, say which
                return self._load_each(values, kinds)
        if kinds == self._all_binary and not self._arrays and self._fixed_ok(values):
            try:
                return self._binary.load_sequence(values)
            except Exception:
                return self._load_each(values, kinds)
        try:
            if "b" not in kinds:
                out = self._text.load_sequence(values)
            elif "t" not in kinds and self._sizes_ok(values):
                out = self._binary.load_sequence(values)
            else:
                out = self._load_each(values, kinds)
        except Exception:  # find the column, say which
            out = self._load_each(values, kinds)
        if "u" in kinds:
            out = tuple(UNCHANGED if k == "u" else v for k, v in zip(kinds, out))
        return out

    def _fixed_ok(self, values) -> bool:
        """Every fixed-size binary value has its type's length (no NULLs: the caller saw
        only 'b' kinds)."""
        pick = self._fixed_values
        return pick is None or tuple(map(len, pick(values))) == self._fixed_sizes

    def _sizes_ok(self, values) -> bool:
        for i, size in self._sizes:
            v = values[i]
            if v is not None and len(v) != size:
                return False
        for i in self._arrays:
            if values[i] is not None:
                try:
                    check_binary_array(values[i])
                except (ValueError, struct.error):
                    return False
        return True

    def _load_each(self, values, kinds) -> tuple:
        out = []
        for i, (kind, data) in enumerate(zip(kinds, values)):
            if data is None:
                out.append(None)
                continue
            try:
                out.append((self._binary_loads if kind == "b" else self._text_loads)[i](data))
            except Exception as err:
                raise self._error(i, self.type_oids[i], kind, _describe(err)) from err
        return tuple(out)

    def load_lenient(self, columns: Sequence) -> tuple[tuple, list[ValueLoadError]]:
        """Never raises: a value that does not load stays a :class:`RawValue` and its
        :class:`ValueLoadError` is listed. Columns beyond the relation's stay RawValues with
        type OID 0; missing columns are reported."""
        try:
            return self.load(columns), []
        except ValueError:
            pass
        out, errors = [], []
        for i, col in enumerate(columns):
            kind, data = col.kind, col.value
            oid = self.type_oids[i] if i < self._n else 0
            if kind == "u":
                out.append(UNCHANGED)
            elif data is None:
                out.append(None)
            elif i >= self._n:
                out.append(RawValue(kind, bytes(data), 0))
                errors.append(ValueLoadError(i, 0, kind, f"the relation has {self._n} columns"))
            else:
                try:
                    out.append((self._binary_loads if kind == "b" else self._text_loads)[i](data))
                except Exception as err:
                    out.append(RawValue(kind, bytes(data), oid))
                    errors.append(self._error(i, oid, kind, _describe(err)))
        for i in range(len(columns), self._n):
            errors.append(
                self._error(i, self.type_oids[i], "", f"missing: the row has {len(columns)}")
            )
        return tuple(out), errors


def _picker(indexes: list[int]):
    """A C-speed function giving the values at ``indexes`` as a tuple (None: no indexes)."""
    if not indexes:
        return None
    if len(indexes) == 1:
        (i,) = indexes
        return lambda values: (values[i],)
    return itemgetter(*indexes)


def _sized(load, size: int):
    def checked(data):
        if len(data) != size:
            raise ValueError(f"a binary value of this type is {size} bytes, got {len(data)}")
        return load(data)

    return checked


def _checked_array(load):
    def checked(data):
        check_binary_array(data)
        return load(data)

    return checked


def _describe(err: Exception) -> str:
    text = str(err) or type(err).__name__
    return f"{text} ({type(err).__name__})"
