"""A root daemon without a lane user gives its lanes a dynamic uid (support/sandbox.py, decision 0033): one that
no passwd or group entry names and no process holds, locked in systemd's own lock directory so that systemd's
allocator (which takes the same BSD lock before it hands a uid to a DynamicUser= service, and skips one it cannot
lock) never gives it to a service while the lanes live. Runs as any user, on a lock directory of its own."""
from __future__ import annotations

import fcntl
import os

import pytest

from edgeinfer.support import sandbox


def free_uids(n: int) -> list[int]:
    used = sandbox._uids_in_use()
    return [u for u in sandbox.DYNAMIC_UIDS if u not in used and not sandbox._named(u)][:n]


@pytest.fixture
def held():
    before = list(sandbox._held_locks)
    yield
    for fd in sandbox._held_locks[len(before):]:
        os.close(fd)
    sandbox._held_locks[:] = before


def test_the_lock_is_systemds_own():
    assert sandbox.DYNAMIC_UID_LOCKS == "/run/systemd/dynamic-uid"
    assert (sandbox.DYNAMIC_UIDS.start, sandbox.DYNAMIC_UIDS.stop - 1) == (61184, 65519)


def test_a_uid_systemd_has_locked_is_skipped_and_the_one_taken_is_locked_for_systemd(tmp_path, held):
    a, b = free_uids(2)
    taken_by_systemd = os.open(tmp_path / str(a), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(taken_by_systemd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what pick_uid holds for a DynamicUser= service
    try:
        uid = sandbox.dynamic_uid(range(a, b + 1), str(tmp_path))
    finally:
        os.close(taken_by_systemd)
    assert uid == b
    # ...and systemd's allocator, trying that uid now, cannot lock it: it moves on to another.
    probe = os.open(tmp_path / str(b), os.O_RDWR | os.O_NOFOLLOW)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
    assert (os.stat(tmp_path / str(b)).st_mode & 0o777) == 0o600


def test_every_uid_taken_is_a_clear_error(tmp_path, held):
    a, = free_uids(1)
    fd = os.open(tmp_path / str(a), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(OSError, match=f"no free dynamic uid for the lanes in {a}-{a}: create the user edgeinfer"):
            sandbox.dynamic_uid(range(a, a + 1), str(tmp_path))
    finally:
        os.close(fd)


def test_a_lock_file_unlinked_by_its_holder_is_not_taken_for_a_lock(tmp_path, held, monkeypatch):
    """systemd unlinks a uid's lock file when it frees the uid, while it holds the lock: a process that opened the
    file before and locks it after holds a lock on nothing (the next allocator makes a new file). Such a uid is
    passed over, as systemd's pick_uid does."""
    a, b = free_uids(2)
    real_flock = sandbox.fcntl.flock

    def flock_after_an_unlink(fd, op):
        real_flock(fd, op)
        path = tmp_path / str(a)
        if path.exists() and os.fstat(fd).st_ino == os.stat(path).st_ino:
            path.unlink()  # what systemd's dynamic_user_close does between our open and our flock
    monkeypatch.setattr(sandbox.fcntl, "flock", flock_after_an_unlink)
    assert sandbox.dynamic_uid(range(a, b + 1), str(tmp_path)) == b
