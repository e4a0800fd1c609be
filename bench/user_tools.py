"""The tools users point at an OpenAI-compatible server, end to end against ``asyncdp serve``.

Starts ``asyncdp serve builtin:tiny-dense -dp 2`` on a free loopback port, then runs, each in its own venv
outside the repo (see docs/benchmarks.md for the install commands), with local data only:

  lm-eval mc        lm-evaluation-harness ``local-completions``, the multiple-choice (loglikelihood) task of
                    ``bench/tasks/asyncdp_smoke_mc.yaml`` (echo + logprobs + max_tokens 1, prompts as token ids,
                    4 prompts per request); every sample's loglikelihood must be a finite number <= 0
  lm-eval gen       ``local-completions``, the ``generate_until`` task of ``bench/tasks/asyncdp_smoke_gen.yaml``
  lm-eval chat      ``local-chat-completions`` with the chat template, the same ``generate_until`` task
  guidellm compl    guidellm, streamed ``/v1/completions``, synthetic prompts, the model's own tokenizer
  guidellm chat     guidellm, streamed ``/v1/chat/completions``

A run passes when the tool exits 0, reports every request successful and logs no failed API request. The random
tiny model makes accuracy meaningless: the numbers show the tools ran, not quality. Afterwards the server must
still have nothing in flight. Every failed request the tools logged (status and error body) is collected into the
JSON, so a failure names the parameter the server refused. Prints a progress line per run and a table; writes
``bench/results/user_tools.json``. Every run is bounded (request counts and a timeout per run).

    python bench/user_tools.py                       # all runs
    python bench/user_tools.py --only lm-eval        # runs whose name starts with "lm-eval"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL = "builtin:tiny-dense"
MAX_MODEL_LEN = 512
TOOLS_DIR = Path(os.environ.get("ASYNCDP_TOOLS_DIR", "/work/tools"))


@dataclass
class Run:
    name: str
    tool: str
    passed: bool = False
    seconds: float = 0.0
    requests: int = 0
    headline: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    log: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def asyncdp_server(log_path: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """``asyncdp serve builtin:tiny-dense -dp 2`` (two API servers) on a free loopback port; SIGTERM at the end."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "asyncdp", "serve", MODEL, "-dp", "2", "--host", "127.0.0.1", "--port", str(port),
           "--executor", "torch", "--torch-threads", "1", "--max-model-len", str(MAX_MODEL_LEN)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=ROOT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            try:  # the poll interval, ending early if the server died
                raise RuntimeError(f"asyncdp serve exited with {proc.wait(timeout=0.2)} before ready; see {log_path}")
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"asyncdp serve was not ready in {timeout_s} s; see {log_path}") from None
        yield base_url
    finally:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its children in order
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def inflight(base_url: str) -> float:
    """``asyncdp:dp_inflight_requests`` summed over engines, as one API process reports it."""
    text = httpx.get(f"{base_url}/metrics", timeout=5.0, headers={"Connection": "close"}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("asyncdp:dp_inflight_requests{"))


