"""Per-request sampling parameters (vLLM's shape), validated in one place.

``SamplingParams`` travels inside ``AddRequest`` on the wire, so it is a frozen msgspec struct. ``validate()``
raises :class:`~asyncdp.errors.InvalidSamplingParams` naming the field and its allowed range; the API layer and
the offline ``LLM`` both call it before a request reaches an engine. ``structured`` (``StructuredOutputs``, in
:mod:`.structured` with the grammar checks, re-exported here with its ``StartMarker``) is checked by compiling its
grammar, so an uncompilable schema or regex is refused there too, naming ``structured.<field>``.
``allowed_token_ids`` and ``bad_words`` are checked against a vocabulary, and the words tokenized, by
:mod:`.token_filters`. The server's (or the offline ``LLM``'s) bounds beyond ``validate()``'s ranges are checked by
their owners with the functions here: ``--max-logprobs`` (:func:`check_logprobs`) and ``--scheduling-policy``
(:func:`check_priority`); :func:`default_sampling_params` are vLLM's ``LLM.get_default_sampling_params``.
"""

from __future__ import annotations

import math
from hashlib import blake2b
from operator import attrgetter
from typing import Any

import msgspec

from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.errors import ConfigError, InvalidRequestError, InvalidSamplingParams
from asyncdp.sampling_params.structured import StartMarker, StructuredOutputs
from asyncdp.sampling_params.token_filters import MAX_NUM_BAD_WORDS, with_token_filters

__all__ = ["MAX_INT32", "MAX_LOGIT_BIAS", "MAX_N", "MAX_NUM_BAD_WORDS", "MAX_PENALTY", "MIN_REPETITION_PENALTY",
           "SamplingParams", "StartMarker", "StructuredOutputs", "check_logprobs", "default_sampling_params",
           "sample_seed", "with_token_filters"]
# Most sequences one request may ask for (n, best_of), as OpenAI caps them.
MAX_N = 128
# Integer fields that name token ids or counts travel as msgpack ints and index tensors: keep them in int32.
MAX_INT32 = 2**31 - 1
# OpenAI's ranges: penalties in [-2, 2], logit_bias values in [-100, 100].
MAX_PENALTY = 2.0
# The smallest repetition_penalty: logits are fp32, where a smaller divisor (1e-40 is subnormal, 1e-300 rounds to
# 0) turns the penalised logits into inf and the distribution into NaN. 1e-6 keeps logits / penalty finite.
MIN_REPETITION_PENALTY = 1e-6
MAX_LOGIT_BIAS = 100.0


def salt_root(cache_salt: str) -> int:
    """The hash a salted prompt's block hashes chain from (``cache_salt``): BLAKE2b-64, personalised apart from the
    block hashes, of the salt's UTF-8 bytes, read little-endian. The engine's block manager and the routing policies'
    predicted hits (``asyncdp.dp.policy.RequestView.root_hash``) both start from it."""
    digest = blake2b(cache_salt.encode("utf-8", "surrogatepass"), digest_size=8, person=b"asyncdp-salt").digest()
    return int.from_bytes(digest, "little")


def check_priority(scheduling_policy: str, priority: int) -> None:
    """A request's ``priority`` other than 0 needs ``--scheduling-policy priority``: vLLM's refusal otherwise (the
    API server's 400, and the engine's for the offline ``LLM`` or a rank set up otherwise than its API server)."""
    if priority != 0 and scheduling_policy != "priority":
        raise InvalidRequestError(f"Got priority {priority} but Priority scheduling is not enabled.", field="priority")


def check_logprobs(params: SamplingParams, limit: int | None, *, beam_width: int = 0) -> None:
    """vLLM's refusal of more sample or prompt logprobs than ``limit`` (``--max-logprobs``, its -1 the vocabulary's size; None: no limit), or
    of a beam search whose steps ask ``2 * beam_width`` (the field named is ``n``, the request's beam width)."""
    if limit is None:
        return
    for kind, field, asked in (("sample", "logprobs", params.logprobs),
                               ("prompt", "prompt_logprobs", params.prompt_logprobs),
                               ("sample", "n", 2 * beam_width or None)):
        if asked is not None and asked > limit:
            raise InvalidSamplingParams(f"Requested {kind} logprobs of {asked}, which is greater than max allowed: "
                                        f"{limit}", field=field)


def default_sampling_params(defaults: GenerationDefaults, source: str) -> SamplingParams:
    """vLLM's ``LLM.get_default_sampling_params``: ``SamplingParams`` with the sampling ``defaults`` set, the others
    (``max_tokens`` 16 included) its own; a ConfigError naming ``source`` where one is out of range, the cap too."""
    try:
        params = SamplingParams(**defaults.values()).validate()
        if defaults.max_tokens_cap is not None:
            msgspec.structs.replace(params, max_tokens=defaults.max_tokens_cap).validate()
    except InvalidSamplingParams as exc:
        raise ConfigError(f"the sampling defaults of {source} are invalid: {exc}") from None
    return params


