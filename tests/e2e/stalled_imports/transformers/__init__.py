"""A stand-in for transformers (see ``tests/e2e/stalled_imports/_asyncdp_stall.py``)."""

from _asyncdp_stall import stand_in

stand_in(__name__)
