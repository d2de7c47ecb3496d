"""Where the codecs' Kaitai Struct files and sample captures are (what ``pgcdc kaitai DIR``
copies out), for the Kaitai Web IDE (https://ide.kaitai.io).

Drag both ``.ksy`` files of a codec into the IDE, then a capture file (a segment of a capture
directory, or the sample written here): the IDE parses it with ``*_capture.ksy``, which
imports ``*_message.ksy`` for each record.

An installed wheel carries the files in ``<codec>/kaitai/``; in a clone of the repository they
are the generator's output in ``generated/kaitai/`` and ``generated/samples/``.
"""

from __future__ import annotations

import importlib
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