def tool_env(home: Path) -> dict[str, str]:
    """The tools' environment: offline hub and datasets, a private cache, none of this repo on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(home / "hf"),
               NO_COLOR="1", OPENAI_API_KEY="x", TOKENIZERS_PARALLELISM="false")
    return env


def execute(run: Run, cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int | None:
    """Run one tool command with its output in ``log_path``; the exit code, or None after ``timeout_s``."""
    run.log = str(log_path)
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=ROOT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            run.failures.append(f"timed out after {timeout_s} s")
            return None


_LMEVAL_FAILED = re.compile(r"API request failed! Status code: (\d+), Response text: (.*?)\. Retrying")


def lm_eval(name: str, base_url: str, tokenizer: Path, work: Path, timeout_s: float, *, chat: bool) -> Run:
    run = Run(name, "lm-eval")
    task = "asyncdp_smoke_gen" if chat or name.endswith("gen") else "asyncdp_smoke_mc"
    out = work / name.replace(" ", "_")
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    model_args = (f"model={MODEL},base_url={base_url}{endpoint},tokenizer_backend=huggingface,"
                  f"tokenizer={tokenizer},num_concurrent=2,max_retries=1,timeout=60,max_length={MAX_MODEL_LEN}")
    cmd = [str(TOOLS_DIR / "lmeval/bin/lm-eval"), "run", "--model",
           "local-chat-completions" if chat else "local-completions", "--model_args", model_args,
           "--tasks", task, "--include_path", str(ROOT / "bench/tasks"), "--output_path", str(out),
           "--log_samples", "--seed", "0"]
    cmd += ["--apply_chat_template"] if chat else []
    cmd += ["--batch_size", "4"] if task == "asyncdp_smoke_mc" else []
    code = execute(run, cmd, tool_env(work), work / f"{out.name}.log", timeout_s)
    text = Path(run.log).read_text(errors="replace")
    run.failures += sorted({f"{status} {body[:300]}" for status, body in _LMEVAL_FAILED.findall(text)})
    if code not in (0, None):
        run.failures.append(f"exit code {code}: {text.strip().splitlines()[-1][:300] if text.strip() else ''}")
    results = sorted(out.rglob("results_*.json"))
    samples = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    if code == 0 and results:
        metrics = json.loads(results[-1].read_text())["results"][task]
        run.headline = {k.split(",")[0]: v for k, v in metrics.items() if isinstance(v, int | float)}
        rows = [json.loads(line) for s in samples for line in s.read_text().splitlines() if line.strip()]
        run.requests = sum(len(r.get("resps", [])) for r in rows)
        if task == "asyncdp_smoke_mc":
            lls = [resp[0] for r in rows for resp in r.get("filtered_resps", [])]
            bad = [ll for ll in lls if not (isinstance(ll, int | float) and math.isfinite(ll) and ll <= 0)]
            run.headline["mean_loglikelihood"] = sum(lls) / len(lls) if lls and not bad else float("nan")
            if bad or not lls:
                run.failures.append(f"loglikelihoods not finite and <= 0: {bad[:5] or 'none'}")
    elif code == 0:
        run.failures.append("no results file")
    run.passed = code == 0 and not run.failures
    return run


def guidellm(name: str, base_url: str, tokenizer: Path, work: Path, timeout_s: float, *, endpoint: str,
             requests: int) -> Run:
    run = Run(name, "guidellm")
    out = work / f"{name.replace(' ', '_')}.json"
    cmd = [str(TOOLS_DIR / "guidellm/bin/guidellm"), "run",
           "--backend", f"kind=openai_http,target={base_url},model={MODEL},request_format={endpoint},timeout=60",
           "--profile", "kind=concurrent,streams=4",
           "--constraint", f"kind=max_requests,count={requests}",
           "--constraint", f"kind=max_duration,seconds={int(timeout_s * 0.6)}",
           "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
           "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=32",
           "--output", f"kind=json,path={out}", "--disable-progress"]
    code = execute(run, cmd, tool_env(work), work / f"{out.stem}.log", timeout_s)
    if code not in (0, None):
        tail = Path(run.log).read_text(errors="replace").strip().splitlines()
        run.failures.append(f"exit code {code}: {tail[-1][:300] if tail else ''}")
    if code == 0 and out.exists():
        bench = json.loads(out.read_text())["benchmarks"][0]
        metrics = bench["metrics"]
        totals = metrics["request_totals"]
        run.requests = totals["total"]

        def mean(key: str) -> float:
            return metrics[key]["successful"]["mean"]

        run.headline = {"successful": totals["successful"], "errored": totals["errored"],
                        "incomplete": totals["incomplete"], "req_per_s": mean("requests_per_second"),
                        "out_tok_per_s": mean("output_tokens_per_second"),
                        "ttft_ms": mean("time_to_first_token_ms"), "itl_ms": mean("inter_token_latency_ms")}
        errored = (bench.get("requests") or {}).get("errored") or []
        run.failures += sorted({str(r.get("info", {}).get("error") or r.get("error") or r)[:300] for r in errored})
        if totals["errored"] or totals["incomplete"] or totals["successful"] != requests:
            run.failures.append(f"{totals['successful']} of {requests} requests successful "
                                f"({totals['errored']} errored, {totals['incomplete']} incomplete)")
    elif code == 0:
        run.failures.append("no benchmark JSON")
    run.passed = code == 0 and not run.failures
    return run


def plan(base_url: str, tokenizer: Path, work: Path, timeout_s: float, requests: int) -> list[tuple[str, Callable[[], Run]]]:
    return [
        ("lm-eval mc", lambda: lm_eval("lm-eval mc", base_url, tokenizer, work, timeout_s, chat=False)),
        ("lm-eval gen", lambda: lm_eval("lm-eval gen", base_url, tokenizer, work, timeout_s, chat=False)),
        ("lm-eval chat", lambda: lm_eval("lm-eval chat", base_url, tokenizer, work, timeout_s, chat=True)),
        ("guidellm compl", lambda: guidellm("guidellm compl", base_url, tokenizer, work, timeout_s,
                                            endpoint="/v1/completions", requests=requests)),
        ("guidellm chat", lambda: guidellm("guidellm chat", base_url, tokenizer, work, timeout_s,
                                           endpoint="/v1/chat/completions", requests=requests)),
    ]


def table(runs: list[Run]) -> str:
    lines = ["| run | result | s | requests | headline numbers |", "|---|---|---|---|---|"]
    for r in runs:
        nums = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.headline.items())
        lines.append(f"| {r.name} | {'PASS' if r.passed else 'FAIL'} | {r.seconds:.1f} | {r.requests} | {nums} |")
    for r in runs:
        for f in r.failures:
            lines.append(f"  {r.name}: {f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run only the runs whose name starts with this")
    parser.add_argument("--requests", type=int, default=24, help="requests per guidellm run")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="limit per tool run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/user_tools.json")
    args = parser.parse_args()
    missing = [t for t in ("lmeval/bin/lm-eval", "guidellm/bin/guidellm") if not (TOOLS_DIR / t).exists()]
    if missing:
        print(f"missing tool venvs under {TOOLS_DIR}: {missing}; see docs/benchmarks.md", file=sys.stderr)

    sys.path.insert(0, str(ROOT))
    from asyncdp.model import resolve_model

    tokenizer = resolve_model(MODEL)  # the built-in checkpoint directory, tokenizer files included
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="asyncdp-user-tools-") as tmp:
        work = Path(tmp)
        with asyncdp_server(work / "asyncdp.log") as base_url:
            todo = [(n, f) for n, f in plan(base_url, tokenizer, work, args.timeout_s, args.requests)
                    if n.startswith(args.only)]
            for i, (name, start) in enumerate(todo, 1):
                print(f"[{i}/{len(todo)}] {name} ...", end=" ", flush=True)
                t0 = time.monotonic()
                run = start()
                run.seconds = time.monotonic() - t0
                print(f"{'PASS' if run.passed else 'FAIL'} in {run.seconds:.1f} s", flush=True)
                runs.append(run)
            left = inflight(base_url)
            server_log = (work / "asyncdp.log").read_text(errors="replace")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for r in runs:  # keep the tools' logs beside the JSON: the temporary folder goes
            if r.log:
                kept = args.out.parent / f"user_tools-{Path(r.log).name}"
                kept.write_text(Path(r.log).read_text(errors="replace"))
                r.log = str(kept)
        (args.out.parent / "user_tools-asyncdp.log").write_text(server_log)
    tracebacks = server_log.count("Traceback")
    report = {"model": MODEL, "dp": 2, "inflight_after": left, "server_tracebacks": tracebacks,
              "runs": [asdict(r) for r in runs]}
    args.out.write_text(json.dumps(report, indent=2))
    print(table(runs))
    print(f"in flight after the runs: {left:g}; tracebacks in the server log: {tracebacks}; JSON: {args.out}")
    return 0 if runs and all(r.passed for r in runs) and left == 0 and tracebacks == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
