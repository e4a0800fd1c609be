"""The endpoint learns who the client is: the router appends the peer's address to ``X-Forwarded-For`` (keeping the
chain the client sent), sets ``X-Forwarded-Proto``, and passes ``Forwarded`` and everything else as they came."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from asyncdp.router.headers import upstream_headers
from tests.router.upstream import echo_upstream, header_values, routed, stop


def scope(headers: list[tuple[bytes, bytes]], client: tuple[str, int] | None = ("192.0.2.10", 5555),
          scheme: str = "http") -> dict[str, object]:
    return {"headers": headers, "client": client, "scheme": scheme}


def test_the_peer_is_appended_to_every_x_forwarded_for_the_client_sent_in_order() -> None:
    out = upstream_headers(scope([(b"X-Forwarded-For", b"203.0.113.7"), (b"accept", b"*/*"),
                                  (b"x-forwarded-for", b" 198.51.100.1, 10.0.0.2 ")]))
    assert [v for k, v in out if k == b"x-forwarded-for"] == [b"203.0.113.7, 198.51.100.1, 10.0.0.2, 192.0.2.10"]
    assert (b"accept", b"*/*") in out


def test_x_forwarded_proto_says_how_the_client_reached_the_router_whatever_the_client_claimed() -> None:
    out = upstream_headers(scope([(b"x-forwarded-proto", b"https")], scheme="http"))
    assert [v for k, v in out if k.lower() == b"x-forwarded-proto"] == [b"http"]
    out = upstream_headers(scope([], scheme="https"))
    assert [v for k, v in out if k.lower() == b"x-forwarded-proto"] == [b"https"]


def test_forwarded_is_passed_as_it_came_and_hop_by_hop_headers_are_not() -> None:
    out = upstream_headers(scope([(b"forwarded", b"for=203.0.113.7;proto=https"), (b"connection", b"x-hop"),
                                  (b"x-hop", b"1"), (b"host", b"router"), (b"content-length", b"2")]))
    assert (b"forwarded", b"for=203.0.113.7;proto=https") in out
    assert not {k for k, _ in out} & {b"connection", b"x-hop", b"host", b"content-length"}


def test_without_a_peer_address_the_chain_is_kept_as_it_is() -> None:
    out = upstream_headers(scope([(b"x-forwarded-for", b"203.0.113.7")], client=None))
    assert [v for k, v in out if k == b"x-forwarded-for"] == [b"203.0.113.7"]
    assert not [v for k, v in upstream_headers(scope([], client=None)) if k == b"x-forwarded-for"]


def test_an_ipv6_peer_is_appended_bare() -> None:
    out = upstream_headers(scope([], client=("::1", 4000)))
    assert [v for k, v in out if k == b"x-forwarded-for"] == [b"::1"]


@pytest.mark.anyio
async def test_a_real_endpoint_sees_the_clients_address_through_a_real_router(tmp_path: Path) -> None:
    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url) as router:
        with anyio.fail_after(20):
            async with httpx.AsyncClient(base_url=router.base_url, timeout=10) as http:
                r = await http.post("/v1/completions", json={"prompt": "hi"},
                                    headers={"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https",
                                             "Forwarded": "for=203.0.113.7", "X-Custom": "kept"})
                plain = await http.get("/v1/models")
        assert r.status_code == 200 and plain.status_code == 200
        seen = r.json()
        # the router's peer is this test's client, 127.0.0.1; the chain before it is the client's own
        assert header_values(seen, "x-forwarded-for") == ["203.0.113.7, 127.0.0.1"]
        assert header_values(seen, "x-forwarded-proto") == ["http"]
        assert header_values(seen, "forwarded") == ["for=203.0.113.7"]
        assert header_values(seen, "x-custom") == ["kept"]
        assert header_values(plain.json(), "x-forwarded-for") == ["127.0.0.1"]
        assert await stop(router) == 0
