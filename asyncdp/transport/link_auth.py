"""Link authentication: a mutual challenge-response on the deployment secret, before a link's first frame.

Theory of operation
-------------------
Every process of a deployment holds the same secret (on one node the launcher draws it; across nodes the
operator gives every node the same one) or none. With one, every stream link runs this exchange right after
connect/accept, before any frame is read as a message; each side sends a fresh random nonce, and each proves it
holds the secret with an HMAC-SHA256 over a role tag, its peer's nonce and its own::

    connecting side                                   accepting side
    HELLO     MAGIC | Nc                  (40 bytes) ->
                                                     <- CHALLENGE  MAGIC | Ns | HMAC(s, "server" | Nc | Ns)  (72)
    checks the accepting side's proof
    PROOF     HMAC(s, "client" | Ns | Nc) (32 bytes) ->   checks the connecting side's proof

What it withstands:

* replay: each proof covers the other side's fresh nonce, so a recorded exchange proves nothing on a new link;
* reflection: the role tags differ and each side puts its peer's nonce first, so a proof one side computed never
  passes for the other side's (opening a second link to a server to have it compute a client's proof gets a
  server's proof of other nonces); a peer that echoes our nonce as its own is refused outright;
* strangers: the frames have small fixed sizes and the exchange one deadline (``AUTH_TIMEOUT_S``), so a peer that
  sends nothing, garbage or an asyncdp frame without a secret costs 40 bytes and a few seconds at most, and nothing
  it sent is ever decoded. A proof is compared with :func:`hmac.compare_digest`.

It authenticates the two ends when the link is set up and nothing more: the frames that follow are neither
encrypted nor signed, so a peer on the network path that rewrites TCP segments is out of its reach (a VPN or an
encrypted overlay network is).

The pure parts (the frames, the proofs, the checks) are plain functions; :func:`prove` (the connecting side,
raises :class:`~asyncdp.errors.LinkAuthError`) and :func:`verify` (the accepting side, returns a
:class:`Refusal` or None) are the async shells over an anyio ``BufferedByteStream``, which the link then keeps (no
byte read past the exchange is lost). :class:`RefusalLog` turns refusals into log lines, at most one WARNING a
minute per listener.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import struct
from dataclasses import dataclass

import anyio
from anyio.streams.buffered import BufferedByteStream

from asyncdp.errors import LinkAuthError

log = logging.getLogger(__name__)

# Its first four bytes, read as a frame header by a process without a secret, are a frame of 1.1 GB: no frame.
MAGIC = b"ADPauth1"
NONCE_BYTES = 32
PROOF_BYTES = 32  # SHA-256
HELLO_BYTES = len(MAGIC) + NONCE_BYTES
CHALLENGE_BYTES = len(MAGIC) + NONCE_BYTES + PROOF_BYTES
AUTH_TIMEOUT_S = 5.0  # the whole exchange, on either side
REFUSAL_WARNING_EVERY_S = 60.0
_SERVER_TAG = b"asyncdp-link-auth-1 server"
_CLIENT_TAG = b"asyncdp-link-auth-1 client"
_FRAME_HEADER = struct.Struct(">I")
_MAX_PLAUSIBLE_FRAME = 1 << 20  # a first frame of an asyncdp peer without a secret is a few KiB
SET_THE_SECRET = "give every node the same ASYNCDP_DP_SECRET or --data-parallel-secret-file"
# What a process without a secret sees when a peer with one says HELLO (asyncdp.transport.links quotes it).
UNEXPECTED_HELLO = ("a deployment-secret handshake: that peer holds a deployment secret and this process none; "
                    + SET_THE_SECRET)
LINK_SECRET_BYTES = 32  # a secret the launcher draws for a deployment that is all on one node


def unauthenticated_warning(address: str, rpc_port: int) -> str:
    """The startup warning of a deployment that spans launches (nodes) and has no secret."""
    return (f"the links between this deployment's processes are not authenticated: anyone who can reach "
            f"{address} (the rpc port {rpc_port} and the ports the deployment binds after it) can connect as one of "
            f"its nodes or ranks, send it requests or stop it; {SET_THE_SECRET}")


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The accepting side's proof: over its peer's nonce, then its own."""
    return hmac.new(secret, _SERVER_TAG + client_nonce + server_nonce, hashlib.sha256).digest()


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The connecting side's proof: over its peer's nonce, then its own."""
    return hmac.new(secret, _CLIENT_TAG + server_nonce + client_nonce, hashlib.sha256).digest()


def check_challenge(secret: bytes, client_nonce: bytes, challenge: bytes) -> str | None:
    """Why the accepting side's ``CHALLENGE`` (``CHALLENGE_BYTES`` long) does not prove it holds ``secret``, as the
    end of "the peer at ADDR ..."; None when it does."""
    if not challenge.startswith(MAGIC):
        return _not_asyncdp(challenge)
    server_nonce = challenge[len(MAGIC):len(MAGIC) + NONCE_BYTES]
    if hmac.compare_digest(server_nonce, client_nonce):
        return "echoed this process's nonce as its own: a reflection, refused"
    if not hmac.compare_digest(challenge[len(MAGIC) + NONCE_BYTES:], server_proof(secret, client_nonce, server_nonce)):
        return f"holds another deployment secret: the secrets do not match; {SET_THE_SECRET}"
    return None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an accepted link was refused, as the end of "refused a link from ADDR ...". ``quiet``: a connection
    that closed before sending a byte (a port scan, a TCP probe), logged at DEBUG only. ``plain_frame``: it began
    with an asyncdp frame (a peer without a secret), which is told why in a ``HandshakeError``."""

    problem: str
    quiet: bool = False
    plain_frame: bool = False


