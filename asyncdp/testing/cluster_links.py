"""The in-memory cluster's link wiring: every :class:`~asyncdp.testing.links.SimLink` end the harness hands out,
and what the harness observes through their hooks (no production role is mocked).

Theory of operation. :class:`ClusterLinks` creates the rank<->client link pairs (``pair``), remembers each end by
rank and by client, and installs the hooks that record traffic: the rank each ``AddRequest`` went to
(``routed``), per rank the requests it reported finished (``finished``), per client the virtual time of every
``StatsSnapshot`` (``snapshots``), and an ``activity`` event replaced whenever a message passes, so waiters
recheck. Faults act on the ends: ``close_rank`` cuts a rank's links (a SIGKILL: peers see EOF), ``stall_client``
makes one client stop reading from every rank (the rank's outbox to it fills). ``close_all`` closes every end,
so no memory stream outlives the cluster.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from asyncdp import messages as m
from asyncdp.testing.links import LINK_BUFFER, SimLink, sim_link_pair


class ClusterLinks:
    def __init__(self, *, dp_size: int, num_clients: int, codec: bool, link_buffer: int = LINK_BUFFER) -> None:
        self.codec = codec
        self.link_buffer = link_buffer
        #: request id -> the rank its client sent it to
        self.routed: dict[str, int] = {}
        #: per rank: requests it reported finished to the clients
        self.finished = [0] * dp_size
        #: per client: (virtual receive time, snapshot) of every StatsSnapshot, in arrival order
        self.snapshots: list[list[tuple[float, m.StatsSnapshot]]] = [[] for _ in range(num_clients)]
        self.first_snapshot = [anyio.Event() for _ in range(num_clients)]
        #: [client][rank]: set once the client's end of that rank's link closed (the client dropped the rank)
        self.released = [[anyio.Event() for _ in range(dp_size)] for _ in range(num_clients)]
        #: [rank][client]: set once the rank's end of that client's link closed (the rank cut or lost it)
        self.rank_closed = [[anyio.Event() for _ in range(num_clients)] for _ in range(dp_size)]
        self.rank_ends: list[list[SimLink]] = [[] for _ in range(dp_size)]  # also the coordinator link
        self.client_ends: list[list[SimLink]] = [[] for _ in range(num_clients)]  # the ends facing the ranks
        self.activity = anyio.Event()
        self._all: list[SimLink] = []

    def engine_pair(self, dp_rank: int, client_index: int) -> tuple[SimLink, SimLink]:
        """A rank<->client link with its recording hooks: (the rank's end, the client's end)."""
        rank_end, client_end = sim_link_pair(name=f"rank{dp_rank}-client{client_index}", codec=self.codec,
                                             max_buffer=self.link_buffer)
        self._all += [rank_end, client_end]
        rank_end.on_send = self._on_rank_send(dp_rank)
        rank_end.on_close = self.rank_closed[dp_rank][client_index].set
        client_end.on_send = self._on_client_send(dp_rank)
        client_end.on_receive = self.poke
        client_end.on_close = self.released[client_index][dp_rank].set
        self.rank_ends[dp_rank].append(rank_end)
        self.client_ends[client_index].append(client_end)
        return rank_end, client_end

    def add_rank_end(self, dp_rank: int, link: SimLink) -> None:
        """Another end of the rank's (its coordinator link), closed with the rest by :meth:`close_rank`."""
        self.rank_ends[dp_rank].append(link)

    def watch_snapshots(self, client_index: int, link: SimLink) -> None:
        link.on_receive = self._on_snapshot(client_index)

    def poke(self, _msg: object = None) -> None:
        self.activity.set()
        self.activity = anyio.Event()

    def close_rank(self, dp_rank: int) -> None:
        for link in self.rank_ends[dp_rank]:
            link.close_nowait()

    def stall_client(self, client_index: int) -> None:
        for link in self.client_ends[client_index]:
            link.stall()

    def unstall_client(self, client_index: int) -> None:
        for link in self.client_ends[client_index]:
            link.unstall()

    def close_all(self) -> None:
        for link in self._all:
            link.unstall()
            link.close_nowait()

    def _on_client_send(self, dp_rank: int) -> Callable[[m.Message], None]:
        def record(msg: m.Message) -> None:
            if isinstance(msg, m.AddRequest):
                self.routed[msg.request_id] = dp_rank
        return record

    def _on_rank_send(self, dp_rank: int) -> Callable[[m.Message], None]:
        def record(msg: m.Message) -> None:
            if isinstance(msg, m.EngineOutputs):
                self.finished[dp_rank] += len(msg.finished_request_ids)
            self.poke()
        return record

    def _on_snapshot(self, client_index: int) -> Callable[[m.Message], None]:
        def record(msg: m.Message) -> None:
            if isinstance(msg, m.StatsSnapshot):
                self.snapshots[client_index].append((anyio.current_time(), msg))
                self.first_snapshot[client_index].set()
        return record
