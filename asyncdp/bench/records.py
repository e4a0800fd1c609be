"""The request record and the workload file of the routing benchmark (spec routing-bench §4.0).

A :class:`Record` is one request, described by its *segments* rather than its tokens: ``segments`` is a list of
``(segment_id, length)`` pairs, and :mod:`asyncdp.bench.materialise` turns each into the first ``length``
tokens of a random stream seeded by ``(seed, segment_id)``. Requests that share a segment id at the same place
share those tokens, which is how every shared prefix of every workload is written. The answer of request ``i``
is the segment :func:`answer_segment_id` ``(i)`` of ``output_length`` tokens: the simulated executor emits it,
and a later turn that quotes the answer lists that segment, so its history hits the blocks the engine cached.

When a request is sent: at ``max(t_arrival_ms or 0, done(after_req) + think_ms)``, where ``done`` is the time
the client sees the last token of ``after_req``. Open loop: ``t_arrival_ms`` set, no ``after_req``. Closed loop:
``t_arrival_ms`` null and a chain of ``after_req``. Mixed (W5's schedule, W10's sessions): both. ``req_id`` is the
record's index in the workload, and ``after_req`` always names an earlier record.

A :class:`Workload` is the header (generator, scale, seed, options, arrival process, cluster hints, ideal hit
rate, measure window) plus the records. On disk it is JSONL: the header as the first line, under the key
``"workload"``, then one record a line, a superset of the Mooncake trace format (``input_length``,
``output_length``, ``hash_ids``). The encoding is deterministic: the same workload gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from asyncdp.bench.arrivals import Arrival, resolve_times_ms, retime
from asyncdp.errors import ConfigError

VOCAB_SIZE = 32_000
BLOCK_SIZE = 16
#: the simulated engine's max_model_len unless the workload sets one (:mod:`~asyncdp.bench.simulate`); a request
#: longer than it (prompt and output) fails or is cut short
DEFAULT_MAX_MODEL_LEN = 65_536
#: virtual seconds: the simulator fails a run that has not ended by then, instead of hanging; so no send time may lie
#: beyond it
DEADLINE_S = 48 * 3600.0
#: the most KV blocks (of 16 tokens) a simulated rank may have: its block manager holds about 160 bytes of Python
#: objects per block, so this is about 650 MB a rank (gpu_1b has 120 000 blocks); a mistyped count was a
#: MemoryError traceback at the first run
MAX_KV_BLOCKS = 1 << 22


def answer_segment_id(req_id: int) -> str:
    """The id of request ``req_id``'s answer segment (its output tokens in the simulated executor)."""
    return f"ans/{req_id}"


class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    req_id: int
    t_arrival_ms: float | None
    client: int
    turn: int
    after_req: int | None
    think_ms: float
    segments: tuple[tuple[str, int], ...]
    input_length: int
    output_length: int
    group: str
    hash_ids: tuple[int, ...] | None = None
    routing_key: str | None = None


