"""schemathesis against ``GET /openapi.json`` of a live ``asyncdp serve builtin:tiny-dense -dp 2`` (issue 12).

The ``schemathesis run`` CLI runs in a subprocess against the server's own document: its examples, coverage
(boundary values of every field, valid and invalid) and fuzzing phases, positive and negative data, a bounded
number of examples per operation, one worker, a fixed seed and a time budget. The checks are the ones that
hold for any OpenAI-compatible server whatever it generates: no 5xx, every status and content type documented,
every response matching its documented schema (errors have OpenAI's shape), and every schema-invalid request
refused (nothing is accepted and ignored). The control routes
(``/pause``, ``/resume``, tagged ``control``) are left out: pausing would stall the rest of the run. Afterwards
the deployment still serves, nothing is left in flight and every API process is attached to the coordinator;
the fixture's teardown asserts a clean exit and no traceback in the log.

The module runs twice: against a server without flags (every route), and against one with the output parsers
(``--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3``), on the chat route only and
with a smaller budget, where every answer passes through them (the reasoning split, tools with ``tool_choice``
"auto", a constraint that starts after ``</think>``) and must match the document's ``message.reasoning``,
``content: null``, ``tool_calls`` and ``delta`` schemas.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, Server, serve
from tests.e2e.hostile_cases import PARSER_FLAGS
from tests.e2e.hostile_checks import settle_problems

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MAX_EXAMPLES = 25  # per operation and phase
MAX_TIME_S = 30  # one pass of both phases takes ~13 s here; fuzzing repeats until the budget is spent
PARSERS_MAX_TIME_S = 12  # chat only: one pass of both phases takes ~3 s
MAX_MODEL_LEN = 64
# positive_data_acceptance is left out: rules across fields (prompt plus max_tokens within max_model_len, token ids
# in the vocabulary, best_of >= n) are stated in descriptions, not schemas, so schema-valid data may be a 400.
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "negative_data_rejection")


def schemathesis_cli() -> list[str]:
    """The CLI of the venv running the tests (or on PATH): ``python -m schemathesis.cli`` has no stable name."""
    beside = Path(sys.executable).with_name("schemathesis")
    found = str(beside) if beside.exists() else shutil.which("schemathesis")
    if found is None:
        pytest.fail("schemathesis is not installed: pip install -e '.[test]'")
    return [found]


@dataclass(frozen=True)
class Config:
    """One deployment the module runs against: its extra flags, the paths schemathesis tests, its time budget."""

    flags: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()  # empty: every route but the control ones
    max_time_s: int = MAX_TIME_S


CONFIGS = {
    "plain": Config(),
    "parsers": Config(PARSER_FLAGS, ("/v1/chat/completions",), PARSERS_MAX_TIME_S),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def config(request: pytest.FixtureRequest) -> Config:
    return CONFIGS[request.param]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, config: Config) -> Iterator[Server]:
    # A short --max-model-len bounds the generated requests that leave max_tokens unset (up to the whole context).
    with serve(tmp_path_factory.mktemp("schemathesis"), "-dp", "2", "--api-server-count", "2",
               "--max-model-len", str(MAX_MODEL_LEN), *config.flags) as s:
        yield s


async def test_the_openapi_document_is_served_and_names_the_generation_routes(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
        r = await http.get("/openapi.json")
    assert r.status_code == 200, r.text[:500]
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize"):
        assert path in doc["paths"], sorted(doc["paths"])


async def test_schemathesis_finds_no_server_error_and_no_undocumented_response(
        server: Server, config: Config, tmp_path: Path) -> None:
    report = tmp_path / "report"
    cmd = [*schemathesis_cli(), "run", f"{server.base_url}/openapi.json",
           "--checks", ",".join(CHECKS), "--mode", "all", "--phases", "examples,coverage,fuzzing",
           "--max-examples", str(MAX_EXAMPLES), "--max-time", str(config.max_time_s), "--workers", "1",
           "--seed", "12", "--request-timeout", "30", "--generation-database", "none",
           "--exclude-tag", "control", "--suppress-health-check", "all", "--no-color",
           "--report", "junit", "--report-dir", str(report), *(f"--include-path={p}" for p in config.paths)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
    with anyio.fail_after(3 * MAX_TIME_S):  # (the same for a smaller budget: the startup is the same)  # the CLI's own budget, plus startup and the last requests
        # In tmp_path: the CLI keeps a cache folder (.schemathesis/) in its working directory.
        proc = await anyio.run_process(cmd, check=False, env=env, stderr=subprocess.STDOUT, cwd=tmp_path)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"schemathesis exited {proc.returncode}:\n{out[-12000:]}"

    with anyio.fail_after(30):
        async with server.openai() as client:
            r = await client.completions.create(model=MODEL, prompt="after schemathesis", max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert not await settle_problems(server)
