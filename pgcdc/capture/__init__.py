"""Live capture from a replication slot: ``pgcdc capture`` and its Python API.

Modules: :mod:`.walsender` (the replication connection), :mod:`.options` (the pgoutput options
of a session), :mod:`.stream` (the Python API: an iterator with an explicit ``ack``),
:mod:`.segments` (the capture directory), :mod:`.sql` (the SQL-interface mode) and :mod:`.cli`.
"""
