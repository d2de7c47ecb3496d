"""View-model for the generated Python package: turns the spec into decode/encode steps.

All choices about struct formats, gate conditions and local variable names are made here
once, so the templates stay simple and the generated code does no interpretation at run time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from .. import gates
from ..model import (
    int_bounds,
    BYTE1,
    BYTEN,
    REST,
    STRING,
    Block,
    Field,
    Message,
    Spec,
    implicit_fields,
    snake_case,
)

_INT_CODES = {
    ("Int8", False): "B",
    ("Int8", True): "b",
    ("Int16", False): "H",
    ("Int16", True): "h",
    ("Int32", False): "I",
    ("Int32", True): "i",
    ("Int64", False): "Q",
    ("Int64", True): "q",
}
_SIZES = {"B": 1, "b": 1, "H": 2, "h": 2, "I": 4, "i": 4, "Q": 8, "q": 8}


def annotation(f: Field, optional: bool) -> str:
    if f.is_int:
        base = "int"
    elif f.type in (STRING, BYTE1):
        base = "str"
    elif f.type in (BYTEN, REST):
        base = "bytes"
    else:
        base = f.type
    return f"{base} | None" if optional else base


def _code(f: Field) -> str:
    return "B" if f.type == BYTE1 else _INT_CODES[(f.type, bool(f.signed))]


@dataclass
class Attr:
    """One attribute of a generated dataclass, and the local variable that carries it."""

    name: str
    var: str
    annotation: str
    optional: bool
    description: str
    semantic: str | None = None
    kind: str = "scalar"  # scalar | string | bytes | part | repeat | choice
    type_name: str = ""  # part or element class for part/repeat attrs
    index: int = 0  # position among its class's attrs (the C column decoder's column)
    nested_func: str = ""  # the part's or repeat element's decoder suffix (_tuple_data)
    # decode_arrow: the attribute's first buffer in its class's block (see arrow_layout)
    abuf: int = 0


@dataclass
class CRead:
    """One fixed-width field as the C accelerator reads and writes it."""

    var: str  # C integer variable (v_...)
    size: int
    signed: bool
    rel: int  # offset inside its fixed run
    role: str  # literal | choice | int
    code: int = 0  # literal byte
    table: str = ""  # choice table
    obj: str = ""  # PyObject variable of the stored value (p_...), "" when not stored
    bounds: tuple[int, int] = (0, 0)
    source: tuple[str, str] | None = None  # implicit count/length: (attr variable, seq|bytes)


@dataclass
class Step:
    kind: str  # fixed | string | bytes | part | repeat | tagged
    cond: str | None = None
    gate_text: str = ""
    c_cond: str | None = None
    dcond: str | None = None  # the condition in the decoders, which index the gates tuple
    fields: list[Field] = field(default_factory=list)
    # fixed runs
    struct_name: str = ""
    size: int = 0
    single_byte: bool = False
    pad: int = 0  # bytes before the run that the struct skips (read already: a repeat's head)
    advance: bool = True  # False: the bytes step right after it moves the offset past it
    targets: list[str] = field(default_factory=list)  # unpack targets
    pack_args: list[str] = field(default_factory=list)  # pack arguments (literals inlined)
    layout: list[tuple[str, int]] = field(default_factory=list)  # (field name, size) for errors
    literals: list[tuple[str, int, str, int]] = field(default_factory=list)  # var, byte, name, rel
    choices: list[tuple[str, str, str, str, int]] = field(
        default_factory=list
    )  # var, raw, table, name, rel
    computed: list[tuple[str, str]] = field(default_factory=list)  # implicit var, expression
    c_reads: list[CRead] = field(default_factory=list)
    # variable-size fields
    var: str = ""
    name: str = ""
    length_var: str = ""
    lead: int = 0  # bytes: the size of the fixed run before it, not yet added to the offset
    inline: bool = False  # bytes: the last step before the build, which slices it in place
    func: str = ""
    inline_view: ClassView | None = None  # part: its decode steps, inlined at the call site
    # repeat
    count_var: str = ""
    count_bytes: int = 0  # size of the count field: 2 or less bounds the list it sizes
    element: ClassView | None = None
    element_groups: list = field(default_factory=list)
    element_path: str = ""
    constants: list = field(default_factory=list)  # (byte, choice) whose element is fixed
    constants_table: str = ""
    remaining_table: str = ""  # the head's choices whose element is not a constant
    head_step: Step | None = None  # the element's leading choice byte
    after_head_groups: list = field(default_factory=list)  # the element after that byte
    scalar_code: str = ""
    scalar_bounds: tuple[int, int] = (0, 0)
    scalar_type: str = ""
    item_var: str = ""
    inline_var: str = ""  # the element's bytes field sliced at its build (see inline_last)
    item_attr: Attr | None = None  # a repeat of one field: that field, as decode_arrow stores it
    # tagged
    optional: bool = False
    raw_var: str = ""
    table: str = ""
    inner_groups: list = field(default_factory=list)
    # every local the step sets (for `else: x = None`) and the stored ones among them
    all_vars: list[str] = field(default_factory=list)
    stored: list[Attr] = field(default_factory=list)


@dataclass
class Group:
    """Consecutive steps under one gate condition (None = always present)."""

    cond: str | None
    gate_text: str
    steps: list[Step]
    stored: list[Attr]
    all_vars: list[str]
    c_cond: str | None = None
    dcond: str | None = None


@dataclass
class ClassView:
    name: str
    description: str
    attrs: list[Attr]
    groups: list[Group] = field(default_factory=list)
    path: str = ""
    func: str = ""
    message: Message | None = None
    is_part: bool = False
    is_element: bool = False
    doc_anchor: str = ""
    uses_gates: bool = False  # parts: whether the decoder needs the version/context arguments
    inline_var: str = ""  # the bytes field sliced at the build (see inline_last)


def _merge_advances(steps: list[Step]) -> list[Step]:
    """A fixed run followed by a bytes field under the same gate: the bytes step adds the run's
    size to the offset as it computes its start (one addition less per value)."""
    out = list(steps)
    for i in range(len(out) - 1):
        a, b = out[i], out[i + 1]
        if a.kind == "fixed" and b.kind == "bytes" and a.cond == b.cond:
            out[i] = replace(a, advance=False)
            out[i + 1] = replace(b, lead=a.size + a.pad)
    return out


def inline_last(groups: list[Group]) -> str:
    """When the last step before a build is an unconditional bytes field, the build stores its
    slice directly (no local in between); returns its variable, or ""."""
    if not groups or groups[-1].cond is not None or not groups[-1].steps:
        return ""
    last = groups[-1].steps[-1]
    if last.kind != "bytes":
        return ""
    groups[-1].steps[-1] = replace(last, inline=True)
    return last.var


def group_steps(steps: list[Step]) -> list[Group]:
    groups: list[Group] = []
    for s in _merge_advances(steps):
        if not groups or groups[-1].cond != s.cond or s.cond is None:
            groups.append(Group(s.cond, s.gate_text, [], [], [], s.c_cond, s.dcond))
        g = groups[-1]
        g.steps.append(s)
        g.stored.extend(s.stored)
        g.all_vars.extend(s.all_vars)
    return groups


class PythonView:
    """Everything the Python templates need, computed once from the spec."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.context_index = {c.name: i + 1 for i, c in enumerate(spec.contexts)}
        self.structs: dict[str, tuple[str, int]] = {}
        # structs that skip leading pad bytes: the decoder's alone (the encoder packs whole runs)
        self.pad_structs: dict[str, tuple[str, int]] = {}
        self.unpacked: set[str] = set()  # structs the decoders read with unpack_from
        self.choice_tables: dict[str, list[tuple[int, str]]] = {}
        self.classes: list[ClassView] = []
        self._inlining = 0  # > 0 while building the inlined copy of a part (not registered)
        self.remaining_tables: dict[str, list[tuple[int, str]]] = {}  # Python decoder only
        self.constant_tables: list = []  # (name, element class, choice field, [(byte, choice)])
        self.parts = [
            self._scope(
                p.class_name,
                p.description,
                p.blocks,
                "_path",
                "",
                is_part=True,
                doc_anchor=p.doc_anchor,
            )
            for p in spec.parts
        ]
        self.messages = [
            self._scope(
                m.class_name,
                m.description,
                m.blocks,
                f'("{m.class_name}",)',
                "",
                message=m,
                doc_anchor=m.doc_anchor,
            )
            for m in spec.messages
        ]
        self.parts_by_func = {c.func: c for c in self.parts}
        self.contexts = spec.contexts
        # The gate values every decoder and encoder takes: the version, then each context.
        self.version_arg = "_pv"
        self.gate_params = ", ".join(["_pv", *(f"_ctx_{c.name}" for c in spec.contexts)])
        self.gate_args = self.gate_params
        self.gate_names = ", ".join([spec.version.name, *(c.name for c in spec.contexts)])
        sig = []
        for p in spec.parameters:
            if p.kind == "version":
                default = "" if p.default is None else f" = {p.default!r}"
                sig.append(f"{p.name}: int{default}")
            else:
                sig.append(f"{p.name}: str = {p.default!r}")
        sig += [f"{c.name}: bool = False" for c in spec.per_message_contexts]
        self.signature = ", ".join(sig)
        self.call_args = ", ".join(
            [p.name for p in spec.parameters] + [c.name for c in spec.per_message_contexts]
        )
        # without the per-message contexts (capture.from_payloads derives them)
        self.mode_signature = ", ".join(sig[: len(spec.parameters)])
        self.mode_call_args = ", ".join(
            [p.name for p in spec.parameters] + ["False" for _ in spec.per_message_contexts]
        )
        self.record_gate_fields = [spec.version.name, *(c.name for c in spec.contexts)]
        example = [f"{spec.version.name}={spec.version.values[-1]}"]
        self.example_args = ", ".join(example)

    # -- helpers -------------------------------------------------------------
    def _struct(self, codes: str) -> str:
        name = "_S_" + codes
        self.structs[name] = (">" + codes, sum(_SIZES[c] for c in codes))
        return name

    def _table(self, owner: str, f: Field) -> str:
        name = f"_{snake_case(owner).upper()}_{f.name.upper()}"
        self.choice_tables[name] = [(ord(c), c) for c, _ in f.choices]
        return name

    def _cond(self, f: Field, raw_vars: dict[str, str]) -> dict:
        """The field's gate as Step arguments: the Python condition over the encoders'
        parameters (cond), the same over the decoders' gates tuple (dcond), words for errors
        and the C condition."""
        g = f.gate
        return {
            "cond": gates.python(g, raw_vars),
            "dcond": gates.python(
                g, raw_vars, "_g[0]", lambda name: f"_g[{self.context_index[name]}]"
            ),
            "gate_text": gates.words(g, self.spec.version.name),
            "c_cond": gates.c(g, raw_vars),
        }

    # -- scopes --------------------------------------------------------------
    def _scope(
        self,
        name,
        description,
        blocks,
        path,
        prefix,
        message=None,
        is_part=False,
        is_element=False,
        doc_anchor="",
    ):
        attrs: list[Attr] = []
        steps = self._steps(blocks, attrs, path, prefix, name, skip_tag=message is not None)
        self._inline_parts(steps, path)
        for i, a in enumerate(attrs):
            a.index = i
            if a.type_name:
                a.nested_func = "_" + snake_case(a.type_name)
        groups = group_steps(steps)
        view = ClassView(
            name,
            description,
            attrs,
            groups,
            path,
            "_" + snake_case(name),
            message,
            is_part,
            is_element,
            doc_anchor,
            uses_gates=any(f.gated for b in blocks for f in b.fields),
            inline_var=inline_last(groups),
        )
        if not self._inlining:
            self.classes.append(view)
        return view

    def _inline_parts(self, steps: list[Step], path: str) -> None:
        """Give every part step the part's decode steps with locals of its own, for the Python
        decoders to inline: a call per part (its frame and the (value, offset) tuple it
        returns) cost as much as decoding a row of ten columns' kinds and lengths."""
        for s in steps:
            if s.kind == "part":
                part = self.spec.part(s.fields[0].type)
                self._inlining += 1
                try:
                    s.inline_view = self._scope(
                        part.class_name,
                        part.description,
                        part.blocks,
                        sub(path, s.name),
                        f"_{s.var.lstrip('_')}_",
                        is_part=True,
                    )
                finally:
                    self._inlining -= 1
            elif s.kind == "tagged":
                self._inline_parts([t for g in s.inner_groups for t in g.steps], path)

    def _steps(self, blocks, attrs, path, prefix, owner, skip_tag=False) -> list[Step]:
        implicit = implicit_fields(blocks)
        sources = {}  # implicit field -> (Python expression, (sized variable, seq|bytes))
        for b in blocks:
            if b.count:
                sources[b.count] = (f"len({prefix}{b.name})", (prefix + b.name, "seq"))
            for f in b.fields:
                if f.length:
                    sources[f.length] = (f"len({prefix}{f.name})", (prefix + f.name, "bytes"))
        raw_vars: dict[str, str] = {}
        steps: list[Step] = []
        for bi, b in enumerate(blocks):
            if b.kind == "repeat":
                step = self._repeat(b, attrs, path, prefix, owner)
                count = next(f for blk in blocks for f in blk.fields if f.name == b.count)
                step.count_bytes = count.size
                steps.append(step)
            elif b.kind == "tagged":
                steps.append(self._tagged(b, implicit, raw_vars, attrs, prefix, owner, sources))
            else:
                fields = b.fields[1:] if skip_tag and bi == 0 else b.fields
                steps.extend(
                    self._fields(fields, implicit, raw_vars, attrs, prefix, owner, sources)
                )
        return steps

    def _fields(
        self, fields, implicit, raw_vars, attrs, prefix, owner, sources, force_optional=False
    ) -> list[Step]:
        steps: list[Step] = []
        for f in fields:
            gate = self._cond(f, raw_vars)
            cond = gate["cond"]
            var = prefix + f.name
            attr = None
            if not f.is_literal and f.name not in implicit:
                kind = (
                    "choice"
                    if f.choices
                    else "string"
                    if f.type == STRING
                    else "bytes"
                    if f.type in (BYTEN, REST)
                    else "part"
                    if f.is_part
                    else "scalar"
                )
                attr = Attr(
                    f.name,
                    var,
                    annotation(f, cond is not None or force_optional),
                    cond is not None or force_optional,
                    f.description,
                    f.semantic,
                    kind,
                    f.type if f.is_part else "",
                )
                attrs.append(attr)
            if f.size is not None:
                last = steps[-1] if steps else None
                run = last if last and last.kind == "fixed" and last.cond == cond else None
                if run is None:
                    run = Step("fixed", **gate)
                    steps.append(run)
                self._add_fixed(run, f, var, owner, raw_vars, sources)
            else:
                # variable-size steps: the kind names the template branch
                extra = {}
                if f.type == BYTEN:
                    kind, extra = "bytes", {"length_var": prefix + f.length}
                elif f.type == STRING:
                    kind = "string"
                elif f.type == REST:
                    kind = "rest"
                else:
                    kind, extra = "part", {"func": "_" + snake_case(f.type)}
                run = Step(kind, fields=[f], var=var, name=f.name, **gate, **extra)
                steps.append(run)
            if not f.is_literal:
                run.all_vars.append(var)
            if attr:
                run.stored.append(attr)
        for s in steps:
            if s.kind == "fixed":
                codes = "".join(_code(f) for f in s.fields)
                s.struct_name = self._struct(codes)
                s.size = self.structs[s.struct_name][1]
                s.single_byte = codes == "B"
                if not s.single_byte:  # a single unsigned byte is read by indexing instead
                    self.unpacked.add(s.struct_name)
        return steps

    def _add_fixed(self, run: Step, f: Field, var: str, owner, raw_vars, sources):
        rel = sum(size for _, size in run.layout)
        run.fields.append(f)
        run.layout.append((f.name, f.size))
        signed = bool(f.signed)
        if f.is_literal:
            lit = f"_lit_{var.lstrip('_')}"
            run.targets.append(lit)
            run.pack_args.append(str(ord(f.value)))
            run.literals.append((lit, ord(f.value), f.name, rel))
            run.c_reads.append(CRead("v" + lit, 1, False, rel, "literal", code=ord(f.value)))
        elif f.choices:
            raw = f"_raw_{var.lstrip('_')}"
            raw_vars[f.name] = raw
            table = self._table(owner, f)
            run.targets.append(raw)
            run.pack_args.append(raw)
            run.choices.append((var, raw, table, f.name, rel))
            run.c_reads.append(
                CRead("v" + raw, 1, False, rel, "choice", table=table, obj="p" + var)
            )
        else:
            run.targets.append(var)
            run.pack_args.append(var)
            read = CRead("v" + var, f.size, signed, rel, "int", bounds=int_bounds(f))
            if f.name in sources:
                expr, read.source = sources[f.name]
                run.computed.append((var, expr))
            else:
                read.obj = "p" + var
            run.c_reads.append(read)

    def _repeat(self, b: Block, attrs, path, prefix, owner) -> Step:
        var = prefix + b.name
        elem_path = f"(*{path}, {b.name!r}, _i{len(prefix)})"
        step = Step(
            "repeat",
            var=var,
            name=b.name,
            count_var=prefix + b.count,
            element_path=elem_path,
            all_vars=[var],
        )
        if len(b.fields) == 1:
            f = b.fields[0]
            attr = Attr(
                b.name,
                var,
                f"tuple[{annotation(f, False)}, ...]",
                False,
                b.description or f.description,
                None,
                "repeat",
            )
            if f.is_int:
                step.scalar_code = _code(f)
                step.size = f.size
                step.scalar_bounds = int_bounds(f)
                step.scalar_type = f.type
            item_prefix = prefix + "_" + b.name + "_"
            step.item_var = item_prefix + f.name
            items: list[Attr] = []
            step.element_groups = group_steps(
                self._fields(b.fields, set(), {}, items, item_prefix, owner, {})
            )
            step.item_attr = items[0]
        else:
            elem = self._scope(
                b.struct,
                b.description,
                (Block("header", b.fields),),
                elem_path,
                prefix + "_" + snake_case(b.struct) + "_",
                is_element=True,
            )
            step.element = elem
            step.element_groups = elem.groups
            step.inline_var = elem.inline_var
            self._constant_elements(step, b)
            attr = Attr(
                b.name,
                var,
                f"tuple[{b.struct}, ...]",
                False,
                b.description,
                None,
                "repeat",
                b.struct,
            )
        attrs.append(attr)
        step.stored.append(attr)
        return step

    def _constant_elements(self, step: Step, b: Block) -> None:
        """Choices of the leading Byte1 that leave every other field absent make the element
        a constant: the decoder shares one immutable instance instead of building it."""
        head = b.fields[0]
        if not head.choices or head.gated:
            return
        rest = b.fields[1:]
        if not rest or any(f.only_if is None or f.only_if.field != head.name for f in rest):
            return
        used = {c for f in rest for c in f.only_if.choices}
        step.constants = [(ord(c), c) for c, _ in head.choices if c not in used]
        step.constants_table = f"_CONST_{snake_case(b.struct).upper()}"
        if not self._inlining:
            self.constant_tables.append(
                (step.constants_table, step.element, head.name, step.constants)
            )
        # The decoder looks the head byte up among the other choices first: an element that
        # carries more fields (a value) is the common case, and it then takes one lookup.
        remaining = [c for c, _ in head.choices if c in used]
        step.remaining_table = f"_MORE_{snake_case(b.struct).upper()}"
        self.remaining_tables[step.remaining_table] = [(ord(c), c) for c in remaining]
        # The Python decoders read the head byte once, for the constants table and the choice
        # alike. Past the constants only the other choices remain, so a gate on the head that
        # holds for all of those is always true there and is left out.
        head_step, *after = [s for g in step.element.groups for s in g.steps]
        assert head_step.kind == "fixed" and head_step.single_byte and head_step.choices
        step.head_step = head_step
        after = [
            replace(s, cond=None, gate_text="", c_cond=None, dcond=None)
            if all(
                f.since == 0 and not f.when and set(remaining) <= set(f.only_if.choices)
                for f in s.fields
            )
            else s
            for s in after
        ]
        if after and after[0].kind == "fixed" and after[0].cond is None:
            # The run right after the head byte is read from the head's offset by a struct
            # that skips it: one offset addition less per element.
            first = after[0]
            codes = "x" + self.structs[first.struct_name][0][1:]
            name = "_S_" + codes
            self.pad_structs[name] = (">" + codes, first.size + 1)
            after[0] = replace(first, struct_name=name, single_byte=False, pad=1)
        step.after_head_groups = group_steps(after)
        step.inline_var = inline_last(step.after_head_groups)

    def _tagged(self, b: Block, implicit, raw_vars, attrs, prefix, owner, sources) -> Step:
        head = b.fields[0]
        var = prefix + head.name
        raw = f"_raw_{var.lstrip('_')}"
        raw_vars[head.name] = raw
        attr = Attr(
            head.name,
            var,
            annotation(head, b.optional),
            b.optional,
            head.description,
            None,
            "choice",
        )
        attrs.append(attr)
        inner = self._fields(
            b.fields[1:],
            implicit,
            raw_vars,
            attrs,
            prefix,
            owner,
            sources,
            force_optional=b.optional,
        )
        step = Step(
            "tagged",
            optional=b.optional,
            fields=[head],
            raw_var=raw,
            table=self._table(owner, head),
            var=var,
            name=head.name,
            inner_groups=group_steps(inner),
            all_vars=[var] + [v for s in inner for v in s.all_vars],
        )
        step.stored = [attr] + [a for s in inner for a in s.stored]
        return step


