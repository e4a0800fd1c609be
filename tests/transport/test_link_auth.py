"""The deployment secret's handshake (asyncdp.transport.link_auth) over memory byte-stream pairs: the right secret
passes both ways and the link then carries frames; another secret, a silent peer (virtual time), garbage, an
asyncdp frame without the handshake, a replayed exchange and reflected nonces or proofs all fail, and nothing the
peer sent is ever read as a message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import trio
from anyio.streams.buffered import BufferedByteStream
from anyio.streams.stapled import StapledObjectStream

from asyncdp import messages
from asyncdp.errors import LinkAuthError
from asyncdp.transport import StreamLink
from asyncdp.transport.link_auth import (
    AUTH_TIMEOUT_S,
    CHALLENGE_BYTES,
    HELLO_BYTES,
    MAGIC,
    NONCE_BYTES,
    Refusal,
    check_challenge,
    client_proof,
    prove,
    server_proof,
    verify,
)
from asyncdp.transport.links import frame_bytes

SECRET = b"the deployment's secret"
OTHER = b"another deployment's secret"


_OPENED: list[Any] = []


@pytest.fixture(autouse=True)
def _close_every_stream() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def stream_pair() -> tuple[BufferedByteStream, BufferedByteStream]:
    """Two connected ends of an in-memory byte stream (what a socket pair is to the handshake); closed after the
    test."""
    a_send, b_receive = anyio.create_memory_object_stream[bytes](16)
    b_send, a_receive = anyio.create_memory_object_stream[bytes](16)
    _OPENED.extend((a_send, b_receive, b_send, a_receive))
    return (BufferedByteStream(StapledObjectStream(a_send, a_receive)),
            BufferedByteStream(StapledObjectStream(b_send, b_receive)))


async def exchange(client_secret: bytes, server_secret: bytes) -> tuple[BaseException | None, Refusal | None,
                                                                          BufferedByteStream, BufferedByteStream]:
    """Run both sides; the client's failure (it closes its end, as ``connect`` does) and the server's verdict."""
    client, server = stream_pair()
    raised: list[BaseException] = []
    verdict: list[Refusal | None] = []

    async def connecting() -> None:
        try:
            await prove(client, client_secret, "unix:/peer")
        except LinkAuthError as exc:
            raised.append(exc)
            await client.aclose()

    async def accepting() -> None:
        verdict.append(await verify(server, server_secret))

    with anyio.fail_after(2 * AUTH_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(connecting)
            tg.start_soon(accepting)
    return (raised[0] if raised else None), verdict[0], client, server


@pytest.mark.anyio
async def test_the_right_secret_passes_both_ways_and_the_link_then_carries_frames_both_ways():
    raised, refusal, client, server = await exchange(SECRET, SECRET)
    assert raised is None and refusal is None
    a, b = StreamLink(client, name="client"), StreamLink(server, name="server")
    await a.send(messages.Subscribe(dp_rank=3))
    assert await b.receive() == messages.Subscribe(dp_rank=3)
    await b.send(messages.Heartbeat(sender="s", seq=1))
    assert await a.receive() == messages.Heartbeat(sender="s", seq=1)


@pytest.mark.anyio
async def test_another_secret_fails_on_the_connecting_side_with_one_line_and_the_accepting_side_refuses():
    raised, refusal, _, server = await exchange(OTHER, SECRET)
    assert isinstance(raised, LinkAuthError)
    assert str(raised).startswith("the peer at unix:/peer holds another deployment secret: the secrets do not match")
    assert "\n" not in str(raised) and SECRET.decode() not in str(raised) and OTHER.decode() not in str(raised)
    assert refusal is not None and not refusal.quiet
    assert "closed the link instead of proving it holds this deployment's secret" in refusal.problem


@pytest.mark.anyio
async def test_a_peer_that_skips_the_check_and_proves_another_secret_is_refused():
    """A rogue connecting side that ignores the server's proof and answers with its own secret's."""
    client, server = stream_pair()
    verdict: list[Refusal | None] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(verdict, verify(server, SECRET)))
        nonce = b"n" * NONCE_BYTES
        await client.send(MAGIC + nonce)
        challenge = await client.receive_exactly(CHALLENGE_BYTES)
        await client.send(client_proof(OTHER, challenge[len(MAGIC):len(MAGIC) + NONCE_BYTES], nonce))
    assert verdict[0] is not None and "its proof does not match this deployment's secret" in verdict[0].problem


async def _append(out: list[Refusal | None], verdict: object) -> None:
    out.append(await verdict)  # type: ignore[misc]


@pytest.mark.trio
async def test_a_silent_peer_is_refused_at_the_deadline_on_either_side(autojump_clock):
    _, server = stream_pair()
    started = trio.current_time()
    refusal = await verify(server, SECRET)
    assert refusal is not None and f"within {AUTH_TIMEOUT_S:g} s" in refusal.problem
    assert trio.current_time() - started == AUTH_TIMEOUT_S
    client, _ = stream_pair()
    with pytest.raises(LinkAuthError, match=f"did not answer the deployment-secret handshake within {AUTH_TIMEOUT_S:g} s"):
        await prove(client, SECRET, "tcp:10.0.0.1:29550")


@pytest.mark.anyio
@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", b"\xff" * 64], ids=["http", "ones"])
async def test_garbage_is_refused_after_eight_bytes(garbage):
    client, server = stream_pair()
    await client.send(garbage)
    refusal = await verify(server, SECRET)
    assert refusal is not None and "does not speak the deployment-secret handshake" in refusal.problem
    assert not refusal.plain_frame
    assert server.buffer == garbage[len(MAGIC):]  # read no further than the magic


@pytest.mark.anyio
async def test_an_asyncdp_frame_without_the_handshake_is_refused_as_a_peer_without_a_secret():
    client, server = stream_pair()
    await client.send(frame_bytes(messages.Subscribe(dp_rank=0)))
    refusal = await verify(server, SECRET)
    assert refusal is not None and refusal.plain_frame and "it holds no secret" in refusal.problem


@pytest.mark.anyio
async def test_a_connection_that_closes_at_once_is_a_quiet_refusal():
    client, server = stream_pair()
    await client.aclose()
    refusal = await verify(server, SECRET)
    assert refusal is not None and refusal.quiet


@pytest.mark.anyio
async def test_a_replayed_exchange_proves_nothing_to_either_side():
    recorded_client, recorded_server = stream_pair()
    async with anyio.create_task_group() as tg:  # an exchange a listener on the path recorded
        tg.start_soon(prove, recorded_client, SECRET, "unix:/peer")
        hello = await recorded_server.receive_exactly(HELLO_BYTES)
        challenge = MAGIC + b"s" * NONCE_BYTES + server_proof(SECRET, hello[len(MAGIC):], b"s" * NONCE_BYTES)
        await recorded_server.send(challenge)
        proof = await recorded_server.receive_exactly(32)
    attacker, server = stream_pair()  # replayed to an accepting side: it draws a fresh nonce
    await attacker.send(hello)
    async with anyio.create_task_group() as tg:
        verdict: list[Refusal | None] = []
        tg.start_soon(lambda: _append(verdict, verify(server, SECRET)))
        await attacker.receive_exactly(CHALLENGE_BYTES)
        await attacker.send(proof)
    assert verdict[0] is not None and "proof does not match" in verdict[0].problem
    client, attacker = stream_pair()  # replayed to a connecting side: it drew a fresh nonce
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: attacker.send(challenge))
        with pytest.raises(LinkAuthError, match="secrets do not match"):
            await prove(client, SECRET, "unix:/peer")


@pytest.mark.anyio
async def test_a_server_proof_reflected_back_from_a_second_link_does_not_pass_for_a_client_proof():
    """The attacker holds no secret: it opens link 1 (its nonce Na, the server's Ns1), then link 2 saying Ns1 as its
    nonce, hoping the server computes on link 2 what link 1 wants; neither server proof passes on link 1."""
    first_attacker, first = stream_pair()
    second_attacker, second = stream_pair()
    verdicts: list[Refusal | None] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(verdicts, verify(first, SECRET)))
        await first_attacker.send(MAGIC + b"a" * NONCE_BYTES)
        challenge1 = await first_attacker.receive_exactly(CHALLENGE_BYTES)
        ns1, proof1 = challenge1[len(MAGIC):len(MAGIC) + NONCE_BYTES], challenge1[len(MAGIC) + NONCE_BYTES:]
        tg.start_soon(lambda: _append(verdicts, verify(second, SECRET)))
        await second_attacker.send(MAGIC + ns1)
        challenge2 = await second_attacker.receive_exactly(CHALLENGE_BYTES)
        await first_attacker.send(challenge2[len(MAGIC) + NONCE_BYTES:])  # the server's proof over (Ns1, Ns2)
        await second_attacker.send(proof1)  # and link 1's server proof on link 2
    assert len(verdicts) == 2 and all(v is not None and "proof does not match" in v.problem for v in verdicts)


@pytest.mark.anyio
async def test_a_server_proof_reflected_back_on_its_own_link_is_refused():
    attacker, server = stream_pair()
    verdicts: list[Refusal | None] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(verdicts, verify(server, SECRET)))
        await attacker.send(MAGIC + b"a" * NONCE_BYTES)
        challenge = await attacker.receive_exactly(CHALLENGE_BYTES)
        await attacker.send(challenge[len(MAGIC) + NONCE_BYTES:])
    assert verdicts[0] is not None and "proof does not match" in verdicts[0].problem


@pytest.mark.anyio
async def test_a_peer_that_echoes_the_nonce_or_reflects_the_hello_is_refused():
    client, attacker = stream_pair()
    async with anyio.create_task_group() as tg:
        async def echo() -> None:
            hello = await attacker.receive_exactly(HELLO_BYTES)
            await attacker.send(hello + b"p" * 32)  # the client's own nonce as the server's
        tg.start_soon(echo)
        with pytest.raises(LinkAuthError, match="reflection"):
            await prove(client, SECRET, "unix:/peer")


def test_the_two_proofs_differ_for_the_same_nonces_in_either_order():
    a, b = b"a" * NONCE_BYTES, b"b" * NONCE_BYTES
    proofs = {server_proof(SECRET, a, b), server_proof(SECRET, b, a), client_proof(SECRET, a, b),
              client_proof(SECRET, b, a), server_proof(OTHER, a, b)}
    assert len(proofs) == 5


def test_check_challenge_names_each_failure():
    nonce, ns = b"c" * NONCE_BYTES, b"s" * NONCE_BYTES
    assert check_challenge(SECRET, nonce, MAGIC + ns + server_proof(SECRET, nonce, ns)) is None
    assert "do not match" in (check_challenge(OTHER, nonce, MAGIC + ns + server_proof(SECRET, nonce, ns)) or "")
    assert "reflection" in (check_challenge(SECRET, nonce, MAGIC + nonce + server_proof(SECRET, nonce, nonce)) or "")
    assert "is not an asyncdp listener" in (check_challenge(SECRET, nonce, b"HTTP/1.1 400 Bad Request".ljust(72)) or "")
