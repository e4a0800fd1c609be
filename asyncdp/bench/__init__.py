"""The routing benchmark behind ``asyncdp bench routing`` (spec ``routing-bench.md``).

Pure data generation lives here so far: request records and workload files (:mod:`.records`), arrival
processes (:mod:`.arrivals`), tokens, block hashes and the ideal hit rate (:mod:`.materialise`), the ten
workload generators W1-W10 (:mod:`.workloads`) and the Mooncake trace format (:mod:`.trace`). None of these
modules imports anyio or torch.
"""
