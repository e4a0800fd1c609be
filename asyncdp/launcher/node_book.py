"""The head's book of the deployment's nodes and ranks: who may join, who is ready, who is lost. Pure.

Theory of operation
-------------------
The head front-end (the owner of rank 0) hosts the handshake listener every engine of the deployment joins, and
headless launchers open their node link on it (spec §5.3, §5.4, §5.7). :class:`NodeBook` decides, without any
I/O, what each arrival means:

* :meth:`NodeBook.admit_node` checks a ``NodeHello``: the protocol version, that headless nodes belong to an
  internal-LB deployment, that the node's ranks lie in ``[0, N)`` and overlap no other node's (this node's own
  ranks included), and that its parallel configuration equals the head's (the differing fields are named);
* :meth:`NodeBook.admit_engine` checks an engine's ``Hello`` (E4, E5): protocol version, rank range, a rank seen
  twice, local vs remote, the headless flag the mode expects, and, in internal mode, that a remote rank comes
  from an admitted headless node;
* :meth:`NodeBook.engine_ready` records ``Ready`` and checks the configuration agreement with rank 0 (E6);
* :meth:`NodeBook.lose_node` marks a node lost (or stopped) and names its ranks. Dense: a node restarted in its
  place with the same ranks and configuration takes them back (its entry comes back alive with the new launcher;
  spec §13: orchestrators restart a whole node); other ranks overlapping a lost node's, and anything of a MoE
  group, are refused (:meth:`NodeBook.rejoin_problem`). :meth:`NodeBook.missing` lists the ranks not
  ready yet (the startup progress line, and :meth:`NodeBook.timeout_line`, E9's failure when
  ``--engine-ready-timeout-s`` expires), :meth:`NodeBook.rows` the nodes for ``/server_info``.

Every check returns a problem string (the message both sides log) or None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncdp.config.summary import config_hash, config_mismatch_message, summary_differences
from asyncdp.messages import PROTOCOL_VERSION, Hello, NodeHello, NodeRow, ProcessRow


def span(ranks: list[int] | tuple[int, ...] | range) -> str:
    """``[2, 3]`` -> ``"ranks 2..3"``; one rank -> ``"rank 2"``; none -> ``"no ranks"``."""
    ranks = sorted(ranks)
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}..{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def check_config_agreement(summaries: dict[int, dict[str, Any]], dp_rank: int,
                           summary: Mapping[str, Any]) -> str | None:
    """E6: record ``dp_rank``'s parallel-configuration summary; return the mismatch message once it (or any rank
    recorded before rank 0) hashes differently from rank 0's, naming the differing fields. Ranks may report in
    any order. A summary off the wire may hold anything msgpack does: a value that is no str, int or bool (which
    the hash could not digest) is a mismatch of its own, and nothing of it is recorded."""
    odd = sorted(k for k, v in summary.items() if not isinstance(v, str | int | bool))
    if odd:
        return (f"configuration mismatch: engine rank {dp_rank} sent a configuration summary whose "
                f"{', '.join(odd[:5])} {'is' if len(odd) == 1 else 'are'} no str, int or bool")
    summaries[dp_rank] = dict(summary)
    rank0 = summaries.get(0)
    if rank0 is None:
        return None
    for r in ([dp_rank] if dp_rank != 0 else sorted(r for r in summaries if r != 0)):
        if config_hash(summaries[r]) != config_hash(rank0):
            return config_mismatch_message(r, summaries[r], rank0)
    return None


@dataclass
class NodeEntry:
    """One launch of the deployment as the head knows it."""

    index: int  # 0: the head itself; remote nodes count from 1 in the order they joined
    role: str  # "head" | "headless" | "hybrid" | "external"
    host: str
    pid: int | None  # its launcher's pid (None: not known yet)
    ranks: list[int]
    state: str = "alive"  # "alive" | "lost" | "stopped"
    processes: list[ProcessRow] = field(default_factory=list)  # what a hybrid/external node reported of itself

    def describe(self) -> str:
        where = f"{self.host}, pid {self.pid}" if self.pid else self.host
        return f"the {self.role} node with {span(self.ranks)} ({where})"


@dataclass
class NodeBook:
    dp_size: int
    mode: str  # the head's mode: "internal" | "hybrid" | "external" | "single"
    local_ranks: tuple[int, ...]  # the head's own engines
    summary: Mapping[str, Any]  # the head's parallel configuration (parallel_config_summary)
    host: str = "127.0.0.1"
    pid: int | None = None
    role: str = "head"  # this launch's own role (a hybrid node with S > 0 keeps a book of its own engines)
    is_moe: bool = False  # a MoE group takes no member back; a dense deployment takes a restarted node's ranks
    nodes: list[NodeEntry] = field(default_factory=list)
    connected: dict[int, Hello] = field(default_factory=dict)  # rank -> its Hello
    ready: set[int] = field(default_factory=set)
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes.append(NodeEntry(0, self.role, self.host, self.pid, list(self.local_ranks)))

    # ------------------------------------------------------------------ arrivals

    def admit_node(self, hello: NodeHello) -> tuple[NodeEntry | None, str | None]:
        """A launcher's ``NodeHello``: its entry, or the reason it is refused.

        A headless node joins an internal-LB deployment before its engines start. A hybrid node (S > 0) or an
        external rank server joins a deployment of its own mode once it serves; its engines may have said
        ``Hello`` already, so the entry they created (same launcher pid) is completed, not refused as an
        overlap."""
        first, size = hello.start_rank, hello.size_local
        # (checked before any list is built: the frame is anyone's, and its size_local may be 2**62)
        in_range = size >= 1 and first >= 0 and first + size <= self.dp_size
        ranks = list(range(first, first + size)) if in_range else []
        shown = span(ranks) if in_range else "no ranks" if size < 1 else f"ranks {first}..{first + size - 1}"
        who = f"the {hello.role} node with {shown} ({hello.host}, pid {hello.pid})"
        if hello.protocol_version != PROTOCOL_VERSION:
            return None, f"{who} speaks protocol_version {hello.protocol_version}, the head {PROTOCOL_VERSION}"
        expected = "internal" if hello.role == "headless" else hello.role
        if self.mode != expected:
            if hello.role == "headless":
                return None, (f"{who} joined a {self.mode}-LB deployment; headless nodes belong to internal-LB "
                              "deployments (drop --headless and give that node its own API endpoint)")
            return None, f"{who} joined a {self.mode}-LB deployment; every node must use the same LB mode"
        if not in_range:
            return None, f"{who} is outside the deployment's ranks [0, {self.dp_size})"
        if gone := self.rejoin_problem(ranks):
            return None, gone
        known = next((n for n in self.nodes[1:] if n.role == hello.role and n.pid == hello.pid
                      and n.host == hello.host and n.state == "alive"), None)
        for node in self.nodes:
            if node is not known and node.state == "alive" and (taken := sorted(set(ranks) & set(node.ranks))):
                return None, f"{who} overlaps {node.describe()} in {span(taken)}"
        diffs = summary_differences(hello.config_summary, self.summary)
        if diffs:
            return None, f"configuration mismatch: {who} differs from the head in {', '.join(diffs)}"
        entry = known or self._revive(hello.role, hello.host, hello.pid, ranks)
        entry.ranks = ranks
        entry.processes = list(hello.processes)
        return entry, None

    def admit_engine(self, hello: Hello) -> str | None:
        """An engine's ``Hello`` (E4, E5; E6 against this launch's configuration when the engine says its own):
        None when it may join."""
        r = hello.dp_rank
        if hello.protocol_version != PROTOCOL_VERSION:
            return f"engine rank {r}: protocol_version {hello.protocol_version} != {PROTOCOL_VERSION}"
        if not 0 <= r < self.dp_size:
            return f"engine rank {r}: dp_rank {r} is outside [0, {self.dp_size})"
        if self.node_of(r) is None and (gone := self.rejoin_problem([r], whole=False)):
            return f"engine rank {r}: {gone}"
        if r in self.connected:
            first = self.connected[r]
            return (f"engine rank {r}: dp_rank {r} connected twice (first from {first.host}, pid {first.pid}; "
                    f"again from {hello.host}, pid {hello.pid})")
        is_local = r in self.local_ranks
        if hello.local != is_local:
            return (f"engine rank {r}: connected with local={hello.local}, but rank {r} runs "
                    f"{'on the head' if is_local else 'on another node'}")
        expect_headless = not is_local and self.mode == "internal"
        if hello.headless != expect_headless:
            return (f"engine rank {r} connected with headless={hello.headless}, but this deployment expects "
                    f"headless={expect_headless} (use --headless only on engine-only nodes of internal-LB "
                    "deployments)")
        if expect_headless and self.node_of(r) is None:
            return f"engine rank {r}: no admitted headless node brings rank {r}"
        # Before the DP group forms (E6 at Ready comes after it: a MoE group's collectives would mismatch first)
        if hello.config_summary and (diffs := summary_differences(hello.config_summary, self.summary)):
            where = "the head" if self.role == "head" else "this node's front-end"
            return (f"configuration mismatch: engine rank {r} ({hello.host}, pid {hello.pid}) differs from {where} "
                    f"in {', '.join(diffs)}")
        self.connected[r] = hello
        if not is_local and self.mode != "internal":  # a hybrid/external node: known only through its engines
            self._note_remote_engine(hello)
        return None

    def engine_ready(self, dp_rank: int, config_hash_: str | None, summary: Mapping[str, Any]) -> str | None:
        """``Ready`` from ``dp_rank``: None, or the E6 mismatch once its configuration differs from rank 0's."""
        if config_hash_ is not None:
            problem = check_config_agreement(self.summaries, dp_rank, summary)
            if problem:
                return problem
        self.ready.add(dp_rank)
        return None

    def engine_gone(self, hello: Hello) -> None:
        """The handshake link of the engine that said ``hello`` closed (its process ended). An engine of a lost
        node may end after a restarted node's engine took its rank: that one stays."""
        if self.connected.get(hello.dp_rank) is hello:
            del self.connected[hello.dp_rank]
            self.ready.discard(hello.dp_rank)

    def rejoin_problem(self, ranks: list[int], *, whole: bool = True) -> str | None:
        """Why ``ranks`` may not join where some of them left this running deployment (their node was lost or
        stopped); None when they may. A MoE group takes no member back (its group was torn down: only a restart
        of the whole deployment serves again). A dense deployment takes a node restarted in place of a left one
        back when it brings the same ranks (``whole``: a node's ``NodeHello``); an engine's ``Hello``
        (``whole=False``: a hybrid node's engines come one by one) may bring any rank that left."""
        for node in self.nodes:
            if node.state == "alive" or not (taken := sorted(set(ranks) & set(node.ranks))):
                continue
            how = f"{span(taken)} left this deployment when {node.describe()} " + (
                "was lost" if node.state == "lost" else "stopped")
            if self.is_moe:
                return (f"{how}, and a running deployment takes no rank back: restart the whole deployment, head "
                        "included, to serve them again")
            if whole and sorted(ranks) != sorted(node.ranks):
                return (f"{how}; a node restarted in its place must bring the same ranks, {span(node.ranks)} "
                        f"(--data-parallel-start-rank {min(node.ranks)} --data-parallel-size-local "
                        f"{len(node.ranks)})")
        return None

    def _revive(self, role: str, host: str, pid: int | None, ranks: list[int]) -> NodeEntry:
        """The entry of a node restarted in place of one that left (dense): that node's entry, alive again with the
        new launcher; else a new entry."""
        entry = next((n for n in self.nodes[1:] if n.role == role and n.state != "alive"
                      and set(ranks) & set(n.ranks)), None)
        if entry is None:
            entry = NodeEntry(len(self.nodes), role, host, pid, ranks)
            self.nodes.append(entry)
        entry.state, entry.host, entry.pid, entry.ranks, entry.processes = "alive", host, pid, list(ranks), []
        return entry

    # ------------------------------------------------------------------ views

    def node_of(self, dp_rank: int) -> NodeEntry | None:
        return next((n for n in self.nodes if dp_rank in n.ranks and n.state == "alive"), None)

    def lose_node(self, entry: NodeEntry, *, orderly: bool = False) -> list[int]:
        """Mark ``entry`` lost (or stopped: it left on purpose, after ``NodeShutdown`` or its own ``NodeStopping``,
        however its drain went: the head's log says that); return its ranks. Either way they left; a dense deployment
        takes them back from a node restarted in its place."""
        entry.state = "stopped" if orderly else "lost"
        for r in entry.ranks:
            self.ready.discard(r)
            self.connected.pop(r, None)
        return list(entry.ranks)

    def missing(self) -> list[int]:
        """Ranks of the deployment that did not send ``Ready`` yet."""
        return [r for r in range(self.dp_size) if r not in self.ready]

    def waiting_line(self) -> str:
        """What startup still waits for, for the progress log every 10 s."""
        missing = self.missing()
        absent = [r for r in missing if r not in self.connected]
        parts = [f"{span(missing)} not ready"]
        if absent:
            parts.append(f"{span(absent)} not connected yet")
        return "; ".join(parts)

    def timeout_line(self, timeout_s: float, address: str, rpc_port: int) -> str:
        """E9: the ranks not ready when ``--engine-ready-timeout-s`` expired (:meth:`waiting_line`), and what to
        do: other nodes' ranks that never connected need their node started, with ``-dpa address -dpp
        rpc_port``; the others are slow to load (or failed: their logs say)."""
        line = f"{self.waiting_line()} after --engine-ready-timeout-s ({timeout_s:g} s)"
        absent = [r for r in self.missing() if r not in self.connected and r not in self.local_ranks]
        if not absent:
            return f"{line}: raise it if they only load slowly, or see their logs"
        what = f"that runs {span(absent)}"
        launch = {"internal": f"the headless node {what} (--headless --data-parallel-start-rank {absent[0]})",
                  "hybrid": f"the hybrid node {what} (--data-parallel-hybrid-lb --data-parallel-start-rank "
                            f"{absent[0]})",
                  }.get(self.mode, f"the launch {what} (--data-parallel-rank {absent[0]})")
        return (f"{line}: {span(absent)} never arrived; start {launch} with -dpa {address} -dpp {rpc_port}, or "
                f"raise --engine-ready-timeout-s if {'it starts' if len(absent) == 1 else 'they start'} slowly")

    def rows(self) -> list[NodeRow]:
        return [NodeRow(node=n.index, role=n.role, host=n.host, pid=n.pid, ranks=list(n.ranks), state=n.state)
                for n in self.nodes]

    def _note_remote_engine(self, hello: Hello) -> None:
        """Group a hybrid node's (or an external rank server's) engines by their launcher (the parent pid their
        ``Hello`` names)."""
        for node in self.nodes[1:]:
            if node.role == self.mode and node.host == hello.host and node.pid == (hello.launcher_pid or None) \
                    and node.state == "alive":
                node.ranks = sorted({*node.ranks, hello.dp_rank})
                return
        self._revive(self.mode, hello.host, hello.launcher_pid or None, [hello.dp_rank])
