"""Where a waiting grammar starts: the watch of one constrained request's sampled ids, until its start.

A request whose ``StructuredOutputs`` has ``start_after`` or ``start_markers`` (a reasoning model's end of
thinking) samples freely until its generated ids reach one of them; :func:`start_watch` builds the watch that
``GrammarMatchers.advance`` feeds each sampled id while it waits, and whose ``seen`` says when the id just fed
was the last of a start (the next id is the grammar's first). Only generated ids are fed, never the prompt's.

Each start is matched on its own, by small state kept per id, with no search over the ids so far:

- a sequence (``start_after``, or a marker's ``ids`` alone): the last ``len(ids)`` ids, compared when the id is
  the sequence's last one;
- a header (a marker with ``closed_by``, gpt-oss's ``<|channel|>final`` ... ``<|message|>``): the same for its
  opening, its closing and its cancelling ids, and the number of ids since the opening. The closing counts when
  it begins at most ``max_gap_tokens`` ids after the opening (all its ids after it) with no cancelling ids
  completed in between; a later opening starts the count over. This is vLLM's gpt-oss rule (its reasoning ends
  at the first ``<|channel|>final`` that ``<|message|>`` follows within a bounded number of ids with no
  ``<|end|>`` between), checked once per id instead of by scanning back.

The common case, one sequence, is the watch itself (its ``seen`` one deque append and at most one comparison).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncdp.sampling_params import StartMarker, StructuredOutputs


class SequenceWatch:
    """Whether the ids sampled so far end with ``ids``."""

    __slots__ = ("ids", "tail")

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.tail: deque[int] = deque(maxlen=len(ids))

    def seen(self, token_id: int) -> bool:
        """Take the next sampled id; whether it completes the sequence."""
        self.tail.append(token_id)
        return token_id == self.ids[-1] and tuple(self.tail) == self.ids


class HeaderWatch:
    """Whether the ids sampled so far end with a header: the opening ids, at most ``max_gap_tokens`` ids, the
    closing ids, and no cancelling ids completed after the opening (see the module)."""

    __slots__ = ("_cancels", "_closes", "_limit", "_opens", "_since")

    def __init__(self, marker: StartMarker) -> None:
        self._opens = SequenceWatch(marker.ids)
        self._closes = SequenceWatch(marker.closed_by)
        self._cancels = SequenceWatch(marker.cancelled_by) if marker.cancelled_by else None
        self._limit = marker.max_gap_tokens + len(marker.closed_by)  # ids after the opening, the closing's last
        self._since = -1  # ids sampled since the opening (-1: no header open)

    def seen(self, token_id: int) -> bool:
        """Take the next sampled id; whether it completes a header."""
        opened = self._opens.seen(token_id)
        closed = self._closes.seen(token_id)
        cancelled = self._cancels is not None and self._cancels.seen(token_id)
        if self._since >= 0:
            self._since += 1
            if cancelled or self._since > self._limit:
                self._since = -1
            elif closed and self._since >= len(self._closes.ids):
                return True
        if opened:
            self._since = 0
        return False


class AnyWatch:
    """Several starts: whether the id just sampled completes any of them (every watch sees every id)."""

    __slots__ = ("_watches",)

    def __init__(self, watches: list[Callable[[int], bool]]) -> None:
        self._watches = watches

    def seen(self, token_id: int) -> bool:
        started = False
        for seen in self._watches:
            started = seen(token_id) or started
        return started


Watch = SequenceWatch | HeaderWatch | AnyWatch


def start_watch(structured: StructuredOutputs) -> Watch | None:
    """The watch of a grammar that waits for ``structured``'s ``start_after`` or ``start_markers`` (None: it starts
    at the first generated id)."""
    watches: list[Watch] = [SequenceWatch(structured.start_after)] if structured.start_after else []
    watches += [HeaderWatch(m) if m.closed_by else SequenceWatch(m.ids) for m in structured.start_markers]
    if len(watches) > 1:
        return AnyWatch([w.seen for w in watches])
    return watches[0] if watches else None
