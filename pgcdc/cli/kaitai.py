"""``pgcdc kaitai DIR``: write the codecs' Kaitai Struct files and sample captures to DIR, for
the Kaitai Web IDE (see :mod:`pgcdc.kaitai`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pgcdc.kaitai import CODECS, kaitai_files
from pgcdc.cli._common import Parser, command


@command
def main(argv: list[str] | None = None) -> int:
    parser = Parser(
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
