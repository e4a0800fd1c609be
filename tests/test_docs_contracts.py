"""The JSON documents, the bench flags and the links the docs describe cannot drift from the code.

``/load`` and ``/server_info`` are built by the real builders and every field they return must be named where the
docs list those fields; ``asyncdp bench routing`` and ``asyncdp bench calibrate`` are compared with their flag
tables in docs/reference/cli.md both ways; every relative link between the docs must reach a file and, with a
``#fragment``, a heading of it. (tests/test_docs_cli.py does the same for ``asyncdp serve``.)
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from asyncdp import messages as m
from asyncdp.apiserver.client_config import ClientConfig
from asyncdp.apiserver.load_view import LoadView
from asyncdp.apiserver.server_info import client_server_info
from asyncdp.bench.command import DEFAULT_SCALE, TRACE_BLOCK
from asyncdp.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CLI = DOCS / "reference" / "cli.md"
HTTP = DOCS / "reference" / "http-api.md"


def _cfg(**changes: Any) -> ClientConfig:
    base: dict[str, Any] = dict(client_index=0, client_count=2, managed_ranks=(0, 1), dp_size=2, model_name="m",
                                max_model_len=64, mode="internal", is_moe=True)
    base.update(changes)
    return ClientConfig(**base)


def load_document() -> dict[str, Any]:
    view = LoadView((0, 1))
    view.on_snapshot(m.StatsSnapshot(counts=[(1, 2, 0.5), (0, 1, 0.25)], wave=3, running=True, seq=7), now=1.0)
    return view.document(_cfg(), {0: (True, 1.0), 1: (True, 1.0)}, now=1.5, wave=3, wave_running=True,
                         inflight_of=lambda _rank: 0)


class _Client:
    """What ``client_server_info`` reads of a DP client, with every optional part present."""

    cfg = _cfg()
    processes = [{"role": "coordinator", "host": "h", "pid": 1}]
    nodes: list[dict[str, Any]] = []
    current_wave, wave_running, coordinator_state = 3, True, "alive"

    def engine_states(self) -> dict[int, tuple[bool, float]]:
        return {0: (True, 0.0)}

    def inflight_of(self, dp_rank: int) -> int:
        return 0

    def snapshot_age_s(self) -> float | None:
        return 0.1

    def node_processes(self) -> list[dict[str, Any]] | None:
        return []


def _table_fields(text: str) -> set[str]:
    """Every backticked name in the first cell of the table rows of ``text``."""
    return {name for line in text.splitlines() if line.startswith("| `")
            for name in re.findall(r"`(?:ranks\[\]\.)?([a-z_]+)`", line.split("|")[1])}


def _row(text: str, route: str) -> str:
    line = next((line for line in text.splitlines() if line.startswith(f"| `{route}")), None)
    assert line is not None, f"no table row for {route}"
    return line


def test_every_load_field_is_in_the_external_lb_contract_table():
    doc = load_document()
    text = (DOCS / "howto" / "external-lb.md").read_text(encoding="utf-8")
    section = text[text.index("## The telemetry contract"):text.index("## Rank hints in external mode")]
    table = _table_fields(section)
    for key in doc:
        assert key in table, f"/load field {key} is missing from the table of external-lb.md"
    for key in doc["ranks"][0]:
        assert key in table, f"/load field ranks[].{key} is missing from the table of external-lb.md"
    example = re.search(r"```json\n(.*?)```", section, flags=re.S)
    assert example is not None
    for key in [*doc, *doc["ranks"][0]]:
        assert f'"{key}"' in example.group(1), f"/load field {key} is missing from external-lb.md's example"


def test_every_load_and_server_info_field_is_named_in_the_http_reference():
    text = HTTP.read_text(encoding="utf-8")
    load_row = _row(text, "GET /load")
    doc = load_document()
    for key in [*doc, *doc["ranks"][0]]:
        assert f"`{key}`" in load_row or f"`{key}`/" in load_row or f"/`{key.split('_')[-1]}`" in load_row, \
            f"/load field {key} is not named in the /load row of http-api.md"
    info = client_server_info(_Client())
    info_row = _row(text, "GET /server_info")
    for key in [*info, *info["managed_ranks"][0]]:
        assert f"`{key}`" in info_row, f"/server_info field {key} is not named in the /server_info row of http-api.md"


# ---------------------------------------------------------------- bench flags against their tables

def _help(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def _section(heading: str) -> str:
    text = CLI.read_text(encoding="utf-8")
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start:] if nxt < 0 else text[start:nxt]


@pytest.mark.parametrize("action", ["routing", "calibrate"])
def test_bench_flags_and_their_table_agree_both_ways(monkeypatch, action):
    options = set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", _help(monkeypatch, "bench", action), flags=re.M))
    options.discard("--help")
    assert len(options) > 8
    table = _section(f"## `asyncdp bench {action}`")
    documented = {flag for line in table.splitlines() if line.startswith("| `--")
                  for flag in re.findall(r"`(--[a-z][a-z0-9-]*)`", line.split("|")[1])}
    assert options - documented == set(), f"asyncdp bench {action} flags missing from cli.md"
    assert documented - options == set(), f"cli.md documents flags asyncdp bench {action} does not accept"


def test_bench_routing_defaults_in_the_table_are_the_parsers():
    parser = build_parser()
    ns = parser.parse_args(["bench", "routing", "--workload", "w1"])
    rows = {re.findall(r"`(--[a-z0-9-]+)`", line.split("|")[1])[0]: line.split("|")[2].strip()
            for line in _section("## `asyncdp bench routing`").splitlines() if line.startswith("| `--")}
    # Flags whose parser default is None (to tell "given" from not) document the value the command then uses.
    effective = {"--scale": DEFAULT_SCALE, "--trace-block-size": TRACE_BLOCK}
    checked = 0
    for flag, cell in rows.items():
        if flag == "--workload":  # given above
            continue
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is None:
            value = effective.get(flag)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            assert str(value) in cell, f"{flag}: the parser's default is {value!r}, cli.md says {cell!r}"
            checked += 1
    assert checked >= 9


# ---------------------------------------------------------------- links between the docs

LINKED_DOCS = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("path", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        assert dest.exists(), f"{path.name} links to {target}, which does not exist"
        if fragment and dest.suffix == ".md":
            assert fragment in _anchors(dest), f"{path.name} links to {target}: no such heading in {dest.name}"


# ---------------------------------------------------------------- commands in blocks the command checks read

STEP_DOCS = [DOCS / "tutorial.md", *sorted((DOCS / "howto").glob("*.md"))]


@pytest.mark.parametrize("path", STEP_DOCS, ids=lambda p: p.name)
def test_commands_to_run_are_in_bash_blocks(path):
    """tests/test_docs_cli.py checks the ```bash blocks (the venv's programs, the model the curl asks for); a
    command in an unlabeled block escaped those checks (simulate.md's ``asyncdp bench routing`` lines)."""
    text = path.read_text(encoding="utf-8")
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        if lang != "bash":
            for line in body.splitlines():
                program = line.split()[0] if line.split() else ""
                assert Path(program).name not in ("asyncdp", "python", "python3", "pip", "curl"), \
                    f"{path.name}: `{line.strip()}` is a command in a ```{lang} block: label it ```bash"


# ---------------------------------------------------------------- refused request parameters, per route

def test_every_refused_parameter_is_listed_under_the_routes_that_take_it():
    """A parameter only one route's schema has is marked so (``(…, completions)``, or after "for chat"): the
    list said prompt_embeds for both routes, and chat took it as an unknown field (200)."""
    import msgspec

    from asyncdp.api.params import REFUSED
    from asyncdp.api.schemas import ChatRequest, CompletionRequest

    text = HTTP.read_text(encoding="utf-8")
    para = text[text.index("### Refused parameters"):text.index("### Limits")]
    both_part, _, chat_part = para.partition("and for chat")
    fields = {cls: {f.name for f in msgspec.structs.fields(cls)} for cls in (ChatRequest, CompletionRequest)}
    for name in REFUSED:
        if f"| `{name}` |" in text:  # a row of its own (guided_decoding_backend, with structured outputs)
            continue
        mention = re.search(rf"`{name}`( \([^)]*\))?", para)
        assert mention is not None, f"refused parameter {name} is missing from http-api.md"
        in_chat, in_completions = name in fields[ChatRequest], name in fields[CompletionRequest]
        if in_chat and not in_completions:
            assert f"`{name}`" in chat_part, f"{name} is chat-only: list it after 'and for chat'"
        elif in_completions and not in_chat:
            assert "completions" in (mention.group(1) or ""), f"{name} is completions-only: mark it (completions)"
        else:
            assert f"`{name}`" in both_part, f"{name} is refused on both routes: list it before 'and for chat'"


def test_every_policy_preset_the_docs_name_is_accepted():
    """``--lb-policy name@preset`` spellings in the reference and the how-tos (a preset renamed or dropped in the
    code would leave the docs recommending a command line that exits 2)."""
    from asyncdp.config.flags import LB_POLICIES
    from asyncdp.dp.balance import make_policy

    checked = 0
    for path in [CLI, *sorted((DOCS / "howto").glob("*.md"))]:
        for name in re.findall(r"`([a-z_0-9]+@[a-z_0-9.]+)`", path.read_text(encoding="utf-8")):
            if name.partition("@")[0] in LB_POLICIES:
                make_policy(name)  # raises ConfigError for an unknown preset
                checked += 1
    assert checked >= 10
