"""The mapInArrow side of decode_messages: decode the data column of Arrow batches with the
codec's own decoder and build the message column.

Three paths, fastest first: the C accelerator's decode_arrow writes Arrow buffers that
.buffers wraps; its decode_columns appends values to lists per column (.columns);
without the accelerator, or for a batch either declines, rows are decoded into objects one by
one, which also says which rows fail and why.

Rows that cannot be decoded (bad bytes, a null data or context column, a context the version
cannot have, a string Spark cannot hold) get `message` = null and the codec's error text, with
byte offset and field path; FAILFAST raises that error instead.
"""

from __future__ import annotations

from itertools import product, repeat

import numpy as np
import pyarrow as pa

from pgcdc.runtime.decoding import Retry
from pgcdc.runtime.codec_errors import DecodeError
from pgcdc.runtime.spark.arrow import scatter, struct_array
from pgcdc.runtime.spark.buffers import ArrowBlocks, TooLarge
from pgcdc.runtime.spark.columns import columns_struct_array
from pgcdc.runtime.spark.plan import first_bad_string

__all__ = ["BatchDecoder", "map_batches"]

MESSAGE_COLUMN = "message"
ERROR_COLUMN = "decode_error"


def map_batches(batches, *, codec, args, data_index, contexts, failfast, out_schema):
    """The function decode_messages hands to mapInArrow: the input columns pass through,
    `message` (and, unless failfast, `decode_error`) are appended."""
    decoder = BatchDecoder(
        codec, args, data_index, contexts, failfast, out_schema.field(MESSAGE_COLUMN).type
    )
    for batch in batches:
        message, errors = decoder.decode(batch)
        arrays = [*batch.columns, message]
        if not failfast:
            error_type = out_schema.field(ERROR_COLUMN).type
            arrays.append(
                pa.nulls(batch.num_rows, error_type) if errors is None else errors.cast(error_type)
            )
        yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def _missing_context_hint(params, args: tuple, per_message: list, contexts) -> str:
    """A row that fails to decode may only have been decoded in the wrong context: a
    per-message context the parameters allow but no column gives is false for every row. Say
    so in the error, with the fix."""
    given = {name for name, _, _ in contexts}
    enabled = {
        name for mode, value in zip(params.modes, args[1:]) for name in mode.enables.get(value, ())
    }
    for name in per_message:
        if name in given or name not in enabled:
            continue  # given per row, or these parameters never turn it on: nothing missed
        return (
            f" (hint: no {name}_col was given, so {name} was false for every row; if this "
            f"message was sent with {name} true, pass {name}_col: with_{name}(df, data_col, "
            "order_by=...) derives it)"
        )
    return ""


