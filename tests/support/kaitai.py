"""Helpers for the Kaitai tests, for any spec: render a spec's .ksy pair (and its sample) in
memory, compile them with the pinned npm compiler, import the Python it produces in isolation,
and compare its parse with a Python codec field by field.

Gate values are the codec's: (version, context, ...) as PARAMS.resolve returns them, which is
also the order of the message .ksy's params."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import shutil
import subprocess
import sys
from contextlib import contextmanager
from functools import lru_cache
from io import BytesIO
from pathlib import Path
from codegen.loader import load_spec
from codegen.model import Spec
from codegen.templating import environment, header, tidy_c
from codegen.targets import kaitai as kaitai_target
from codegen.targets import python as python_target
from tests.tiers import fast_tier  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
KSC = ROOT / "tools" / "ksc.mjs"
SPEC_DIR = ROOT / "spec"
GENERATED = ROOT / "generated"


class CompileError(AssertionError):
    pass


# -- rendering -------------------------------------------------------------------------------
@dataclasses.dataclass
class Rendered:
    """The Kaitai target's outputs for one spec, rendered in memory, and the fresh codec the
    sample was built with."""

    spec: Spec
    files: dict  # path under generated/ -> text or bytes

    @property
    def message_ksy(self) -> str:
        return kaitai_target.message_ksy(self.spec)

    @property
    def capture_ksy(self) -> str:
        return kaitai_target.capture_ksy(self.spec)

    @property
    def sample(self) -> bytes | None:
        rel = kaitai_target.sample_output(self.spec)
        return self.files.get(rel) if rel else None

    def write_ksy(self, out_dir: Path) -> tuple[Path, Path]:
        """The .ksy pair written to out_dir; returns (capture, message) paths."""
        paths = []
        for rel in (self.capture_ksy, self.message_ksy):
            dest = out_dir / Path(rel).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(self.files[rel])
            paths.append(dest)
        return paths[0], paths[1]


def render_targets(spec: Spec, targets=(python_target, kaitai_target), binaries=True) -> dict:
    """Render the given targets of a spec in memory, as render_all does: binary outputs such as
    the sample are built from the text outputs (unless `binaries` is false)."""
    env = environment()
    files, builders = {}, []
    for target in targets:
        for rel, template, context in target.outputs(spec):
            if template is None:
                builders.append((rel, context))
                continue
            text = env.get_template(template).render(spec=spec, **context)
            if rel.endswith(".c"):
                text = tidy_c(text)
            files[rel] = header(spec, Path(rel).suffix) + text
    for rel, build in builders if binaries else ():
        files[rel] = build(dict(files))
    return files


@lru_cache(maxsize=None)
def rendered(spec_path: Path) -> Rendered:
    path = Path(spec_path).resolve()
    # named as `make generate` names it, so headers match the committed files
    display = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    spec = load_spec(path, display_name=display)
    return Rendered(spec, render_targets(spec))


def fresh_codec(r: Rendered):
    """The Python codec of a rendered spec, imported from memory (for specs, like the toy one,
    whose package is not installed)."""
    return kaitai_target.load_fresh_codec(r.files, r.spec.targets)


# -- compiling -------------------------------------------------------------------------------
def node() -> str:
    if fast_tier():
        import pytest

        pytest.skip("fast tier: the Kaitai compiler (Node.js) runs in `make test`")
    exe = shutil.which("node")
    if exe is None:
        _missing("node is not installed; the Kaitai tests need Node.js 18 or later")
    if not (ROOT / "node_modules" / "kaitai-struct-compiler").is_dir():
        _missing("the Kaitai compiler is not installed; run `npm ci` in the repo root")
    return exe


def _missing(why: str) -> None:
    raise CompileError(why)


def ksc(ksy_files, out_dir: Path | None = None, langs=("python",)) -> subprocess.CompletedProcess:
    """Run tools/ksc.mjs; any compiler error or warning raises CompileError with its output."""
    args = [node(), str(KSC)]
    for lang in langs:
        args += ["-t", lang]
    if out_dir is not None:
        args += ["-d", str(out_dir)]
    args += [str(p) for p in ksy_files]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0 or proc.stderr.strip():
        raise CompileError(
            f"kaitai-struct-compiler failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc


def class_name(ksy_id: str) -> str:
    """The class ksc makes of a .ksy id (pgoutput_message -> PgoutputMessage)."""
    return "".join(part.capitalize() for part in ksy_id.split("_"))


@dataclasses.dataclass
class Parsers:
    """The compiled classes of one compilation (imported under their own module objects)."""

    Message: type  # noqa: N815 - the class ksc generated
    Capture: type  # noqa: N815

    def parse_message(self, data: bytes, gates: tuple):
        from kaitaistruct import KaitaiStream

        return self.Message(*gates, KaitaiStream(BytesIO(bytes(data))))

    def parse_capture(self, data: bytes):
        from kaitaistruct import KaitaiStream

        return self.Capture(KaitaiStream(BytesIO(bytes(data))))


def compile_parsers(spec: Spec, capture_ksy: Path, message_ksy: Path, out_dir: Path) -> Parsers:
    """Compile a .ksy pair to Python in out_dir and import it without leaving the modules in
    sys.modules, so several compilations (e.g. of a mutated spec) can live side by side."""
    ksc([capture_ksy, message_ksy], out_dir)
    names = (spec.targets.kaitai_message, spec.targets.kaitai_capture)
    with _isolated(names, out_dir / "python"):
        msg = importlib.import_module(names[0])
        cap = importlib.import_module(names[1])
    return Parsers(getattr(msg, class_name(names[0])), getattr(cap, class_name(names[1])))


@contextmanager
def _isolated(names, path: Path):
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


# -- comparison ------------------------------------------------------------------------------
class Mismatch(AssertionError):
    pass


def compare(py, ks, path: str = "") -> None:
    """Every field of the codec's value `py` equals the Kaitai attribute of the same name.

    Mapping: None <-> attribute not read; int <-> int; a Byte1 choice ('K') <-> its enum member;
    str <-> the exact bytes (the codec decodes with surrogateescape, the .ksy keeps bytes);
    bytes <-> bytes; tuple <-> list; dataclass <-> KaitaiStruct of the same class name (ignoring case).
    """
    if dataclasses.is_dataclass(py):
        if ks is None:
            raise Mismatch(f"{path or 'message'}: {type(py).__name__} not read by the .ksy")
        # ksc names classes after the .ksy's snake_case ids: XLogData is XlogData there
        if type(ks).__name__.lower() != type(py).__name__.lower():
            raise Mismatch(f"{path}: .ksy type {type(ks).__name__}, codec {type(py).__name__}")
        for f in dataclasses.fields(py):
            compare(getattr(py, f.name), getattr(ks, f.name, None), f"{path}.{f.name}".lstrip("."))
        return
    if py is None:
        if ks is not None:
            raise Mismatch(f"{path}: the .ksy read {ks!r}, the codec has None")
        return
    if ks is None:
        raise Mismatch(f"{path}: the codec has {py!r}, the .ksy did not read it")
    if isinstance(py, tuple):
        if not isinstance(ks, list) or len(ks) != len(py):
            raise Mismatch(f"{path}: {len(py)} items in the codec, .ksy has {ks!r}")
        for i, (a, b) in enumerate(zip(py, ks)):
            compare(a, b, f"{path}[{i}]")
        return
    if not _same_scalar(py, ks):
        raise Mismatch(f"{path}: codec {py!r}, .ksy {ks!r}")


def _same_scalar(py, ks) -> bool:
    if isinstance(ks, enum.Enum):
        return isinstance(py, str) and len(py) == 1 and ord(py) == ks.value
    if isinstance(py, str):
        return isinstance(ks, bytes) and ks == py.encode("utf-8", "surrogateescape")
    if isinstance(py, bool) or isinstance(ks, bool):
        return type(py) is type(ks) and py == ks
    if isinstance(py, int):
        return isinstance(ks, int) and py == ks
    if isinstance(py, (bytes, bytearray, memoryview)):  # Rest may come as a view
        return isinstance(ks, bytes) and bytes(py) == ks
    raise Mismatch(f"no comparison for {type(py).__name__}")


def check_message(parsers: Parsers, codec, data: bytes, gates: tuple, expected=None) -> None:
    """The .ksy parse of `data` consumes every byte and equals the codec's decode field by field."""
    if expected is None:
        expected = codec.decode_gates(bytes(data), *gates)
    try:
        ks = parsers.parse_message(data, gates)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a mismatch here
        raise Mismatch(f"the .ksy could not parse {bytes(data).hex()}: {exc!r}") from exc
    check_parsed(ks, expected, data)