def sub(path: str, *names) -> str:
    """Python expression for a field path below `path`; a constant tuple when it can be one."""
    extra = ", ".join(repr(n) for n in names)
    if path.startswith('("') and "*" not in path:
        return path.rstrip(")").rstrip(",") + ", " + extra + ")"
    return f"(*{path}, {extra})"


ACCEL_TEMPLATE = "python/_speedups.c.j2"


def outputs(spec: Spec):
    from ..templating import environment, tidy_c

    view = PythonView(spec)
    sizes = arrow_layout(view)
    ctx = {
        "view": view,
        "arrow_sizes": sizes,
        "arrow_layout": arrow_layout_text(view),
        "int_bounds": int_bounds,
        "sub": sub,
        "c_locals": c_locals,
        "arrow_ints": arrow_ints,
        "c_ll": c_ll,
        "accel_id": "",
    }
    # The accelerator's id is the hash of its own source (rendered with an empty id): the
    # Python side refuses a compiled module whose id differs, so a stale build is never used.
    body = tidy_c(environment().get_template(ACCEL_TEMPLATE).render(spec=spec, **ctx))
    ctx["accel_id"] = hashlib.sha256(body.encode()).hexdigest()[:16]
    pkg = spec.targets.package + "/"
    for name in ("__init__", "_messages", "_decoder", "_encoder", "_stream", "capture"):
        yield f"{pkg}{name}.py", f"python/{name}.py.j2", ctx
    yield f"{pkg}py.typed", "python/py.typed.j2", ctx
    yield f"{pkg}_speedups.c", ACCEL_TEMPLATE, ctx


