"""The tools users point at an OpenAI-compatible server, end to end against ``asyncdp serve``.

Starts ``asyncdp serve builtin:tiny-dense -dp 2 --enable-tokenizer-info-endpoint`` on a free loopback port, then
runs, each tool in its own venv outside the repo (see docs/benchmarks.md for the install commands), with local data
only:

  lm-eval mc         lm-evaluation-harness ``local-completions``, the multiple-choice (loglikelihood) task of
                     ``bench/tasks/asyncdp_smoke_mc.yaml`` (echo + logprobs + max_tokens 1, prompts as token ids,
                     4 prompts per request), the model's tokenizer loaded locally
  lm-eval gen        ``local-completions``, the ``generate_until`` task of ``bench/tasks/asyncdp_smoke_gen.yaml``
  lm-eval chat       ``local-chat-completions`` with the chat template, the same ``generate_until`` task
  lm-eval remote-tok the mc task with lm-eval's remote tokenizer (``GET /tokenizer_info``, which the server serves
                     with ``--enable-tokenizer-info-endpoint``, and ``POST /tokenize``), what
                     ``tokenizer_backend=auto`` picks when the server offers it; with ``lm-eval mc`` run too, its
                     loglikelihoods must equal that run's within 1e-3
  lm-eval hf-ref     no server: lm-eval's ``hf`` model on the same checkpoint (transformers, float32, CPU); the
                     server's loglikelihoods must equal it within 1e-3 and its greedy generations must be identical
  guidellm compl     guidellm, streamed ``/v1/completions``, synthetic prompts, the model's own tokenizer
  guidellm chat      guidellm, streamed ``/v1/chat/completions``

A run passes when the tool exits 0, reports every request successful and logs no failed API request. The random
tiny model makes accuracy meaningless; comparing with transformers on the same weights is what makes the numbers
mean something. Afterwards nothing may be in flight and the server log must hold no traceback. Every failed
request is collected with its status and error body (guidellm does not log bodies: its request is replayed once to
read the server's answer), so a failure names the parameter the server refused. Prints a progress line per run and
a table; writes ``bench/results/user_tools.json`` and keeps the tools' outputs and logs in
``bench/results/user_tools/``. Every run is bounded (request counts, and a timeout per run).

    python bench/user_tools.py                       # all runs, 5-8 min on 2 cores
    python bench/user_tools.py --only lm-eval        # runs whose name starts with "lm-eval"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from bench.serving import asyncdp_serve, check_output, positive_float, positive_int  # noqa: E402

MODEL = "builtin:tiny-dense"
MAX_MODEL_LEN = 512
TOOLS_DIR = Path(os.environ.get("ASYNCDP_TOOLS_DIR", "/work/tools"))
#: each tool's venv under TOOLS_DIR, its executable there and what installs it (docs/benchmarks.md, "User tools");
#: a run needs the tool its name starts with
TOOLS = {"lm-eval": ("lmeval", "lm-eval", "'lm-eval[api,hf]' transformers"),
         "guidellm": ("guidellm", "guidellm", "guidellm")}


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


@contextmanager
def asyncdp_server(log_path: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """``asyncdp serve builtin:tiny-dense -dp 2`` (two API servers) with ``/tokenizer_info`` on a free loopback
    port; SIGTERM at the end."""
    with open(log_path, "wb") as log:
        try:
            with asyncdp_serve(MODEL, "-dp", "2", "--executor", "torch", "--torch-threads", "1", "--max-model-len",
                               str(MAX_MODEL_LEN), "--enable-tokenizer-info-endpoint", log=log,
                               env={"OMP_NUM_THREADS": "1"},
                               timeout_s=timeout_s) as (base_url, _):
                yield base_url
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {log_path}") from None


def inflight(base_url: str) -> float:
    """``asyncdp:dp_inflight_requests`` summed over engines, as one API process reports it."""
    text = httpx.get(f"{base_url}/metrics", timeout=5.0, headers={"Connection": "close"}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("asyncdp:dp_inflight_requests{"))


def tool_path(tool: str) -> Path:
    venv, exe, _ = TOOLS[tool]
    return TOOLS_DIR / venv / "bin" / exe


def missing_tools(runs: list[str]) -> str | None:
    """None if every tool ``runs`` need is installed, else what is missing and how to install it."""
    missing = [tool for tool in TOOLS if any(r.startswith(tool + " ") for r in runs) and not tool_path(tool).exists()]
    if not missing:
        return None
    lines = [f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: no "
             f"{' and no '.join(str(tool_path(t)) for t in missing)} "
             f"(ASYNCDP_TOOLS_DIR={TOOLS_DIR}). Each tool has its own venv outside the repo (docs/benchmarks.md, "
             "\"User tools\"); install with:"]
    for tool in missing:
        venv, _, packages = TOOLS[tool]
        lines += [f"  python3.11 -m venv {TOOLS_DIR / venv}",
                  f"  {TOOLS_DIR / venv}/bin/pip install torch==2.13.0 {packages}"]
    lines.append("or set ASYNCDP_TOOLS_DIR to where they are, or pick the runs of the installed tools with --only.")
    return "\n".join(lines)


def run_names() -> list[str]:
    """The runs' names in order (:func:`plan` only builds closures: nothing starts here)."""
    return [name for name, _ in plan("", Path(), Path(), 0.0, 0)]


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
MC, GEN = "asyncdp_smoke_mc", "asyncdp_smoke_gen"


