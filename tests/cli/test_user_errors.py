"""Errors that teach: each says what was expected and how to fix it (issue: first hour as a
user). Optional dependencies are hidden by a meta path finder, as a venv without the extra
would lack them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pgcdc
import pgoutput_codec as pgc
from pgoutput_codec import capture

ROOT = Path(__file__).resolve().parents[2]

WITHOUT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
from pgcdc.cli import main
sys.exit(main({argv!r}))
"""


def run_without(blocked: set[str], argv: list[str], cwd: Path = ROOT):
    code = WITHOUT.format(blocked=sorted(blocked), argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'generated'}", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    "blocked, argv, extra",
    [
        ({"pyspark"}, ["apply", "x.pgcap", "--out", "state"], "spark"),
        ({"orjson"}, ["changes", "x.pgcap"], "postgres"),
        ({"psycopg"}, ["capture", "--slot", "s", "--publication", "p", "--out", "d"], "postgres"),
    ],
)
def test_missing_extra_names_the_pip_command(blocked, argv, extra, tmp_path):
    proc = run_without(blocked, argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"pip install 'pgcdc[{extra}]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_lost_module_of_an_installed_extra_is_not_called_missing(tmp_path):
    """A ModuleNotFoundError for a module of an extra that is installed (a broken install,
    an import gone wrong) is a traceback, not advice to install what is there."""
    code = WITHOUT.replace('name.split(".")[0] in {blocked!r}', "name == 'pyspark.sql'")
    code = code.format(argv=["apply", "x.pgcap", "--out", "state"])
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'generated'}", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr and "'pyspark.sql'" in proc.stderr, proc.stderr
    assert "pip install" not in proc.stderr, proc.stderr


def test_demo_without_a_server_says_how_to_start_one(tmp_path):
    proc = run_without(set(), ["demo", "dsn", "--dir", str(tmp_path / "nowhere")])
    assert proc.returncode == 1
    assert "pgcdc demo start --dir" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_command_lists_the_commands():
    proc = run_without(set(), ["aply"])
    assert proc.returncode == 2 and "apply" in proc.stderr and "capture" in proc.stderr


def test_lsn_helpers_are_public():
    # PostgreSQL's text form: high and low 32 bits in hex (pg_lsn_out).
    assert pgcdc.parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert pgcdc.format_lsn((0x16 << 32) | 0xB374D848) == "16/B374D848"
    with pytest.raises(ValueError, match="16/B374D848"):
        pgcdc.parse_lsn("not an lsn")


def test_capture_from_payloads_refuses_lsn_text_with_the_fix():
    with pytest.raises(pgc.DecodeError, match="parse_lsn"):
        list(capture.from_payloads([("0/16B3748", b"B" + bytes(20))], 1))


def test_spark_decode_without_in_stream_col_says_so(spark):  # noqa: F811
    """A streamed change decoded without its in_stream column fails with the fix in the text."""
    from pgoutput_codec.spark import decode_messages

    col = pgc.TupleColumn(kind="t", value=b"42")
    streamed = pgc.encode(
        pgc.Insert(xid=777, relation_oid=16384, new_tuple=pgc.TupleData(columns=(col,))),
        protocol_version=2,
        streaming="on",
        in_stream=True,
    )
    df = spark.createDataFrame([(bytearray(streamed),)], "data binary")
    row = decode_messages(df, "data", protocol_version=2, streaming="on").collect()[0]
    assert row["message"] is None
    assert "in_stream_col" in row["decode_error"] and "with_in_stream" in row["decode_error"]
    # Off: nothing could have been in a stream, so no hint.
    off = decode_messages(df, "data", protocol_version=2, streaming="off").collect()[0]
    assert off["decode_error"] and "in_stream_col" not in off["decode_error"]


def test_readme_fast_entry_points_are_exported():
    # The README documents decode_tuple / decode_gates for callers that resolved parameters once.
    data = pgc.encode(pgc.StreamStop(), protocol_version=4, streaming="parallel")
    gates = pgc.PARAMS.resolve(4, "parallel", False)
    assert pgc.decode_tuple(data, gates) == pgc.decode_gates(data, *gates) == pgc.StreamStop()
    assert "decode_tuple" in pgc.__all__
