"""Capture: a replication slot into a capture directory (``pgcdc capture``), and read back.

- Live: :mod:`.walsender` (the replication connection), :mod:`.options` (the pgoutput options
  of a session), :mod:`.checks` (before streaming), :mod:`.logical` (the Python API: an
  iterator with an explicit ``ack``), :mod:`.sql` (the SQL-interface mode), :mod:`.catchup`
  (a backlog read by one peek), :mod:`.heartbeat`, :mod:`.copyread` (the read loop in C).
- Durable: :mod:`.runner` (the resumable capture loop), :mod:`.segments` (the capture
  directory), :mod:`.catalog` (the types and relations recorded beside it), :mod:`.prune`,
  :mod:`.metrics`, :mod:`.log`.
- Read back: :mod:`.files` (capture files and directories, in capture order), :mod:`.chunks`.

The command's arguments are parsed in :mod:`pgcdc.cli.capture`.
"""
