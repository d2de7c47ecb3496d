"""The exit statuses of every ``pgcdc`` command. Only :mod:`pgcdc.cli` returns them: the
library raises (:mod:`pgcdc.errors`), and :func:`pgcdc.cli._common.exit_code` maps its errors
to these."""

OK = 0
BAD_DATA = 1  # the input was read, and something in it cannot be processed (DataError)
USAGE = 2  # bad options, input that may not be read, a server or set-up that refuses (SetupError)
INTERRUPTED = 130  # as a shell reports a process ended by SIGINT (KeyboardInterrupt, Interrupted)
