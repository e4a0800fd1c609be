"""bench/router_agreement.py: the G6 burst analysis (R routers with no shared state) on a small burst."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench import router_agreement as ra

ROOT = Path(__file__).resolve().parents[2]


def _ns(**kw: int) -> argparse.Namespace:
    base = {"groups": 8, "prompts": 8, "system": 256, "question": 32, "dp": 4, "seed": 1}
    return argparse.Namespace(**{**base, **kw})


def test_one_router_places_every_group_once_and_evenly():
    copies, skew = ra.run(ra.asyncdp, 1, _ns())
    assert copies == 1.0 and skew == 1.0


def test_independent_routers_copy_groups_and_a_consistent_hash_does_not():
    copies4, _ = ra.run(ra.asyncdp, 4, _ns())
    assert copies4 > 1.5  # each router's first request of a group is a miss it places on its own view
    hashed, _ = ra.run(ra.blch(10.0, 10.0), 4, _ns())  # a bound that never binds: pure hashing
    assert hashed == 1.0


def test_routers_asking_the_coordinators_prefix_directory_place_every_group_once_and_evenly():
    for routers in (1, 4, 8):
        copies, skew = ra.run(ra.WithDirectory(), routers, _ns())
        assert copies == 1.0 and skew == 1.0, routers


def test_the_script_prints_the_table():
    out = subprocess.run([sys.executable, "bench/router_agreement.py", "--groups", "8", "--prompts", "4",
                          "--system", "64", "--question", "16", "--dp", "2"], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert "prefills/group" in out and out.count("x asyncdp R=1") == 10
