"""A deployment's run directory, ``<tmp>/asyncdp-XXXXXXXX``: its Unix sockets and its metrics files.

Who removes it:

- the launcher, when it exits (:meth:`RunDir.remove`);
- a child orphaned by a SIGKILLed launcher, when that child exits (:func:`asyncdp.worker.remove_orphaned_run_dir`);
- when the whole tree died at once (``kill -9`` of every process, an OOM kill of the cgroup, a container stopped
  hard) nobody was left to, so the next launch on the machine does (:func:`sweep_stale`).

How a launch knows a directory lost its launcher: while the launcher lives it holds an exclusive ``flock`` on the
directory, taken before it writes the ``owner`` file. The kernel drops the lock when the process dies, however it
dies. So a directory with an ``owner`` file whose lock can be taken has no launcher. A directory without that file
is either being created right now or not ours to judge (an older asyncdp's, another program's); it is never
touched. Only directories of this user are looked at.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger("asyncdp.launcher")

PREFIX = "asyncdp-"
OWNER_FILE = "owner"


class RunDir:
    """A run directory this process created and holds the lock of, until :meth:`remove`."""

    def __init__(self, path: str, lock_fd: int) -> None:
        self.path = path
        self._lock_fd = lock_fd

    def remove(self) -> None:
        """Remove the directory, then drop the lock (in this order: a sweeper that waited on the lock finds
        nothing left to remove)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def create(directory: str | None = None) -> RunDir:
    """A new run directory under ``directory`` (default: the temporary directory), locked and owned by this
    process. The descriptor holding the lock is not inherited by children."""
    path = tempfile.mkdtemp(prefix=PREFIX, dir=directory)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh name: nobody else can hold it
    Path(path, OWNER_FILE).write_text(f"{os.getpid()}\n")
    return RunDir(path, fd)


def sweep_stale(directory: str | None = None) -> list[str]:
    """Remove every run directory under ``directory`` (default: the temporary directory) whose launcher is gone,
    and return their paths. Safe to run from any number of processes at once."""
    removed = []
    for path, owner in stale(directory):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        log.info("removed %s, the run directory of a deployment (launcher pid %s) that was killed", path, owner)
    return removed


def stale(directory: str | None = None) -> list[tuple[str, str]]:
    """``(path, recorded launcher pid)`` of every run directory under ``directory`` (default: the temporary
    directory) whose launcher is gone, in name order."""
    root = directory or tempfile.gettempdir()
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(PREFIX))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(root, name)
        if (owner := _stale_owner(path)) is not None:
            found.append((path, owner))
    return found


def _stale_owner(path: str) -> str | None:
    """The recorded launcher pid of ``path`` if it is a run directory of ours that no live launcher holds."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            owner = Path(path, OWNER_FILE).read_text().strip()
        except OSError:
            return None  # being created now, or not a run directory of this version
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # its launcher lives
        if not os.path.exists(os.path.join(path, OWNER_FILE)):
            return None  # its launcher removed it and let go of the lock meanwhile (RunDir.remove)
        return owner or "?"
    finally:
        os.close(fd)  # the directory is removed before anyone could create a new one of the same name
