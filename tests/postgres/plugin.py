"""pytest plugin: print the pgoutput message-type coverage table (type x server) at the end of
the run. Register it from the top-level tests/conftest.py:

    pytest_plugins = ["tests.postgres.plugin"]

The table shows the counts decoded by the codec during tests/codec/test_postgres_replay.py (and the
live test); if no replay test ran, nothing is printed.
"""

from __future__ import annotations

from collections import Counter

# Attribute set on the pytest config object by the replay/live tests:
# {column (e.g. "pg16" or "live pg16"): Counter(message name -> count)}
CONFIG_ATTR = "pgoutput_coverage"

MESSAGE_NAMES = (
    "Begin",
    "Message",
    "Commit",
    "Origin",
    "Relation",
    "Type",
    "Insert",
    "Update",
    "Delete",
    "Truncate",
    "StreamStart",
    "StreamStop",
    "StreamCommit",
    "StreamAbort",
    "BeginPrepare",
    "Prepare",
    "CommitPrepared",
    "RollbackPrepared",
    "StreamPrepare",
)


def coverage(config) -> dict[str, Counter]:
    cov = getattr(config, CONFIG_ATTR, None)
    if cov is None:
        cov = {}
        setattr(config, CONFIG_ATTR, cov)
    return cov


def format_table(cov: dict[str, Counter]) -> list[str]:
    cols = sorted(cov)
    width = max([9] + [len(c) + 2 for c in cols])
    lines = [f"{'message type':18}" + "".join(f"{c:>{width}}" for c in cols)]
    names = list(MESSAGE_NAMES) + sorted({n for c in cov.values() for n in c} - set(MESSAGE_NAMES))
    for n in names:
        lines.append(f"{n:18}" + "".join(f"{cov[c].get(n, 0):>{width}}" for c in cols))
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    cov = getattr(config, CONFIG_ATTR, None)
    if not cov:
        return
    terminalreporter.section("pgoutput message coverage (decoded from real servers)")
    for line in format_table(cov):
        terminalreporter.write_line(line)