# -- decode_arrow's buffers ------------------------------------------------------------------
# Each message type's rows go to one block of growable buffers, its parts' and repeat elements'
# buffers laid out inside it after the attribute that holds them. Per attribute, in order:
#   scalar, choice:  values (8 bytes per row; a choice: its byte), [validity] when optional
#   string, bytes:   lengths (4 bytes per row), data, [validity] when optional
#   part:            [validity] when optional, then the part's own block (one row per row)
#   repeat:          lengths (4 bytes per row), then the element's block (one row per element)
# Validity holds one byte per row (0: absent); rows never written read as zero.
ARROW_WIDTH = {"scalar": 1, "choice": 1, "string": 2, "bytes": 2, "part": 0, "repeat": 1}


def arrow_layout(view: PythonView) -> dict[str, int]:
    """Number every attribute's buffers (Attr.abuf, relative to its class's block); returns
    the block size of each class by decoder suffix (func)."""
    classes = {c.func: c for c in view.classes}
    sizes: dict[str, int] = {}

    def attr_size(a: Attr, item: Attr | None) -> int:
        size = ARROW_WIDTH[a.kind] + (a.kind != "repeat" and a.optional)
        if a.kind == "part" or (a.kind == "repeat" and a.nested_func):
            size += block(classes[a.nested_func])
        elif a.kind == "repeat":
            item.abuf = 0
            size += attr_size(item, None)
        return size

    def block(c: ClassView) -> int:
        if c.func not in sizes:
            items = {s.stored[0].var: s.item_attr for s in _all_steps(c.groups) if s.item_attr}
            total = 0
            for a in c.attrs:
                a.abuf = total
                total += attr_size(a, items.get(a.var))
            sizes[c.func] = total
        return sizes[c.func]

    for c in view.classes:
        block(c)
    return sizes


