"""The cyclic collector's pause around bulk event reading leaves it as it found it."""

from __future__ import annotations

import gc

import pytest

from pgcdc.events.gcpause import paused


def test_a_pause_restores_the_collector_and_nests():
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause found it off: it stays off
    assert gc.isenabled()


def test_a_pause_ends_with_an_error_and_leaves_a_disabled_collector_off():
    with pytest.raises(ZeroDivisionError), paused():
        1 / 0
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_generator_left_unfinished_restores_it_when_closed():
    def batches():
        with paused():
            yield from range(3)

    it = batches()
    assert next(it) == 0 and not gc.isenabled()
    it.close()
    assert gc.isenabled()
