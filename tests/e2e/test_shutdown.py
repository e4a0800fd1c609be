"""End to end: SIGTERM to the launcher while streams are in flight (spec §12.5), one short-lived deployment each.

``--shutdown-timeout 0``: every in-flight stream ends with an SSE error event naming the shutdown (issue #12: an
abandoned request is an error, never a 200 cut short with ``finish_reason == "abort"``) and the launcher
exits 0 within 4 s, leaving no process behind. ``--shutdown-timeout 5``: new requests are refused (503 or a
refused connection) while the in-flight stream runs to its natural end, then the launcher exits 0. SIGINT
(Ctrl-C) stops a single-mode deployment the same way.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, Server, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# tiny-dense streams ~500 tokens/s on one core: in-flight streams must outlast the signal, so allow long ones.
LONG_ARGS = ("--max-model-len", "2048")

LONG = {"max_tokens": 1900, "temperature": 1.0, "stream": True, "extra_body": {"ignore_eos": True}}


async def _consume(client: openai.AsyncOpenAI, prompt: str, first: anyio.Event, outcome: list[str],
                   extra: dict | None = None) -> None:
    """Stream one long completion; record how it ended: a finish reason, ``error: <message>`` for an error event
    or status, or ``closed``."""
    reason = None
    try:
        stream = await client.completions.create(model=MODEL, prompt=prompt, **{**LONG, **(extra or {})})
        async for chunk in stream:
            first.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
    except openai.APIConnectionError:
        reason = reason or "closed"
    except openai.APIError as exc:
        reason = reason or f"error: {exc.message}"
    except httpx.HTTPError:
        reason = reason or "closed"
    outcome.append(reason or "closed")


async def _exit_code_after(server: Server, timeout_s: float) -> int | None:
    try:
        return await anyio.to_thread.run_sync(lambda: server.process.wait(timeout=timeout_s))
    except Exception:  # subprocess.TimeoutExpired
        return None


async def test_sigterm_with_zero_timeout_ends_streams_with_an_error_event_and_exits_0_within_4s(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--shutdown-timeout", "0", *LONG_ARGS) as server:
        outcomes: list[str] = []
        with anyio.fail_after(30):
            async with server.openai() as client, anyio.create_task_group() as tg:
                firsts = [anyio.Event() for _ in range(4)]
                for i, first in enumerate(firsts):
                    tg.start_soon(_consume, client, f"stream {i}", first, outcomes)
                for first in firsts:
                    await first.wait()
                server.remember_tree()
                t0 = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                code = await _exit_code_after(server, 4.0)
                took = time.monotonic() - t0
        assert code == 0, f"exit {code} after {took:.1f} s\n{server.log()[-3000:]}"
        # An abandoned stream ends with an error event that names the cause, not with finish_reason "abort".
        assert len(outcomes) == 4 and all(o.startswith("error: ") and "shutdown-timeout 0" in o
                                          for o in outcomes), outcomes
        assert not server.wait_gone(), server.log()[-3000:]
        assert "Traceback" not in server.log(), server.log()[-3000:]


async def test_sigterm_with_timeout_drains_in_flight_and_refuses_new(tmp_path: Path) -> None:
    # The deadline is far above the stream's length (1200 tokens: ~2 s on a quiet machine, 5-13 s on a loaded
    # one), so the test shows the drain, not the machine's speed; the stream still outlasts the refusal below.
    with serve(tmp_path, "-dp", "2", "--shutdown-timeout", "60", *LONG_ARGS) as server:
        outcomes: list[str] = []
        refused: list[str] = []
        with anyio.fail_after(90):
            async with server.openai() as client, anyio.create_task_group() as tg:
                first = anyio.Event()
                tg.start_soon(_consume, client, "drain me", first, outcomes, {"max_tokens": 1200})
                await first.wait()
                server.remember_tree()
                t0 = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                # The signal reaches the API processes a moment later: retry until one refuses, while the
                # in-flight stream is still running.
                with anyio.fail_after(3):
                    while not refused and not outcomes:
                        try:
                            async with httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http:
                                r = await http.post("/v1/completions",
                                                    json={"model": MODEL, "prompt": "late", "max_tokens": 1})
                            if r.status_code == 503:
                                refused.append("503")
                        except httpx.ConnectError:
                            refused.append("refused")
                        except httpx.TransportError:  # queued on a listener nobody accepts on: not a refusal
                            pass
                        await anyio.sleep(0.05)
                assert refused, "no new request was refused before the in-flight stream ended"
                assert not outcomes, "the in-flight stream ended before any request was refused"
            code = await _exit_code_after(server, 70.0)
            took = time.monotonic() - t0
        assert outcomes == ["length"], f"{outcomes}\n{server.log()[-3000:]}"
        assert code == 0, f"exit {code} after {took:.1f} s\n{server.log()[-3000:]}"
        assert not server.wait_gone(), server.log()[-3000:]
        assert "Traceback" not in server.log(), server.log()[-3000:]


async def test_sigint_stops_a_single_rank_deployment_cleanly(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) is a graceful stop too, in single mode (one process plus its engine, no coordinator)."""
    with serve(tmp_path, "-dp", "1", "--shutdown-timeout", "0") as server:
        async with server.openai() as client:
            with anyio.fail_after(30):
                r = await client.completions.create(model=MODEL, prompt="before the signal", max_tokens=2)
        assert r.choices[0].finish_reason in ("length", "stop")
        took = await anyio.to_thread.run_sync(lambda: server.stop(timeout_s=4.1, sig=signal.SIGINT))
        assert took < 4.1


async def test_health_during_a_drain_says_the_server_is_shutting_down(tmp_path: Path) -> None:
    # One API process: its listener keeps accepting while it drains, so /health answers during the drain.
    with serve(tmp_path, "--shutdown-timeout", "60", *LONG_ARGS) as server:
        outcomes: list[str] = []
        answers: list[str] = []
        with anyio.fail_after(90):
            async with server.openai() as client, anyio.create_task_group() as tg:
                first = anyio.Event()
                tg.start_soon(_consume, client, "drain me", first, outcomes, {"max_tokens": 1200})
                await first.wait()
                server.remember_tree()
                server.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(5):  # the signal reaches the API process a moment later: poll until then
                    async with httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http:
                        while not answers and not outcomes:
                            r = await http.get("/health")
                            if r.status_code == 503:
                                answers.append(r.json()["error"]["message"])
                            await anyio.sleep(0.05)
            assert await _exit_code_after(server, 70.0) == 0, server.log()[-3000:]
        assert answers == ["The server is shutting down."], f"{answers} {outcomes}\n{server.log()[-3000:]}"
        assert outcomes == ["length"], f"{outcomes}\n{server.log()[-3000:]}"
        assert not server.wait_gone(), server.log()[-3000:]
