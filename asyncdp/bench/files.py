"""The output files of ``asyncdp bench``: checked before any run, written whole or not at all.

A benchmark can run for an hour; its results must not then be lost to an output path that could have been
checked first. :func:`check_file` and :func:`check_folder` run before the first run and raise a
:class:`~asyncdp.errors.ConfigError` (exit 2) naming the flag: the path is a folder (or, for a folder, a file),
its folder cannot be made, nothing can be created in it (a probe file is made there, or in the nearest existing
folder above a folder still to be made, and removed: ``os.access`` says yes to root even on ``/sys``), or it is
one of the command's input files (``--export-trace`` equal to
``--trace`` once overwrote the trace it was replaying) or another output's file. The checks
create nothing: a missing folder is made by :func:`write`, so a run that fails or is interrupted leaves no empty
folder behind.

:func:`write` then writes a regular file (or a new one) through a temporary file in the same folder, renamed
over the target once complete: a failure or a signal midway leaves the target as it was, never half a file, and
the temporary file is removed. An existing file that is not a regular one (``/dev/stdout``, a FIFO) is written
in place. A failure to write there is :class:`WriteFailed`, whose message names the flag and the reason; the
command prints it on one line and exits 1, after keeping the document elsewhere with :func:`keep` (a disk that
filled during the run, ``/dev/full``: what no check before the run can see).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from asyncdp.errors import ConfigError

__all__ = ["WriteFailed", "check_file", "check_folder", "keep", "write"]


class WriteFailed(Exception):
    """An output file could not be written (the message names the flag, the path and the reason)."""


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _file_above(folder: Path) -> Path | None:
    """The nearest existing path at or above ``folder`` when it is not a folder (a path "inside" a file)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _probe(flag: str, value: str, folder: Path, problem: str | None = None) -> None:
    """Something can be created in ``folder``: a probe file, removed at once. ``problem``: what the refusal says
    (default: that nothing can be written in ``folder``)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".asyncdp-probe-")
    except OSError as exc:
        raise ConfigError(f"{flag} {value}: {problem or f'cannot write in the folder {folder}'} "
                          f"({exc.strerror}).") from None
    os.close(fd)
    os.unlink(probe)


def check_file(flag: str, value: str, *, make_folder: bool = True,
               others: Sequence[tuple[str, str | None]] = ()) -> Path:
    """``value`` as a path ``flag`` can write (see the module docstring); ``others``: (flag, path) of the command's
    input files and of the outputs checked before, none of which it may be."""
    path = Path(value)
    for other_flag, other in others:
        if other and _same(path, Path(other)):
            raise ConfigError(f"{flag} {value}: the same file as {other_flag} {other}; give another file name.")
    if path.is_dir():
        raise ConfigError(f"{flag} {value}: is a folder; give a file name.")
    real = Path(os.path.realpath(path))
    folder = real.parent
    file_above = _file_above(folder)
    if file_above is not None:
        raise ConfigError(f"{flag} {value}: {file_above} is a file, not a folder.")
    if not folder.is_dir():
        if not make_folder:
            raise ConfigError(f"{flag} {value}: the folder {folder} does not exist.")
        _probe_above(flag, value, folder)
        return path
    if real.exists() and not real.is_file():
        if not os.access(real, os.W_OK):  # a device or a FIFO: written in place, if at all
            raise ConfigError(f"{flag} {value}: not writable.")
        return path
    if real.exists() and not os.access(real, os.W_OK):  # (the rename would replace it all the same)
        raise ConfigError(f"{flag} {value}: the file is not writable.")
    _probe(flag, value, folder)
    return path


def check_folder(flag: str, value: str) -> Path:
    """``value`` as a folder ``flag`` can write files into, made if missing."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {value}: not a folder; give a folder name.")
    file_above = _file_above(path)
    if file_above is not None:
        raise ConfigError(f"{flag} {value}: {file_above} is a file, not a folder.")
    if not path.is_dir():
        _probe_above(flag, value, path)
        return path
    _probe(flag, value, path)
    return path


def _probe_above(flag: str, value: str, folder: Path) -> None:
    """``folder`` (missing) can be made: the nearest existing folder above it takes a probe file."""
    above = next((p for p in folder.parents if p.is_dir()), None)
    if above is None:
        raise ConfigError(f"{flag} {value}: cannot create the folder {folder} (no folder above it exists).")
    _probe(flag, value, above, f"cannot create the folder {folder}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


Fill = Callable[[Path], None] | bytes | str  # the content, or a function that writes it to a given path


def _put(fill: Fill, target: Path) -> None:
    if callable(fill):
        fill(target)
    elif isinstance(fill, bytes):
        target.write_bytes(fill)
    else:
        target.write_text(fill, encoding="utf-8")


def write(flag: str, path: Path, fill: Fill) -> None:
    """Write ``path`` whole or not at all (module docstring). An OSError is :class:`WriteFailed`."""
    def put(target: Path) -> None:
        _put(fill, target)

    real = Path(os.path.realpath(path))
    try:
        real.parent.mkdir(parents=True, exist_ok=True)  # the checks before the run made no folder
        if real.exists() and not real.is_file():
            put(real)
            return
        mode = stat.S_IMODE(real.stat().st_mode) if real.exists() else 0o666 & ~_umask()
        fd, tmp_name = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            put(tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, real)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise WriteFailed(f"cannot write {flag} {path}: {exc.strerror or exc}") from None


def keep(fill: Fill, suffix: str) -> str | None:
    """``fill`` saved in a new file of the temporary folder (after the intended output failed); its path, or None
    if that fails too."""
    try:
        fd, name = tempfile.mkstemp(prefix="asyncdp-bench-", suffix=suffix)
        os.close(fd)
        _put(fill, Path(name))
    except OSError:
        return None
    return name
