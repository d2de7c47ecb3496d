"""Loading a row's TupleData columns into Python values."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import pq
from psycopg.adapt import Transformer

from ._catalog import Catalog
from ._loaders import ADAPTERS, AdaptContext
from ._special import UNCHANGED, RawValue, ValueLoadError

TEXT, BINARY = pq.Format.TEXT, pq.Format.BINARY


class RowLoader:
    """Built once per (relation, column types); reused for every row of that relation.

    :meth:`load` gives one Python value per column: ``None`` for SQL NULL ('n'),
    :data:`UNCHANGED` for an unchanged TOAST value ('u'), else the value loaded from its text
    ('t') or binary ('b') form. Each column's kind decides, so mixed rows are fine."""

    __slots__ = ("type_oids", "_n", "_text", "_binary", "_text_loads", "_binary_loads")

    def __init__(self, type_oids: Sequence[int], *, catalog: Catalog | None = None):
        self.type_oids = tuple(type_oids)
        self._n = len(self.type_oids)
        ctx = AdaptContext(catalog.adapters if catalog is not None else ADAPTERS)
        self._text = Transformer(ctx)
        self._text.set_loader_types(self.type_oids, TEXT)
        self._binary = Transformer(ctx)
        self._binary.set_loader_types(self.type_oids, BINARY)
        self._text_loads = [self._text.get_loader(o, TEXT).load for o in self.type_oids]
        self._binary_loads = [self._binary.get_loader(o, BINARY).load for o in self.type_oids]

    def load(self, columns: Sequence) -> tuple:
        """Raises :class:`ValueLoadError` (column, type OID, kind) for a value that does not
        load, ``ValueError`` when the row has another number of columns."""
        if len(columns) != self._n:
            raise ValueError(
                f"the row has {len(columns)} columns, the relation {self._n}: the Relation "
                "message for this table is missing or out of date"
            )
        values = [c.value for c in columns]
        kinds = "".join([c.kind for c in columns])
        try:
            if "b" not in kinds:
                out = self._text.load_sequence(values)
            elif "t" not in kinds:
                out = self._binary.load_sequence(values)
            else:
                out = self._load_each(values, kinds)
        except Exception:  # find the column, say which
            out = self._load_each(values, kinds)
        if "u" in kinds:
            out = tuple(UNCHANGED if k == "u" else v for k, v in zip(kinds, out))
        return out

    def _load_each(self, values, kinds) -> tuple:
        out = []
        for i, (kind, data) in enumerate(zip(kinds, values)):
            if data is None:
                out.append(None)
                continue
            try:
                out.append((self._binary_loads if kind == "b" else self._text_loads)[i](data))
            except Exception as err:
                raise ValueLoadError(i, self.type_oids[i], kind, _describe(err)) from err
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
                    errors.append(ValueLoadError(i, oid, kind, _describe(err)))
        for i in range(len(columns), self._n):
            errors.append(
                ValueLoadError(i, self.type_oids[i], "", f"missing: the row has {len(columns)}")
            )
        return tuple(out), errors


def _describe(err: Exception) -> str:
    text = str(err) or type(err).__name__
    return f"{text} ({type(err).__name__})"