def arrow_layout_text(view: PythonView) -> str:
    """decode_arrow's layout for the Python side, as a Python literal: {message class:
    entries}, an entry being (attribute, kind, optional, first buffer, nested entries or None,
    first buffer of the nested block); buffers count from the start of the message's block."""
    classes = {c.func: c for c in view.classes}

    def entries(c: ClassView, base: int) -> tuple:
        items = {s.stored[0].var: s.item_attr for s in _all_steps(c.groups) if s.item_attr}
        return tuple(entry(a, base, items.get(a.var)) for a in c.attrs)

    def entry(a: Attr, base: int, item: Attr | None) -> tuple:
        first = base + a.abuf
        nested, start = None, first + ARROW_WIDTH[a.kind] + (a.kind != "repeat" and a.optional)
        if a.kind == "part" or (a.kind == "repeat" and a.nested_func):
            nested = entries(classes[a.nested_func], start)
        elif a.kind == "repeat":
            nested = (entry(item, start, None),)
        return (a.name, a.kind, a.optional, first, nested, start if nested else None)

    return repr({c.name: entries(c, 0) for c in view.messages})


def arrow_ints(groups: list[Group]) -> list[tuple[str, bool]]:
    """decode_arrow's integer locals for one function (name, signed): every fixed read, a
    scalar repeat's items included; it makes no Python objects."""
    ints: dict[str, bool] = {}
    for s in _all_steps(groups):
        ints.update((r.var, r.signed) for r in s.c_reads)
        if s.kind == "tagged":
            ints["v" + s.raw_var] = False
        if s.kind == "repeat":
            ints.update(arrow_ints(s.element_groups))
    return sorted(ints.items())


