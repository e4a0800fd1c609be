"""Every inter-process message, as a frozen typed struct, and the one codec that frames them.

Messages are msgspec structs tagged by ``type`` (the class name) and encoded as msgpack. Two unions share the
codec: :data:`Message` for links (engines, clients, coordinator) and :data:`ControlMessage` for the control
channel between a parent and its child processes (the worker hello carrying the role's config from
:mod:`asyncdp.config.roles`, commands down, events up). A frame with an unknown
tag raises :class:`~asyncdp.errors.ProtocolError` at decode time; readers log and drop it (spec §5.1).
``PROTOCOL_VERSION`` is carried in ``Hello`` and checked by the head at handshake (E5).

Field names follow the DP vocabulary of the specification (§5.2): ``dp_rank``, ``wave``, ``client_index``.

The messages live in :mod:`.link`, :mod:`.node_link` and :mod:`.control`; this module is their one import path and
holds the union of the link messages and the codec.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from asyncdp.errors import ProtocolError
from asyncdp.messages.control import (
    ApiListening,
    ApiStopped,
    ChildReady,
    ControlMessage,
    CoordinatorListening,
    PeerLeftGroup,
    ProcessTable,
    Shutdown,
    Stopping,
    WorkerHello,
)
from asyncdp.messages.link import (
    ERROR_KINDS,
    LAUNCH_NONCE_BYTES,
    PAUSE_ERROR,
    PREFIX_CACHE_BUSY,
    PROTOCOL_VERSION,
    AbortRequests,
    AddRequest,
    ClientAddr,
    CoordinatorAddrs,
    CoordinatorReady,
    DPGroupInfo,
    EngineDead,
    EngineOutputs,
    EngineReady,
    FirstRequest,
    Goodbye,
    HandshakeError,
    HandshakeInit,
    Heartbeat,
    Hello,
    Logprob,
    PrefixCacheReset,
    PrefixClaim,
    PrefixOwner,
    PrefixPlaced,
    RankDraining,
    RankStats,
    Ready,
    RequestOutput,
    SchedulerStats,
    StartWave,
    StartWaveRequest,
    StatsSnapshot,
    Subscribe,
    Teardown,
    TokenLogprobs,
    UtilityCall,
    UtilityResult,
    WaveComplete,
)
from asyncdp.messages.node_link import (
    NodeAccepted,
    NodeHello,
    NodeRow,
    NodeShutdown,
    NodeStopped,
    NodeStopping,
    NodeTopology,
    ProcessRow,
)

Message = Union[  # noqa: UP007 - msgspec needs a real Union of tagged structs
    Hello, HandshakeInit, HandshakeError, Ready, EngineReady,
    AddRequest, AbortRequests, UtilityCall, UtilityResult, EngineOutputs, EngineDead, RankDraining, PrefixCacheReset,
    Subscribe, CoordinatorReady, RankStats, WaveComplete, StartWaveRequest, FirstRequest, StartWave,
    PrefixClaim, PrefixOwner, PrefixPlaced,
    StatsSnapshot, Teardown, Heartbeat, Goodbye, NodeHello, NodeAccepted, NodeShutdown, NodeStopping,
    NodeStopped, NodeTopology,
]

__all__ = [
    "AbortRequests",
    "AddRequest",
    "ApiListening",
    "ApiStopped",
    "ChildReady",
    "ClientAddr",
    "ControlMessage",
    "CoordinatorAddrs",
    "CoordinatorListening",
    "CoordinatorReady",
    "DPGroupInfo",
    "ERROR_KINDS",
    "EngineDead",
    "EngineOutputs",
    "EngineReady",
    "FirstRequest",
    "Goodbye",
    "HandshakeError",
    "HandshakeInit",
    "Heartbeat",
    "Hello",
    "LAUNCH_NONCE_BYTES",
    "Logprob",
    "Message",
    "NodeAccepted",
    "NodeHello",
    "NodeRow",
    "NodeShutdown",
    "NodeStopped",
    "NodeStopping",
    "NodeTopology",
    "PAUSE_ERROR",
    "PREFIX_CACHE_BUSY",
    "PROTOCOL_VERSION",
    "PeerLeftGroup",
    "PrefixCacheReset",
    "PrefixClaim",
    "PrefixOwner",
    "PrefixPlaced",
    "RankDraining",
    "ProcessRow",
    "ProcessTable",
    "RankStats",
    "Ready",
    "RequestOutput",
    "SchedulerStats",
    "Shutdown",
    "StartWave",
    "StartWaveRequest",
    "StatsSnapshot",
    "Stopping",
    "Subscribe",
    "Teardown",
    "TokenLogprobs",
    "UtilityCall",
    "UtilityResult",
    "WaveComplete",
    "WorkerHello",
    "decode",
    "decode_control",
    "describe_tagged",
    "encode",
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_control_decoder = msgspec.msgpack.Decoder(ControlMessage)


def encode(msg: Message | ControlMessage) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """A link frame; an unknown tag or a malformed field is a ProtocolError."""
    return _decode(_decoder, data)


def decode_control(data: bytes) -> ControlMessage:
    """A control-channel frame; a link message, an unknown tag or a malformed field is a ProtocolError."""
    return _decode(_control_decoder, data)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid message: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from exc


def describe_tagged(data: bytes) -> str | None:
    """What an undecodable link frame says it is, when it has this codec's shape (a msgpack map with a string
    ``type``: an asyncdp message of another protocol version), e.g. ``"a NodeAccepted message"`` or ``"a Hello
    message of protocol_version 4"``; None when it is no such map (another protocol altogether)."""
    try:
        obj = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    version = obj.get("protocol_version")
    return f"a {obj['type'][:40]} message" + (f" of protocol_version {version}" if isinstance(version, int) else "")
