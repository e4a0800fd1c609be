"""Structured outputs in the engine: one grammar matcher per constrained request, and each step's token bitmask.

The grammar library is llguidance (the one vLLM uses by default; it installs without a CUDA torch or triton).
``SamplingParams.structured`` names a JSON schema, any JSON object, a regex, a list of choices or a Lark grammar;
``asyncdp.sampling_params.structured.grammar_text`` turns it into an llguidance grammar; ``SamplingParams.validate``
compiles it once per distinct text (tokenizer-free, cached) and refuses what the library cannot compile, or what exhausts
its limits within a short bounded probe, with an ``InvalidSamplingParams`` naming the field, before the request
reaches a step. The parameters own that check, so ``sampling_params`` (a wire type under ``messages``) never
imports the engine. Templates are built under the same ``grammar_limits``.

``GrammarMatchers`` lives in the engine core. A rank compiles a request's grammar first, with ``prepare`` in a
worker thread of its own (``asyncdp.engine.rank_grammar``), then ``add`` copies the template. ``add`` (called by ``EngineCore.add_request``) gives the request a
matcher: a ``deep_copy`` of a compiled template cached by grammar text and whitespace pattern
(``StructuredOutputs.grammar_key``; so a repeated schema compiles once).
Per step, only when some live request has a matcher, ``token_masks`` fills one int32 bitmask row (bit t of row r:
token t allowed) per sampled chunk that has one; the executor applies it to those rows' logits before sampling.
After sampling, ``advance`` feeds the accepted token to the matcher and says whether the request must end:
the grammar is complete (the core finishes it with ``stop``; EOS is allowed by the mask once the grammar
accepts), or the matcher failed. A batch without constrained rows costs one empty-dict test. ``discard`` drops a
finished or aborted request.

Starting after a marker (``StructuredOutputs.start_after``: a reasoning model's ``</think>``; ``start_markers``:
more of them, gpt-oss's final-channel header with or without a content type; as vLLM's structured outputs wait for
the reasoning parser's end of reasoning). Such a request gets its matcher at ``add`` as any other, but is
*waiting*: ``token_masks`` gives it no row and ``advance`` only feeds its sampled ids to its watch
(:mod:`asyncdp.engine.grammar_start`: a few ids of state per start, so a marker of several tokens may span
steps), never to the matcher. The token that completes a start ends the wait; the next one is the grammar's
first, from its start state. A request that ends while waiting (EOS, a stop, ``max_tokens``) was never constrained: EOS stops it with
``stop`` as vLLM lets it, the length limit with ``length``. Only generated ids count, never the prompt's.

Failures. Matchers are built under ``grammar_limits`` (those validation probed the grammar with), but a limit
can still be hit mid-generation (``asyncdp.sampling_params``'s probe walks one short path). llguidance then puts
the matcher in an error state: its mask allows only EOS and it rejects every token. ``advance`` reports that
(``error`` gives the library's message, logged once per request as a warning), and the core ends the request
with an error naming the grammar field instead of a ``stop`` that would pass the truncated text off as complete.
The lexer is shared by a template and its copies, so the failure reaches the template and the other live
requests of the same grammar too (each fails at its next mask, the same visible way); the template is evicted,
so the next request with that grammar starts from a fresh one.

The llguidance tokenizer is built from the engine's Hugging Face fast tokenizer once (0.3 s for SmolLM2's 49k
vocabulary on an idle core, a second or more on a loaded one, holding the GIL throughout), with the model's
vocabulary size (the logits' width) and the engine's EOS ids: by ``warm``, which a rank runs in a background thread
once it reported ready, or by the first grammar that needs it. Whichever comes second waits for the first (a lock),
so it is built once. It is built in two library calls (without the token-mask "slices", then with the library's
default ones), so the longest stretch that holds the GIL, during which no other thread of the process runs, is
shorter; the engine's tokenizer is copied first only when it pads or truncates (the copy alone took 0.1 s).

No torch here (the bitmask is a numpy array): the executor converts it.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from asyncdp.engine.grammar_start import Watch, start_watch
from asyncdp.errors import InvalidRequestError, InvalidSamplingParams
from asyncdp.sampling_params.structured import (
    grammar_limits,
    grammar_text,
    library_error,
    llguidance_module,
    refuse_grammar,
)

if TYPE_CHECKING:
    from asyncdp.engine.executor import ScheduledChunk, TokenMasks
    from asyncdp.sampling_params import StructuredOutputs

log = logging.getLogger(__name__)

_MAX_TEMPLATES = 64
_Key = tuple[str, str, str | None]  # StructuredOutputs.grammar_key(): what a template is compiled from


class GrammarMatchers:
    """The matchers of one engine core's constrained requests, by request id."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Collection[int]) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._ll_tokenizer: Any = None
        self._building = threading.Lock()  # held while the tokenizer is built (by ``warm`` or a first grammar)
        self._templates: OrderedDict[_Key, Any] = OrderedDict()
        # Grammars compile in worker threads (``prepare``) while the execution thread copies templates (``add``):
        # the cache's get-then-move and insert-then-evict are one step each. A compile itself holds no lock.
        self._cache_lock = threading.Lock()
        self.matchers: dict[str, Any] = {}
        self._origins: dict[str, tuple[_Key, Any]] = {}  # request id -> (key, template) it copies
        self._waiting: dict[str, Watch] = {}  # request id -> its start's watch, until the grammar starts

    @classmethod
    def for_engine(cls, executor: Any, tokenizer: Any, vocab_size: int | None, eos_token_ids: Collection[int],
                   structured: StructuredOutputs | None = None) -> GrammarMatchers:
        """An engine core's matchers; InvalidRequestError (naming ``structured``'s field) where no grammar can apply:
        an executor that does not apply token masks (the sim executor), or no tokenizer."""
        if not getattr(executor, "applies_token_masks", False) or tokenizer is None:
            raise InvalidRequestError("structured outputs need an executor that applies token masks (the torch "
                                      "executor, not --executor sim) and a tokenizer.", field=None if structured is
                                      None else structured.param or f"structured.{structured.kind()[0]}")
        return cls(tokenizer, vocab_size if vocab_size is not None else len(tokenizer), eos_token_ids)

    def __len__(self) -> int:
        return len(self.matchers)

    def _tokenizer(self) -> Any:
        tokenizer = self._ll_tokenizer
        if tokenizer is None:
            with self._building:  # being built in another thread (the rank's warm-up): wait for it, not build twice
                if self._ll_tokenizer is None:
                    self._ll_tokenizer = self._build_tokenizer()
                tokenizer = self._ll_tokenizer
        return tokenizer

    def _build_tokenizer(self) -> Any:
        llg = llguidance_module()
        # A Hugging Face fast tokenizer's Rust backend, or a ``tokenizers.Tokenizer`` itself.
        backend = getattr(self._hf_tokenizer, "backend_tokenizer", self._hf_tokenizer)
        if not hasattr(backend, "to_str"):
            raise InvalidSamplingParams("structured outputs need a fast (Rust) tokenizer; this engine's "
                                        "tokenizer is not one.", field="structured")
        if getattr(backend, "padding", None) is not None or getattr(backend, "truncation", None) is not None:
            backend = copy.copy(backend)
            backend.no_padding()
            backend.no_truncation()
        plain = llg.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids, slices=[])
        return plain.with_slices(llg.LLTokenizer.general_slices())  # LLTokenizer's default slices, in a second call

    def _cached(self, key: _Key) -> Any:
        with self._cache_lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
            return template

    def _template(self, key: _Key) -> Any:
        template = self._cached(key)
        if template is not None:
            return template
        kind, text, whitespace_pattern = key
        try:
            grammar = grammar_text(kind, text, whitespace_pattern)
        except ValueError as exc:
            raise refuse_grammar(kind, str(exc)) from exc
        template = llguidance_module().LLMatcher(self._tokenizer(), grammar, log_level=0, limits=grammar_limits())
        if template.is_error():
            raise refuse_grammar(kind, library_error(template.get_error()))
        with self._cache_lock:
            self._templates[key] = template
            if len(self._templates) > _MAX_TEMPLATES:
                self._templates.popitem(last=False)
        return template

    def warm(self) -> None:
        """Build the llguidance tokenizer now, from any thread; a grammar compiled meanwhile waits for it."""
        self._tokenizer()

    def prepare(self, structured: StructuredOutputs) -> None:
        """Build the tokenizer and compile the grammar's template now (InvalidSamplingParams if it does not
        compile), so that ``add`` only copies it."""
        self._template(structured.grammar_key())

    def add(self, request_id: str, structured: StructuredOutputs, *, compile_grammar: bool = True) -> bool:
        """Give ``request_id`` a fresh matcher for its grammar (InvalidSamplingParams if it does not compile).
        With ``compile_grammar=False`` only from a template ``prepare`` compiled: False (no matcher) when there is
        none (evicted since, or never compiled)."""
        key = structured.grammar_key()
        template = self._template(key) if compile_grammar else self._cached(key)
        if template is None:
            return False
        self.matchers[request_id] = template.deep_copy()
        self._origins[request_id] = (key, template)
        watch = start_watch(structured)
        if watch is not None:
            self._waiting[request_id] = watch
        return True

    def waiting(self, request_id: str) -> bool:
        """Whether the request's grammar waits for its start (``start_after``, ``start_markers``): its tokens are
        free until then."""
        return request_id in self._waiting

    def discard(self, request_id: str) -> None:
        self.matchers.pop(request_id, None)
        self._origins.pop(request_id, None)
        self._waiting.pop(request_id, None)

    def clear(self) -> None:
        """Drop every request's matcher (the templates stay)."""
        self.matchers.clear()
        self._origins.clear()
        self._waiting.clear()

    def _evict_template_of(self, request_id: str) -> None:
        """A failed matcher leaves its template's shared lexer in the error state: the next request with that
        grammar gets a fresh template, whatever path it would take."""
        origin = self._origins.get(request_id)
        with self._cache_lock:
            if origin is not None and self._templates.get(origin[0]) is origin[1]:
                del self._templates[origin[0]]

    def token_masks(self, chunks: Sequence[ScheduledChunk]) -> TokenMasks | None:
        """One bitmask row per sampled chunk with a matcher whose grammar has started (None: no such chunk in the
        batch)."""
        import numpy as np

        from asyncdp.engine.executor import TokenMasks

        matchers, waiting = self.matchers, self._waiting
        rows = [i for i, c in enumerate(chunks)
                if c.sample and c.request_id in matchers and c.request_id not in waiting]
        if not rows:
            return None
        width = (self.vocab_size + 31) // 32
        bitmask = np.empty((len(rows), width), dtype=np.int32)
        row_bytes = width * 4
        base = bitmask.ctypes.data
        for r, i in enumerate(rows):
            matchers[chunks[i].request_id].unsafe_compute_mask_ptr(base + r * row_bytes, row_bytes)
        return TokenMasks(chunk_indices=rows, bitmask=bitmask)

    def advance(self, request_id: str, token_id: int) -> bool:
        """Feed the sampled token to the request's matcher; True when the request must end: its grammar is
        complete, or its matcher failed (``error`` says which; a failed matcher's mask allows only EOS). While the
        grammar waits for its marker, the token is only watched for it (False)."""
        matcher = self.matchers.get(request_id)
        if matcher is None:
            return False
        watch = self._waiting.get(request_id)
        if watch is not None:
            if watch.seen(token_id):
                del self._waiting[request_id]  # the next token is the grammar's first
            return False
        if matcher.is_error() or not matcher.consume_token(token_id):
            log.warning("request %s: its grammar failed at token %d (%s); ending it with an error", request_id,
                        token_id, self.error(request_id))
            self._evict_template_of(request_id)
            return True
        return bool(matcher.is_stopped())

    def error(self, request_id: str) -> str:
        """The library's error of the request's matcher, "" while it has none (or the request no matcher)."""
        matcher = self.matchers.get(request_id)
        if matcher is None or not matcher.is_error():
            return ""
        return library_error(matcher.get_error()) or "the grammar matcher failed"
