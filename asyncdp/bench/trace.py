"""The Mooncake trace format: read a user's trace as a workload, write any workload as a trace.

Format (kvcache-ai/Mooncake FAST'25 traces; also Dynamo's mocker and aiperf's trace replay): one JSON object a
line with ``timestamp`` (ms since the first request), ``input_length``, ``output_length`` and ``hash_ids``, one
id per block of ``block_size`` tokens (512 by default), the last block possibly partial, so there are exactly
``ceil(input_length / block_size)`` ids. Equal ids at the same position mean a shared prefix. Other fields are
ignored; empty lines are skipped.

Reading (spec §4 W10): each id materialises as a fixed random ``block_size``-token block seeded by the id
(segment ``m/<id>``, see :mod:`asyncdp.bench.materialise`), the last one truncated to ``input_length``; send
times are the timestamps less the first one, replayed at ``speed``. A bad line is a :class:`ConfigError` naming
the file, the line and what is wrong: not JSON, not an object, a missing field, a wrong type, a negative or zero
length, too few or too many ids for ``input_length``, a timestamp before the previous one. Two limits of the
simulator too: a timestamp more than :data:`~asyncdp.bench.records.DEADLINE_S` (48 virtual hours) after the first
one (the simulator stops a run there; a mistyped line of 1e12 ms had it step through virtual hours for minutes,
1e308 was an OverflowError), and a request whose ``input_length + output_length`` exceeds the simulated engine's
``max_model_len`` (65 536 tokens, or what the cost profile's KV cache holds if less: the engine would refuse the
prompt or cut the answer short, and an ``output_length`` of 1e8 once took 4 GB to be cut short).

Writing: records that carry ``hash_ids`` keep them. Others get ids from their block structure: a block's id
names (parent block id, the pieces of segments it holds), numbered in order of first appearance, so exactly the
blocks with equal prefixes get equal ids (what equal tokens would give, without materialising any). A record
without a send time (closed loop) is written at its predecessor's timestamp plus its think time, i.e. with zero
service time, or at 0; timestamps count from the first request, in whole milliseconds, and lines are sorted by
them (stable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from asyncdp.bench.arrivals import Trace
from asyncdp.bench.materialise import ideal_hit_rate
from asyncdp.bench.records import DEADLINE_S, DEFAULT_MAX_MODEL_LEN, Record, Workload
from asyncdp.errors import ConfigError

MOONCAKE_BLOCK = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_encoder = msgspec.json.Encoder()


def block_segment_id(hash_id: int) -> str:
    """The segment a Mooncake hash id materialises as (a fixed random block seeded by the id)."""
    return f"m/{hash_id}"


def block_segments(hash_ids: Sequence[int], input_length: int,
                   block_size: int = MOONCAKE_BLOCK) -> list[tuple[str, int]]:
    """Segments of a Mooncake row: one block per id, the last truncated so the lengths add up to input_length."""
    tail = input_length - (len(hash_ids) - 1) * block_size
    return [(block_segment_id(h), block_size if i < len(hash_ids) - 1 else tail) for i, h in enumerate(hash_ids)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_row(obj: Any, block_size: int, where: str) -> tuple[float, int, int, list[int]]:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
    for name in _FIELDS:
        if name not in obj:
            raise ConfigError(f"{where}: missing field {name!r} (a Mooncake row has {', '.join(_FIELDS)}).")
    ts, n_in, n_out, ids = (obj[name] for name in _FIELDS)
    if not (_is_int(ts) or isinstance(ts, float)) or not math.isfinite(ts):
        raise ConfigError(f"{where}: 'timestamp' must be a number of milliseconds, got {ts!r}.")
    for name, value in (("input_length", n_in), ("output_length", n_out)):
        if not _is_int(value):
            raise ConfigError(f"{where}: {name!r} must be an integer, got {value!r}.")
        if value < 1:
            raise ConfigError(f"{where}: {name!r} must be >= 1, got {value}.")
    if ts < 0:
        raise ConfigError(f"{where}: 'timestamp' must be >= 0, got {ts}.")
    if not isinstance(ids, list) or not all(_is_int(h) and h >= 0 for h in ids):
        raise ConfigError(f"{where}: 'hash_ids' must be a list of non-negative integers.")
    expected = math.ceil(n_in / block_size)
    if len(ids) != expected:
        what = "too few" if len(ids) < expected else "too many"
        raise ConfigError(f"{where}: {what} hash_ids: {len(ids)} for input_length {n_in}, expected {expected} "
                          f"(one per block of {block_size} tokens; is --trace-block-size right?).")
    return float(ts), n_in, n_out, ids


def parse_trace(data: bytes, source: str = "<trace>", block_size: int = MOONCAKE_BLOCK, *,
                max_model_len: int = DEFAULT_MAX_MODEL_LEN, why: str = "the simulator's default") -> list[Record]:
    """The records of a Mooncake trace; ``source`` names it in errors. ``max_model_len``: the most tokens a request
    may hold, prompt and output (``why`` says where it comes from, in the error)."""
    if block_size < 1:
        raise ConfigError(f"--trace-block-size must be >= 1 (got {block_size}).")
    rows: list[tuple[float, int, int, list[int]]] = []
    last_ts, last_no = -math.inf, 0
    for no, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{source}:{no}"
        try:
            obj = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc}).") from exc
        row = _parse_row(obj, block_size, where)
        if row[0] < last_ts:
            raise ConfigError(f"{where}: timestamp {obj['timestamp']} goes backwards "
                              f"(line {last_no} has {last_ts:g}); a trace must be sorted by time.")
        if rows and not row[0] - rows[0][0] <= DEADLINE_S * 1000.0:
            raise ConfigError(f"{where}: timestamp {obj['timestamp']} is {(row[0] - rows[0][0]) / 3.6e6:.4g} hours "
                              f"after the first request's ({rows[0][0]:g} ms); the simulator stops a run after "
                              f"{DEADLINE_S / 3600:g} virtual hours (timestamps are in milliseconds).")
        if row[1] + row[2] > max_model_len:
            raise ConfigError(f"{where}: input_length {row[1]} + output_length {row[2]} tokens exceed the simulated "
                              f"engine's max_model_len {max_model_len} ({why}), the most one request may hold: "
                              "the engine would refuse its prompt or cut its answer short.")
        last_ts, last_no = row[0], no
        rows.append(row)
    if not rows:
        raise ConfigError(f"{source}: the trace has no requests.")
    first = rows[0][0]
    return [Record(req_id=i, t_arrival_ms=round((ts - first) * 1000.0) / 1000.0, client=i, turn=0, after_req=None,
                   think_ms=0.0, segments=tuple(block_segments(ids, n_in, block_size)), input_length=n_in,
                   output_length=n_out, group="trace", hash_ids=tuple(ids))
            for i, (ts, n_in, n_out, ids) in enumerate(rows)]


def read_trace(path: str | Path, block_size: int = MOONCAKE_BLOCK, *, seed: int = 0, speed: float = 1.0,
               dp_size: int = 8, max_model_len: int = DEFAULT_MAX_MODEL_LEN,
               why: str = "the simulator's default") -> Workload:
    """A Mooncake trace file as a workload (``seed`` seeds the blocks' tokens; ``speed`` divides the times;
    ``max_model_len`` and ``why``: see :func:`parse_trace`)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read trace {p}: {exc.strerror}.") from exc
    records = tuple(parse_trace(data, str(p), block_size, max_model_len=max_model_len, why=why))
    return Workload(name=f"trace:{p.name}", scale="trace", seed=seed, arrival=Trace(speed=speed), records=records,
                    ideal_hit_rate=round(ideal_hit_rate(records), 6), dp_size=dp_size,
                    options={"block_size": block_size, "path": str(p)})


