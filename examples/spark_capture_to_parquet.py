"""Decode a pgoutput capture on a local Spark and write one Parquet table per message type.

    python examples/spark_capture_to_parquet.py CAPTURE.pgcap[.gz] OUT_DIR

Each capture record carries its protocol version, stream flags and LSN; the job builds a
DataFrame (capture_seq, capture_lsn, data, in_stream), decodes it with decode_messages, and writes
OUT_DIR/<message type>/ (e.g. OUT_DIR/insert/) with capture_seq, capture_lsn and the message's fields, plus
OUT_DIR/_errors/ for rows that did not decode (none for a well-formed capture). Only message
types the capture holds get a directory; timestamps are Parquet INT64 microseconds.
"""

from __future__ import annotations

import re
import sys

import pyarrow as pa
from pyspark.sql import functions as F

from pgoutput_codec import capture
from pgoutput_codec.spark import (
    MESSAGE_COLUMNS,
    TYPE_NAMES,
    decode_messages,
    local_spark_session,
)


def main(capture_path: str, out_dir: str) -> None:
    records = capture.read(capture_path)
    if not records:
        raise SystemExit("empty capture")
    versions = {(r.protocol_version, r.parallel_streaming) for r in records}
    if len(versions) != 1:
        raise SystemExit(f"one slot per capture expected, found {sorted(versions)}")
    ((protocol_version, parallel),) = versions
    streaming = "parallel" if parallel else ("on" if any(r.in_stream for r in records) else "off")

    spark = local_spark_session("pgoutput-capture-to-parquet", cores=2)
    try:
        table = pa.table(
            {
                "capture_seq": pa.array(range(len(records)), pa.int64()),
                "capture_lsn": pa.array([r.lsn for r in records], pa.decimal128(20, 0)),
                "data": pa.array([r.data for r in records], pa.binary()),
                "in_stream": pa.array([r.in_stream for r in records], pa.bool_()),
            }
        )
        df = spark.createDataFrame(table)
        decoded = decode_messages(
            df,
            "data",
            protocol_version=protocol_version,
            streaming=streaming,
            in_stream_col="in_stream",
            mode="PERMISSIVE",
        ).cache()
        counts = {
            row["type"]: row["count"] for row in decoded.groupBy("message.type").count().collect()
        }
        for type_name in TYPE_NAMES:
            if not counts.get(type_name):
                continue  # no directory for a message type the capture does not hold
            column = MESSAGE_COLUMNS.get(type_name)  # None: a message without fields
            fields = [f"message.{column}.*"] if column else []
            table_dir = column or re.sub(r"(?<!^)(?=[A-Z])", "_", type_name).lower()
            rows = decoded.where(F.col("message.type") == type_name)
            rows.select("capture_seq", "capture_lsn", *fields).write.mode("overwrite").parquet(
                f"{out_dir}/{table_dir}"
            )
        if counts.get(None):
            decoded.where(F.col("decode_error").isNotNull()).select(
                "capture_seq", "capture_lsn", "data", "decode_error"
            ).write.mode("overwrite").parquet(f"{out_dir}/_errors")
        for type_name in sorted(counts, key=lambda t: (t is None, t or "")):
            print(f"{type_name or '(decode error)':20} {counts[type_name]:8}")
    finally:
        spark.stop()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
