"""The head's side of the engine handshake (spec §5.3 steps 2-6) and the MoE configuration agreement (E6).

Theory of operation
-------------------
Each engine connects to the node's handshake listener and says ``Hello``; :func:`handshake` checks it (protocol
version, rank range, a rank seen twice, the headless flag: E4, E5), answers ``HandshakeInit`` (the client
addresses, the coordinator's, the DP group's rendezvous) and waits for ``Ready``. For a MoE group,
:func:`check_config_agreement` compares every rank's configuration summary with rank 0's and names the differing
fields. The link then stays open for the deployment's life (spec §5.7). A broken or silent handshake during
startup fails the node with a reason; it never raises into the launcher's task group.
"""

from __future__ import annotations

from typing import Any

import anyio

from asyncdp import messages as m
from asyncdp.errors import ProtocolError
from asyncdp.launcher.node import RunningNode
from asyncdp.transport import Link

HANDSHAKE_HELLO_TIMEOUT_S = 30.0


async def handshake(node: RunningNode, link: Link) -> None:
    """Handshake with one engine, then keep the link open for the deployment's life."""
    try:
        await _handshake_steps(node, link)
    except (anyio.EndOfStream, anyio.BrokenResourceError, ProtocolError, TimeoutError) as exc:
        # The engine closed its link (it crashed loading the model, say) or spoke garbage. Its exit is seen by
        # the child watchers; during startup, fail now with a reason instead of crashing the launcher.
        if not node.started:
            node.fail(f"startup failed: the handshake with an engine broke off ({type(exc).__name__}: {exc})")


def _hello_problem(node: RunningNode, hello: m.Hello) -> str | None:
    dp_size = node.plan.dp_size
    if hello.protocol_version != m.PROTOCOL_VERSION:
        return f"protocol_version {hello.protocol_version} != {m.PROTOCOL_VERSION}"
    if not 0 <= hello.dp_rank < dp_size:
        return f"dp_rank {hello.dp_rank} is outside [0, {dp_size})"
    if hello.dp_rank in node.connected_ranks:
        return f"dp_rank {hello.dp_rank} connected twice"
    if hello.headless:
        return (f"engine rank {hello.dp_rank} connected with headless=True, but this deployment expects "
                "headless=False")
    return None


async def _handshake_steps(node: RunningNode, link: Link) -> None:
    with anyio.fail_after(HANDSHAKE_HELLO_TIMEOUT_S):  # a connected engine says Hello at once
        hello = await link.receive()
    if not isinstance(hello, m.Hello):
        await link.send(m.HandshakeError(reason=f"expected Hello, got {type(hello).__name__}"))
        return
    problem = _hello_problem(node, hello)
    if problem:
        await link.send(m.HandshakeError(reason=problem))
        node.fail(f"startup failed: handshake with engine rank {hello.dp_rank}: {problem}")
        return
    node.connected_ranks.add(hello.dp_rank)
    await link.send(m.HandshakeInit(clients=node.client_addrs, coordinator=node.coordinator_addrs,
                                    dp_group=node.dp_group_info, client_count=node.table.client_count))
    ready = await link.receive()
    if not isinstance(ready, m.Ready):
        node.fail(f"startup failed: engine rank {hello.dp_rank} sent {type(ready).__name__} instead of Ready")
        return
    if ready.config_hash is not None:
        problem = check_config_agreement(node.summaries, hello.dp_rank, ready.config_summary)
        if problem:
            node.fail(f"startup failed: {problem}")
            return
    node.ready_ranks.add(hello.dp_rank)
    async for _ in link:  # the handshake link stays open for the deployment's life (spec §5.7)
        pass


def check_config_agreement(summaries: dict[int, dict[str, Any]], dp_rank: int,
                           summary: dict[str, Any]) -> str | None:
    """E6: record ``dp_rank``'s parallel-configuration summary; return the mismatch message once it (or any rank
    recorded before rank 0) hashes differently from rank 0's, naming the differing fields. Ranks may report in
    any order."""
    from asyncdp.config.flags import config_hash, config_mismatch_message

    summaries[dp_rank] = dict(summary)
    rank0 = summaries.get(0)
    if rank0 is None:
        return None
    for r in ([dp_rank] if dp_rank != 0 else sorted(r for r in summaries if r != 0)):
        if config_hash(summaries[r]) != config_hash(rank0):
            return config_mismatch_message(r, summaries[r], rank0)
    return None
