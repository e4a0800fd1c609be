"""The run directory's lock and the sweep of those left by deployments killed whole (real processes, a real
``flock``, a private temporary root per test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from asyncdp.launcher import rundir

# Creates a run directory under argv[1], prints its path, then waits for stdin to close: a launcher that lives
# until the test kills it.
_OWNER = "import sys; from asyncdp.launcher import rundir; print(rundir.create(sys.argv[1]).path, flush=True); sys.stdin.read()"


@contextmanager
def owner_process(root: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        path = Path(proc.stdout.readline().strip())
        assert path.is_dir(), path
        yield proc, path
    finally:
        proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_a_new_run_directory_names_its_owner_and_is_not_swept_while_its_owner_lives(tmp_path: Path) -> None:
    run_dir = rundir.create(str(tmp_path))
    path = Path(run_dir.path)
    assert path.parent == tmp_path and path.name.startswith("asyncdp-")
    assert (path / "owner").read_text() == f"{os.getpid()}\n"
    (path / "asyncdp-client-x.sock").touch()
    assert rundir.sweep_stale(str(tmp_path)) == []  # held by this process (another open file: flock conflicts)
    assert path.is_dir()
    run_dir.remove()
    assert not path.exists()
    run_dir.remove()  # twice is harmless


def test_the_run_directory_of_a_killed_owner_is_swept_and_a_live_owners_is_kept(tmp_path: Path) -> None:
    with owner_process(tmp_path) as (killed, dead_path), owner_process(tmp_path) as (_, live_path):
        (dead_path / "metrics").mkdir()
        (dead_path / "metrics" / "counter_1.db").write_bytes(b"x")
        assert rundir.sweep_stale(str(tmp_path)) == []  # both owners alive
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        assert rundir.sweep_stale(str(tmp_path)) == [str(dead_path)]
        assert not dead_path.exists()
        assert live_path.is_dir()
        assert rundir.sweep_stale(str(tmp_path)) == []
    assert rundir.sweep_stale(str(tmp_path)) == [str(live_path)]  # its owner was killed on the way out


def test_the_sweep_never_touches_what_it_cannot_prove_is_a_dead_deployments(tmp_path: Path) -> None:
    no_owner = tmp_path / "asyncdp-older"  # another version's, or one being created at this instant
    no_owner.mkdir()
    (no_owner / "asyncdp-handshake-x.sock").touch()
    a_file = tmp_path / "asyncdp-client-abc.sock"
    a_file.touch()
    other = tmp_path / "not-asyncdp-xyz"
    other.mkdir()
    (other / "owner").write_text("1\n")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "owner").write_text("1\n")
    (tmp_path / "asyncdp-link").symlink_to(target)
    assert rundir.sweep_stale(str(tmp_path)) == []
    assert no_owner.is_dir() and a_file.exists() and other.is_dir() and target.is_dir()
    assert rundir.sweep_stale(str(tmp_path / "missing")) == []
