"""From segment records to tokens, block hashes and the ideal hit rate (spec routing-bench §4.0, §2.0, §6).

Tokens. Segment ``segment_id`` of a workload with seed ``seed`` is the first ``length`` draws of a
``random.Random`` seeded with BLAKE2b-64 of ``"{seed}/seg/{segment_id}"``, uniform over the vocabulary (32 000).
The draws are one ``random()`` each, so a shorter segment with the same id is a prefix of a longer one (W10's
truncated last block). A prompt is its segments concatenated; a request's answer is its answer segment
(:func:`~asyncdp.bench.records.answer_segment_id`), which the simulated executor must emit.

Block hashes. :func:`hashes` is the engine's own chained hash (``asyncdp.engine.block_manager``: BLAKE2b-64 of
the parent hash and the little-endian token ids), so a prefix-aware policy's index and the ranks' caches name
blocks alike.

Ideal hit rate: one rank, an infinite cache, requests in record order. Each request hits the longest run of
full blocks that an earlier request left cached, capped at ``floor((input_length - 1) / bs) · bs``; then its
prompt and its answer but the last token (whose KV is never computed) stay cached as full blocks, as in vLLM,
where output blocks are hashed too. :func:`ideal_hits` computes it on segments, without tokens: two token
streams agree at a position exactly when their segment lists agree up to there (same ids, same lengths before,
same id at that place), up to a 32 000^-16 chance per block. :func:`ideal_hits_tokens` computes the same on
materialised tokens and real block hashes; the tests hold the two equal.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from hashlib import blake2b

from asyncdp.bench.records import BLOCK_SIZE, VOCAB_SIZE, Record, answer_segment_id
from asyncdp.engine.block_manager import compute_block_hashes


def segment_rng(seed: int, segment_id: str) -> random.Random:
    """The random stream of one segment: seeded with BLAKE2b-64 of ``"{seed}/seg/{segment_id}"``."""
    digest = blake2b(f"{seed}/seg/{segment_id}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def segment_tokens(seed: int, segment_id: str, length: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    """The first ``length`` tokens of segment ``segment_id``."""
    rnd = segment_rng(seed, segment_id).random
    return [int(rnd() * vocab_size) for _ in range(length)]


class Materialiser:
    """Tokens of prompts and answers, with each segment drawn once (shared system prompts, histories)."""

    def __init__(self, seed: int, vocab_size: int = VOCAB_SIZE) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self._cache: dict[str, list[int]] = {}

    def segment(self, segment_id: str, length: int) -> list[int]:
        tokens = self._cache.get(segment_id)
        if tokens is None or len(tokens) < length:
            tokens = self._cache[segment_id] = segment_tokens(self.seed, segment_id, length, self.vocab_size)
        return tokens[:length]

    def prompt(self, record: Record) -> list[int]:
        out: list[int] = []
        for segment_id, length in record.segments:
            out.extend(self.segment(segment_id, length))
        return out

    def answer(self, record: Record) -> list[int]:
        """The tokens the simulated executor emits for ``record``: its answer segment."""
        return segment_tokens(self.seed, answer_segment_id(record.req_id), record.output_length, self.vocab_size)

    def forget(self) -> None:
        self._cache.clear()


def prompt_tokens(record: Record, seed: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    return Materialiser(seed, vocab_size).prompt(record)


def answer_tokens(record: Record, seed: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    return Materialiser(seed, vocab_size).answer(record)


def hashes(seq: Sequence[int], block_size: int) -> list[int]:
    """Spec §2.0 ``hashes(seq, B)``: the chained hash of each complete block of ``block_size`` units."""
    return compute_block_hashes(seq, block_size)


def cached_extent(record: Record, block_size: int) -> int:
    """Tokens of ``record`` left in the cache: full blocks of prompt + answer, less the last answer token."""
    return (record.input_length + record.output_length - 1) // block_size * block_size


def _hit_cap(record: Record, block_size: int) -> int:
    return (record.input_length - 1) // block_size * block_size


class SegmentCache:
    """An infinite prefix cache over segment lists (see the module docstring); O(segments) per call."""

    def __init__(self) -> None:
        # node ids name a list of whole segments; _extent[(node, sid)] is the furthest cached offset into
        # segment sid placed after that list, _child[(node, sid, length)] the node after the whole segment.
        self._extent: dict[tuple[int, str], int] = {}
        self._child: dict[tuple[int, str, int], int] = {}

    def match(self, segments: Iterable[tuple[str, int]]) -> int:
        """Tokens of the longest cached prefix of ``segments``."""
        node, matched = 0, 0
        for sid, length in segments:
            reach = self._extent.get((node, sid), 0)
            if reach < length:
                return matched + reach
            matched += length
            nxt = self._child.get((node, sid, length))
            if nxt is None:
                return matched
            node = nxt
        return matched

    def insert(self, segments: Iterable[tuple[str, int]], extent: int) -> None:
        """Cache the first ``extent`` tokens of ``segments``."""
        node, pos = 0, 0
        for sid, length in segments:
            if pos >= extent:
                return
            covered = min(length, extent - pos)
            key = (node, sid)
            if self._extent.get(key, 0) < covered:
                self._extent[key] = covered
            if covered < length:
                return
            child_key = (node, sid, length)
            nxt = self._child.get(child_key)
            if nxt is None:
                nxt = self._child[child_key] = len(self._child) + 1
            node = nxt
            pos += length


def ideal_hits(records: Iterable[Record], block_size: int = BLOCK_SIZE) -> list[int]:
    """Per record, the prompt tokens an ideal cache serves (one rank, infinite cache, records in order)."""
    cache = SegmentCache()
    out: list[int] = []
    for r in records:
        matched = min(cache.match(r.segments), _hit_cap(r, block_size))
        out.append(matched // block_size * block_size)
        cache.insert((*r.segments, (answer_segment_id(r.req_id), r.output_length)), cached_extent(r, block_size))
    return out


def ideal_hits_tokens(records: Iterable[Record], seed: int, block_size: int = BLOCK_SIZE,
                      vocab_size: int = VOCAB_SIZE) -> list[int]:
    """:func:`ideal_hits` on materialised tokens and real block hashes (the reference; slower)."""
    mat = Materialiser(seed, vocab_size)
    cached: set[int] = set()
    out: list[int] = []
    for r in records:
        prompt = mat.prompt(r)
        hit = 0
        for h in hashes(prompt[:_hit_cap(r, block_size)], block_size):
            if h not in cached:
                break
            hit += block_size
        out.append(hit)
        cached.update(hashes((prompt + mat.answer(r))[:cached_extent(r, block_size)], block_size))
    return out


def ideal_hit_rate(records: Sequence[Record], block_size: int = BLOCK_SIZE) -> float:
    """Σ ideal cached prompt tokens / Σ prompt tokens (spec §4.0 "ideal hit rate")."""
    total = sum(r.input_length for r in records)
    return sum(ideal_hits(records, block_size)) / total if total else 0.0


def ideal_hit_rate_by(records: Sequence[Record], key: Callable[[Record], Hashable],
                      block_size: int = BLOCK_SIZE) -> dict[Hashable, float]:
    """The ideal hit rate per ``key(record)`` (e.g. per round of W4: ``lambda r: r.turn``), keys in first-seen
    order; the cache is still one cache over all records in order."""
    hit: dict[Hashable, int] = {}
    total: dict[Hashable, int] = {}
    for r, h in zip(records, ideal_hits(records, block_size), strict=True):
        k = key(r)
        hit[k] = hit.get(k, 0) + h
        total[k] = total.get(k, 0) + r.input_length
    return {k: hit[k] / total[k] for k in total}
