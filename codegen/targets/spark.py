"""View-model for the Spark target: one StructType per message and part, and the table that
binds pgcdc.runtime.spark (the hand-written decoder driver) to a generated codec.

This module is the Spark translator of the spec: wire types to Spark types, gates to
nullability, semantics to convenience columns. Nothing else in the Spark target decides them.

    Byte1 (choices)    StringType, one character
    Int8  unsigned     ShortType      signed  ByteType
    Int16 unsigned     IntegerType    signed  ShortType
    Int32 unsigned     LongType       signed  IntegerType
    Int64 unsigned     DecimalType(20,0)      signed  LongType
    String             StringType (valid UTF-8 only; otherwise a decode error)
    Byten, Rest        BinaryType
    shared part        StructType
    repeat             ArrayType of the element (struct, or scalar for one-field repeats)

A field is nullable when its gate can leave it off the wire or its tagged block is optional.
Convenience columns sit right after the raw top-level message field they come from:
`<field>_text` (LSN as PostgreSQL prints it) for `semantic: lsn` and `<field>_ts`
(TimestampType) for `semantic: timestamp`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import SpecError
from ..model import BYTE1, BYTEN, REST, STRING, Block, Field, Spec, implicit_fields, snake_case

TYPE_COLUMN = "type"  # MESSAGE_SCHEMA's discriminator: the message's class name
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
# Markdown rows for the generated schema's docstring.
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
    ("Byten, rest of message", "bytes", "BinaryType", ""),
    ("repeat", "tuple", "ArrayType(element, containsNull=false)", ""),
    ("shared part", "dataclass", "StructType", ""),
]
# The runtime's column roles (pgcdc.runtime.spark.plan): a raw value, or one computed from it.
VALUE, LSN_TEXT, TIMESTAMP = "value", "lsn_text", "timestamp"
# Names the generated wrappers take for themselves; a spec parameter may not use them.
RESERVED_ARGS = {"df", "data_col", "mode", "data", "engine"}
# The JVM target's Java decoder (codegen/targets/jvm.py): its package, and its class per codec.
JAVA_PACKAGE = "pgcdc.codec"


def java_class_name(package: str) -> str:
    """pgoutput_codec -> PgoutputCodecDecoder."""
    return "".join(p[:1].upper() + p[1:] for p in package.split("_")) + "Decoder"


@dataclass
class SparkField:
    """One StructField of a generated StructType, and where its value comes from."""

    name: str
    spark: str  # Python expression for the pyspark DataType
    nullable: bool
    description: str
    attr: str  # the attribute of the codec's dataclass it is built from
    role: str = VALUE
    nested: str | None = None  # class name of a part or repeat element (struct values)


@dataclass
class SparkStruct:
    name: str  # the codec's class name
    description: str
    const: str  # e.g. BEGIN_STRUCT
    fields: list[SparkField] = field(default_factory=list)
    column: str = ""  # messages: the struct's column in MESSAGE_SCHEMA ("" without fields)
    tag: str = ""
    since: int = 0


def _const(class_name: str) -> str:
    return snake_case(class_name).upper() + "_STRUCT"


def spark_type(f: Field) -> str:
    """The Spark type of one wire field (repeats and convenience columns are built on it)."""
    if f.is_int:
        return SPARK_INT[(f.type, bool(f.signed))]
    if f.type in (BYTE1, STRING):
        return "StringType()"
    if f.type in (BYTEN, REST):
        return "BinaryType()"
    return _const(f.type)


def nullable(f: Field, block: Block) -> bool:
    """Gates -> nullability: null exactly when the field can be absent from the wire."""
    return not f.gate.always or (block.kind == "tagged" and block.optional)


class SparkView:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.package = spec.targets.package
        self.jvm_class = f"{JAVA_PACKAGE}.{java_class_name(self.package)}"
        self.jvm_file = f"jvm/{java_class_name(self.package)}.java"
        self.nested: list[SparkStruct] = []  # parts and repeat elements, before their users
        self.by_name: dict[str, SparkStruct] = {}
        for p in spec.parts:
            self._struct(p.class_name, p.description, p.blocks, top=False)
        self.messages = [
            self._struct(
                m.class_name,
                m.description,
                m.blocks,
                top=True,
                tag=m.tag,
                since=m.since,
                line=m.line,
            )
            for m in spec.messages
        ]
        self.message_columns = [m for m in self.messages if m.fields]
        self.empty_messages = [m for m in self.messages if not m.fields]
        for m in self.message_columns:
            m.column = m.const.removesuffix("_STRUCT").lower()
            if m.column == TYPE_COLUMN:  # the column cannot shadow the discriminator
                m.column += "_message"
        self.mapping_rows = MAPPING_ROWS
        used = {"StringType", "StructField", "StructType"}
        for st in self.nested + self.messages:
            for f in st.fields:
                used |= set(re.findall(r"\b([A-Z][A-Za-z]*Type)\(", f.spark))
        self.spark_imports = sorted(used)
        self.version = spec.version
        self.modes = spec.modes
        self.stream_contexts = [
            (
                c,
                [
                    (m.tag, value)
                    for m in spec.messages
                    for name, value in m.sets_context
                    if name == c.name
                ],
            )
            for c in spec.per_message_contexts
        ]
        self._check_names()

    def _check_names(self) -> None:
        for p in self.spec.parameters:
            if p.name in RESERVED_ARGS or p.name.endswith("_col"):
                raise SpecError(
                    self.spec.source_name,
                    0,
                    ("parameters",),
                    f"parameter {p.name!r} clashes with the Spark decoder's arguments",
                )

    # -- structs -------------------------------------------------------------
    def _struct(self, name, description, blocks, *, top, tag="", since=0, line=0) -> SparkStruct:
        s = SparkStruct(name, description, _const(name), tag=tag, since=since)
        implicit = implicit_fields(blocks)
        for bi, b in enumerate(blocks):
            if b.kind == "repeat":
                s.fields.append(self._repeat(b))
                continue
            fields = b.fields[1:] if top and bi == 0 else b.fields  # a message's tag byte
            for f in fields:
                if f.is_literal or f.name in implicit:
                    continue
                s.fields.append(
                    SparkField(
                        f.name,
                        spark_type(f),
                        nullable(f, b),
                        f.description,
                        f.name,
                        nested=f.type if f.is_part else None,
                    )
                )
                if top:
                    s.fields.extend(self._convenience(f, nullable(f, b), name, line))
        self.by_name[name] = s
        if not top:
            self.nested.append(s)
        return s

    def _repeat(self, b: Block) -> SparkField:
        if len(b.fields) == 1:
            f = b.fields[0]
            element, nested = spark_type(f), f.type if f.is_part else None
        else:
            self._struct(b.struct, b.description, (Block("header", b.fields),), top=False)
            element, nested = _const(b.struct), b.struct
        return SparkField(
            b.name,
            f"ArrayType({element}, False)",
            False,
            b.description or b.fields[0].description,
            b.name,
            nested=nested,
        )

    def _convenience(self, f: Field, null: bool, owner: str, line: int) -> list[SparkField]:
        if f.semantic == "lsn":
            if f.type != "Int64" or f.signed:
                raise SpecError(
                    self.spec.source_name,
                    f.line or line,
                    (owner, f.name),
                    "semantic lsn needs an unsigned Int64 (Spark: <name>_text)",
                )
            return [
                SparkField(
                    f"{f.name}_text",
                    "StringType()",
                    null,
                    f"{f.name} as PostgreSQL prints an LSN (X/Y).",
                    f.name,
                    LSN_TEXT,
                )
            ]
        if f.semantic == "timestamp":
            if not (f.is_int and f.signed):
                raise SpecError(
                    self.spec.source_name,
                    f.line or line,
                    (owner, f.name),
                    "semantic timestamp needs a signed integer (Spark: <name>_ts)",
                )
            return [
                SparkField(
                    f"{f.name}_ts",
                    "TimestampType()",
                    True,
                    f"{f.name} as a timestamp; null when {f.name} is null or outside "
                    "0001-01-02 .. 9999-12-30 (e.g. PostgreSQL's +-infinity).",
                    f.name,
                    TIMESTAMP,
                )
            ]
        return []

    # -- the generated wrappers' signatures ------------------------------------
    @property
    def decode_params(self) -> list[str]:
        """decode_messages' keyword parameters: the spec's parameters, then one column name
        per per-message context."""
        v = self.version
        out = [v.name if v.default is None else f"{v.name}={v.default!r}"]
        out += [f"{m.name}={m.default!r}" for m in self.modes]
        out += [f"{c.name}_col=None" for c in self.spec.per_message_contexts]
        return out

    @property
    def codec_params(self) -> list[str]:
        """decode_row's keyword parameters: those of the codec's decode()."""
        v = self.version
        out = [v.name if v.default is None else f"{v.name}={v.default!r}"]
        out += [f"{m.name}={m.default!r}" for m in self.modes]
        out += [f"{c.name}=False" for c in self.spec.per_message_contexts]
        return out


def outputs(spec: Spec):
    view = SparkView(spec)
    ctx = {"view": view}
    yield f"{view.package}/spark_schema.py", "spark/spark_schema.py.j2", ctx
    yield f"{view.package}/spark.py", "spark/spark.py.j2", ctx
