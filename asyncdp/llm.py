"""Offline batch inference in vLLM's shape: ``LLM(model, **engine_args).generate(prompts, params)``.

One in-process ``EngineCore`` (no DP, no processes). ``generate`` adds every prompt (``n > 1`` fans out into
``n`` sub-requests, with ``seed + k`` when a seed is set), steps the core until all finish, and returns one
cumulative ``asyncdp.outputs.RequestOutput`` per prompt, in prompt order. If stepping raises (or is
interrupted), the outstanding requests are aborted so the engine stays usable. A request the engine ends with an
error (its grammar failed mid-generation) raises ``InvalidRequestError`` naming its field the same way: no
output cut short is returned as if complete.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from typing import Any

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore, build_engine_core
from asyncdp.errors import InvalidRequestError
from asyncdp.outputs import CompletionOutput, RequestOutput
from asyncdp.sampling_params import SamplingParams

PromptType = str | list[int] | dict[str, Any]


def _normalize_prompts(prompts: Any) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    return list(prompts)


class LLM:
    def __init__(self, model: str, **engine_args: Any) -> None:
        config = EngineConfig(model=model, **engine_args).validate()
        self.llm_engine: EngineCore = self._build(config)
        self.tokenizer = self.llm_engine.tokenizer
        self._counter = itertools.count()

    @staticmethod
    def _build(config: EngineConfig) -> EngineCore:
        return build_engine_core(config)

    @classmethod
    def from_engine_core(cls, core: EngineCore) -> LLM:
        """Wrap an already built core (tests, custom executors)."""
        self = cls.__new__(cls)
        self.llm_engine = core
        self.tokenizer = core.tokenizer
        self._counter = itertools.count()
        return self

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("text prompts need a tokenizer", field="prompt")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            return self._tokenize(prompt["prompt"])
        return None, list(prompt)

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        items = _normalize_prompts(prompts)
        if sampling_params is None:
            params_list = [SamplingParams()] * len(items)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(items)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(items):
                raise InvalidRequestError(
                    f"got {len(params_list)} sampling params for {len(items)} prompts", field="sampling_params")
        core = self.llm_engine
        results: list[RequestOutput] = []
        children: dict[str, tuple[CompletionOutput, RequestOutput]] = {}
        added: list[str] = []
        try:
            for prompt, params in zip(items, params_list, strict=True):
                params.validate()
                text, token_ids = self._tokenize(prompt)
                rid = str(next(self._counter))
                result = RequestOutput(request_id=rid, prompt=text, prompt_token_ids=token_ids)
                results.append(result)
                for k in range(params.n):
                    sub = params if params.n == 1 else _child_params(params, k)
                    sub_id = rid if params.n == 1 else f"{rid}_{k}"
                    core.add_request(sub_id, token_ids, sub)
                    added.append(sub_id)
                    completion = CompletionOutput(index=k, text="", token_ids=[])
                    result.outputs.append(completion)
                    children[sub_id] = (completion, result)
            self._run(children, len(results) if use_tqdm else 0)
        except BaseException:
            core.abort_requests(added)
            with contextlib.suppress(Exception):
                core.step()  # applies the aborts (all requests are ours, so nothing else is scheduled)
            raise
        for result in results:
            result.finished = all(c.finish_reason is not None for c in result.outputs)
        return results

    def _run(self, children: dict[str, tuple[CompletionOutput, RequestOutput]], progress_total: int) -> None:
        core = self.llm_engine
        remaining = set(children)
        bar = _progress_bar(progress_total)
        idle_steps = 0
        while remaining:
            step = core.step()
            idle_steps = 0 if step.executed or step.outputs else idle_steps + 1
            if idle_steps > 2:
                raise RuntimeError("the engine stopped making progress (is it paused?)")
            for delta in step.outputs:
                entry = children.get(delta.request_id)
                if entry is None:
                    continue
                if delta.error_type is not None:  # its grammar failed mid-generation: no cut-short answer
                    raise InvalidRequestError(delta.error or "the request failed", field=delta.error_field)
                completion, result = entry
                completion.token_ids.extend(delta.new_token_ids)
                completion.text += delta.new_text
                if delta.logprobs is not None:
                    completion.logprobs = (completion.logprobs or []) + list(delta.logprobs)
                if delta.prompt_logprobs is not None and result.prompt_logprobs is None:  # n > 1: same for all
                    result.prompt_logprobs = delta.prompt_logprobs
                result.num_cached_tokens = max(result.num_cached_tokens, delta.num_cached_tokens)
                if delta.finished:
                    completion.finish_reason = delta.finish_reason
                    completion.stop_reason = delta.stop_reason
                    remaining.discard(delta.request_id)
                    if bar is not None and all(c.finish_reason is not None for c in result.outputs):
                        bar.update(1)
        if bar is not None:
            bar.close()

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _child_params(params: SamplingParams, k: int) -> SamplingParams:
    import msgspec

    seed = None if params.seed is None else params.seed + k
    return msgspec.structs.replace(params, n=1, seed=seed)


def _progress_bar(total: int) -> Any:
    if total <= 0:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts")
