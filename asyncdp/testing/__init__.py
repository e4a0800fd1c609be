"""Public test helpers: a deterministic in-process engine client and a tiny byte-level tokenizer."""

from asyncdp.testing.fake_client import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer

__all__ = ["FakeEngineClient", "byte_tokenizer"]
