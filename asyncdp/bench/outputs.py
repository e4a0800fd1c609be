"""What ``asyncdp bench routing`` writes besides its tables: ``--export-trace`` before the runs, and ``--json``,
``--csv`` and ``--plots`` after them, each file whole or not at all (:func:`~asyncdp.bench.files.write`; the
paths were checked before the first run, :func:`~asyncdp.bench.guards.check_outputs`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["export_trace", "write_outputs"]


def export_trace(path: str, label: str, resolved: Any, dp_size: int, block_size: int) -> None:
    """``--export-trace``: the workload with the send times its runs use (R_sat, ``--rate-scale`` and the replay
    speed applied), so that ``--trace`` of the file at the same ``--dp`` replays the same requests at the same
    times; one line on stderr, naming the workload by ``label``, says how."""
    from asyncdp.bench.files import write
    from asyncdp.bench.trace import MOONCAKE_BLOCK, encode_trace

    write("--export-trace", Path(path), encode_trace(resolved, block_size))
    size = f" --trace-block-size {block_size}" if block_size != MOONCAKE_BLOCK else ""
    print(f"asyncdp bench: wrote {label} seed {resolved.seed} ({len(resolved.records)} requests) to {path}; "
          f"replay it with --trace {path} --dp {dp_size}{size}", file=sys.stderr)


def write_outputs(ns: argparse.Namespace, doc: str, runs: list[dict[str, Any]], robust: list[dict[str, Any]],
                  plots: Callable[[], list[Path]]) -> int:
    """Write ``--json`` (``doc``), ``--csv`` and ``--plots``; 0, or 1 with one line per file that failed, the
    JSON and CSV then kept in the temporary folder (:func:`~asyncdp.bench.files.keep`): the paths were checked
    before the runs, so this is a disk that filled, ``/dev/full`` and the like."""
    from asyncdp.bench.files import WriteFailed, keep, write

    def csv(path: Path) -> None:
        from asyncdp.bench.plots import write_csv  # (only with --csv)

        write_csv(path, runs, robust)

    status = 0
    outputs: list[tuple[str, str | None, Any, str]] = [("--json", ns.json, doc, ".json"), ("--csv", ns.csv, csv, ".csv")]
    for flag, value, fill, suffix in outputs:
        if not value:
            continue
        try:
            write(flag, Path(value), fill)
        except WriteFailed as exc:
            kept = keep(fill, suffix)
            print(f"asyncdp bench: error: {exc}" + (f"; the results are in {kept}" if kept else ""), file=sys.stderr)
            status = 1
    if ns.plots:
        try:
            written = plots()
        except WriteFailed as exc:  # (each PNG is written whole or not at all, as the other files)
            print(f"asyncdp bench: error: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"asyncdp bench: error: cannot write --plots {ns.plots}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"asyncdp bench: {len(written)} plots written to {ns.plots}", file=sys.stderr)
    return status
