"""Run a process role's async main under anyio, with the event-loop guards every asyncdp process needs.

anyio's asyncio backend waits on a raw Unix socket with ``loop.add_reader(sock, future.set_result, None)`` and
removes the reader from the future's done-callback. When the waiting task is cancelled in the same loop iteration
in which the selector has already queued the reader's handle (a link closing while shutdown cancels its reader),
the handle runs ``set_result`` on the cancelled future and asyncio logs ``InvalidStateError`` with a traceback at
ERROR. Nothing is lost (the future was cancelled on purpose), so :func:`run` installs an exception handler that
drops exactly that case and passes everything else to the previous handler.

:func:`die_with_parent` is the other thing every child process needs: no child outlives the process that started it.
:func:`exit_after_parent_death` is its form for a child that has its own way to notice the death (EOF on its
control channel) and its own clean-up to do: the kernel's signal (or the parent's pidfd, for a parent on trio)
only starts a bounded grace, on a thread that runs whatever the main thread is doing, and never reads as a
request to drain (as SIGTERM does for a rank, which would then end its requests as if they were finished
normally).
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # the signals that stop a process in order


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel (Linux) for ``sig`` when this process's parent exits, and exit at once (status 1) if the
    parent, ``parent_pid`` as the parent knew itself, is already gone. The kernel sends it when the *thread* that
    started this process exits, so a parent must start children from threads that live as long as it does."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


def exit_after_parent_death(parent_pid: int, grace_s: float, on_exit: Callable[[], None],
                            sig: int = signal.SIGHUP, *, by_signal: bool = True) -> None:
    """Ask the kernel (Linux) for ``sig`` when the parent exits; when it comes, give the process ``grace_s`` to
    end on its own (its orderly reaction to the parent's death, with its log line and its clean-up), then run
    ``on_exit`` and leave with ``os._exit(1)``. Exit at once (status 1) if the parent is already gone.

    ``sig`` is blocked in this thread, so in every thread started after this call (call it first thing), and a
    daemon thread waits for it with ``sigwait``: the grace starts even while the main thread is stuck in C code,
    and no event loop's handler for SIGTERM or SIGINT sees it. Must be called before any other thread starts.

    ``by_signal=False``: the thread waits on a pidfd of the parent instead (Linux 5.3+). The kernel's signal
    follows the thread that forked this process, not its process: a parent that forks from a worker thread which
    later exits (trio's ``open_process`` does) would send it while alive, so such a parent's children watch the
    process itself. Without the grace, a child whose main thread is busy (importing torch, loading weights) when
    its parent is SIGKILLed would outlive it until it next reads its control channel."""
    if _prctl() is None:
        return
    if not by_signal:
        try:
            pidfd = os.pidfd_open(parent_pid)
        except (AttributeError, OSError):  # no pidfd (an old kernel), or no such process any more
            return
        if os.getppid() != parent_pid:  # the pid was reused: the parent is gone
            os._exit(1)

        def wait_for_parent_exit() -> None:
            select.select([pidfd], [], [])  # readable once the parent has exited
            _grace_then_exit(grace_s, on_exit)

        threading.Thread(target=wait_for_parent_exit, name="parent-death-watch", daemon=True).start()
        return

    def wait_for_signal() -> None:
        signal.sigwait({sig})
        _grace_then_exit(grace_s, on_exit)

    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    threading.Thread(target=wait_for_signal, name="parent-death-watch", daemon=True).start()
    die_with_parent(parent_pid, sig)


def _grace_then_exit(grace_s: float, on_exit: Callable[[], None]) -> None:
    log.warning("the parent process is gone; exiting in at most %.0f s", grace_s)
    threading.Event().wait(grace_s)
    log.error("the parent process is gone and this process did not end within %.0f s; exiting now", grace_s)
    try:
        on_exit()
    finally:
        os._exit(1)


def die_with_parent_preexec(parent_pid: int, sig: int = signal.SIGKILL, *,
                            block_stops: bool = False) -> Callable[[], None]:
    """:func:`die_with_parent` as a ``subprocess.Popen`` ``preexec_fn``, armed between fork and exec, so not even
    the child's interpreter start-up outlives the parent. Everything it calls is resolved here, before the fork:
    the child runs no import and takes no lock before its exec, and leaves with ``os._exit``.

    ``block_stops`` (a child that runs ``python -m asyncdp``): SIGTERM and SIGINT are blocked across the exec, so
    one sent while the child's interpreter starts, before it has any handling of its own, waits instead of killing
    it at once; :mod:`asyncdp.__main__` unblocks them once its handling is in place, and the child ends as a stop
    while it starts ends (exit 0 for a server)."""
    prctl = _prctl()
    block = functools.partial(signal.pthread_sigmask, signal.SIG_BLOCK, STOP_SIGNALS) if block_stops else None

    def arm() -> None:
        if block is not None:
            block()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm


def is_cancelled_future_wakeup(context: dict[str, Any]) -> bool:
    """True for the harmless race: a queued ``Future.set_result`` handle firing on a future already cancelled."""
    if not isinstance(context.get("exception"), asyncio.InvalidStateError):
        return False
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    target = getattr(callback, "__self__", None)
    return (isinstance(target, asyncio.Future) and getattr(callback, "__name__", "") == "set_result"
            and target.cancelled())


def install_loop_guards() -> None:
    """Filter :func:`is_cancelled_future_wakeup` out of the running asyncio loop's exception handler."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if is_cancelled_future_wakeup(context):
            log.debug("ignored a wake-up of a cancelled future: %s", context.get("handle"))
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


_held: list[int] = []  # the stop signals held for the server's own handling (see :func:`run`)


def _hold(signum: int, frame: FrameType | None) -> None:
    if signum not in _held:  # a stop, however many times it came before the server could act on it
        _held.append(signum)


def take_early_stops() -> list[int]:
    """The stop signals (SIGTERM, SIGINT) that came while :func:`run` held them, before the server's own receiver
    was in place, each once; they are taken. A server calls it right after opening its
    ``anyio.open_signal_receiver`` (whose handlers replaced the hold) and acts on each as on a signal its receiver
    got; it starts nothing (no child) once one was taken."""
    taken = list(_held)
    _held.clear()
    return taken


def run(main: Callable[..., Awaitable[T]], *args: Any, backend: str = "asyncio", hold_stops: bool = False) -> T:
    """``anyio.run(main, *args, backend=backend)`` with :func:`install_loop_guards` in place first.

    ``hold_stops`` (a server's top process, which opens its own signal receiver first thing in the loop): SIGTERM
    and SIGINT raise nothing inside the event loop; from just before it starts until the server's receiver
    replaces the handler, one that comes is only held, for :func:`take_early_stops`. A signal's handler runs in
    whatever Python code the main thread runs, in the loop that can be the loop's own: on asyncio the exception
    of a callback was logged with its traceback and the server went on starting, the stop lost; SIGINT went to
    asyncio's own handling (a cancellation of the main task), which ended the launcher without its stop line and
    was lost on the router; trio ended in a ``TrioInternalError``. The hold records the signal as it comes, so the server's first look sees every stop
    from before its receiver. (On asyncio one that comes while the receiver is being installed, between its
    wake-up pipe and its handler, can reach both: a second stop the server handles before it starts anything.)
    Afterwards both signals have their handling of before again. Where a signal is ignored, or off the main
    thread (where no handler can be set), nothing changes."""

    async def guarded() -> T:
        if backend == "asyncio":
            install_loop_guards()
        return await main(*args)

    held = [s for s in STOP_SIGNALS if signal.getsignal(s) not in (signal.SIG_IGN, None)] \
        if hold_stops and threading.current_thread() is threading.main_thread() else []
    before = {s: signal.getsignal(s) for s in held}
    _held.clear()
    try:
        for sig in held:
            signal.signal(sig, _hold)
        return anyio.run(guarded, backend=backend)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
