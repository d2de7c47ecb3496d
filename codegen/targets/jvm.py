"""View-model for the JVM target: one Java class per spec that decodes its messages straight
into Spark rows of MESSAGE_SCHEMA, for decode_messages(engine="jvm") (pgcdc.runtime.spark.jvm).

The class extends the hand-written runtime (pgcdc/runtime/spark/java: MessageUdf,
WireReader), which holds everything that does not depend on the spec. Here the spec becomes a
list of decode operations per message, part and repeat element; the Spark side (slots, value
types, convenience columns) comes from the Spark target's view, so both engines share one
mapping.

The operations follow the Python decoder's order of checks, so that a bad message fails with
the same byte offset, field path and reason on both engines: fixed-width fields read in runs
(consecutive fields under one gate, within one block) that are checked for length first, then
for their literals, then for their choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import BYTE1, BYTEN, REST, STRING, Block, Field, Gate, Spec, implicit_fields
from .spark import JAVA_PACKAGE, LSN_TEXT, TIMESTAMP, VALUE, SparkView, java_class_name

# (wire type, signed) -> (Java expression reading it at `{at}`, its Java type, the value Spark
# gets from it: the type of the Spark target's table, boxed)
_READ = {
    ("Int8", False): ("r.u8({at})", "int", "Short.valueOf((short) {v})"),
    ("Int8", True): ("r.d[{at}]", "byte", "Byte.valueOf({v})"),
    ("Int16", False): ("r.u16({at})", "int", "Integer.valueOf({v})"),
    ("Int16", True): ("(short) r.u16({at})", "short", "Short.valueOf({v})"),
    ("Int32", False): ("r.u32({at})", "long", "Long.valueOf({v})"),
    ("Int32", True): ("r.i32({at})", "int", "Integer.valueOf({v})"),
    ("Int64", False): ("r.i64({at})", "long", "WireReader.u64({v})"),
    ("Int64", True): ("r.i64({at})", "long", "Long.valueOf({v})"),
}


@dataclass
class RunField:
    name: str
    size: int
    rel: int
    role: str  # literal | choice | int
    code: int = 0  # literal byte
    table: str = ""  # choice: its table constant
    allowed: str = ""  # choice: the allowed values as the Python error lists them
    local: str = ""  # choice: its raw byte's local; implicit int: its value's local
    read: str = ""  # int: the read expression at the run's offset
    jtype: str = ""  # int: its Java type
    box: str = ""  # int: the stored value's expression over `t`
    slot: int | None = None  # where the value goes (None: implicit, or a literal)
    lsn_slot: int | None = None
    ts_slot: int | None = None


@dataclass
class Op:
    kind: str  # run | string | bytes | rest | part | repeat | tagged
    cond: str | None = None
    name: str = ""
    slot: int | None = None
    fields: list[RunField] = field(default_factory=list)  # run
    size: int = 0  # run: total size; scalar repeat: item size
    bad_last: str | None = None  # string: the last path name of a bad-string error
    length: str = ""  # bytes: the length local
    method: str = ""  # part / repeat: the method decoding one value or element
    row: bool = True  # repeat: the element is a struct (else the item method's one value)
    count: str = ""  # repeat: the count local
    small: bool = False  # repeat: a count of 2 bytes or fewer (the list is made that long)
    read: str = ""  # scalar repeat
    box: str = ""
    optional: bool = False  # tagged
    local: str = ""
    table: str = ""
    allowed: str = ""
    inner: list[Op] = field(default_factory=list)


@dataclass
class Method:
    name: str
    kind: str  # message | part | element | item
    width: int  # values it fills (an item method: 1)
    ops: list[Op]
    locals: list[tuple[str, str, str]]  # (Java type, name, initial value)
    path: str = ""  # message: its class name (the path's root)


@dataclass
class Dispatch:
    code: int
    name: str
    since: int
    index: int  # in TYPE_NAMES
    method: str
    column: int | None  # its struct's position in MESSAGE_SCHEMA, None without fields


class JvmView:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.spark = SparkView(spec)
        self.package = spec.targets.package
        self.java_package = JAVA_PACKAGE
        self.class_name = java_class_name(self.package)
        self.context_index = {c.name: i + 1 for i, c in enumerate(spec.contexts)}
        self.version_name = spec.version.name
        self.tables: dict[str, list[int]] = {}
        self.methods: list[Method] = []
        for p in spec.parts:
            self._method(f"p_{p.class_name}", "part", p.class_name, p.blocks)
        columns = {s.name: i + 1 for i, s in enumerate(self.spark.message_columns)}
        self.width = 1 + len(self.spark.message_columns)
        self.type_names = [m.class_name for m in spec.messages]
        self.dispatch = []
        for k, m in enumerate(spec.messages):
            method = f"m_{m.class_name}"
            self._method(method, "message", m.class_name, m.blocks, top=True)
            self.dispatch.append(
                Dispatch(ord(m.tag), m.class_name, m.since, k, method, columns.get(m.class_name))
            )

    # -- slots ---------------------------------------------------------------------------
    def _slots(self, struct: str | None) -> dict[tuple[str, str], int]:
        if struct is None:
            return {}
        fields = self.spark.by_name[struct].fields
        return {(f.attr, f.role): i for i, f in enumerate(fields)}

    # -- methods -------------------------------------------------------------------------
    def _method(self, name, kind, struct, blocks, top=False, item_of=None) -> Method:
        slots = self._slots(struct) if item_of is None else {(item_of, VALUE): 0}
        scope = _Scope(self, slots, blocks, name)
        ops = scope.blocks_ops(blocks, skip_tag=top, item=item_of is not None)
        width = len(self.spark.by_name[struct].fields) if item_of is None else 1
        method = Method(name, kind, width, ops, scope.local_decls(), struct if top else "")
        self.methods.append(method)
        return method

    def cond(self, gate: Gate, choice_locals: dict[str, str]) -> str | None:
        terms = [f"g[{self.context_index[name]}] != 0" for name in gate.when]
        if gate.since:
            terms.append(f"g[0] >= {gate.since}")
        if gate.only_if:
            local = choice_locals[gate.only_if.field]
            terms.append(
                "(" + " || ".join(f"{local} == {ord(c)}" for c in gate.only_if.choices) + ")"
            )
        return " && ".join(terms) or None

    def table(self, owner: str, f: Field) -> tuple[str, str]:
        """The choice table constant of a Byte1 field and its allowed values as Python's
        bad_choice lists them (in byte order)."""
        codes = sorted(ord(c) for c, _ in f.choices)
        name = f"T_{owner}_{f.name}".upper()
        self.tables[name] = codes
        return name, ", ".join(repr(chr(c)) for c in codes)


class _Scope:
    """The operations of one method: a message, part, repeat element or item."""

    def __init__(self, view: JvmView, slots: dict, blocks, owner: str):
        self.view = view
        self.slots = slots
        self.implicit = implicit_fields(blocks)
        self.choice_locals: dict[str, str] = {}
        self.int_locals: dict[str, str] = {}  # implicit field -> (type, local)
        self.owner = owner  # the method's name: tables and item methods are named after it

    def local_decls(self) -> list[tuple[str, str, str]]:
        out = [("int", local, "-1") for local in self.choice_locals.values()]
        out += [("long", local, "0") for local in self.int_locals.values()]
        return out

    def blocks_ops(self, blocks: tuple[Block, ...], skip_tag=False, item=False) -> list[Op]:
        ops: list[Op] = []
        for bi, b in enumerate(blocks):
            if b.kind == "repeat":
                ops.append(self._repeat(b, blocks))
            elif b.kind == "tagged":
                ops.append(self._tagged(b))
            else:
                fields = b.fields[1:] if skip_tag and bi == 0 else b.fields
                ops.extend(self._fields(fields, item=item))
        return ops

    def _slot(self, f: Field, role: str = VALUE) -> int | None:
        return self.slots.get((f.name, role))

    def _fields(self, fields, item=False) -> list[Op]:
        """Fixed-width fields in runs (consecutive, one gate), the others one op each."""
        ops: list[Op] = []
        last_gate = None
        for f in fields:
            cond = self.view.cond(f.gate, self.choice_locals)
            if f.size is not None:
                run = ops[-1] if ops and ops[-1].kind == "run" and last_gate == f.gate else None
                if run is None:
                    run = Op("run", cond)
                    ops.append(run)
                run.fields.append(self._run_field(f, run.size))
                run.size += f.size
            elif f.type == STRING:
                ops.append(
                    Op("string", cond, f.name, self._slot(f), bad_last=None if item else f.name)
                )
            elif f.type == BYTEN:
                ops.append(Op("bytes", cond, f.name, self._slot(f), length=self._int(f.length)))
            elif f.type == REST:
                ops.append(Op("rest", cond, f.name, self._slot(f)))
            else:
                part = f"p_{f.type}"
                ops.append(Op("part", cond, f.name, self._slot(f), method=part))
            last_gate = f.gate
        return ops

    def _int(self, name: str) -> str:
        return self.int_locals.setdefault(name, f"v_{name}")

    def _run_field(self, f: Field, rel: int) -> RunField:
        if f.is_literal:
            return RunField(f.name, f.size, rel, "literal", code=ord(f.value))
        if f.type == BYTE1:
            table, allowed = self.view.table(self.owner, f)
            local = self.choice_locals.setdefault(f.name, f"c_{f.name}")
            return RunField(
                f.name,
                1,
                rel,
                "choice",
                table=table,
                allowed=allowed,
                local=local,
                slot=self._slot(f),
            )
        read, jtype, box = _READ[(f.type, bool(f.signed))]
        rf = RunField(f.name, f.size, rel, "int", read=read, jtype=jtype, box=box.format(v="t"))
        if f.name in self.implicit:
            rf.local = self._int(f.name)
        else:
            rf.slot = self._slot(f)
            rf.lsn_slot = self._slot(f, LSN_TEXT)
            rf.ts_slot = self._slot(f, TIMESTAMP)
        return rf

    def _repeat(self, b: Block, blocks) -> Op:
        count = next(f for blk in blocks for f in blk.fields if f.name == b.count)
        op = Op(
            "repeat",
            None,
            b.name,
            self.slots.get((b.name, VALUE)),
            count=self._int(b.count),
            small=count.size <= 2,
        )
        if len(b.fields) == 1 and b.fields[0].is_int:
            f = b.fields[0]
            read, jtype, box = _READ[(f.type, bool(f.signed))]
            op.size, op.read, op.jtype, op.box = f.size, read, jtype, box.format(v="t")
            op.kind = "scalars"
        elif len(b.fields) == 1:
            f = b.fields[0]
            method = f"i_{self.owner}_{b.name}"
            self.view._method(method, "item", None, (Block("header", b.fields),), item_of=f.name)
            op.method = method
            op.row = False
        else:
            method = f"e_{b.struct}"
            if not any(m.name == method for m in self.view.methods):
                self.view._method(method, "element", b.struct, (Block("header", b.fields),))
            op.method = method
        return op

    def _tagged(self, b: Block) -> Op:
        head = b.fields[0]
        table, allowed = self.view.table(self.owner, head)
        local = self.choice_locals.setdefault(head.name, f"c_{head.name}")
        return Op(
            "tagged",
            None,
            head.name,
            self._slot(head),
            optional=b.optional,
            local=local,
            table=table,
            allowed=allowed,
            inner=self._fields(b.fields[1:]),
        )


def outputs(spec: Spec):
    view = JvmView(spec)
    yield f"{view.package}/{view.spark.jvm_file}", "jvm/decoder.java.j2", {"jvm": view}
