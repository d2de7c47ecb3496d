"""When sync's cycles run, for both engines (the driver's loop in :mod:`pgcdc.sync.loop`
and the Structured Streaming query of :mod:`pgcdc.sync.query`)."""

TABLES_CHECK_SECONDS = 30.0  # how often the publication's tables are compared to the snapshot
# this much WAL made durable by the capture past what the last cycle saw starts a cycle before
# the trigger (a burst, a rerun's backlog: the capture reads it meanwhile); after a cycle of
# CATCH_UP_EVENTS or more, anything new durable does (a burst's tail)
EAGER_WAL = 4 << 20
# how often sync looks for durable records between cycles: sooner after a cycle of a burst
# and before the first (a rerun's backlog)
POLL, POLL_BURST = 0.1, 0.02
CHILD_RESTARTS = 5  # capture processes that died (not exit 0 or 2) in a row before giving up
CAPTURE_UP = 10.0  # seconds a restarted capture runs before its deaths are counted anew
