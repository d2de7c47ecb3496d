"""The exit statuses of every ``pgcdc`` command, for the library code that runs one
(:mod:`pgcdc.sync`) as much as for :mod:`pgcdc.cli`."""

OK = 0
BAD_DATA = 1  # the input was read, and something in it cannot be processed
USAGE = 2  # bad options, input that may not be read, a server or set-up that refuses
INTERRUPTED = 130  # as a shell reports a process ended by SIGINT
