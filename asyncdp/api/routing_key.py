"""The request's routing key: the session it belongs to, for the balancer's policy (``RequestView.routing_key``).

A key keeps a conversation's or a user's requests together where the policy uses one: ``session_hash`` maps it
to a rank on a hash ring, ``asyncdp`` breaks its ties with it (H6). The key is the first of, as routers that
hash sessions read them (vLLM Router's consistent hash, production-stack's session router):

1. the ``X-Session-ID`` header;
2. the ``X-User-ID`` header;
3. the body's ``prompt_cache_key`` (OpenAI's key for requests that share a prompt prefix);
4. the body's ``user``.

An empty one counts as none. A key longer than ``MAX_KEY_CHARS`` (any length is valid: ``user`` is whatever id
the application has) is replaced by a digest of it, so a policy that remembers keys (``session_hash@sticky_*``)
holds a bounded amount per key and the same long key still maps to the same rank.
"""

from __future__ import annotations

import hashlib
from typing import Any

from asyncdp.api.rank_hint import routing_headers
from asyncdp.api.schemas import _Common

MAX_KEY_CHARS = 128


def routing_key(headers: Any, req: _Common) -> str | None:
    """The request's routing key from its headers and body, or None. ``headers`` may be the request's
    :func:`~.rank_hint.routing_headers` already (one pass over the headers for the rank hint and the key)."""
    found = routing_headers(headers)
    for value in (found.get("x-session-id"), found.get("x-user-id"), req.prompt_cache_key, req.user):
        if value:
            if len(value) > MAX_KEY_CHARS:
                return "blake2b:" + hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
            return value
    return None