class Workload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A generated (or replayed) workload: header fields, then ``records`` in send-priority order.

    Cluster hints are the values the spec fixes for the workload; ``None`` leaves them to the cost profile.
    ``warmup_ms``: requests sent before it are outside the measure window (C6). ``duration_s``: nothing is sent
    after it (closed loops run for a fixed virtual time). ``sweep_rates_rps``: run the workload once per rate on
    a fresh cluster, with the :class:`~asyncdp.bench.arrivals.Dispatch` rate replaced (W4). ``resolved``: the
    send times are final (see :func:`resolve`); until then they are at the nominal rates.
    """

    name: str
    scale: str
    seed: int
    arrival: Arrival
    records: tuple[Record, ...]
    ideal_hit_rate: float
    dp_size: int
    options: dict[str, Any] = {}
    kv_blocks_per_rank: int | None = None
    block_size: int = BLOCK_SIZE
    max_model_len: int | None = None
    vocab_size: int = VOCAB_SIZE
    warmup_ms: float = 0.0
    duration_s: float | None = None
    sweep_rates_rps: tuple[float, ...] = ()
    resolved: bool = False
    notes: str = ""


class _Header(msgspec.Struct, frozen=True):
    workload: dict[str, Any]


_encoder = msgspec.json.Encoder(order="deterministic")
_record_decoder = msgspec.json.Decoder(Record)


def header_fields(workload: Workload) -> dict[str, Any]:
    """The header as a plain dict (everything but the records)."""
    fields = msgspec.structs.asdict(workload)
    del fields["records"]
    out: dict[str, Any] = msgspec.to_builtins(fields, order="deterministic")
    return out


def encode_workload(workload: Workload) -> bytes:
    """The JSONL bytes of ``workload``: header line, then one record a line."""
    lines = [_encoder.encode(_Header(header_fields(workload)))]
    lines.extend(_encoder.encode(r) for r in workload.records)
    return b"\n".join(lines) + b"\n"


def write_workload(workload: Workload, path: str | Path) -> None:
    Path(path).write_bytes(encode_workload(workload))


def decode_workload(data: bytes, source: str = "<bytes>") -> Workload:
    """Parse JSONL written by :func:`encode_workload`; a bad line is a ConfigError naming ``source:line``."""
    lines = [(i, line) for i, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    if not lines:
        raise ConfigError(f"{source}: empty workload file (expected a header line, then records).")
    first_no, first = lines[0]
    try:
        header = msgspec.json.decode(first, type=_Header).workload
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}:{first_no}: not a workload header ({exc}).") from exc
    records = []
    for no, line in lines[1:]:
        try:
            records.append(_record_decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{source}:{no}: bad request record ({exc}).") from exc
    try:
        workload = msgspec.convert({**header, "records": []}, Workload)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}:{first_no}: bad workload header ({exc}).") from exc
    workload = msgspec.structs.replace(workload, records=tuple(records))
    check_records(workload.records, source)
    return workload


def read_workload(path: str | Path) -> Workload:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read workload file {p}: {exc.strerror}.") from exc
    return decode_workload(data, str(p))


def check_records(records: tuple[Record, ...], source: str = "workload") -> None:
    """The invariants every consumer relies on: ids are indices, ``after_req`` points back, lengths add up."""
    for index, r in enumerate(records):
        where = f"{source}: record {index}"
        if r.req_id != index:
            raise ConfigError(f"{where}: req_id is {r.req_id}, expected its index {index}.")
        if r.after_req is not None and not 0 <= r.after_req < index:
            raise ConfigError(f"{where}: after_req {r.after_req} does not name an earlier record.")
        if sum(length for _, length in r.segments) != r.input_length:
            raise ConfigError(f"{where}: segment lengths do not add up to input_length {r.input_length}.")
        if r.input_length < 1 or r.output_length < 1:
            raise ConfigError(f"{where}: input_length and output_length must be >= 1.")


def resolve(workload: Workload, rate_scale: float = 1.0, r_sat_rps: float | None = None) -> Workload:
    """The workload with final send times: ``--rate-scale`` applied, a relative ladder placed at ``r_sat_rps``
    and a trace at its replay speed. What every policy of a comparison then replays (C1)."""
    if workload.resolved:
        raise ConfigError(f"workload {workload.name} already has final send times; resolve it once.")
    arrival, divisor = retime(workload.arrival, rate_scale, r_sat_rps)
    times = resolve_times_ms([r.t_arrival_ms for r in workload.records], divisor)
    records = tuple(msgspec.structs.replace(r, t_arrival_ms=t) for r, t in zip(workload.records, times, strict=True))
    dispatch_rates = tuple(r * rate_scale for r in workload.sweep_rates_rps)
    return msgspec.structs.replace(workload, arrival=arrival, records=records, sweep_rates_rps=dispatch_rates,
                                   resolved=True, warmup_ms=workload.warmup_ms / divisor)
