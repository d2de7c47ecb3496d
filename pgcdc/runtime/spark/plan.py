"""How a generated codec's dataclasses map onto its Spark structs: the plan every Spark
conversion (Arrow batches, rows) follows.

The generator emits, per struct, its columns in StructType order as
(column name, attribute, role, nested class name or None); the role is VALUE for a raw value,
LSN_TEXT or TIMESTAMP for a convenience column computed from the attribute. The Spark (or
Arrow) type of the column says how the value converts; the plan says where it comes from.
Importing this module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

__all__ = [
    "VALUE",
    "LSN_TEXT",
    "TIMESTAMP",
    "TS_MIN_US",
    "TS_MAX_US",
    "ColumnPlan",
    "StructPlan",
    "compile_plans",
    "first_bad_string",
]

VALUE, LSN_TEXT, TIMESTAMP = "value", "lsn_text", "timestamp"
# <field>_ts is set only within 0001-01-02 .. 9999-12-30 (PostgreSQL micros since 2000-01-01),
# the values both Python's datetime and Spark's TimestampType hold.
TS_MIN_US = -63_082_195_200_000_000
TS_MAX_US = 252_455_443_200_000_000


@dataclass(frozen=True)
class ColumnPlan:
    name: str  # the Spark field
    attr: str  # the dataclass attribute it comes from
    role: str
    nested: StructPlan | None  # the struct plan of a part or repeat element
    get: attrgetter


@dataclass(frozen=True)
class StructPlan:
    name: str  # the codec's class name
    cls: type
    columns: tuple[ColumnPlan, ...]

    @property
    def raw(self) -> tuple[ColumnPlan, ...]:
        return tuple(c for c in self.columns if c.role == VALUE)


def compile_plans(table: dict, classes) -> dict[str, StructPlan]:
    """StructPlans by class name from the generated table; `classes` is the codec's module
    of dataclasses."""
    plans: dict[str, StructPlan] = {}

    def plan(name: str) -> StructPlan:
        if name not in plans:
            columns = tuple(
                ColumnPlan(
                    col, attr, role, None if nested is None else plan(nested), attrgetter(attr)
                )
                for col, attr, role, nested in table[name]
            )
            plans[name] = StructPlan(name, getattr(classes, name), columns)
        return plans[name]

    for name in table:
        plan(name)
    return plans


def first_bad_string(value, plan: StructPlan, path: tuple) -> tuple | None:
    """The field path of the first string (in wire order) that is not valid UTF-8, or None.

    The codec keeps such strings with surrogateescape; Spark's StringType cannot hold them."""
    for column in plan.raw:
        found = _bad_in(column.get(value), column.nested, (*path, column.attr))
        if found:
            return found
    return None


def _bad_in(value, nested, path):
    if isinstance(value, str):
        return None if value.isascii() or _encodes(value) else path
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            found = _bad_in(item, nested, (*path, i))
            if found:
                return found
        return None
    if value is not None and nested is not None:
        return first_bad_string(value, nested, path)
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
