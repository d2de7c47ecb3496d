"""Helpers for the Kaitai tests: compile .ksy files with the pinned npm compiler, import the
Python it produces in isolation, and compare its parse with the Python codec field by field."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import shutil
import subprocess
import sys
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KSC = ROOT / "tools" / "ksc.mjs"
KAITAI_DIR = ROOT / "generated" / "kaitai"
MESSAGE_KSY = "pgoutput_message.ksy"
CAPTURE_KSY = "pgoutput_capture.ksy"
SAMPLE = ROOT / "generated" / "samples" / "pgoutput_sample.pgcap"
MODULES = ("pgoutput_message", "pgoutput_capture")


class CompileError(AssertionError):
    pass


def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        raise CompileError("node is not installed; the Kaitai tests need Node.js 18 or later")
    if not (ROOT / "node_modules" / "kaitai-struct-compiler").is_dir():
        raise CompileError("the Kaitai compiler is not installed; run `npm ci` in the repo root")
    return exe


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
        raise CompileError(f"kaitai-struct-compiler failed (exit {proc.returncode}):\n"
                           f"{proc.stderr}{proc.stdout}")
    return proc


def compile_python(kaitai_dir: Path, out_dir: Path) -> Path:
    """Compile both .ksy files of `kaitai_dir` to Python in out_dir/python; returns that dir."""
    ksc([kaitai_dir / CAPTURE_KSY, kaitai_dir / MESSAGE_KSY], out_dir)
    return out_dir / "python"


@dataclasses.dataclass
class Parsers:
    """The compiled classes of one compilation (imported under their own module objects)."""

    message_module: object
    capture_module: object

    @property
    def Message(self):  # noqa: N802
        return self.message_module.PgoutputMessage

    @property
    def Capture(self):  # noqa: N802
        return self.capture_module.PgoutputCapture

    def parse_message(self, data: bytes, pv: int, in_stream: bool, parallel: bool):
        from kaitaistruct import KaitaiStream

        return self.Message(pv, in_stream, parallel, KaitaiStream(BytesIO(bytes(data))))

    def parse_capture(self, data: bytes):
        from kaitaistruct import KaitaiStream

        return self.Capture(KaitaiStream(BytesIO(bytes(data))))


def load_parsers(py_dir: Path) -> Parsers:
    """Import pgoutput_message / pgoutput_capture from py_dir without leaving them in
    sys.modules, so several compilations (e.g. of a mutated spec) can live side by side."""
    with _isolated(MODULES, py_dir):
        msg = importlib.import_module("pgoutput_message")
        cap = importlib.import_module("pgoutput_capture")
    return Parsers(msg, cap)


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


# -- comparison -----------------------------------------------------------------------------
class Mismatch(AssertionError):
    pass


def _public(obj) -> dict:
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def compare(py, ks, path: str = "") -> None:
    """Every field of the codec's value `py` equals the Kaitai attribute of the same name.

    Mapping: None <-> attribute not read; int <-> int; a Byte1 choice ('K') <-> its enum member;
    str <-> the exact bytes (the codec decodes with surrogateescape, the .ksy keeps bytes);
    bytes <-> bytes; tuple <-> list; dataclass <-> KaitaiStruct of the same class name.
    """
    if dataclasses.is_dataclass(py):
        if ks is None:
            raise Mismatch(f"{path or 'message'}: {type(py).__name__} not read by the .ksy")
        if type(ks).__name__ != type(py).__name__:
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
    if isinstance(ks, enum.Enum):
        ok = isinstance(py, str) and len(py) == 1 and ord(py) == ks.value
    elif isinstance(py, str):
        ok = isinstance(ks, bytes) and ks == py.encode("utf-8", "surrogateescape")
    elif isinstance(py, bool) or isinstance(ks, bool):
        ok = type(py) is type(ks) and py == ks
    elif isinstance(py, int):
        ok = isinstance(ks, int) and not isinstance(ks, enum.Enum) and py == ks
    elif isinstance(py, bytes):
        ok = isinstance(ks, bytes) and py == ks
    else:
        raise Mismatch(f"{path}: no comparison for {type(py).__name__}")
    if not ok:
        raise Mismatch(f"{path}: codec {py!r}, .ksy {ks!r}")


def check_message(parsers: Parsers, data: bytes, pv: int, in_stream: bool,
                  parallel: bool, expected=None) -> None:
    """The .ksy parse of `data` consumes every byte and equals the codec's decode field by field."""
    if expected is None:
        from pgoutput_codec import capture

        expected = capture.Record(pv, in_stream, parallel, 0, data).decode()
    try:
        ks = parsers.parse_message(data, pv, in_stream, parallel)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a mismatch here
        raise Mismatch(f"the .ksy could not parse {data.hex()}: {exc!r}") from exc
    check_parsed(ks, expected, data)


def check_parsed(ks, expected, data: bytes) -> None:
    if not ks._io.is_eof():
        raise Mismatch(f"the .ksy stopped at byte {ks._io.pos()} of {len(data)}: {data.hex()}")
    if ks.tag.value != data[0]:
        raise Mismatch(f"tag {ks.tag!r} != {data[0]:#x}")
    try:
        compare(expected, ks.body)
    except Mismatch as exc:
        raise Mismatch(f"{exc} (message {data.hex()})") from None


def ksy_accepts(parsers: Parsers, data: bytes, pv: int, in_stream: bool, parallel: bool):
    """The parse, or None when the .ksy rejects the bytes or leaves some unread."""
    try:
        ks = parsers.parse_message(data, pv, in_stream, parallel)
    except Exception:  # noqa: BLE001 - EOF, validation and enum errors all mean "rejected"
        return None
    return ks if ks._io.is_eof() else None
