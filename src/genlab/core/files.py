"""Files a run writes: atomic writes, and one process at a time in a folder (a run, a sweep): an exclusive,
non-blocking flock on FOLDER/.lock, which the kernel drops however the process ends. Without flock (Windows, some
filesystems) the folder is unguarded."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from genlab.core.errors import GenlabError


def acquire(folder: Path, busy: str):
    """The held lock (for `release`), or None where flock is unavailable. When another process holds it: GenlabError
    with `busy` formatted with that process's pid."""
    try:
        import fcntl
    except ImportError:
        return None
    f = open(Path(folder) / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise GenlabError(busy.format(pid=holder)) from None
    except OSError:  # no flock on this filesystem
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def release(lock) -> None:
    if lock is not None and not lock.closed:
        import fcntl
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


@contextlib.contextmanager
def held(folder: Path, busy: str):
    lock = acquire(folder, busy)
    try:
        yield
    finally:
        release(lock)


def write_atomic(path, text: str) -> None:
    """Write a file through a temporary name and a rename: a full disk leaves the old file or none, never half of it,
    and no temporary file behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
