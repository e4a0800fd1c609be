"""Building one rank's :class:`~asyncdp.engine.core.EngineCore` from its configuration: the model and tokenizer
resolved, the model's facts checked against the flags, the executor chosen (torch or the simulated one)."""

from __future__ import annotations

from typing import Any

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.executor import Executor
from asyncdp.errors import ConfigError


def build_engine_core(config: EngineConfig, *, dp: Any = None, dp_rank: int = 0) -> EngineCore:
    """Resolve the model, load tokenizer and model info, build the executor and the core.

    ``dp_rank`` (the rank this core serves; ``dp.dp_rank`` when ``dp`` is given) seeds the torch executor's
    unseeded sampling with ``rank_seed(config.seed, dp_rank)``, so ranks draw different samples.

    ``dp`` (an ``asyncdp.model.distributed.DPContext``) builds the torch executor for a MoE rank of a DP group:
    it loads only its share of the experts and joins the group's collectives on every forward.

    Nothing is left running if any part fails: a built executor is shut down before the error propagates.
    """
    # lazy: asyncdp.model imports transformers
    from asyncdp.model import load_tokenizer, read_model_info, resolve_model, resolve_tokenizer

    config.validate()
    model_path = resolve_model(config.model)
    tokenizer = load_tokenizer(resolve_tokenizer(config.tokenizer, model_path))
    info = read_model_info(model_path)
    if config.max_model_len is not None and config.max_model_len > info.max_position_embeddings:
        raise ConfigError(
            f"--max-model-len {config.max_model_len} exceeds the model's max_position_embeddings "
            f"({info.max_position_embeddings}); lower --max-model-len.")
    executor: Executor
    if config.executor == "sim":
        from asyncdp.engine.sim_executor import SimExecutor

        executor = SimExecutor(
            config, info.vocab_size, max_model_len=config.max_model_len or info.max_position_embeddings,
            avoid_token_ids=info.eos_token_ids)
    else:
        from asyncdp.engine.model_runner import TorchExecutor  # the only torch importer

        executor = TorchExecutor(config, model_path, dp=dp, dp_rank=dp_rank)
    try:
        return EngineCore(config, executor, tokenizer, eos_token_ids=info.eos_token_ids)
    except BaseException:
        executor.shutdown()
        raise
