"""The example router of docs/howto/external-lb.md skips what is not an asyncdp /load answer and refuses
counts that would make it hang or do nothing (its run against real rank servers is in tests/e2e)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "howto" / "external_lb_router.py"
spec = importlib.util.spec_from_file_location("external_lb_router", SCRIPT)
assert spec is not None and spec.loader is not None
router = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = router  # (dataclasses look their module up there)
spec.loader.exec_module(router)

RANK = {"dp_rank": 0, "up": True, "waiting": 1, "running": 2, "inflight": 3, "kv_cache_usage": 0.5}


def test_a_load_answer_of_the_contract_is_kept_and_anything_else_is_skipped() -> None:
    good = {"seq": 4, "ranks": [RANK]}
    assert router.checked_load(good) is good
    for bad in ({"seq": 1}, [1, 2], {"seq": 1, "ranks": [{**RANK, "up": "yes"}]},
                {"seq": 1, "ranks": [{k: v for k, v in RANK.items() if k != "up"}]},
                {"seq": 1, "ranks": [{**RANK, "waiting": "3"}]}, {"seq": "1", "ranks": []}, None):
        with pytest.raises(ValueError):
            router.checked_load(bad)


@pytest.mark.parametrize("flag", ["--concurrency", "--requests", "--max-tokens", "--timeout-s"])
def test_a_count_that_is_not_positive_is_a_usage_error(flag: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "http://127.0.0.1:9", "--model", "m", flag, "0"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and f"{flag} must be > 0" in done.stderr and "Traceback" not in done.stderr


def test_the_how_to_states_the_scripts_length_truly() -> None:
    doc = (SCRIPT.parent / "external-lb.md").read_text()
    claim = re.search(r"\(httpx and anyio, under (\d+) lines\)", doc)
    assert claim is not None, "external-lb.md no longer states the router's length: update this test"
    assert len(SCRIPT.read_text().splitlines()) < int(claim.group(1))
