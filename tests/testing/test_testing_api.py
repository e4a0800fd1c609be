"""``asyncdp.testing`` is public: every exported name resolves, lazily, without importing the harness early."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import asyncdp.testing


def test_every_name_in_all_resolves():
    for name in asyncdp.testing.__all__:
        assert getattr(asyncdp.testing, name) is not None, name


def test_cluster_harness_names_are_exported():
    cluster = importlib.import_module("asyncdp.testing.cluster")
    for name in ("open_sim_cluster", "SimCluster", "SimRequest", "MemoryLinkListener", "SimRankExecutor"):
        assert getattr(asyncdp.testing, name) is getattr(cluster, name)


def test_importing_the_package_does_not_import_the_harness():
    code = "import sys, asyncdp.testing; print('asyncdp.testing.cluster' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=".")
    assert out.stdout.strip() == "False"


def test_stream_rng_is_seeded_by_seed_and_stream_name():
    a = [asyncdp.testing.stream_rng(3, "workload").random() for _ in range(2)]
    assert a[0] == a[1]
    assert asyncdp.testing.stream_rng(3, "workload").random() != asyncdp.testing.stream_rng(3, "policy/0").random()
    assert asyncdp.testing.stream_rng(3, "workload").random() != asyncdp.testing.stream_rng(4, "workload").random()


def test_a_trio_that_keeps_its_timers_otherwise_is_refused_by_name(monkeypatch):
    """The same-instant timer order patches trio's private deadline heap; a trio whose heap has another shape gets a
    clear refusal before any run, not an AttributeError from inside ``trio.run``."""
    run_module = importlib.import_module("trio._core._run")

    class OtherDeadlines:  # a future trio: its own layout, an add() the patch would not know how to replace
        def __init__(self):
            self.entries = []

        def add(self, deadline, cancel_scope):
            self.entries.append((deadline, cancel_scope))

    monkeypatch.setattr(run_module, "Deadlines", OtherDeadlines)
    original = OtherDeadlines.add
    with pytest.raises(RuntimeError, match=r"keeps its timers differently.*install trio<=0\.35"), \
            asyncdp.testing.timer_ties_in_arming_order():
        pass
    assert OtherDeadlines.add is original  # left as it was
