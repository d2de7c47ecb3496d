"""Regenerate tests/captures/ from scratch against real PostgreSQL 15, 16, 17 and 18.

    python -m tests.postgres.make_captures [--out tests/captures] [--servers pg15,pg16,...]

For each server: create the schema and publication(s), the slots, run the workload once, then
capture through the SQL interface for every protocol version the server supports x every valid
option set, plus two walsender captures (highest protocol version with binary, the richest
streaming mode and two_phase; protocol 1 in text). Writes ``<server>/<name>.pgcap.gz`` and
``manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from pgoutput_codec import capture as capfmt

from . import capture, servers, workload
from .capture import Options

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "captures"

SLOT_PLAIN = "slot_plain"
SLOT_TWO_PHASE = "slot_2pc"
SLOT_WS_MAX = "slot_ws_max"
SLOT_WS_V1 = "slot_ws_v1"


def max_protocol(major: int) -> int:
    return 4 if major >= 16 else 3


def streaming_modes(pv: int) -> list[str]:
    if pv < 2:
        return ["off"]
    if pv < 4:
        return ["off", "on"]
    return ["off", "on", "parallel"]


def capture_name(o: Options) -> str:
    parts = [
        f"proto{o.protocol_version}",
        "binary" if o.binary else "text",
        f"streaming_{o.streaming}",
    ]
    if o.two_phase:
        parts.append("two_phase")
    elif o.two_phase_slot:
        parts.append("two_phase_slot")
    if o.decoding == "buffered_override":
        parts.append("buffered")
    if o.publication != workload.PUBLICATION:
        parts.append("no_generated_columns")
    parts.append(o.interface)
    return "-".join(parts) + ".pgcap.gz"


def option_sets(major: int) -> list[Options]:
    """SQL-interface option sets for a server of this major version."""
    origin = "any" if major >= 16 else None
    base_decoding = "immediate" if major >= 16 else "buffered"
    out = []
    for pv in range(1, max_protocol(major) + 1):
        for binary in (False, True):
            for mode in streaming_modes(pv):
                for two_phase in (False, True) if pv >= 3 else (False,):
                    out.append(
                        Options(pv, binary, mode, two_phase, origin=origin, decoding=base_decoding)
                    )
    if major >= 16:
        # debug_logical_replication_streaming=buffered: only transactions above
        # logical_decoding_work_mem stream (what production servers do)
        for mode in streaming_modes(4):
            out.append(Options(4, True, mode, True, origin=origin, decoding="buffered_override"))
    # a two_phase slot sends two-phase messages even at protocol 1 without the two_phase option
    out.append(
        Options(1, False, "off", False, origin=origin, decoding=base_decoding, two_phase_slot=True)
    )
    out.append(
        Options(2, False, "on", False, origin=origin, decoding=base_decoding, two_phase_slot=True)
    )
    if major >= 18:
        out.append(
            Options(
                4,
                True,
                "parallel",
                True,
                origin=origin,
                publication=workload.PUBLICATION_NO_GENERATED,
                decoding=base_decoding,
            )
        )
    return out


def walsender_sets(major: int) -> list[tuple[str, Options]]:
    origin = "any" if major >= 16 else None
    dec = "immediate" if major >= 16 else "buffered"
    pv = max_protocol(major)
    return [
        (
            SLOT_WS_MAX,
            Options(
                pv,
                True,
                streaming_modes(pv)[-1],
                True,
                origin=origin,
                interface="walsender",
                decoding=dec,
            ),
        ),
        (
            SLOT_WS_V1,
            Options(1, False, "off", False, origin=origin, interface="walsender", decoding=dec),
        ),
    ]


def _server_decoding(o: Options) -> Options:
    """Options with the debug_logical_replication_streaming value to SET on the session."""
    from dataclasses import replace

    return replace(o, decoding="buffered" if o.decoding == "buffered_override" else o.decoding)


def manifest_options(o: Options, major: int, slot_two_phase: bool) -> dict:
    return {
        "binary": o.binary,
        "streaming": o.streaming,
        "two_phase": o.two_phase,
        "two_phase_slot": slot_two_phase,  # slot created with two_phase = true
        "messages": o.messages,
        "origin": o.origin,
        "interface": o.interface,
        "publication": o.publication,
        "publish_generated_columns": (
            "stored"
            if (major >= 18 and o.publication == workload.PUBLICATION)
            else ("none" if major >= 18 else None)
        ),
        "debug_logical_replication_streaming": (
            None
            if major < 16
            else ("buffered" if o.decoding == "buffered_override" else o.decoding)
        ),
    }


def write_catalog(conn, directory: Path) -> Path:
    """``directory/catalog.jsonl``: what the captures' types that are not built in are, as
    ``pgcdc capture`` records it (pgcdc.capture.catalog), read from the server after the
    workload's schema is made (the captures were made from that same schema)."""
    from pgcdc.capture.catalog import CATALOG_FILE, describe_types

    oids = [r[0] for r in conn.execute(
        "SELECT DISTINCT a.atttypid::int8 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' "
        "AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"
    ).fetchall()]  # fmt: skip
    types = describe_types(lambda q, p: conn.execute(q, p).fetchall(), oids)
    line = {"lsn": "0/0", "relation": 0, "types": [types[o] for o in sorted(types)]}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CATALOG_FILE
    path.write_text(json.dumps(line, sort_keys=True) + "\n")
    return path