def _all_steps(groups: list[Group]):
    for g in groups:
        for s in g.steps:
            yield s
            if s.kind == "tagged":
                yield from _all_steps(s.inner_groups)


def c_ll(n: int) -> str:
    """A C long long literal (the most negative one cannot be written directly)."""
    return "(-9223372036854775807LL - 1)" if n == -(1 << 63) else f"{n}LL"


def c_locals(groups: list[Group]) -> tuple[list[tuple[str, bool]], list[str]]:
    """The C accelerator's locals for one function: integer variables (name, signed) and the
    PyObject variables it must release on the way out, nested repeat elements included."""
    ints: dict[str, bool] = {}
    objs: dict[str, None] = {}

    def walk(gs):
        for g in gs:
            for s in g.steps:
                for r in s.c_reads:
                    ints[r.var] = r.signed
                    if r.obj:
                        objs[r.obj] = None
                if s.kind in ("string", "bytes", "rest", "part", "repeat", "tagged"):
                    objs["p" + s.var] = None
                if s.kind == "tagged":
                    ints["v" + s.raw_var] = False
                    walk(s.inner_groups)
                if s.kind == "repeat" and not s.scalar_code:
                    walk(s.element_groups)
                    if s.element:
                        objs.update((("p" + a.var), None) for a in s.element.attrs)

    walk(groups)
    return sorted(ints.items()), list(objs)