def samples(out: Path, task: str) -> list[dict]:
    """lm-eval's logged samples of ``task`` under ``out``, by document."""
    rows = [json.loads(line) for f in sorted(out.rglob(f"samples_{task}_*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["doc_id"])


def loglikelihoods(rows: list[dict]) -> list[float]:
    return [float(resp[0]) for r in rows for resp in r["filtered_resps"]]  # logged as strings


def lm_eval(name: str, work: Path, timeout_s: float, tasks: tuple[str, ...], model: str, model_args: str,
            extra: tuple[str, ...] = ()) -> Run:
    run = Run(name, "lm-eval")
    out = work / name.replace(" ", "_")
    cmd = [str(tool_path("lm-eval")), "run", "--model", model, "--model_args", model_args,
           "--tasks", ",".join(tasks), "--include_path", str(ROOT / "bench/tasks"), "--output_path", str(out),
           "--log_samples", "--seed", "0", *extra]
    code = execute(run, cmd, tool_env(work), work / f"{out.name}.log", timeout_s)
    text = Path(run.log).read_text(errors="replace")
    run.failures += sorted({f"{status} {body[:300]}" for status, body in _LMEVAL_FAILED.findall(text)})
    if code not in (0, None):
        run.failures.append(f"exit code {code}: {text.strip().splitlines()[-1][:300] if text.strip() else ''}")
    results = sorted(out.rglob("results_*.json"))
    if code == 0 and results:
        metrics = json.loads(results[-1].read_text())["results"]
        for task in tasks:
            short = task.removeprefix("asyncdp_smoke_")
            run.headline.update({f"{short} {k.split(',')[0]}": v for k, v in metrics[task].items()
                                 if isinstance(v, int | float) and not k.startswith(("sample_len", "alias"))})
            rows = samples(out, task)
            run.requests += sum(len(r.get("resps", [])) for r in rows)
            if task == MC:
                lls = loglikelihoods(rows)
                bad = [ll for ll in lls if not (math.isfinite(ll) and ll <= 0)]
                if bad or not lls:
                    run.failures.append(f"loglikelihoods not finite and <= 0: {bad[:5] or 'none'}")
                else:
                    run.headline["mean loglikelihood"] = sum(lls) / len(lls)
    elif code == 0:
        run.failures.append("no results file")
    run.passed = code == 0 and not run.failures
    return run


def server_args(base_url: str, endpoint: str, tokenizer: Path | None) -> str:
    tok = f"tokenizer_backend=huggingface,tokenizer={tokenizer}" if tokenizer else "tokenizer_backend=remote"
    return (f"model={MODEL},base_url={base_url}{endpoint},{tok},num_concurrent=2,max_retries=1,timeout=60,"
            f"max_length={MAX_MODEL_LEN}")


def compare_with_reference(ref: Run, work: Path) -> None:
    """The server's loglikelihoods and greedy generations against transformers' on the same checkpoint."""
    if not ref.passed:
        return
    ref_out = work / ref.name.replace(" ", "_")
    for server_run, task in (("lm-eval_mc", MC), ("lm-eval_gen", GEN)):
        got, want = samples(work / server_run, task), samples(ref_out, task)
        if not got:
            ref.failures.append(f"{server_run}: no samples to compare")
            continue
        if task == MC:
            diffs = [abs(a - b) for a, b in zip(loglikelihoods(got), loglikelihoods(want), strict=True)]
            ref.headline["max |loglikelihood - hf|"] = max(diffs)
            if max(diffs) > 1e-3:
                ref.failures.append(f"loglikelihoods differ from transformers by up to {max(diffs):.3g}")
        else:
            texts = [(r["filtered_resps"], w["filtered_resps"]) for r, w in zip(got, want, strict=True)]
            same = sum(a == b for a, b in texts)
            ref.headline["greedy outputs = hf"] = same / len(texts)
            if same != len(texts):
                ref.failures.append(f"greedy generations differ from transformers: {texts}")
    ref.passed = not ref.failures


def compare_with_mc(remote: Run, work: Path) -> None:
    """The remote tokenizer's loglikelihoods against the ``lm-eval mc`` run's (the tokenizer loaded locally), when
    that run ran: the server's /tokenize must give lm-eval the same tokens."""
    want = samples(work / "lm-eval_mc", MC)
    if not remote.passed or not want:
        return
    diffs = [abs(a - b) for a, b in zip(loglikelihoods(samples(work / "lm-eval_remote-tok", MC)),
                                        loglikelihoods(want), strict=True)]
    remote.headline["max |loglikelihood - mc|"] = max(diffs)
    if max(diffs) > 1e-3:
        remote.failures.append(f"loglikelihoods differ from lm-eval mc's by up to {max(diffs):.3g}")
    remote.passed = not remote.failures


# What guidellm 0.8 sends (its request handlers), replayed once to read the error body it does not log.
GUIDELLM_BODY = {"/v1/completions": {"prompt": "hello", "max_tokens": 4},
                 "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello"}],
                                          "max_completion_tokens": 4}}