def catalog_only(key: str, out: Path, log=print) -> None:
    """Write ``out/<key>/catalog.jsonl`` without capturing again, and check that it describes
    every type the existing captures' Type messages name, by the same OID and name."""
    import pgoutput_codec as pgc

    with servers.running_server(key) as srv, srv.connect() as conn:
        workload.prepare_schema(conn, srv.major)
        path = write_catalog(conn, out / key)
    described = {t["oid"]: t for t in json.loads(path.read_text())["types"]}
    for cap in sorted((out / key).glob("*.pgcap*")):
        for rec in capfmt.read(cap):
            msg = rec.decode()
            if isinstance(msg, pgc.Type) and msg.type_oid >= 16384:
                t = described.get(msg.type_oid)
                if t is None or t["name"] != msg.type_name.split(".")[-1]:
                    # a domain is named by its base type; anything else must match
                    if t is None or t["kind"] != "domain":
                        raise SystemExit(f"{cap}: Type {msg.type_oid} {msg.type_name} is not {t}")
    log(f"{key}: {path} describes {len(described)} types")


def capture_server(key: str, out: Path, log=print) -> list[dict]:
    entries = []
    t0 = time.monotonic()
    with servers.running_server(key) as srv, srv.connect() as conn:
        workload.prepare_schema(conn, srv.major)
        write_catalog(conn, out / key)
        for slot, two_phase in (
            (SLOT_PLAIN, False),
            (SLOT_TWO_PHASE, True),
            (SLOT_WS_MAX, True),
            (SLOT_WS_V1, False),
        ):
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                [slot, two_phase],
            )
        workload.run(conn, srv.major)
        jobs = [
            (SLOT_TWO_PHASE if (o.two_phase or o.two_phase_slot) else SLOT_PLAIN, o)
            for o in option_sets(srv.major)
        ] + walsender_sets(srv.major)
        for slot, o in jobs:
            so = _server_decoding(o)
            if o.interface == "sql":
                recs = capture.sql_capture(conn, slot, so)
            else:
                recs = capture.walsender_capture(srv, slot, so)
            rel = f"{key}/{capture_name(o)}"
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            capfmt.write(out / rel, recs)
            entries.append(
                {
                    "path": rel,
                    "server": key,
                    "server_version": srv.version,
                    "server_major": srv.major,
                    "protocol_version": o.protocol_version,
                    "options": manifest_options(
                        o, srv.major, slot in (SLOT_TWO_PHASE, SLOT_WS_MAX)
                    ),
                    "records": len(recs),
                    "message_counts": capture.message_counts(recs),
                }
            )
    log(f"{key} ({srv.version}): {len(entries)} captures in {time.monotonic() - t0:.1f}s")
    return entries


def coverage(entries: list[dict]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for e in entries:
        col = table.setdefault(e["server"], {n: 0 for n in capture.ALL_MESSAGE_NAMES})
        for name, n in e["message_counts"].items():
            col[name] = col.get(name, 0) + n
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--servers", default=",".join(servers.SERVER_KEYS))
    ap.add_argument("--catalog-only", action="store_true",
                    help="only write each server's catalog.jsonl beside its captures")  # fmt: skip
    args = ap.parse_args(argv)
    keys = [k for k in args.servers.split(",") if k]
    if args.catalog_only:
        for k in keys:
            catalog_only(k, args.out)
        return 0
    # find every server first: a missing one is an error before anything is deleted
    for k in keys:
        servers.find_bindir(k)
    t0 = time.monotonic()
    out: Path = args.out
    for k in keys:
        shutil.rmtree(out / k, ignore_errors=True)
    entries = []
    manifest_path = out / "manifest.json"
    if manifest_path.exists() and set(keys) != set(servers.SERVER_KEYS):
        # regenerating a subset: keep the other servers' entries
        old = json.loads(manifest_path.read_text())["files"]
        entries = [e for e in old if e["server"] not in keys]
    for k in keys:
        entries += capture_server(k, out)
    entries.sort(
        key=lambda e: (
            servers.SERVER_KEYS.index(e["server"]) if e["server"] in servers.SERVER_KEYS else 99
        )
    )
    manifest = {
        "format": "pgoutput-captures",
        "capture_format_version": capfmt.FORMAT_VERSION,
        "files": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    table = coverage(entries)
    names = capture.ALL_MESSAGE_NAMES
    print(f"{'message':18}" + "".join(f"{k:>9}" for k in table))
    for n in names:
        print(f"{n:18}" + "".join(f"{table[k].get(n, 0):>9}" for k in table))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len(entries)} files, {total / 1e6:.2f} MB, {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
