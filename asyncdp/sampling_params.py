"""Per-request sampling parameters (vLLM's shape), validated in one place.

``SamplingParams`` travels inside ``AddRequest`` on the wire, so it is a frozen msgspec struct. ``validate()``
raises :class:`~asyncdp.errors.InvalidSamplingParams` naming the field and its allowed range; the API layer and
the offline ``LLM`` both call it before a request reaches an engine.
"""

from __future__ import annotations

import msgspec

from asyncdp.errors import InvalidSamplingParams

# Logprobs beyond this many alternatives are refused, as in vLLM's default.
MAX_LOGPROBS = 20


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-n alternatives per generated token (0: only the sampled token)
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> SamplingParams:
        """Check every range; return self so calls can be chained."""
        def bad(field: str, allowed: str, value: object) -> InvalidSamplingParams:
            return InvalidSamplingParams(f"{field} must be {allowed}, got {value!r}.", field=field)

        if self.n < 1:
            raise bad("n", ">= 1", self.n)
        if not self.temperature >= 0.0:  # also catches NaN
            raise bad("temperature", ">= 0", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]", self.top_p)
        if self.top_k < -1:
            raise bad("top_k", "-1, 0 (disabled) or >= 1", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]", self.min_p)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", ">= 1", self.max_tokens)
        if self.min_tokens < 0:
            raise bad("min_tokens", ">= 0", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise bad("logprobs", f"in [0, {MAX_LOGPROBS}]", self.logprobs)
        if any(not s for s in self.stop):
            raise bad("stop", "non-empty strings", list(self.stop))
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "non-negative token ids", list(self.stop_token_ids))
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise bad("seed", "a 64-bit integer", self.seed)
        return self
