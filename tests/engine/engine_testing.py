"""Shared fakes for the engine tests: a byte-level tokenizer and a scripted executor (no torch)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders
from tokenizers.models import BPE

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.engine.sim_executor import SimExecutor

EOS_ID = 256
BOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259


def make_byte_tokenizer() -> Tokenizer:
    """256 byte tokens (id = byte value) plus <eos>, <bos>, <pad> as special tokens."""
    vocab = {f"<0x{i:02X}>": i for i in range(256)}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(["<eos>", "<bos>", "<pad>"])
    return tok


def encode(text: str) -> list[int]:
    return list(text.encode())


class ScriptedExecutor:
    """Samples the scripted tokens of each request in order (a request id without a script gets token 65)."""

    def __init__(self, scripts: dict[str, list[int]], *, num_kv_blocks: int = 64, max_model_len: int = 512):
        self.scripts = scripts
        self._num_kv_blocks = num_kv_blocks
        self._max_model_len = max_model_len
        self.vocab_size = VOCAB_SIZE
        self.batches: list[ModelBatch] = []
        self.shut_down = False

    @property
    def num_kv_blocks(self) -> int:
        return self._num_kv_blocks

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def execute(self, batch: ModelBatch) -> StepResult:
        self.batches.append(batch)
        out: list[int | None] = []
        for c in batch.chunks:
            script = self.scripts.get(c.request_id, [])
            out.append((script[c.num_output_tokens] if c.num_output_tokens < len(script) else 65)
                       if c.sample else None)
        return StepResult(out, forward_time_s=0.001)

    def execute_dummy(self) -> None:
        pass

    def shutdown(self) -> None:
        self.shut_down = True


def sim_core(*, tokenizer: object = "bytes", max_model_len: int = 512, **config: object) -> EngineCore:
    cfg = EngineConfig(executor="sim", **config).validate()  # type: ignore[arg-type]
    executor = SimExecutor(cfg, VOCAB_SIZE, max_model_len=max_model_len, avoid_token_ids={EOS_ID})
    tok = make_byte_tokenizer() if tokenizer == "bytes" else tokenizer
    return EngineCore(cfg, executor, tok, eos_token_ids={EOS_ID})


def scripted_core(scripts: dict[str, list[int]], *, num_kv_blocks: int = 64, max_model_len: int = 512,
                  **config: object) -> tuple[EngineCore, ScriptedExecutor]:
    cfg = EngineConfig(executor="sim", **config).validate()  # type: ignore[arg-type]
    ex = ScriptedExecutor(scripts, num_kv_blocks=num_kv_blocks, max_model_len=max_model_len)
    return EngineCore(cfg, ex, make_byte_tokenizer(), eos_token_ids={EOS_ID}), ex


def run_to_completion(core: EngineCore, max_steps: int = 10_000) -> dict[str, dict]:
    """Step until idle; collect per request: tokens, text, finish_reason, stop_reason."""
    res: dict[str, dict] = {}
    for _ in range(max_steps):
        if not core.has_unfinished():
            return res
        step = core.step()
        for o in step.outputs:
            r = res.setdefault(o.request_id, {"tokens": [], "text": "", "finish_reason": None,
                                              "stop_reason": None, "deltas": []})
            r["tokens"] += o.new_token_ids
            r["text"] += o.new_text
            r["deltas"].append(o.new_text)
            if o.finished:
                r["finish_reason"] = o.finish_reason
                r["stop_reason"] = o.stop_reason
    raise AssertionError("engine did not finish")
