"""Builders shared by the node book tests: a book, a headless node's hello, an engine's hello."""

from __future__ import annotations

from typing import Any

from asyncdp.launcher.node_book import NodeBook
from asyncdp.messages import PROTOCOL_VERSION, Hello, NodeHello

SUMMARY: dict[str, Any] = {"model": "tiny", "dtype": "float32", "dp_size": 4, "enable_expert_parallel": False,
                           "dp_sync_interval": 32, "protocol_version": PROTOCOL_VERSION}


def book(mode: str = "internal", local: tuple[int, ...] = (0, 1), dp: int = 4, *, is_moe: bool = False) -> NodeBook:
    return NodeBook(dp_size=dp, mode=mode, local_ranks=local, summary=SUMMARY, host="h0", pid=100, is_moe=is_moe)


def node_hello(start: int = 2, size: int = 2, **kw: Any) -> NodeHello:
    fields: dict[str, Any] = {"start_rank": start, "size_local": size, "host": "h1", "pid": 200,
                              "protocol_version": PROTOCOL_VERSION, "config_summary": dict(SUMMARY)}
    return NodeHello(**{**fields, **kw})


def hello(rank: int, *, local: bool, headless: bool, pid: int = 300, **kw: Any) -> Hello:
    return Hello(protocol_version=kw.pop("protocol_version", PROTOCOL_VERSION), dp_rank=rank, local=local,
                 headless=headless, host=kw.pop("host", "h1"), pid=pid, **kw)


# ---------------------------------------------------------------------------------------------- span
