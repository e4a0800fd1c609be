"""The routes the docs say stay open while a server shuts down are the ones the drain gate lets through.

docs/howto/external-lb.md tells router authors that ``/load`` (and every other route but a few) answers 503 from
the start of a shutdown; that list must be the gate's own (``asyncdp.api.app._ALWAYS_OPEN``), or a router built
on the docs would read a drain wrongly. (tests/api/test_drain_gate.py checks the gate itself.)
"""

from __future__ import annotations

import re
from pathlib import Path

from asyncdp.api.app import _ALWAYS_OPEN

DOC = Path(__file__).resolve().parent.parent / "docs" / "howto" / "external-lb.md"


def test_the_routes_open_during_a_drain_are_the_gates() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())  # the sentence may wrap
    sentence = re.search(r"as every route but (.*?) does", text)
    assert sentence is not None, "external-lb.md no longer says which routes stay open during a drain: update this"
    assert set(re.findall(r"`(/[a-z_]+)`", sentence.group(1))) == set(_ALWAYS_OPEN)
