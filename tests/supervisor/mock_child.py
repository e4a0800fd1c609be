"""A stand-in for one supervised ``asyncdp serve`` child: serves ``GET /health`` on ``--port`` and does as told.

Standard library only (it starts in a fraction of a second). The test steers it through files in
``--state-dir``, all named after ``--name``:

* ``NAME.pid`` (written once it listens): ``{"pid": ..., "supervised_rank": ..., "grandchild": ...}``;
* ``NAME.health`` (written by the test): the status ``/health`` answers; without it ``--status``;
* ``NAME.probes``: one line appended per ``/health`` request;
* ``NAME.signal``: the name of the first SIGTERM/SIGINT it received; ``NAME.exit``: ``drained`` once it
  finished draining and is about to exit with ``--exit-code``.

On SIGTERM/SIGINT it answers 503 for ``--drain-s`` seconds, still listening, then exits. ``--grandchild`` starts
a sleeping process of its own in a new session (a stand-in for an engine), to check that a straggler's whole
tree is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path


def _record_probe(path: Path) -> None:
    with open(path, "a") as f:
        f.write("probe\n")


def _status(args: argparse.Namespace, state: Path, draining: bool) -> int:
    if draining:
        return 503
    try:
        return int((state / f"{args.name}.health").read_text().strip())
    except (OSError, ValueError):
        return args.status


async def _main(args: argparse.Namespace, grandchild: subprocess.Popen[bytes] | None) -> int:
    state = Path(args.state_dir)
    stop = asyncio.Event()
    draining = False

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        path = head.split(b" ", 2)[1].decode("ascii", "replace") if b" " in head else "?"
        if path == "/health":
            _record_probe(state / f"{args.name}.probes")
            code = _status(args, state, draining)
        else:
            code = 404
        writer.write(f"HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        try:
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass

    context = None
    if args.certfile:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.certfile, args.keyfile)
    server = await asyncio.start_server(handle, args.host, args.port, ssl=context)
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if not received:
            received.append(sig.name)
            (state / f"{args.name}.signal").write_text(sig.name)
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    # The supervisor starts its children with both blocked; ``asyncdp serve`` unblocks them once its own handling
    # is in place (asyncdp.__main__), and so does this stand-in: one that came meanwhile is handled now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    info = {"pid": os.getpid(), "supervised_rank": os.environ.get("ASYNCDP_SUPERVISED_RANK"),
            "grandchild": grandchild.pid if grandchild else None}
    tmp = state / f"{args.name}.pid.tmp"
    tmp.write_text(json.dumps(info))
    tmp.rename(state / f"{args.name}.pid")
    print(f"mock child {args.name} listening on port {args.port}", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()
        draining = True
        await asyncio.sleep(args.drain_s)
    (state / f"{args.name}.exit").write_text("drained")
    if grandchild is not None:
        grandchild.kill()
        grandchild.wait()
    return args.exit_code


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--status", type=int, default=200)
    p.add_argument("--drain-s", type=float, default=0.0)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--certfile")
    p.add_argument("--keyfile")
    p.add_argument("--grandchild", action="store_true")
    args = p.parse_args()
    grandchild = None
    if args.grandchild:
        grandchild = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
    return asyncio.run(_main(args, grandchild))


if __name__ == "__main__":
    sys.exit(main())
