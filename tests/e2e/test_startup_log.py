"""End to end: what ``asyncdp serve builtin:tiny-dense -dp 2`` logs from start to an orderly stop (issue #11).

Startup: one line per stage, in order (model resolved; per rank: weights loaded, KV cache, ready; the launcher's
"serving <model> on http://HOST:PORT with N ranks (M API servers)" naming the bound port), no ``hypercorn.error``
logger and no per-process "Running on" line. SIGTERM while one stream is in flight (with a drain deadline long
enough for it): the stream ends normally, and the log ends with one "stopped: 1 request drained, 0 aborted;
exit status 0" line, with no "lost", ERROR or traceback on the way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch

from tests.e2e.conftest import MODEL, ROOT, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def _index(lines: list[str], pattern: str) -> int:
    found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert len(found) == 1, f"expected one line matching {pattern!r}, found {len(found)}\n" + "\n".join(lines)
    return found[0]


async def test_dp2_startup_logs_each_stage_in_order_and_an_orderly_stop_logs_one_stopped_line(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--shutdown-timeout", "60",
               "--max-model-len", "1024") as server:
        finish: list[str | None] = []
        async with server.openai() as client:
            stream = await client.completions.create(model=MODEL, prompt="hello", max_tokens=300, stream=True,
                                                     extra_body={"ignore_eos": True})
            async with anyio.create_task_group() as tg:
                async for chunk in stream:
                    if not finish:  # the first chunk: the request is in flight; stop the deployment now
                        finish.append(None)
                        tg.start_soon(anyio.to_thread.run_sync, server.stop)  # asserts exit 0, nothing left
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish.append(chunk.choices[0].finish_reason)
        port = server.port
        lines = [line for line in server.log().splitlines() if not line.startswith("$ ")]

    assert finish[-1] == "length"  # drained: it ran to its end although SIGTERM came first
    model = _index(lines, rf"asyncdp\.launcher: model {MODEL}: checkpoint ")
    for rank in (0, 1):
        weights = _index(lines, rf"rank {rank}: weights loaded in [0-9.]+ s: \S+ parameters, float32 on cpu")
        kv = _index(lines, rf"rank {rank}: KV cache of \d+ blocks x 16 tokens = \d+ tokens")
        ready = _index(lines, rf"rank {rank} ready in [0-9.]+ s")
        assert model < weights < kv < ready
    serving = _index(lines, rf"asyncdp\.launcher: serving {MODEL} on http://127\.0\.0\.1:{port} with 2 ranks "
                            r"\(2 API servers\); startup took [0-9.]+ s")
    assert all(serving > _index(lines, rf"rank {r} ready in") for r in (0, 1))
    signal_line = _index(lines, r"received SIGTERM: shutting down")
    stopped = _index(lines, r"asyncdp\.launcher: stopped")
    assert serving < signal_line < stopped == len(lines) - 1
    assert lines[stopped].endswith("stopped: 1 request drained, 0 aborted; exit status 0"), lines[stopped]
    text = "\n".join(lines)
    for banned in ("hypercorn.error", "Running on", "lost", "Traceback", "ERROR"):
        assert banned not in text, f"{banned!r} in the log\n{text}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_engine_refusing_its_flags_at_startup_fails_the_launch_with_its_reason_as_one_line() -> None:
    # --device cuda passes validation (the parent does not import torch) and is refused by the engine as it
    # builds: the launcher names the engine's reason, not a handshake that broke off, and nobody logs a traceback
    cmd = [sys.executable, "-m", "asyncdp", "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--device", "cuda",
           "--torch-threads", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert ("startup failed: engine rank 0: --device cuda was requested but CUDA is not available; use --device cpu "
            "or auto.") in log, log
    assert "Traceback" not in log and "EndOfStream" not in log, log
