"""Command line: `python -m codegen generate|check [--spec FILE] [--out DIR]`.

check exits 0 when the output is up to date, 1 on drift (printing the diff and the fix),
2 when the spec is invalid.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from .errors import SpecError
from .loader import load_spec
from .render import render_all

OK, DRIFT, ERROR = 0, 1, 2
# Generated files that are not rendered text (samples) are listed by the targets too; anything
# else found under these folders is stale output and is removed by `generate`.
MANAGED = ("pgoutput_codec", "kaitai", "docs", "samples")
# Built from the generated C source by `pip install -e .` or `make generate`, never committed.
BUILT = (".so", ".pyd")


def _existing(out: Path) -> dict[str, bytes]:
    found = {}
    for top in MANAGED:
        root = out / top
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in BUILT:
                found[p.relative_to(out).as_posix()] = p.read_bytes()
    return found


def _encode(text) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8")


def generate(spec_path: Path, out: Path) -> int:
    spec = load_spec(spec_path, display_name=_display(spec_path))
    files = render_all(spec)
    old = _existing(out)
    for rel, text in files.items():
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = _encode(text)
        if old.get(rel) != data:
            dest.write_bytes(data)
    for rel in sorted(set(old) - set(files)):
        (out / rel).unlink()
    print(f"generated {len(files)} files into {out}")
    return OK


def check(spec_path: Path, out: Path) -> int:
    spec = load_spec(spec_path, display_name=_display(spec_path))
    files = {rel: _encode(t) for rel, t in render_all(spec).items()}
    old = _existing(out)
    drift = False
    for rel in sorted(set(files) | set(old)):
        new_b, old_b = files.get(rel), old.get(rel)
        if new_b == old_b:
            continue
        drift = True
        if new_b is None:
            print(f"stale file (not generated any more): {out / rel}")
            continue
        try:
            a = (old_b or b"").decode("utf-8").splitlines(keepends=True)
            b = new_b.decode("utf-8").splitlines(keepends=True)
            sys.stdout.writelines(difflib.unified_diff(a, b, f"{out / rel} (committed)",
                                                       f"{out / rel} (from spec)"))
        except UnicodeDecodeError:
            print(f"binary file differs: {out / rel}")
    if drift:
        print(f"\n{out} is out of date with {spec_path}. Fix: make generate "
              f"(python -m codegen generate --spec {spec_path} --out {out})")
        return DRIFT
    print(f"{out} is up to date with {spec_path}")
    return OK


def _display(spec_path: Path) -> str:
    try:
        return spec_path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return spec_path.name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    parser.add_argument("command", choices=["generate", "check"])
    parser.add_argument("--spec", type=Path, default=Path("spec/pgoutput.yaml"))
    parser.add_argument("--out", type=Path, default=Path("generated"))
    args = parser.parse_args(argv)
    try:
        return (generate if args.command == "generate" else check)(args.spec, args.out)
    except SpecError as exc:
        print(f"spec error: {exc}", file=sys.stderr)
        return ERROR


if __name__ == "__main__":
    sys.exit(main())
