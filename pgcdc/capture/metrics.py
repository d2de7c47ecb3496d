"""Metrics for scraping: the Prometheus text format through ``prometheus-client``, off by
default, on 127.0.0.1 unless another address is given.

    from pgcdc.capture.metrics import PipelineMetrics, serve
    metrics = PipelineMetrics("capture", slot="s")
    server = serve(metrics, "127.0.0.1:9187")   # or "9187": host 127.0.0.1
    metrics.messages += n                       # plain attributes, set as the pipeline goes
    ...
    server.close()

The values are plain attributes of :class:`PipelineMetrics`, set by the pipeline where it
already holds them (a capture per batch of records, not per message), or filled by a
``refresh`` callback right before each scrape; the registry reads them only when scraped. No
lock, no per-message cost. One registry per object (not prometheus-client's global one), so a
process may run several pipelines, and tests several captures.

Metric names, all with the labels ``component`` (capture, sync) and ``slot``:

=========================================  =======  ============================================
pgcdc_messages_received_total              counter  pgoutput messages received from the slot
pgcdc_bytes_received_total                 counter  bytes of those messages
pgcdc_received_lsn                         gauge    the highest LSN received
pgcdc_durable_lsn                          gauge    the position durable on our side
pgcdc_confirmed_lsn                        gauge    the position confirmed to the server
pgcdc_server_wal_lsn                       gauge    the server's WAL end, as last reported
pgcdc_lag_bytes                            gauge    server WAL end minus the durable position
pgcdc_last_message_timestamp_seconds       gauge    Unix time the last message arrived
pgcdc_reconnects_total                     counter  attempts to connect again after a loss
pgcdc_heartbeats_total                     counter  heartbeats written
pgcdc_heartbeat_failures_total             counter  heartbeats that could not be written
pgcdc_up                                   gauge    1 while connected to the server and streaming
=========================================  =======  ============================================

LSNs are exported as numbers (a float holds them exactly up to 2^53 bytes of WAL).
"""

from __future__ import annotations

from collections.abc import Callable

# name -> (type, help, attribute of PipelineMetrics)
METRICS = {
    "pgcdc_messages_received": ("counter", "pgoutput messages received from the slot", "messages"),
    "pgcdc_bytes_received": ("counter", "bytes of pgoutput messages received", "bytes"),
    "pgcdc_received_lsn": ("gauge", "the highest LSN received from the slot", "received_lsn"),
    "pgcdc_durable_lsn": ("gauge", "the position durable on the consumer's side", "durable_lsn"),
    "pgcdc_confirmed_lsn": ("gauge", "the position confirmed to the server", "confirmed_lsn"),
    "pgcdc_server_wal_lsn": ("gauge", "the server's WAL end, as last reported", "server_wal_lsn"),
    "pgcdc_lag_bytes": (
        "gauge",
        "bytes of WAL between the server's WAL end and the durable position",
        "lag_bytes",
    ),
    "pgcdc_last_message_timestamp_seconds": (
        "gauge",
        "Unix time the last message arrived (0: none yet)",
        "last_message_time",
    ),
    "pgcdc_reconnects": (
        "counter",
        "attempts to connect again after a connection was lost",
        "reconnects",
    ),
    "pgcdc_heartbeats": ("counter", "heartbeats written to the source", "heartbeats"),
    "pgcdc_heartbeat_failures": (
        "counter",
        "heartbeats that could not be written",
        "heartbeat_failures",
    ),
    "pgcdc_up": ("gauge", "1 while connected to the server and streaming", "up"),
}


class PipelineMetrics:
    """The values of :data:`METRICS` for one pipeline, as plain attributes, and a
    prometheus-client collector that reads them when scraped. A subclass names other
    metrics in its own ``METRICS`` table."""

    METRICS = METRICS

    def __init__(
        self, component: str, slot: str, refresh: Callable[[PipelineMetrics], None] | None = None
    ):
        self.labels = {"component": component, "slot": slot}
        self.refresh = refresh  # refresh(self): called before each scrape
        for _, _, attr in self.METRICS.values():
            setattr(self, attr, 0)
        self.registry = None

    def collect(self):
        """prometheus-client's Collector protocol."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self.refresh is not None:
            try:
                self.refresh(self)
            except Exception:  # noqa: BLE001 - a scrape shows the last values rather than fail
                pass
        names, values = list(self.labels), list(self.labels.values())
        for name, (kind, text, attr) in self.METRICS.items():
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, text, labels=names
            )
            family.add_metric(values, float(getattr(self, attr)))
            yield family

    def make_registry(self):
        """A registry of its own holding this collector (created once)."""
        if self.registry is None:
            from prometheus_client import CollectorRegistry

            self.registry = CollectorRegistry(auto_describe=False)
            self.registry.register(self)
        return self.registry

    def render(self) -> str:
        """The Prometheus text format, as a scrape gets it."""
        from prometheus_client import generate_latest

        return generate_latest(self.make_registry()).decode()


def parse_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (on ``default_host``); ValueError otherwise."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = default_host, text
    host = host.strip("[]") or default_host
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--metrics wants HOST:PORT or PORT, not {text!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--metrics: port {number} is out of range")
    return host, number


class MetricsServer:
    """The HTTP server of :func:`serve`; :meth:`close` stops it."""

    def __init__(self, httpd, thread):
        self.httpd, self.thread = httpd, thread

    @property
    def address(self) -> tuple[str, int]:
        return self.httpd.server_address[:2]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def serve(metrics: PipelineMetrics, address: str) -> MetricsServer:
    """Serve ``metrics`` at ``http://ADDRESS/metrics`` (any path answers) from a daemon
    thread. ``address``: see :func:`parse_address` (port 0: any free port). Needs the
    ``prometheus-client`` package (the ``metrics`` extra; ModuleNotFoundError naming it
    otherwise); OSError when the address cannot be bound."""
    try:
        import prometheus_client as prom
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "prometheus_client":
            raise
        raise ModuleNotFoundError(
            "--metrics needs prometheus-client, which is not installed: "
            "pip install 'pgcdc[metrics]'",
            name="prometheus_client",
        ) from None
    host, port = parse_address(address)
    httpd, thread = prom.start_http_server(port, addr=host, registry=metrics.make_registry())
    return MetricsServer(httpd, thread)
