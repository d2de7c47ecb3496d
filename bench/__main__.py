"""`make bench`: every benchmark of the project, peers in the same run."""

from __future__ import annotations

import argparse

from . import codec_bench, instructions


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument(
        "--skip-instructions",
        action="store_true",
        help="skip the valgrind instruction counts (about 3 minutes)",
    )
    parser.add_argument(
        "--skip-live", action="store_true", help="skip the benchmarks that start PostgreSQL"
    )
    parser.add_argument("--spark-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--spill-mb",
        type=int,
        default=1024,
        help="size of the streamed transaction of the live spill bench (MB of tuple data)",
    )
    args = parser.parse_args()
    codec_bench.print_table(codec_bench.run())
    if not args.skip_instructions:
        counts = instructions.run()
        if counts is not None:
            instructions.print_table(counts)
    from . import events_bench, values_bench

    values_bench.run()  # prints its own table
    events_bench.run(instructions=not args.skip_instructions)  # prints its own table
    if not args.skip_live:
        from . import capture_bench

        capture_bench.run()  # prints its own table
        from . import live_events_bench

        live_events_bench.run(spill_mb=args.spill_mb)  # pgcdc vs pgoutput-decoder; 1 GB spill
    if not args.skip_spark:
        from . import spark_bench

        spark_bench.run(n=args.spark_rows)
        from . import apply_bench

        apply_bench.main([])  # 1M change events: captures -> applied Parquet vs native dedupe
        if not args.skip_live:
            from . import snapshot_bench

            snapshot_bench.run()  # initial snapshot rows/s against one COPY and the peers
            from . import source_bench

            source_bench.main(["--noop", "--cpu"])  # the streaming source vs its peer; round 1 cold
            from . import sync_bench

            sync_bench.main([])  # pgcdc sync: throughput vs the peer, latency, retained WAL


if __name__ == "__main__":
    main()