def sample_seed(seed: int | None, index: int) -> int | None:
    """Sample ``index``'s seed (HTTP ``n``/``best_of``, offline ``n``): ``seed + index``, wrapped into 64 bits."""
    child = None if seed is None else seed + index
    return child - 2**64 if child is not None and child >= 2**64 else child


_INT_FIELDS = ("n", "top_k", "min_tokens", "seed", "max_tokens", "logprobs", "prompt_logprobs", "priority")
_OPTIONAL = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
_NUMBER_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_PLAIN_NUMBERS = frozenset((int, float))
_BOOL_FIELDS = (
    "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens")
# The same fields, read at once for the plain-types check (so a field added above is checked there too).
_REQUIRED_INTS = attrgetter(*(name for name in _INT_FIELDS if name not in _OPTIONAL))
_OPTIONAL_INTS = attrgetter(*_OPTIONAL)
_NUMBERS = attrgetter(*_NUMBER_FIELDS)
_BOOLS = attrgetter(*_BOOL_FIELDS)
_INT, _INT_OR_NONE, _BOOL = frozenset((int,)), frozenset((int, type(None))), frozenset((bool,))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
    prompt_logprobs: int | None = None  # top-n alternatives per prompt token (0: only the prompt token)
    skip_special_tokens: bool = True
    # vLLM's: with skip_special_tokens false, False puts no space between two added tokens in a row (the
    # detokenizer gives the second one's text as it is; asyncdp.engine.detokenizer).
    spaces_between_special_tokens: bool = True
    # Penalties, vLLM semantics: presence/frequency subtract from the logits of tokens already generated
    # (frequency scaled by the count); repetition divides positive (multiplies negative) logits of tokens in the
    # prompt or the output. 0 / 0 / 1 disable them.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token_id, bias) pairs added to the logits before sampling, sorted by token id, ids unique (a dict: sorted).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # A grammar the output must follow (JSON schema, regex, choice, Lark); None: unconstrained.
    structured: StructuredOutputs | None = None
    # vLLM's cache_salt: mixed into the hash of the prompt's first KV block (so into every later one), so requests
    # with different salts, or with and without one, never share prefix-cache blocks. None: unsalted.
    cache_salt: str | None = None
    # vLLM's request priority, under --scheduling-policy priority: lower is served first (ties by arrival) and
    # preempted last. Anything but 0 under fcfs is refused (by the API server and the engine core).
    priority: int = 0
    # vLLM's token filters (asyncdp.sampling_params.token_filters). allowed_token_ids: only these ids may be sampled
    # (None: any; empty is refused). bad_words: words never generated, banned as the token sequences in
    # bad_words_token_ids (made from the words by the API server or the engine core when not given).
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        # vLLM's shapes: stop="x" is one stop string (never its characters), lists are kept as tuples.
        if isinstance(self.stop, str | list):
            msgspec.structs.force_setattr(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            msgspec.structs.force_setattr(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.allowed_token_ids, list):
            msgspec.structs.force_setattr(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        if isinstance(self.bad_words, list):  # duplicates dropped, order kept, as vLLM
            msgspec.structs.force_setattr(self, "bad_words", tuple(dict.fromkeys(self.bad_words)))
        if isinstance(self.bad_words_token_ids, list):
            msgspec.structs.force_setattr(self, "bad_words_token_ids", tuple(
                tuple(seq) if isinstance(seq, list) else seq for seq in self.bad_words_token_ids))
        if isinstance(self.logit_bias, dict):  # vLLM's {token_id: bias}; the struct keeps sorted pairs
            pairs = self.logit_bias.items()
            if all(_is_int(t) for t, _ in pairs):
                msgspec.structs.force_setattr(self, "logit_bias", tuple(sorted(pairs)))

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> SamplingParams:
        """Check every range; return self so calls can be chained."""
        def bad(field: str, allowed: str, value: object) -> InvalidSamplingParams:
            return InvalidSamplingParams(f"{field} must be {allowed}, got {value!r}.", field=field)

        self._check_types(bad)
        if not 1 <= self.n <= MAX_N:
            raise bad("n", f"in [1, {MAX_N}]", self.n)
        if not 0.0 <= self.temperature < math.inf:  # also catches NaN
            raise bad("temperature", ">= 0 and finite", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]", self.top_p)
        if not -1 <= self.top_k <= MAX_INT32:
            raise bad("top_k", f"-1, 0 (disabled) or in [1, {MAX_INT32}]", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]", self.min_p)
        if self.max_tokens is not None and not 1 <= self.max_tokens <= MAX_INT32:
            raise bad("max_tokens", f"in [1, {MAX_INT32}]", self.max_tokens)
        if not 0 <= self.min_tokens <= MAX_INT32:
            raise bad("min_tokens", f"in [0, {MAX_INT32}]", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        # (the most a request may ask is its server's --max-logprobs: check_logprobs)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_INT32:
            raise bad("logprobs", f"in [0, {MAX_INT32}]", self.logprobs)
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_INT32:
            raise bad("prompt_logprobs", f"in [0, {MAX_INT32}]", self.prompt_logprobs)
        if not isinstance(self.stop, tuple) or any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a string or a list of non-empty strings", self.stop)
        if any(not 0 <= t <= MAX_INT32 for t in self.stop_token_ids):
            raise bad("stop_token_ids", f"token ids in [0, {MAX_INT32}]", list(self.stop_token_ids))
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise bad("seed", "a 64-bit integer", self.seed)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise bad(name, f"in [{-MAX_PENALTY:g}, {MAX_PENALTY:g}]", value)
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_PENALTY:
            raise bad("repetition_penalty", f"in [{MIN_REPETITION_PENALTY:g}, {MAX_PENALTY:g}]",
                      self.repetition_penalty)
        ids = [t for t, _ in self.logit_bias]
        if any(not 0 <= t <= MAX_INT32 for t in ids) or len(set(ids)) != len(ids):
            raise bad("logit_bias", f"unique token ids in [0, {MAX_INT32}]", ids)
        if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in self.logit_bias):
            raise bad("logit_bias", f"biases in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
                      [b for _, b in self.logit_bias])
        if self.allowed_token_ids is not None and (
                not self.allowed_token_ids or any(not 0 <= t <= MAX_INT32 for t in self.allowed_token_ids)):
            raise bad("allowed_token_ids", f"a non-empty list of token ids in [0, {MAX_INT32}]",
                      list(self.allowed_token_ids))
        if any(not word for word in self.bad_words):
            raise bad("bad_words", "a list of non-empty strings", list(self.bad_words))
        sequences = self.bad_words_token_ids
        if len(sequences) > MAX_NUM_BAD_WORDS or any(not s or any(not 0 <= t <= MAX_INT32 for t in s)
                                                     for s in sequences):
            raise bad("bad_words", f"at most {MAX_NUM_BAD_WORDS} non-empty token sequences of ids in "
                                   f"[0, {MAX_INT32}]", [list(s) for s in sequences])
        if self.structured is not None:
            self.structured.validate()
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise bad("cache_salt", "a non-empty string or None", self.cache_salt)
        if not -(2**63) <= self.priority < 2**63:
            raise bad("priority", "a 64-bit signed integer", self.priority)
        return self

    def _has_plain_types(self) -> bool:
        """The types nearly every params has, checked at once: exact ints and floats, bools, no token lists, no
        grammar. True only where :meth:`_check_types` finds nothing (it runs where this is False): the full check
        was two thirds of ``validate()``, which the API server runs on every request."""
        return (_INT.issuperset(map(type, _REQUIRED_INTS(self)))
                and _INT_OR_NONE.issuperset(map(type, _OPTIONAL_INTS(self)))
                and _PLAIN_NUMBERS.issuperset(map(type, _NUMBERS(self)))
                and _BOOL.issuperset(map(type, _BOOLS(self)))
                and type(self.stop_token_ids) is tuple and not self.stop_token_ids
                and type(self.logit_bias) is tuple and not self.logit_bias and self.structured is None
                and self.allowed_token_ids is None and type(self.bad_words) is tuple and not self.bad_words
                and type(self.bad_words_token_ids) is tuple and not self.bad_words_token_ids)

    def _check_types(self, bad: Any) -> None:
        """Each field's type, before the ranges compare them (a bool is no number; ``stop``: with its range)."""
        if self._has_plain_types():
            return
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not (_is_int(value) or value is None and name in _OPTIONAL):
                raise bad(name, "an integer" + (" or None" if name in _OPTIONAL else ""), value)
        for name in _NUMBER_FIELDS:
            if not _is_number(getattr(self, name)):
                raise bad(name, "a number", getattr(self, name))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "a bool", getattr(self, name))
        if not isinstance(self.stop_token_ids, tuple) or not all(map(_is_int, self.stop_token_ids)):
            raise bad("stop_token_ids", "a list of integer token ids", self.stop_token_ids)
        if not isinstance(self.logit_bias, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and _is_int(p[0]) and _is_number(p[1]) for p in self.logit_bias):
            raise bad("logit_bias", "a dict {token_id: bias} of integer ids and numbers", self.logit_bias)
        if not isinstance(self.structured, StructuredOutputs | None):
            raise bad("structured", "a StructuredOutputs or None", self.structured)
        if not (self.allowed_token_ids is None or isinstance(self.allowed_token_ids, tuple)
                and all(map(_is_int, self.allowed_token_ids))):
            raise bad("allowed_token_ids", "a list of integer token ids or None", self.allowed_token_ids)
        if not isinstance(self.bad_words, tuple) or not all(isinstance(w, str) for w in self.bad_words):
            raise bad("bad_words", "a list of strings", self.bad_words)
        if not isinstance(self.bad_words_token_ids, tuple) or not all(
                isinstance(s, tuple) and all(map(_is_int, s)) for s in self.bad_words_token_ids):
            raise bad("bad_words_token_ids", "a list of token-id lists", self.bad_words_token_ids)

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)
