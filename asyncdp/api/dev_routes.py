"""vLLM's development routes, served only where vLLM serves them: with ``VLLM_SERVER_DEV_MODE=1`` (or
``ASYNCDP_SERVER_DEV_MODE=1``); without it they do not exist (a 404). One so far: ``POST /reset_prefix_cache``,
which benchmark users send between runs to start from a cold cache (SGLang's ``/flush_cache``).

``POST /reset_prefix_cache?reset_running_requests=&reset_external=`` asks every managed rank of this API server
(every rank of the node on an internal-LB deployment) to drop its prefix cache, as vLLM's engine resets it: the
cached blocks no request uses are forgotten, and a rank where a request holds KV blocks refuses and changes nothing,
unless ``reset_running_requests=true``, which preempts its running requests first (they are recomputed and
complete). The answer is vLLM's: 200 ``{"success": true}`` when every rank reset, ``{"success": false}`` when one
refused (the others reset all the same). ``reset_external`` is accepted and changes nothing: asyncdp has no external
(KV-connector) cache. Each rank that reset tells every API server and the coordinator (``PrefixCacheReset``), whose
routing forgets the prefixes it sent there. The query values are read as vLLM's (pydantic's) booleans.
"""

from __future__ import annotations

import logging

from quart import Quart, Response, request

from asyncdp.api.context import AppState, json_response
from asyncdp.errors import HTTPError, PrefixCacheBusyError

log = logging.getLogger("asyncdp.api")

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def query_bool(name: str) -> bool:
    """Query parameter ``name`` as a boolean (false when absent); another value than pydantic's is a 400 naming it."""
    raw = request.args.get(name)
    if raw is None or raw.lower() in _FALSE:
        return False
    if raw.lower() in _TRUE:
        return True
    raise HTTPError(400, f"{name} must be a boolean (true or false), got {raw!r}.", param=name)


def register(app: Quart, state: AppState) -> None:
    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        running = query_bool("reset_running_requests")
        query_bool("reset_external")  # (checked as vLLM checks it: no external cache to reset here)
        log.info("Resetting prefix cache...")
        try:
            await state.client.call_utility("reset_prefix_cache", reset_running_requests=running)
        except PrefixCacheBusyError as exc:
            log.warning("The prefix cache was not reset: %s", exc)
            return json_response({"success": False})
        return json_response({"success": True})
