"""The poller: one task per endpoint reads its ``GET /load`` every ``poll_interval_s`` and records the answer.

Theory of operation. :meth:`Poller.run` owns one polling task per endpoint in its task group; each poll is one
GET, bounded by ``poll_timeout_s`` as a whole (by default ``stale_after_s``: an answer that takes longer is
stale on arrival), on a keep-alive
connection (with several API processes behind a port, one connection stays on one of them, so its ``seq`` is
comparable from poll to poll). A checked answer goes to :meth:`EndpointLoad.observe`; anything else (refused,
timed out, not 200, not the telemetry contract) to :meth:`EndpointLoad.observe_failure`: the endpoint is out until
it answers again. A poll that timed out also calls, in the polling task, every listener registered for that
endpoint with :meth:`Poller.listen_unanswered` (the requests in flight there, :mod:`asyncdp.router.silence`: no
task per request); a refused connection or a wrong answer does not (an endpoint that drains closes its port but
finishes what it has). Polls of one endpoint start
``poll_interval_s`` apart (or right after the previous one ends, when it took longer). ``task_status.started()``
comes once every endpoint was polled once, answered or not, so the first requests see every endpoint that is up
and one that is down holds nobody back. The poller logs an
endpoint's changes between usable and not, once each; :attr:`Poller.seq` counts those changes and every new
``seq`` an endpoint answers (the ``seq`` of the router's own ``/load``, :meth:`Poller.load`). It ends only by
cancellation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import anyio.abc
import httpx

from asyncdp.router.score import EndpointLoad, candidates, checked_load, score
from asyncdp.router.telemetry import router_load

log = logging.getLogger("asyncdp.router")

UnansweredListener = Callable[[float], None]  # called with the start of a poll that timed out


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an upstream failure, the message taken from the first exception of its cause chain that
    has one: on trio, httpx's ConnectError for a certificate that does not verify (or a TLS handshake cut off) says
    nothing itself, and the reason is two causes down (``BrokenResourceError`` from ``SSLCertVerificationError``)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if str(cause):
            return f"{type(exc).__name__}: {cause}"
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


class Poller:
    """The endpoint table and the tasks that keep it current. ``endpoints[i]`` is the i-th ``--endpoint``."""

    def __init__(self, urls: Sequence[str], *, poll_interval_s: float, stale_after_s: float,
                 poll_timeout_s: float | None = None) -> None:
        self.endpoints = [EndpointLoad(url) for url in urls]
        self.poll_interval_s = poll_interval_s
        self.stale_after_s = stale_after_s
        self.poll_timeout_s = stale_after_s if poll_timeout_s is None else poll_timeout_s
        self.seq = 0  # moves when an endpoint's numbers or usability change: the router's own /load seq
        self._usable: list[bool | None] = [None] * len(self.endpoints)  # as last logged
        # per endpoint: called with its start when a poll there times out (the requests in flight there)
        self._unanswered: list[set[UnansweredListener]] = [set() for _ in self.endpoints]
        self._answered_s = [float("-inf")] * len(self.endpoints)  # when each endpoint's last poll was answered

    def candidates(self) -> list[int]:
        """Usable endpoints' indices, best first (:func:`asyncdp.router.score.candidates`)."""
        return candidates(self.endpoints, anyio.current_time(), self.stale_after_s)

    def num_usable(self) -> int:
        return len(self.candidates())

    def statistics(self) -> list[dict[str, object]]:
        """Per endpoint: its URL, score (None: not used), seq, requests in flight from here, last error."""
        now_s = anyio.current_time()
        return [{"url": ep.url, "score": score(ep, now_s, self.stale_after_s),
                 "seq": None if ep.seq_key is None else ep.seq_key[1],
                 "age_s": None if ep.load is None else round(now_s - ep.polled_at_s, 3),
                 "num_inflight": ep.num_inflight, "sent_since_seq": ep.sent_since_seq, "error": ep.last_error}
                for ep in self.endpoints]

    def load(self) -> dict[str, object]:
        """The router's own ``GET /load`` document (:func:`asyncdp.router.telemetry.router_load`)."""
        return router_load(self.endpoints, anyio.current_time(), self.stale_after_s, self.seq)

    def listen_unanswered(self, i: int, listener: UnansweredListener) -> None:
        """Call ``listener`` each time a ``GET /load`` of endpoint ``i`` times out (the endpoint stopped answering,
        or answers too slowly to be used), in the polling task, with when that poll started (on
        :func:`anyio.current_time`'s clock), until :meth:`unlisten_unanswered`. It must not block."""
        self._unanswered[i].add(listener)

    def unlisten_unanswered(self, i: int, listener: UnansweredListener) -> None:
        self._unanswered[i].discard(listener)

    def answered_since(self, i: int, t_s: float) -> bool:
        """Whether a ``GET /load`` of endpoint ``i`` was answered (anything but a timeout) after ``t_s``."""
        return self._answered_s[i] > t_s

    def _went_unanswered(self, i: int, poll_started_s: float) -> None:
        for listener in list(self._unanswered[i]):  # (a listener may unregister another as it runs)
            listener(poll_started_s)

    async def run(self, http: httpx.AsyncClient, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll every endpoint until cancelled; ``started()`` once each was polled once."""
        first_round = [anyio.Event() for _ in self.endpoints]
        async with anyio.create_task_group() as tg:
            for i in range(len(self.endpoints)):
                tg.start_soon(self._poll_forever, http, i, first_round[i])
            for event in first_round:
                await event.wait()
            task_status.started()

    async def _poll_forever(self, http: httpx.AsyncClient, i: int, polled_once: anyio.Event) -> None:
        while True:
            next_s = anyio.current_time() + self.poll_interval_s
            await self.poll_once(http, i)
            polled_once.set()
            await anyio.sleep(max(0.0, next_s - anyio.current_time()))

    async def poll_once(self, http: httpx.AsyncClient, i: int) -> None:
        ep = self.endpoints[i]
        started_s = anyio.current_time()
        unanswered = False  # timed out: no answer, as opposed to a refused connection or a wrong one
        try:
            with anyio.fail_after(self.poll_timeout_s):
                r = await http.get(f"{ep.url}/load")
            if r.status_code != 200:
                raise ValueError(f"GET /load answered {r.status_code}")
            load = checked_load(r.json())
        except TimeoutError:
            ep.observe_failure(f"GET /load took more than {self.poll_timeout_s:g} s")
            unanswered = True
        except httpx.HTTPError as exc:
            ep.observe_failure(f"GET /load failed: {error_text(exc)}")
            # httpx's own timeouts are the same bound; its pool's says nothing of the endpoint
            unanswered = isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.PoolTimeout)
        except ValueError as exc:  # not 200, not JSON, not the contract
            ep.observe_failure(str(exc))
        else:
            if ep.observe(load, anyio.current_time()):
                self.seq += 1
        self._log_change(i)
        if unanswered:
            self._went_unanswered(i, started_s)
        else:
            self._answered_s[i] = anyio.current_time()

    def _log_change(self, i: int) -> None:
        ep = self.endpoints[i]
        usable = score(ep, anyio.current_time(), self.stale_after_s) is not None
        if usable != self._usable[i]:
            self._usable[i] = usable
            self.seq += 1
            if usable:
                log.info("endpoint %s is usable", ep.url)
            else:
                reason = ep.last_error or "no rank is up"
                log.warning("endpoint %s is not used: %s", ep.url, reason)
