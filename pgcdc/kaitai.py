"""``pgcdc kaitai DIR``: write the codecs' Kaitai Struct files and sample captures to DIR, for
the Kaitai Web IDE (https://ide.kaitai.io).

Drag both ``.ksy`` files of a codec into the IDE, then a capture file (a segment of a capture
directory, or the sample written here): the IDE parses it with ``*_capture.ksy``, which
imports ``*_message.ksy`` for each record.

An installed wheel carries the files in ``<codec>/kaitai/``; in a clone of the repository they
are the generator's output in ``generated/kaitai/`` and ``generated/samples/``.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path

CODECS = ("pgoutput_codec", "replication_codec")
SUFFIXES = (".ksy", ".pgcap", ".pgrcap")


def kaitai_files(codec: str) -> list[Path]:
    package = Path(importlib.import_module(codec).__file__).parent
    shipped = package / "kaitai"
    if shipped.is_dir():
        return sorted(p for p in shipped.iterdir() if p.suffix in SUFFIXES)
    # A repository checkout: the generator's manifest names the files it rendered.
    manifest = package.parent / ".codegen" / f"{codec}.files"
    if manifest.exists():
        names = manifest.read_text().split()
        return [package.parent / n for n in names if n.endswith(SUFFIXES)]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pgcdc kaitai",
        description="Write the Kaitai Struct files (.ksy) and sample captures of the codecs.",
    )
    parser.add_argument("out", type=Path, help="directory to write to (created if missing)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for codec in CODECS:
        files = kaitai_files(codec)
        if not files:
            print(f"pgcdc kaitai: {codec} has no Kaitai files (a broken install?)", file=sys.stderr)
            return 1
        for source in files:
            shutil.copyfile(source, args.out / source.name)
            written.append(source.name)
    print("\n".join(str(args.out / name) for name in written))
    print(
        "Open https://ide.kaitai.io, drag in pgoutput_capture.ksy and pgoutput_message.ksy, "
        "then a capture segment (*.pgcap).",
        file=sys.stderr,
    )
    return 0
