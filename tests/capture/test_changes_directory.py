"""`pgcdc changes` reads a capture directory (as `pgcdc capture` writes it) the same as the
capture file it was cut from, and ignores the partial record a crash leaves at the end."""

from __future__ import annotations

import pytest

import shutil

from pathlib import Path

from pgcdc.cli import changes
from pgoutput_codec import capture

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

CAPTURE = sorted((Path(__file__).parents[1] / "captures" / "pg17").glob("proto4-text-*.pgcap.gz"))[
    0
]


def _events(capsys, *args) -> list[str]:
    assert changes.main([*map(str, args)]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_directory_gives_the_events_of_its_file(tmp_path, capsys):
    records = capture.read(CAPTURE)
    whole = _events(capsys, CAPTURE)
    assert len(whole) > 10
    folder = tmp_path / "capture"
    folder.mkdir()
    shutil.copy(CAPTURE.parent / "catalog.jsonl", folder)  # as pgcdc capture records it
    half = len(records) // 2
    # segment names per the capture-directory contract: <seq:08d>-<start lsn:016X>.pgcap
    capture.write(folder / f"00000000-{0:016X}.pgcap", records[:half])
    last = folder / f"00000001-{records[half].lsn:016X}.pgcap"
    capture.write(last, records[half:])
    with last.open("ab") as f:  # a crash mid-write: a record header and part of its message
        f.write(b"\x04\x00" + bytes(8) + (100).to_bytes(4, "big") + b"BEGI")
    assert _events(capsys, folder) == whole
