"""README.md holds exactly two set-up commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_readme_has_two_one_line_setup_commands_for_a_fresh_python_311() -> None:
    commands = setup_commands()
    assert len(commands) == 2, commands
    for command in commands:
        assert "\n" not in command and command.startswith("python3.11 -m venv .venv && ")
        assert "torch==2.13.0" in command  # an unpinned torch pulls a multi-GB CUDA build
    assert "asyncdp serve" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup_commands()[1] in ci
