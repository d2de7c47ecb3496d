"""Change events: typed rows of a slot's committed transactions, read from capture records.

- :mod:`pgcdc.events.reader`: :class:`Event` and :class:`EventReader` (messages to events);
- :mod:`pgcdc.events.transactions`: which changes belong to which committed transaction;
- :mod:`pgcdc.events.relations`: what each relation OID means, as the stream described it;
- :mod:`pgcdc.events.spill`: transactions held back past a memory bound, on disk;
- :mod:`pgcdc.events.jsonlines`: events as JSON Lines (what ``pgcdc changes`` prints).
"""

from pgcdc.events.reader import Event, EventReader, live_events, read_captures, read_events

__all__ = ["Event", "EventReader", "live_events", "read_captures", "read_events"]
