"""``pgcdc sync --metrics``: one endpoint for the whole pipeline.

The capture runs in a child process with its own :class:`~pgcdc.capture.metrics.PipelineMetrics`
(component ``capture``). Sync serves the address the user gave; the child serves on a free
port of 127.0.0.1 that only sync knows, and each scrape of sync's endpoint fetches the
child's metrics and adds sync's own (component ``sync``): one address to scrape, as with
``pgcdc capture --metrics``, and the child's numbers stay its own (no shared memory, no
per-message cost in sync).

Sync's metrics, with the labels ``component="sync"`` and ``slot``:

====================================  =======  ===================================================
pgcdc_applied_lsn                     gauge    the position the tables are current to
pgcdc_applied_lag_bytes               gauge    the server's WAL position at the last cycle minus it
pgcdc_applied_lag_seconds             gauge    how long ago the server's WAL was last at it
pgcdc_apply_cycles_total              counter  cycles that applied something
pgcdc_applied_events_total            counter  change events those cycles applied
pgcdc_apply_cycle_seconds             gauge    the last such cycle's duration
pgcdc_last_apply_timestamp_seconds    gauge    Unix time the last such cycle ended
pgcdc_table_bytes_rewritten_total     counter  bytes of table files cycles replaced (vacuum's)
pgcdc_capture_restarts_total          counter  capture processes started again after they died
pgcdc_capture_up                      gauge    1 while the capture process answers
pgcdc_tables_set_aside                gauge    tables set aside (not applied until a snapshot)
pgcdc_table_set_aside                 gauge    1 for each table set aside (label ``table``; the
                                               reason is in the log, and in pgcdc status)
====================================  =======  ===================================================
"""

from __future__ import annotations

import socket
import urllib.request

from pgcdc.capture.metrics import PipelineMetrics

# name -> (type, help, attribute of SyncMetrics)
METRICS = {
    "pgcdc_applied_lsn": ("gauge", "the position the tables are current to", "applied_lsn"),
    "pgcdc_applied_lag_bytes": (
        "gauge",
        "the server's WAL position at the last cycle's start minus the applied position",
        "lag_bytes",
    ),
    "pgcdc_applied_lag_seconds": (
        "gauge",
        "how long ago the server's WAL was last at or behind the applied position",
        "lag_seconds",
    ),
    "pgcdc_apply_cycles": ("counter", "apply cycles that applied something", "cycles"),
    "pgcdc_applied_events": ("counter", "change events the apply cycles applied", "events"),
    "pgcdc_apply_cycle_seconds": ("gauge", "the last apply cycle's duration", "cycle_seconds"),
    "pgcdc_last_apply_timestamp_seconds": (
        "gauge",
        "Unix time the last apply cycle ended (0: none yet)",
        "last_cycle_time",
    ),
    "pgcdc_table_bytes_rewritten": (
        "counter",
        "bytes of the tables' data files the apply cycles replaced (kept until vacuum)",
        "rewritten_bytes",
    ),
    "pgcdc_capture_restarts": (
        "counter",
        "capture processes started again after they died",
        "capture_restarts",
    ),
    "pgcdc_capture_up": ("gauge", "1 while the capture process answers", "capture_up"),
    "pgcdc_tables_set_aside": (
        "gauge",
        "tables set aside: not applied until pgcdc resnapshot takes them up again",
        "tables_set_aside",
    ),
}
TABLE_SET_ASIDE = "pgcdc_table_set_aside"  # a sample per table set aside (label table)


class SyncMetrics(PipelineMetrics):
    """Sync's values as plain attributes; scraped, the capture child's metrics come first."""

    METRICS = METRICS

    def __init__(self, slot: str, child_port: int):
        super().__init__("sync", slot)
        self.child_address = f"127.0.0.1:{child_port}"
        self.child_url = f"http://{self.child_address}/metrics"
        self.set_aside: list[str] = []  # the tables set aside (pgcdc.sync.aside)

    def child_families(self):
        """The capture child's metric families, or none while it is down or starting."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(self.child_url, timeout=2) as r:
                text = r.read().decode()
            return list(text_string_to_metric_families(text))
        except (OSError, ValueError):  # down, starting, or a scrape cut short
            return []

    def collect(self):
        """prometheus-client's Collector protocol: the child's families, then sync's."""
        from prometheus_client.core import GaugeMetricFamily

        families = self.child_families()
        self.capture_up = int(bool(families))
        aside = list(self.set_aside)
        self.tables_set_aside = len(aside)
        yield from families
        yield from super().collect()
        family = GaugeMetricFamily(TABLE_SET_ASIDE, "1 for each table set aside (its reason "
                                   "is in the log and in pgcdc status)",
                                   labels=[*self.labels, "table"])  # fmt: skip
        for name in aside:
            family.add_metric([*self.labels.values(), name], 1.0)
        yield family


def free_port() -> int:
    """A port of 127.0.0.1 free right now, for the capture child's own endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