def check_parsed(ks, expected, data: bytes) -> None:
    if not ks._io.is_eof():
        raise Mismatch(f"the .ksy stopped at byte {ks._io.pos()} of {len(data)}: {data.hex()}")
    if ks.tag.value != data[0]:
        raise Mismatch(f"tag {ks.tag!r} != {data[0]:#x}")
    try:
        compare(expected, ks.body)
    except Mismatch as exc:
        raise Mismatch(f"{exc} (message {bytes(data).hex()})") from None


def ksy_accepts(parsers: Parsers, data: bytes, gates: tuple):
    """The parse, or None when the .ksy rejects the bytes or leaves some unread."""
    try:
        ks = parsers.parse_message(data, gates)
    except Exception:  # noqa: BLE001 - EOF, validation and enum errors all mean "rejected"
        return None
    return ks if ks._io.is_eof() else None


def check_capture(parsers: Parsers, spec: Spec, data: bytes, records) -> dict[str, int]:
    """The capture .ksy reads every record's header and message as the codec's capture module
    does; returns how many messages of each codec class it saw."""
    ks = parsers.parse_capture(data)
    assert ks._io.is_eof()
    assert ks.format_version == 1
    assert len(ks.records) == len(records)
    seen: dict[str, int] = {}
    for i, (rec, kr) in enumerate(zip(records, ks.records)):
        where = f"record {i} (lsn {rec.lsn:X})"
        assert getattr(kr, spec.version.name) == rec.version, where
        for c in spec.contexts:
            assert getattr(kr.flags, c.name) is getattr(rec, c.name), (where, c.name)
        assert kr.lsn == rec.lsn, where
        assert kr.len_message == len(rec.data), where
        expected = rec.decode()
        try:
            check_parsed(kr.message, expected, bytes(rec.data))
        except Mismatch as exc:
            raise Mismatch(f"{where}: {exc}") from None
        name = type(expected).__name__
        seen[name] = seen.get(name, 0) + 1
    return seen


def record_gates(spec: Spec, rec) -> tuple:
    """A capture record's gate values: (version, context, ...)."""
    return (rec.version, *(getattr(rec, c.name) for c in spec.contexts))


def build_codec(spec_path: Path, tmp_path: Path, targets: tuple[str, ...]) -> Path:
    """Render ``spec_path``'s ``targets`` under ``tmp_path`` and compile its C accelerator
    in place (-Wall -Werror); the codec's package directory."""
    import sysconfig

    from codegen.render import render_all

    spec = load_spec(spec_path)
    for rel, text in render_all(spec, targets).items():
        dest = tmp_path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(text if isinstance(text, bytes) else text.encode())
    pkg = tmp_path / spec.targets.package
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    cc = subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror",
         f"-I{sysconfig.get_paths()['include']}", f"-I{ROOT / 'pgcdc' / 'runtime'}",
         str(pkg / "_speedups.c"), "-o", str(pkg / f"_speedups{suffix}")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cc.returncode == 0, cc.stderr
    return pkg