def _stranger(head: bytes) -> Refusal:
    """A peer whose first bytes are no ``HELLO``: an asyncdp peer without a secret, or anything else."""
    (size,) = _FRAME_HEADER.unpack(head[:_FRAME_HEADER.size])
    if size <= _MAX_PLAUSIBLE_FRAME:
        return Refusal(f"it sent an asyncdp frame without the deployment-secret handshake (it holds no secret; "
                       f"{SET_THE_SECRET})", plain_frame=True)
    return Refusal(f"it does not speak the deployment-secret handshake (it sent {quote_sent(head)})")


async def verify(stream: BufferedByteStream, secret: bytes) -> Refusal | None:
    """The accepting side of the exchange on a fresh connection: None once the peer proved it holds ``secret``,
    else why not. Reads at most ``HELLO_BYTES + PROOF_BYTES`` and never a frame; ends by ``AUTH_TIMEOUT_S``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    challenged = False
    with anyio.move_on_after(AUTH_TIMEOUT_S):
        try:
            head = await stream.receive_exactly(len(MAGIC))
            if head != MAGIC:
                return _stranger(head)
            client_nonce = await stream.receive_exactly(NONCE_BYTES)
            await stream.send(MAGIC + nonce + server_proof(secret, client_nonce, nonce))
            challenged = True
            proof = await stream.receive_exactly(PROOF_BYTES)
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            if challenged:  # what a peer with another secret does: it found this side's proof wrong
                return Refusal(f"it closed the link instead of proving it holds this deployment's secret (it holds "
                               f"another one, most likely; {SET_THE_SECRET})")
            got = bytes(stream.buffer)
            return Refusal("it closed the link during the deployment-secret handshake"
                           + (f" (it sent {quote_sent(got)})" if got else ""), quiet=not got)
        if hmac.compare_digest(proof, client_proof(secret, nonce, client_nonce)):
            return None
        return Refusal(f"its proof does not match this deployment's secret (it holds another one, or replays an "
                       f"old exchange; {SET_THE_SECRET})")
    got = bytes(stream.buffer)
    return Refusal(f"it did not complete the deployment-secret handshake within {AUTH_TIMEOUT_S:g} s"
                   + (f" (it sent {quote_sent(got)})" if got else ""))


async def prove(stream: BufferedByteStream, secret: bytes, addr: str) -> None:
    """The connecting side of the exchange on a fresh connection to ``addr``; raises
    :class:`~asyncdp.errors.LinkAuthError` naming what went wrong unless both sides proved they hold ``secret``.
    Ends by ``AUTH_TIMEOUT_S``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    with anyio.move_on_after(AUTH_TIMEOUT_S):
        try:
            await stream.send(MAGIC + nonce)
            challenge = await stream.receive_exactly(CHALLENGE_BYTES)
            problem = check_challenge(secret, nonce, challenge)
            if problem is not None:
                raise LinkAuthError(addr, problem)
            await stream.send(client_proof(secret, challenge[len(MAGIC):len(MAGIC) + NONCE_BYTES], nonce))
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            got = bytes(stream.buffer)
            if got and not MAGIC.startswith(got[:len(MAGIC)]):
                raise LinkAuthError(addr, _not_asyncdp(got)) from None
            raise LinkAuthError(addr, "closed the link during the deployment-secret handshake: it holds no "
                                f"deployment secret, or runs an asyncdp without link authentication; {SET_THE_SECRET}"
                                ) from None
        return
    raise LinkAuthError(addr, f"did not answer the deployment-secret handshake within {AUTH_TIMEOUT_S:g} s")


def _not_asyncdp(answer: bytes) -> str:
    return (f"is not an asyncdp listener (it answered the deployment-secret handshake with {quote_sent(answer)}): check "
            "--data-parallel-address/--data-parallel-rpc-port, which name the head's rpc port, not its HTTP --port")


class RefusalLog:
    """The log lines of one listener's refusals: a WARNING naming the remote address, at most one per
    ``every_s`` (a scanner that keeps trying does not flood the log); the refusals in between go to DEBUG and the
    next WARNING counts them. A connection that closed before sending a byte is DEBUG only."""

    def __init__(self, listener: str, *, every_s: float = REFUSAL_WARNING_EVERY_S) -> None:
        self.listener = listener
        self.every_s = every_s
        self.num_refused = 0
        self._muted = 0
        self._next_warning_s = -float("inf")

    def note(self, remote: str, refusal: Refusal) -> None:
        self.num_refused += 1
        now = anyio.current_time()
        if refusal.quiet or now < self._next_warning_s:
            self._muted += 0 if refusal.quiet else 1
            log.debug("refused a link from %s to the %s listener: %s", remote, self.listener, refusal.problem)
            return
        more = f" ({self._muted} more refused since the last such line)" if self._muted else ""
        log.warning("refused a link from %s to the %s listener: %s%s", remote, self.listener, refusal.problem, more)
        self._muted = 0
        self._next_warning_s = now + self.every_s


def quote_sent(data: bytes, limit: int = 24) -> str:
    """The start of what a foreign peer sent, quoted for a log line: its first line, at most ``limit`` bytes."""
    shown = data[:limit].split(b"\r", 1)[0].split(b"\n", 1)[0]
    return repr(shown) + ("..." if len(shown) < len(data) else "")