def replay_guidellm(base_url: str, endpoint: str) -> str:
    body = {"model": MODEL, **GUIDELLM_BODY[endpoint], "stream": True, "stop": None, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    r = httpx.post(f"{base_url}{endpoint}", json=body, timeout=30.0)
    return f"replayed {json.dumps(body)}: {r.status_code} {r.text[:300] if r.status_code >= 400 else 'ok'}"


def guidellm(name: str, base_url: str, tokenizer: Path, work: Path, timeout_s: float, *, endpoint: str,
             requests: int) -> Run:
    run = Run(name, "guidellm")
    out = work / f"{name.replace(' ', '_')}.json"
    cmd = [str(tool_path("guidellm")), "run",
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
                        "incomplete": totals["incomplete"], "req/s": mean("requests_per_second"),
                        "out tok/s": mean("output_tokens_per_second"),
                        "TTFT ms": mean("time_to_first_token_ms"), "ITL ms": mean("inter_token_latency_ms")}
        errored = (bench.get("requests") or {}).get("errored") or []
        run.failures += sorted({str(r.get("info", {}).get("error") or r.get("error") or r)[:200] for r in errored})
        if totals["errored"] or totals["incomplete"] or totals["successful"] != requests:
            run.failures.append(f"{totals['successful']} of {requests} requests successful "
                                f"({totals['errored']} errored, {totals['incomplete']} incomplete)")
            if totals["errored"]:
                run.failures.append(replay_guidellm(base_url, endpoint))
    elif code == 0:
        run.failures.append("no benchmark JSON")
    run.passed = code == 0 and not run.failures
    return run


def plan(base_url: str, tokenizer: Path, work: Path, timeout_s: float, requests: int) -> list[tuple[str, Callable[[], Run]]]:
    completions, chat = "/v1/completions", "/v1/chat/completions"

    def remote() -> Run:
        run = lm_eval("lm-eval remote-tok", work, timeout_s, (MC,), "local-completions",
                      server_args(base_url, completions, None), ("--batch_size", "4"))
        compare_with_mc(run, work)
        return run

    def reference() -> Run:
        run = lm_eval("lm-eval hf-ref", work, timeout_s, (MC, GEN), "hf",
                      f"pretrained={tokenizer},dtype=float32", ("--device", "cpu", "--batch_size", "4"))
        compare_with_reference(run, work)
        return run

    return [
        ("lm-eval mc", lambda: lm_eval("lm-eval mc", work, timeout_s, (MC,), "local-completions",
                                       server_args(base_url, completions, tokenizer), ("--batch_size", "4"))),
        ("lm-eval gen", lambda: lm_eval("lm-eval gen", work, timeout_s, (GEN,), "local-completions",
                                        server_args(base_url, completions, tokenizer))),
        ("lm-eval chat", lambda: lm_eval("lm-eval chat", work, timeout_s, (GEN,), "local-chat-completions",
                                         server_args(base_url, chat, tokenizer), ("--apply_chat_template",))),
        ("lm-eval remote-tok", remote),
        ("lm-eval hf-ref", reference),
        ("guidellm compl", lambda: guidellm("guidellm compl", base_url, tokenizer, work, timeout_s,
                                            endpoint=completions, requests=requests)),
        ("guidellm chat", lambda: guidellm("guidellm chat", base_url, tokenizer, work, timeout_s,
                                           endpoint=chat, requests=requests)),
    ]


def table(runs: list[Run]) -> str:
    lines = ["| run | result | s | requests | headline numbers |", "|---|---|---|---|---|"]
    for r in runs:
        nums = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.headline.items())
        result = "PASS" if r.passed else "FAIL"
        lines.append(f"| {r.name} | {result} | {r.seconds:.1f} | {r.requests} | {nums} |")
    for r in runs:
        for f in r.failures:
            lines.append(f"  {r.name}: {f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run only the runs whose name starts with this")
    parser.add_argument("--requests", type=positive_int, default=24, help="requests per guidellm run")
    parser.add_argument("--timeout-s", type=positive_float, default=240.0, help="limit per tool run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/user_tools.json")
    args = parser.parse_args()
    # Before the server starts: a bad argument or a missing tool is one message and exit 2, not a traceback.
    selected = [name for name in run_names() if name.startswith(args.only)]
    if not selected:
        parser.error(f"--only {args.only!r} matches no run; the runs: {', '.join(run_names())}")
    check_output(parser, "--out", args.out)
    if (missing := missing_tools(selected)) is not None:
        parser.exit(2, f"{parser.prog}: error: {missing}\n")

    from asyncdp.model import resolve_model

    tokenizer = resolve_model(MODEL)  # the built-in checkpoint directory, tokenizer files included
    work = args.out.parent / "user_tools"  # the tools' outputs and logs, kept for inspection
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    runs: list[Run] = []
    with asyncdp_server(work / "asyncdp.log") as base_url:
        todo = [(n, f) for n, f in plan(base_url, tokenizer, work, args.timeout_s, args.requests) if n in selected]
        for i, (name, start) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {name} ...", end=" ", flush=True)
            t0 = time.monotonic()
            run = start()
            run.seconds = time.monotonic() - t0
            print(f"{'PASS' if run.passed else 'FAIL'} in {run.seconds:.1f} s", flush=True)
            runs.append(run)
        left = inflight(base_url)
    tracebacks = (work / "asyncdp.log").read_text(errors="replace").count("Traceback")
    report = {"model": MODEL, "dp": 2, "inflight_after": left, "server_tracebacks": tracebacks,
              "server_log": str(work / "asyncdp.log"), "runs": [asdict(r) for r in runs]}
    args.out.write_text(json.dumps(report, indent=2))
    print(table(runs))
    print(f"in flight after the runs: {left:g}; tracebacks in the server log: {tracebacks}; JSON: {args.out}")
    ok = runs and all(r.passed for r in runs) and left == 0 and tracebacks == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