class BatchDecoder:
    """Decodes batches for one decode_messages call.

    args: the codec parameters (version, modes...); contexts: (context name, column index,
    column name) for each per-message context read from a column, the others being false.
    """

    def __init__(self, codec, args: tuple, data_index: int, contexts, failfast, message_type):
        self.codec = codec
        self.decode_tuple = codec.decode_tuple
        self.data_index = data_index
        self.flag_indexes = [index for _, index, _ in contexts]
        self.failfast = failfast
        params = codec.decoder.PARAMS
        per_message = [c.name for c in params.per_message]
        # gates for each combination of the context columns' values; an error where invalid
        self.gates_for: dict[tuple, tuple | DecodeError] = {}
        for flags in product((False, True, None), repeat=len(contexts)):
            given = dict.fromkeys(per_message, False)
            given.update((name, flag) for (name, _, _), flag in zip(contexts, flags))
            null = [col for (_, _, col), flag in zip(contexts, flags) if flag is None]
            if null:
                self.gates_for[flags] = DecodeError(0, (), f"the {null[0]} column is null")
                continue
            try:
                self.gates_for[flags] = params.resolve(*args, *given.values())
            except ValueError as exc:
                self.gates_for[flags] = DecodeError(0, (), str(exc))
        self.base_gates = self.gates_for[(False,) * len(contexts)]
        self.hint = _missing_context_hint(params, args, per_message, contexts)
        self.allowed = [
            {flag for flag in (False, True) if not self._invalid(i, flag)}
            for i in range(len(contexts))
        ]
        # one entry per message type, in TYPE_NAMES order, plus one for "no message"
        fields = list(message_type)
        self.fields = fields
        self.code_of = {type(None): len(codec.type_names)}
        self.builds = []
        for k, name in enumerate(codec.type_names):
            self.code_of[codec.plans[name].cls] = k
            column = codec.message_columns.get(name)
            index = None if column is None else message_type.get_field_index(column)
            self.builds.append(None if index is None else (index, codec.plans[name]))
        self.names = pa.array([*codec.type_names, ""], fields[0].type)
        # the accelerator's whole-batch decoder into columns, when it is built and in use
        dispatch = codec.decoder.DISPATCH
        speedups = dispatch.speedups if dispatch.accelerated else None
        self.decode_columns = getattr(speedups, "decode_columns", None)
        # its whole-batch decoder into Arrow buffers (accelerators built before it lack it)
        self.decode_arrow = getattr(speedups, "decode_arrow", None)
        layout = getattr(speedups, "ARROW_LAYOUT", None)
        self.arrow_blocks = None if layout is None else ArrowBlocks(layout)

    def _invalid(self, i: int, flag: bool) -> bool:
        key = [False] * len(self.flag_indexes)
        key[i] = flag
        return isinstance(self.gates_for[tuple(key)], DecodeError)

    # -- decoding ------------------------------------------------------------------------
    def decode(self, batch):
        """(message StructArray, error StringArray or None) for one RecordBatch."""
        if self.decode_arrow is not None:
            message = self._decode_arrow(batch)
            if message is not None:
                return message, None
        if self.decode_columns is not None:
            message = self._decode_columns(batch)
            if message is not None:
                return message, None
        n = batch.num_rows
        datas = batch.column(self.data_index).to_pylist()
        flags = [batch.column(i).to_pylist() for i in self.flag_indexes]
        objs, errors = self._decode_rows(datas, flags)
        while True:
            try:
                message = self._assemble(objs, n, bool(errors))
                break
            except UnicodeEncodeError:  # a string Spark cannot hold: those rows become errors
                if not self._reject_bad_strings(objs, datas, flags, errors):
                    raise
        if not errors:
            return message, None
        texts = [None] * n
        for i, err in errors.items():
            texts[i] = str(err)
        return message, pa.array(texts, pa.string())

    def _accelerator_args(self, batch):
        """The arguments of the accelerator's whole-batch decoders for this batch, or None when
        any row needs the row-by-row path (a null, a context it cannot have)."""
        data = batch.column(self.data_index)
        n = len(data)
        if data.null_count or not n:
            return None
        flags = [batch.column(i) for i in self.flag_indexes]
        if flags:
            if any(column.null_count for column in flags):
                return None
            columns = [column.to_pylist() for column in flags]
            if not all(set(c) <= allowed for c, allowed in zip(columns, self.allowed)):
                return None
            gates = list(map(self.gates_for.__getitem__, zip(*columns)))
        else:
            gates = self.base_gates
        _, offsets, values = data.buffers()
        if values is None:
            return None
        return offsets, values, pa.types.is_large_binary(data.type), data.offset, n, gates

    def _decode_arrow(self, batch):
        """The message column decoded in C straight into Arrow buffers, or None when any row
        needs another path (those paths decode the batch again; the row-by-row one says which
        rows fail and why)."""
        args = self._accelerator_args(batch)
        if args is None:
            return None
        n = args[4]
        try:
            codes, blocks = self.decode_arrow(*args)
        except Retry:
            return None
        codes = np.frombuffer(codes, np.uint8)
        children = [None] * len(self.fields)
        try:
            for k, bufs in enumerate(blocks):
                if bufs is None or self.builds[k] is None:
                    continue
                index, plan = self.builds[k]
                kind = self.fields[index].type
                children[index] = self.arrow_blocks.message_struct(bufs, codes == k, plan, kind)
        except TooLarge:
            return None
        children[0] = self.names.take(pa.array(codes))
        for j, child in enumerate(children):
            if child is None:
                children[j] = pa.nulls(n, self.fields[j].type)
        return pa.StructArray.from_arrays(children, fields=self.fields)

    def _decode_columns(self, batch):
        """The message column decoded in C straight into columns, or None when any row needs
        the row-by-row path (a null, a context it cannot have, bytes the accelerator declines:
        that path decodes the batch again and says which rows fail and why)."""
        args = self._accelerator_args(batch)
        if args is None:
            return None
        n = args[4]
        try:
            codes, sets = self.decode_columns(*args)
        except Retry:
            return None
        codes = np.frombuffer(codes, np.uint8)
        children = [None] * len(self.fields)
        for k in np.unique(codes).tolist():
            if self.builds[k] is None:
                continue
            index, plan = self.builds[k]
            compact = columns_struct_array(sets[k], plan, self.fields[index].type)
            children[index] = scatter(compact, np.flatnonzero(codes == k), n)
        children[0] = self.names.take(pa.array(codes))
        for j, child in enumerate(children):
            if child is None:
                children[j] = pa.nulls(n, self.fields[j].type)
        return pa.StructArray.from_arrays(children, fields=self.fields)

    def _decode_rows(self, datas: list, flags: list) -> tuple[list, dict]:
        if all(set(column) <= allowed for column, allowed in zip(flags, self.allowed)):
            if flags:
                gates = list(map(self.gates_for.__getitem__, zip(*flags)))
            else:
                gates = repeat(self.base_gates)
            try:  # the common case: every row decodes, at C speed when accelerated
                return list(map(self.decode_tuple, datas, gates)), {}
            except Exception:  # noqa: BLE001 (the row-by-row pass below says what failed)
                pass
        objs = [None] * len(datas)
        errors: dict[int, DecodeError] = {}
        decode = self.decode_tuple
        for i, data in enumerate(datas):
            gates = self.gates_for[tuple(column[i] for column in flags)]
            if isinstance(gates, DecodeError):
                err = gates
            elif data is None:
                err = DecodeError(0, (), "the data column is null")
            else:
                try:
                    objs[i] = decode(data, gates)
                    continue
                except DecodeError as exc:
                    err = exc
                except Exception as exc:  # noqa: BLE001 (PERMISSIVE never fails the job)
                    err = DecodeError(0, (), f"{type(exc).__name__}: {exc}")
            self._fail(i, err, errors)
        return objs, errors

    def _fail(self, i: int, err: DecodeError, errors: dict) -> None:
        if self.hint:
            err = DecodeError(err.offset, err.path, err.reason + self.hint)
        if self.failfast:
            raise DecodeError(
                err.offset,
                err.path,
                f"{err.reason} (decode_messages FAILFAST, row {i} of an Arrow batch)",
            )
        errors[i] = err

    # -- Arrow ---------------------------------------------------------------------------
    def _assemble(self, objs: list, n: int, with_errors: bool) -> pa.StructArray:
        no_message = len(self.builds)
        codes = np.fromiter(map(self.code_of.__getitem__, map(type, objs)), np.int64, n)
        children = [None] * len(self.fields)
        for k in np.unique(codes).tolist():
            if k == no_message or self.builds[k] is None:
                continue
            index, plan = self.builds[k]
            where = np.flatnonzero(codes == k)
            present = objs if len(where) == n else [objs[i] for i in where.tolist()]
            compact = struct_array(present, plan, self.fields[index].type)
            children[index] = scatter(compact, where, n)
        children[0] = self.names.take(pa.array(codes))
        for j, child in enumerate(children):
            if child is None:
                children[j] = pa.nulls(n, self.fields[j].type)
        mask = pa.array(codes == no_message) if with_errors else None
        return pa.StructArray.from_arrays(children, fields=self.fields, mask=mask)

    # -- strings that are not UTF-8 ----------------------------------------------------------
    def _reject_bad_strings(self, objs, datas, flags, errors) -> bool:
        """Turn rows holding a string that is not UTF-8 into errors; whether any was found."""
        found = False
        for i, obj in enumerate(objs):
            if obj is None:
                continue
            plan = self.codec.plan_of(obj)
            path = first_bad_string(obj, plan, (plan.name,))
            if path is None:
                continue
            gates = self.gates_for[tuple(column[i] for column in flags)]
            offset, reason = self.codec.bad_string_offset(datas[i], gates)
            err = DecodeError(
                offset,
                path,
                f"string is not valid UTF-8 ({reason}), which Spark's StringType cannot hold",
            )
            objs[i] = None
            found = True
            self._fail(i, err, errors)
        return found
