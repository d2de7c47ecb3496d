"""The hypothesis cases of decode_messages (every message combination, replication messages)
shared by tests/spark/test_spark.py and test_spark_jvm.py."""

from __future__ import annotations

from pathlib import Path
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from tests.support import strategies as S  # noqa: E402


def slow(max_examples):
    """Few, wide examples: each is a Spark job (HealthCheck.too_slow etc. do not apply)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
    )  # shrinking: too slow


def _every_combination(valid_utf8=True):
    """One message for every (context, message) pair the spec allows, as one strategy."""
    return st.tuples(
        *[
            S.message_in_context(ctx, m.name, valid_utf8).map(lambda msg, ctx=ctx: (*ctx, msg))
            for ctx, m in S.every_message_in_every_context()
        ]
    )


def _rc():
    import replication_codec
    from replication_codec import spark as rcs

    return replication_codec, rcs


def _replication_message(rc, message, draw_field):
    """A strategy for one replication message, derived from its spec (ints and Rest only)."""
    from codegen.model import implicit_fields

    fields = {}
    implicit = implicit_fields(message.blocks)
    for f in message.all_fields[1:]:
        if f.is_literal or f.name in implicit:
            continue
        fields[f.name] = draw_field(f)
    return st.fixed_dictionaries(fields).map(lambda kw: getattr(rc, message.class_name)(**kw))


def _replication_field(f):
    if f.is_int:
        bits = {"Int8": 8, "Int16": 16, "Int32": 32, "Int64": 64}[f.type]
        if f.signed:
            return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return st.integers(0, 2**bits - 1)
    assert f.type == "Rest", f"no strategy for {f.type}"
    return st.binary(max_size=40)


def _replication_cases():
    from codegen.loader import load_spec

    rc, _ = _rc()
    spec = load_spec(Path(__file__).resolve().parents[2] / "spec" / "replication.yaml")
    cases = [
        _replication_message(rc, m, _replication_field).map(lambda msg, v=v: (v, msg))
        for v in (18, 19)
        for m in spec.messages
        if m.since <= v
    ]
    return st.tuples(*cases)
