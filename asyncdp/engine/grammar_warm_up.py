"""A rank's grammar warm-up: the grammar library's tokenizer, built in a background thread once the rank is ready.

Every rank with llguidance and an executor that masks (the torch executor) builds it, whether a structured-output
request ever comes or not; ``asyncdp.engine.rank_process`` starts it after the rank sent ``Ready`` and
``EngineReady``, so a rank's readiness no longer waits for it (0.3 s of each rank's startup for SmolLM2 on an idle
core, a second or more on a loaded one; figures in docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from typing import TYPE_CHECKING

from asyncdp.errors import InvalidRequestError

if TYPE_CHECKING:
    from asyncdp.engine.core import EngineCore
    from asyncdp.engine.structured import GrammarMatchers

log = logging.getLogger("asyncdp.engine.rank_process")  # the role's startup log name


def start_grammar_warm_up(dp_rank: int, core: EngineCore) -> threading.Thread | None:
    """Build the grammar library's tokenizer in a background thread, once the rank reported ready (None: nothing to
    build without llguidance or an executor that masks).

    It took 0.3 s for SmolLM2's 49k vocabulary on an idle core (a second or more on a loaded one) that every rank
    spent before it reported ready, used by a structured-output request or not. Built on that request instead, on
    the rank's event loop, it had silenced the heartbeats long enough for a loaded machine to lose the rank; here
    the loop stays free, but the library holds the GIL for most of the build (in two calls of at most 0.2 s each
    on an idle core), so the rank's heartbeats, and a first step that comes meanwhile, wait for one call at a time.

    The thread is not the execution thread and takes no limiter: it issues no collective, so a MoE group's
    collectives stay on each rank's execution thread, in the same order; a rank's steps are delayed only by the GIL
    the library holds (the group's ranks warm up at about the same time, each one once). A structured-output
    request that comes before the build ended waits for it (``GrammarMatchers``' lock) in its grammar's compilation,
    in a worker thread of its own (``asyncdp.engine.rank_grammar``), off the event loop and off the steps: the
    rank's other requests step meanwhile, as far as the GIL the build holds lets them. A daemon thread: a rank that
    stops meanwhile does not wait for it.
    """
    if importlib.util.find_spec("llguidance") is None:
        return None
    try:
        matchers = core.grammar_matchers()  # made here, on the event loop: the intake asks for the same object
    except InvalidRequestError:  # the sim executor, or no tokenizer
        return None
    thread = threading.Thread(target=_warm_grammars, args=(dp_rank, matchers), daemon=True,
                              name=f"rank {dp_rank} grammar warm-up")
    thread.start()
    return thread


def _warm_grammars(dp_rank: int, matchers: GrammarMatchers) -> None:
    started = time.monotonic()
    try:
        matchers.warm()
    except InvalidRequestError:  # a tokenizer the library cannot take: refused per request
        return
    except Exception as exc:  # the first structured-output request builds it again, and reports the error
        log.warning("rank %d: building the grammar library's tokenizer failed (%s: %s); structured-output "
                    "requests will try again", dp_rank, type(exc).__name__, exc)
        return
    log.debug("rank %d: the grammar library's tokenizer built in %.2f s, in the background", dp_rank,
              time.monotonic() - started)
