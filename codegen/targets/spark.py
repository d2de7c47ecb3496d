"""View-model for the Spark target: Spark schemas, the lossless type mapping, and an Arrow decoder.

The decoder reuses the Python target's decode steps (the same struct runs, gates and error
builders), but each message decodes into a plain tuple that Arrow converts in bulk, and strings
must be valid UTF-8 because Spark's StringType cannot hold anything else.

Type mapping (the one table every generated Spark file and the README follow):

    Byte1 (choices)    StringType, one character
    Int8  unsigned     ShortType      signed  ByteType
    Int16 unsigned     IntegerType    signed  ShortType
    Int32 unsigned     LongType       signed  IntegerType
    Int64 unsigned     DecimalType(20,0)      signed  LongType
    String             StringType (valid UTF-8 only; otherwise a decode error)
    Byten              BinaryType
    shared part        StructType
    repeat             ArrayType of the element (struct, or scalar for one-field repeats)

Convenience columns sit right after the raw top-level message field they come from:
`<field>_text` (StringType, LSN as PostgreSQL prints it) for `semantic: lsn`, and `<field>_ts`
(TimestampType) for `semantic: timestamp`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..model import BYTE1, BYTEN, STRING, Field, Spec, snake_case
from .python import ClassView, PythonView
from .python import sub as python_sub

TYPE_COLUMN = "type"  # MESSAGE_SCHEMA's discriminator: the message's class name
# (wire type, signed) -> (Spark type, Python-side arrow "raw" builder kind)
SPARK_INT = {
    ("Int8", False): "ShortType()",
    ("Int8", True): "ByteType()",
    ("Int16", False): "IntegerType()",
    ("Int16", True): "ShortType()",
    ("Int32", False): "LongType()",
    ("Int32", True): "IntegerType()",
    ("Int64", False): "DecimalType(20, 0)",
    ("Int64", True): "LongType()",
}
# Markdown rows for the README / module docstrings.
MAPPING_ROWS = [
    ("Byte1 (choice)", "str (1 char)", "StringType", "the one character"),
    ("Int8 unsigned", "int 0..255", "ShortType", "ByteType stops at 127"),
    ("Int8 signed", "int", "ByteType", ""),
    ("Int16 unsigned", "int 0..65535", "IntegerType", "ShortType stops at 32767"),
    ("Int16 signed", "int", "ShortType", ""),
    (
        "Int32 unsigned (oid, xid, counts)",
        "int 0..2^32-1",
        "LongType",
        "IntegerType stops at 2^31-1",
    ),
    ("Int32 signed", "int", "IntegerType", ""),
    ("Int64 unsigned (LSN)", "int 0..2^64-1", "DecimalType(20,0)", "LongType stops at 2^63-1"),
    ("Int64 signed (timestamp)", "int", "LongType", "microseconds since 2000-01-01 UTC, raw"),
    ("String", "str", "StringType", "must be valid UTF-8, see below"),
    ("Byten, tuple column value", "bytes", "BinaryType", ""),
    ("repeat", "tuple", "ArrayType(element, containsNull=false)", ""),
    ("shared part (TupleData)", "dataclass", "StructType", "columns: array<struct<kind, value>>"),
]


@dataclass
class SparkField:
    """One StructField of a generated StructType."""

    name: str
    spark: str  # Python expression for the pyspark DataType
    nullable: bool
    description: str
    # how decode_messages builds the top-level column: plain | u64 | lsn_text | ts
    build: str = "plain"
    source: int = 0  # index of the raw value in the decoded tuple
    # to_row / from_row conversion: scalar | u64 | part | repeat_struct | repeat_scalar | repeat_u64
    conv: str = "scalar"
    ref: str = ""  # part / element class name for part / repeat_struct
    convenience: bool = False


@dataclass
class SparkStruct:
    cls: ClassView
    const: str  # e.g. BEGIN_SCHEMA
    column: str  # column name in MESSAGE_SCHEMA (messages only)
    fields: list[SparkField] = field(default_factory=list)
    is_message: bool = False

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def func(self) -> str:
        return self.cls.func

    @property
    def raw_fields(self) -> list[SparkField]:
        return [f for f in self.fields if not f.convenience]


def _pg_micros(when: datetime) -> int:
    """A naive UTC datetime as PostgreSQL timestamp microseconds (since 2000-01-01)."""
    return (when - datetime(2000, 1, 1)) // timedelta(microseconds=1)


def _const(class_name: str) -> str:

    return snake_case(class_name).upper() + "_STRUCT"


class SparkView:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.py = PythonView(spec)
        self.by_class: dict[str, SparkStruct] = {}
        # Elements and parts first so message structs can refer to them.
        ordered = [c for c in self.py.classes if c.is_element or c.is_part]
        self.nested = [self._struct(c) for c in ordered]
        self.messages = [self._struct(c) for c in self.py.messages]
        self.message_columns = [m for m in self.messages if m.fields]
        self.empty_messages = [m for m in self.messages if not m.fields]
        self.contexts = spec.contexts
        self.mapping_rows = MAPPING_ROWS
        # how the Python view names a part's path: one `_path` argument or (_parent, _name)
        used = {"StringType", "StructField", "StructType"}
        for st in self.nested + self.messages:
            for f in st.fields:
                used |= set(re.findall(r"\b([A-Z][A-Za-z]*Type)\(", f.spark))
        self.spark_imports = sorted(used)
        self.ts_min_us = _pg_micros(datetime(1, 1, 2))
        self.ts_max_us = _pg_micros(datetime(9999, 12, 30))
        self.stream_tags = [
            (m.tag, value)
            for m in spec.messages
            for name, value in m.sets_context
            if name == "in_stream"
        ]

    # -- types ---------------------------------------------------------------
    def _field_type(self, f: Field) -> tuple[str, str]:
        if f.is_int:
            spark = SPARK_INT[(f.type, bool(f.signed))]
            return spark, ("u64" if spark.startswith("Decimal") else "scalar")
        if f.type in (BYTE1, STRING):
            return "StringType()", "scalar"
        if f.type == BYTEN:
            return "BinaryType()", "scalar"
        return _const(f.type), "part"

    def _struct(self, c: ClassView) -> SparkStruct:
        column = c.message.snake_name if c.message else ""
        if column == TYPE_COLUMN:  # the Type message: its struct cannot shadow the type column
            column += "_message"
        s = SparkStruct(c, _const(c.name), column, is_message=c.message is not None)
        fields_by_name = {f.name: f for b in self._blocks(c) for f in b.fields}
        for index, a in enumerate(c.attrs):
            f = fields_by_name.get(a.name)
            if a.kind == "repeat":
                elem = self._repeat_block(c, a.name)
                if len(elem.fields) == 1:
                    spark, conv = self._field_type(elem.fields[0])
                    conv = "repeat_u64" if conv == "u64" else "repeat_scalar"
                    ref = ""
                else:
                    spark, conv, ref = _const(elem.struct), "repeat_struct", elem.struct
                s.fields.append(
                    SparkField(
                        a.name,
                        f"ArrayType({spark}, False)",
                        False,
                        a.description,
                        "plain",
                        index,
                        conv,
                        ref,
                    )
                )
                continue
            spark, conv = self._field_type(f)
            build = "u64" if conv == "u64" else "plain"
            ref = f.type if conv == "part" else ""
            s.fields.append(
                SparkField(a.name, spark, a.optional, a.description, build, index, conv, ref)
            )
            if c.message and a.semantic == "lsn" and conv == "u64":
                s.fields.append(
                    SparkField(
                        f"{a.name}_text",
                        "StringType()",
                        a.optional,
                        f"{a.name} as PostgreSQL prints an LSN (X/Y).",
                        "lsn_text",
                        index,
                        convenience=True,
                    )
                )
            if c.message and a.semantic == "timestamp" and f.is_int and f.signed:
                s.fields.append(
                    SparkField(
                        f"{a.name}_ts",
                        "TimestampType()",
                        True,
                        f"{a.name} as a timestamp; null when {a.name} is null or outside "
                        "0001-01-02 .. 9999-12-30 (e.g. PostgreSQL's +-infinity).",
                        "ts",
                        index,
                        convenience=True,
                    )
                )
        self.by_class[c.name] = s
        return s

    def _blocks(self, c: ClassView):
        if c.message:
            return c.message.blocks
        if c.is_part:
            return self.spec.part(c.name).blocks
        # a repeat element: the fields of the repeat block that names it
        owners = [m.blocks for m in self.spec.messages] + [p.blocks for p in self.spec.parts]
        return [next(b for blocks in owners for b in blocks if b.struct == c.name)]

    def _repeat_block(self, c: ClassView, name: str):
        return next(b for b in self._blocks(c) if b.kind == "repeat" and b.name == name)


def outputs(spec: Spec):
    view = SparkView(spec)
    ctx = {"view": view, "pyview": view.py, "sub": python_sub}
    yield "pgoutput_codec/spark_schema.py", "spark/spark_schema.py.j2", ctx
    yield "pgoutput_codec/spark.py", "spark/spark.py.j2", ctx