class _BlockIds:
    """Mooncake ids for segment lists: a block's key is (parent id, its pieces); ids by first appearance."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[tuple[str, int, int], ...]], int] = {}

    def ids(self, segments: Sequence[tuple[str, int]], block_size: int) -> list[int]:
        out: list[int] = []
        parent = -1
        pieces: list[tuple[str, int, int]] = []
        room = block_size
        for sid, length in segments:
            offset = 0
            while offset < length:
                take = min(room, length - offset)
                pieces.append((sid, offset, take))
                offset += take
                room -= take
                if room == 0:
                    parent = self._id(parent, pieces)
                    out.append(parent)
                    pieces, room = [], block_size
        if pieces:
            out.append(self._id(parent, pieces))
        return out

    def _id(self, parent: int, pieces: list[tuple[str, int, int]]) -> int:
        key = (parent, tuple(pieces))
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found


def _timestamps_ms(records: Sequence[Record]) -> list[float]:
    out: list[float] = []
    for r in records:
        if r.t_arrival_ms is not None:
            out.append(r.t_arrival_ms)
        elif r.after_req is not None:
            out.append(out[r.after_req] + r.think_ms)
        else:
            out.append(0.0)
    return out


def encode_trace(workload: Workload, block_size: int = MOONCAKE_BLOCK) -> bytes:
    """``workload`` in the Mooncake trace format (see the module docstring)."""
    if block_size < 1:
        raise ConfigError(f"--trace-block-size must be >= 1 (got {block_size}).")
    namer = _BlockIds()
    lines: list[tuple[int, bytes]] = []
    stamps = _timestamps_ms(workload.records)
    first = min(stamps, default=0.0)
    for r, t in zip(workload.records, stamps, strict=True):
        ts = t - first
        fits = r.hash_ids is not None and len(r.hash_ids) == math.ceil(r.input_length / block_size)
        ids = list(r.hash_ids) if fits and r.hash_ids is not None else namer.ids(r.segments, block_size)
        row = {"timestamp": round(ts), "input_length": r.input_length, "output_length": r.output_length,
               "hash_ids": ids}
        lines.append((round(ts), _encoder.encode(row)))
    lines.sort(key=lambda item: item[0])
    return b"".join(line + b"\n" for _, line in lines)


def write_trace(workload: Workload, path: str | Path, block_size: int = MOONCAKE_BLOCK) -> None:
    """Export ``workload`` as a Mooncake trace (``--export-trace``)."""
    Path(path).write_bytes(encode_trace(workload, block_size))
