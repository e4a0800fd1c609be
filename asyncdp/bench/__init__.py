"""The routing benchmark behind ``asyncdp bench routing`` and ``asyncdp bench calibrate`` (spec ``routing-bench.md``).

Data (no anyio, no torch): request records and workload files (:mod:`.records`), arrival processes
(:mod:`.arrivals`), tokens, block hashes and the ideal hit rate (:mod:`.materialise`), the ten workload generators
W1-W10 (:mod:`.workloads`) and the Mooncake trace format (:mod:`.trace`).

Runs: :mod:`.simulate` drives one (workload, policy, seed) through the production code of
:func:`asyncdp.testing.open_sim_cluster` (coordinator, rank loops, schedulers, block managers and the real DP
clients with the policy under test) under trio's ``MockClock``, with a cost profile of :mod:`.profiles` in place
of the model; :mod:`.metrics` computes spec §6 from the per-request event log at the client; :mod:`.report`
prints the tables, the ratios to ``vllm`` and the gates G1-G4, :mod:`.pathology` the §8 detectors (G5),
:mod:`.decision_time` times ``select`` (G7); :mod:`.plots` draws the PNGs and writes the CSV; :mod:`.command` is
the command line.

Calibration: :mod:`.sweep` times the real engine's steps through the §5 batch sweep, :mod:`.fit` fits the cost
profile (pure least squares), :mod:`.calibrate` is ``asyncdp bench calibrate``.
"""
