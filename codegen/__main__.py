"""Command line: `python -m codegen generate|check [--spec FILE ...] [--out DIR]`.

Without --spec, every spec under spec/ is rendered (files named *.sample.yaml are samples,
not specs). check exits 0 when the output is up to date, 1 on drift (printing the diff and the
fix), 2 when a spec is invalid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import SpecError
from .loader import load_spec
from .output import OwnershipError, Output
from .render import render_all

OK, DRIFT, ERROR = 0, 1, 2
SPEC_DIR = Path("spec")


def default_specs() -> list[Path]:
    return sorted(p for p in SPEC_DIR.glob("*.yaml") if not p.name.endswith(".sample.yaml"))


def _display(spec_path: Path) -> str:
    try:
        return spec_path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return spec_path.name


def render_specs(spec_paths: list[Path]) -> dict[str, dict[str, bytes]]:
    """{package: {path relative to the output dir: bytes}} for every spec."""
    rendered: dict[str, dict[str, bytes]] = {}
    owner: dict[str, str] = {}
    for path in spec_paths:
        spec = load_spec(path, display_name=_display(path))
        files = {
            rel: t if isinstance(t, bytes) else t.encode() for rel, t in render_all(spec).items()
        }
        package = spec.targets.package
        if package in rendered:
            raise SpecError(
                _display(path),
                1,
                ("targets", "package"),
                f"package {package!r} is also the package of {owner[package]}",
            )
        for rel in files:
            if rel in owner:
                raise SpecError(
                    _display(path), 1, ("targets",), f"{rel} is also rendered from {owner[rel]}"
                )
            owner[rel] = _display(path)
        owner[package] = _display(path)
        rendered[package] = files
    return rendered


def generate(spec_paths: list[Path], out: Path) -> int:
    output = Output(out)
    total = 0
    for package, files in render_specs(spec_paths).items():
        output.replace(package, files)
        total += len(files)
    print(f"generated {total} files into {out}")
    return OK


def check(spec_paths: list[Path], out: Path) -> int:
    output = Output(out)
    drift = False
    for package, files in render_specs(spec_paths).items():
        drift |= output.diff(package, files, sys.stdout)
    if drift:
        specs = " ".join(f"--spec {p}" for p in spec_paths)
        print(
            f"\n{out} is out of date with its specs. Fix: make generate "
            f"(python -m codegen generate {specs} --out {out})"
        )
        return DRIFT
    print(f"{out} is up to date with {', '.join(map(str, spec_paths))}")
    return OK


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codegen",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("command", choices=["generate", "check"])
    parser.add_argument(
        "--spec",
        type=Path,
        action="append",
        help="a spec file (repeatable); default: every spec under spec/",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("generated"),
        help="the output folder; only files the generator wrote are replaced",
    )
    args = parser.parse_args(argv)
    specs = args.spec or default_specs()
    if not specs:
        print(f"spec error: no spec given and none found under {SPEC_DIR}/", file=sys.stderr)
        return ERROR
    try:
        return (generate if args.command == "generate" else check)(specs, args.out)
    except SpecError as exc:
        print(f"spec error: {exc}", file=sys.stderr)
        return ERROR
    except OwnershipError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ERROR


if __name__ == "__main__":
    sys.exit(main())
