"""sync's capture process before it is given its configuration (pgcdc.sync.child): started
ahead while sync plans, it ends with exit 0 when sync stops or goes away instead."""

from __future__ import annotations

import os

import pytest

from pgcdc.sync.child import CaptureProcess


@pytest.fixture
def lock_fd(tmp_path):
    fd = os.open(tmp_path / "_sync.lock", os.O_RDWR | os.O_CREAT, 0o644)
    yield fd
    os.close(fd)


def test_a_waiting_capture_process_stopped_exits_0(lock_fd):
    child = CaptureProcess("json", lock_fd)
    child.spawn()
    child.stop()  # what sync's signal handler and its close() do
    assert child.wait(60) == 0


def test_a_waiting_capture_process_whose_sync_is_gone_exits_0(lock_fd, capfd):
    child = CaptureProcess("json", lock_fd)
    child.spawn()
    child.proc.stdin.close()  # the end of its stdin: sync's process gone, however
    assert child.wait(60) == 0
    # nothing said (its stderr is this process's): it had not started
    assert capfd.readouterr().err == ""
