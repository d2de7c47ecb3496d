"""Spark for every generated codec: decode a binary column of messages into MESSAGE_SCHEMA.

A generated `<package>.spark` module holds what its spec determines (the struct table, the
message columns, its decode_messages signature) and binds one SparkCodec to its codec:

    CODEC = SparkCodec(__name__, decoder=_decoder, classes=_messages, ...)

decode_messages runs the codec's own decoder (`decode_gates`, with the C accelerator when it
is built) in mapInArrow and builds the Arrow columns from the decoded objects (.batches,
.arrow), or the codec's generated Java decoder in the JVM (.jvm); no row is pickled.
message_to_row / row_to_message are the same mapping in plain Python (.rows). Importing this
module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

import functools
import importlib

from pgcdc.runtime.spark.jvm import (
    ENGINES,
    JvmUnavailable,
    decode_messages_jvm,
    notice_fallback,
)
from pgcdc.runtime.spark.plan import compile_plans
from pgcdc.runtime.spark.rows import from_row_converter, to_row_converter

__all__ = ["ERROR_COLUMN", "MESSAGE_COLUMN", "MODES", "SparkCodec"]

MESSAGE_COLUMN = "message"
ERROR_COLUMN = "decode_error"
MODES = ("PERMISSIVE", "FAILFAST")


def _decode_spread(decode_gates, data, gates: tuple):
    return decode_gates(data, *gates)


def _codec_in(module: str) -> SparkCodec:
    return importlib.import_module(module).CODEC


class SparkCodec:
    """The Spark side of one generated codec.

    module: the generated spark module (where executors find this object again: a SparkCodec
    pickles as a reference to it). decoder / classes: the codec's _decoder and _messages
    modules. type_names: the message class names in spec order. message_columns: class name ->
    its struct column in MESSAGE_SCHEMA (messages without fields have none). structs: the
    plan table (.plan). context_changes: per-message context -> {tag: value after it}.
    jvm_class / jvm_file: the generated Java decoder's class and its source file in the
    package (decode_messages' JVM engine, .jvm).
    """

    def __init__(
        self,
        module: str,
        *,
        decoder,
        classes,
        type_names,
        message_columns,
        structs,
        context_changes,
        schema_module,
        jvm_class=None,
        jvm_file=None,
    ):
        self.module = module
        self.jvm_class = jvm_class  # the generated Java decoder (.jvm), if any
        self.jvm_file = jvm_file  # its source, relative to the codec's package
        self.decoder = decoder
        self.type_names = tuple(type_names)
        self.message_columns = dict(message_columns)
        self.plans = compile_plans(structs, classes)
        self.context_changes = context_changes
        self.schema_module = schema_module
        self._plan_of_class = {p.cls: p for p in self.plans.values()}
        # decoders that take the gate values as one tuple (decode_tuple) or as arguments
        self._gates_as_tuple = hasattr(decoder, "decode_tuple")
        if self._gates_as_tuple:
            self.decode_tuple = decoder.decode_tuple
        else:
            self.decode_tuple = functools.partial(_decode_spread, decoder.decode_gates)
        self._converters = {}

    def __reduce__(self):
        return _codec_in, (self.module,)

    @property
    def message_schema(self):
        return importlib.import_module(self.schema_module).MESSAGE_SCHEMA

    def plan_of(self, obj):
        return self._plan_of_class[type(obj)]

    def jvm_source(self):
        """The generated Java decoder's source file, or None."""
        if self.jvm_file is None:
            return None
        from pathlib import Path

        package = importlib.import_module(self.module.rsplit(".", 1)[0])
        return Path(package.__file__).parent / self.jvm_file

    # -- DataFrames ----------------------------------------------------------------------
    def decode_messages(
        self, df, data_col: str, args: tuple, context_cols: dict, mode: str, engine: str = "auto"
    ):
        """df with a `message` column (and `decode_error` unless FAILFAST); see the generated
        module's decode_messages for the arguments.

        engine: "jvm" decodes in the JVM with the codec's generated Java decoder (.jvm;
        compiled once with javac into a cached jar), "python" with the codec's own decoder in
        mapInArrow (.batches), "auto" (the default) the JVM when it can (javac or a
        cached jar, a classic session), else Python with a one-line notice in the log. Both
        give the same rows and the same errors."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import BinaryType, BooleanType, StringType, StructField, StructType

        from pgcdc.runtime.spark.batches import map_batches  # lazy: numpy and pyarrow

        params = self.decoder.PARAMS
        params.resolve(*args, *(False for _ in params.per_message))  # ValueError when invalid
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
        failfast = mode.upper() == "FAILFAST"
        names = df.columns
        types = {f.name: f.dataType for f in df.schema.fields}
        if data_col not in names:
            raise ValueError(f"no column {data_col!r} in {names}")
        if not isinstance(types[data_col], BinaryType):
            raise TypeError(
                f"column {data_col!r} must be binary, not {types[data_col].simpleString()}"
            )
        contexts = []
        for context, column in context_cols.items():
            if column is None:
                continue
            if column not in names:
                raise ValueError(
                    f"no column {column!r} in {names}: derive it with with_{context}(df, "
                    f"{data_col!r}, order_by=..., partition_by=...), or pass {context}_col=None "
                    f"if no message is {context}"
                )
            if not isinstance(types[column], BooleanType):
                raise TypeError(
                    f"column {column!r} must be boolean, not {types[column].simpleString()}"
                )
            contexts.append((context, names.index(column), column))
        added = [StructField(MESSAGE_COLUMN, self.message_schema, True)]
        if not failfast:
            added.append(StructField(ERROR_COLUMN, StringType(), True))
        for f in added:
            if f.name in names:
                raise ValueError(f"df already has a column {f.name!r}")
        if engine != "python":
            jvm = self._decode_jvm(df, data_col, args, contexts, failfast, engine)
            if jvm is not None:
                return jvm
        out = StructType(df.schema.fields + added)
        large = str(df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false"))
        arrow_schema = to_arrow_schema(out, timezone="UTC", prefers_large_types=large == "true")
        fn = functools.partial(
            map_batches,
            codec=self,
            args=tuple(args),
            data_index=names.index(data_col),
            contexts=tuple(contexts),
            failfast=failfast,
            out_schema=arrow_schema,
        )
        return df.mapInArrow(fn, out)

    def _decode_jvm(self, df, data_col, args, contexts, failfast, engine):
        """The JVM engine's DataFrame, or None when engine="auto" cannot use it."""
        from pgcdc.runtime.spark.batches import _missing_context_hint  # lazy: numpy and pyarrow

        params = self.decoder.PARAMS
        per_message = [c.name for c in params.per_message]
        hint = _missing_context_hint(params, tuple(args), per_message, contexts)
        try:
            return decode_messages_jvm(self, df, data_col, tuple(args), contexts, failfast, hint)
        except JvmUnavailable as exc:
            if engine == "jvm":
                raise
            notice_fallback(self, str(exc))
            return None

    def with_context(self, df, data_col, context, *, order_by, partition_by=(), out_col):
        """df with a boolean out_col: true when the last message before the row (by order_by
        within partition_by) that changes `context` set it; false for those messages
        themselves, as StreamDecoder and capture files have it.

        A window function: Spark sorts each partition_by group by order_by and scans it in one
        task, so one group's messages are never processed in parallel.
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        tag = F.substring(F.col(data_col), 1, 1)
        sets = F.lit(None).cast("boolean")
        for t, value in self.context_changes[context].items():
            sets = F.when(tag == F.lit(t.encode()), F.lit(value)).otherwise(sets)
        order = list(order_by) if isinstance(order_by, (list, tuple)) else [order_by]
        window = Window.orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
        if partition_by:
            parts = (
                list(partition_by) if isinstance(partition_by, (list, tuple)) else [partition_by]
            )
            window = window.partitionBy(*parts)
        last = F.last(sets, ignorenulls=True).over(window)
        # a message that opens or closes a block is itself outside it (as in StreamDecoder)
        return df.withColumn(
            out_col,
            F.when(sets.isNotNull(), F.lit(False)).otherwise(F.coalesce(last, F.lit(False))),
        )

    # -- rows ----------------------------------------------------------------------------
    def _converter(self, kind: str, name: str):
        key = (kind, name)
        if key not in self._converters:
            make = to_row_converter if kind == "to" else from_row_converter
            struct = self.message_schema[self.message_columns[name]].dataType
            self._converters[key] = make(self.plans[name], struct)
        return self._converters[key]

    def message_to_row(self, msg) -> dict:
        """A decoded message as a MESSAGE_SCHEMA value (a dict; createDataFrame accepts it):
        unsigned 64-bit values as Decimal, repeats as lists, convenience columns filled in,
        every other message's struct None."""
        name = type(msg).__name__
        row = dict.fromkeys(self.message_columns.values())
        row = {"type": name, **row}
        column = self.message_columns.get(name)
        if column is not None:
            row[column] = self._converter("to", name)(msg)
        return row

    def row_to_message(self, row):
        """The inverse of message_to_row for a collected Row (or dict): the codec's dataclass.
        Convenience columns are ignored; Decimal goes back to int and bytearray to bytes."""
        if row is None:
            return None
        name = row["type"]
        column = self.message_columns.get(name)
        if column is None:
            return self.plans[name].cls()
        return self._converter("from", name)(row[column])

    # -- errors --------------------------------------------------------------------------
    def bad_string_offset(self, data: bytes, gates: tuple) -> tuple[int, str]:
        """(byte offset, reason) of the first string in `data` that is not UTF-8, found by
        running the codec's Python decoder over bytes that report their string slices."""
        _name, _since, python_decoder = self.decoder.DISPATCH.messages[data[0]]
        args = (gates,) if self._gates_as_tuple else gates
        try:
            python_decoder(_Tracked(data), len(data), *args)
        except _BadString as bad:
            return bad.offset, bad.reason
        return 0, "invalid"


class _BadString(Exception):
    def __init__(self, offset: int, reason: str):
        super().__init__(offset, reason)
        self.offset, self.reason = offset, reason


class _Tracked(bytes):
    """Message bytes whose slices remember where they start."""

    def __getitem__(self, key):
        got = bytes.__getitem__(self, key)
        return _Slice(got, key.start or 0) if isinstance(key, slice) else got


class _Slice(bytes):
    def __new__(cls, data: bytes, start: int):
        obj = super().__new__(cls, data)
        obj.start = start
        return obj

    def decode(self, encoding="utf-8", errors="strict"):
        try:
            return bytes.decode(self, encoding)
        except UnicodeDecodeError as exc:
            if errors == "strict":
                raise
            raise _BadString(self.start + exc.start, exc.reason) from None
