"""A SparkSession that starts in the background: ``pgcdc sync`` restarted on a directory has
its capture read the slot's backlog and its first cycles applied in the driver
(:mod:`pgcdc.apply.driver`, no Spark job) while the JVM starts, which takes seconds.

Code that may be handed one (apply) asks :func:`started` before touching the session when it
can do without, and :func:`resolve` where it needs the real one (that waits for it).
"""

from __future__ import annotations

import threading

__all__ = ["SessionLater", "resolve", "started"]


class SessionLater:
    """``start()`` run in a thread from :meth:`begin` (at once unless ``deferred``); any
    attribute of the session begins it if need be and waits for it (and raises what the
    start raised)."""

    def __init__(self, start, *, deferred: bool = False):
        self._start = start
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._session = None
        self._error: BaseException | None = None
        if not deferred:
            self.begin()

    def begin(self) -> None:
        """Start the session in the background (once)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="pgcdc-spark-start",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def _run(self) -> None:
        try:
            self._session = self._start()
        except BaseException as e:  # noqa: BLE001 - given to whoever asks for the session
            self._error = e
        finally:
            self._done.set()

    @property
    def begun(self) -> bool:
        return self._thread is not None

    @property
    def started(self) -> bool:
        """The session exists (False while it starts, or when its start failed)."""
        return self._done.is_set() and self._error is None

    def check(self) -> None:
        """Raise what the start raised, if it has failed."""
        if self._done.is_set() and self._error is not None:
            raise self._error

    def session(self):
        self.begin()
        self._done.wait()
        self.check()
        return self._session

    def __getattr__(self, name):
        return getattr(self.session(), name)


def started(spark) -> bool:
    """Whether ``spark`` (a SparkSession or a :class:`SessionLater`) is there to use now."""
    return not isinstance(spark, SessionLater) or spark.started


def resolve(spark):
    """The SparkSession itself (waiting for a :class:`SessionLater` to start)."""
    return spark.session() if isinstance(spark, SessionLater) else spark
