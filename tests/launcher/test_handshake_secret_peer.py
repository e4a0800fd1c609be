"""A head without a deployment secret names what a node holding one sent, instead of calling it no asyncdp."""

from __future__ import annotations

import pytest

from asyncdp.errors import LinkAuthError
from asyncdp.transport import connect
from tests.launcher.test_foreign_peers import head_listener


@pytest.mark.anyio
async def test_a_node_with_a_secret_at_a_head_without_one_is_named_as_such(tmp_path, caplog):
    async with head_listener(tmp_path) as (node, addr):
        with pytest.raises(LinkAuthError):
            await connect(addr, secret=b"s" * 32)
    assert node.failure is None and not node.shutdown.is_set()
    assert "that peer holds a deployment secret and this process none" in caplog.text
    assert "does not speak asyncdp" not in caplog.text
