"""The coordinator's answer to a client's ``PrefixClaim`` (see :mod:`asyncdp.coordinator.core`, "Prefix claims")."""

from __future__ import annotations

import logging

import anyio

from asyncdp.coordinator.peers import Peer
from asyncdp.dp.prefix_directory import LONG_PLACEMENT_TOKENS, PrefixDirectory
from asyncdp.messages import PrefixClaim, PrefixOwner, PrefixPlaced

log = logging.getLogger("asyncdp.coordinator.core")  # the role's log name, as before this function moved here


def answer_claim(directory: PrefixDirectory, clients: dict[int, Peer], peer: Peer, key: int,
                 msg: PrefixClaim) -> None:
    """Answer a client's ``PrefixClaim`` from the directory, in the reader (the directory is this role's only
    user of it and never awaits, so no core round trip is needed); a malformed claim is logged and dropped (the
    client routes on its own after its timeout). A long new prefix is told to every other client."""
    try:
        answer = directory.claim(msg.hashes, msg.proposal, msg.prompt_tokens, (msg.first_rank, msg.last_rank),
                                 anyio.current_time(), key, msg.candidates, deep=msg.deep)
    except ValueError as exc:
        log.warning("dropping a prefix claim from %s: %s", peer.name, exc)
        return
    peer.send_nowait(PrefixOwner(seq=msg.seq, owner=answer.owner, matched=answer.matched, others=answer.others))
    if answer.placed >= LONG_PLACEMENT_TOKENS:  # a long prefill the other clients' views lack until a snapshot
        placed = PrefixPlaced(rank=answer.owner, prompt_tokens=answer.placed)
        for other_key, other in clients.items():
            if other_key != key:
                other.send_nowait(placed)
