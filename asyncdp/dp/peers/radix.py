"""An approximate radix tree over units (SGLang's cache-aware router tree, routing-bench §2.0).

It records what the router *sent* where, not what an engine caches. Edges are compressed: a node holds the
units on the edge from its parent (``key``, a ``str`` for characters or a ``tuple`` of token ids) and, per owner
rank, the time that rank last had a request routed through it. ``insert`` walks the path, splitting an edge where
the new sequence diverges, and stamps every node on the path for the rank; the rank then owns the whole path, so
a node's owners are a subset of its parent's. ``tree_units[rank]`` is the number of units the rank owns.

``match`` is pure: it returns how many leading units are found (a partial edge counts) and the node reached.
``evict(max_units)`` removes, for each owner above the bound, its least recently used leaves (nodes it owns
with no child it owns) until it fits; a node nobody owns any more leaves the tree. Ties in access time go to
the deeper-first, then older-inserted leaf (a heap over (time, sequence number)).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Units = Sequence[Any]  # str or tuple[int, ...]


def _common(key: Units, seq: Units, pos: int) -> int:
    """How many leading units of ``key`` equal ``seq[pos:]``: whole-edge equality first, then a binary search
    over slice equality, so a 100 k-character prompt costs C-level compares, not a Python loop per unit."""
    n = min(len(key), len(seq) - pos)
    if key[:n] == seq[pos:pos + n]:
        return n
    lo, hi = 0, n - 1  # the answer is in [lo, hi]: key[:lo] matches, key[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key[:mid] == seq[pos:pos + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False, slots=True)
class Node:
    key: Units
    parent: Node | None = None
    children: dict[Any, Node] = field(default_factory=dict)
    owners: dict[int, int] = field(default_factory=dict)  # rank -> last access (us)
    seq: int = 0  # creation order, for deterministic eviction ties


@dataclass(slots=True)
class RadixTree:
    dp_size: int
    root: Node = field(default_factory=lambda: Node(()))
    tree_units: list[int] = field(default_factory=list)
    next_seq: int = 1

    @classmethod
    def empty(cls, dp_size: int) -> RadixTree:
        return cls(dp_size, Node(()), [0] * dp_size)

    # ------------------------------------------------------------ queries (pure)

    def match(self, seq: Units) -> tuple[int, Node]:
        """(number of leading units found, the deepest node reached; the root when nothing matched)."""
        node, pos = self.root, 0
        while pos < len(seq):
            child = node.children.get(seq[pos])
            if child is None:
                break
            k = _common(child.key, seq, pos)
            pos += k
            node = child
            if k < len(child.key):
                break
        return pos, node

    @staticmethod
    def recent_owner(node: Node, excluded: Sequence[int] | set[int] = ()) -> int | None:
        """The owner with the most recent access, the lowest rank on a tie [ours]; None if none is alive."""
        best: tuple[int, int] | None = None
        for r, t in node.owners.items():
            if r in excluded:
                continue
            if best is None or (-t, r) < (-best[1], best[0]):
                best = (r, t)
        return None if best is None else best[0]

    # ------------------------------------------------------------ mutations (hooks only)

    def insert(self, seq: Units, rank: int, now_us: int) -> None:
        node, pos = self.root, 0
        while pos < len(seq):
            child = node.children.get(seq[pos])
            if child is None:
                child = self._new(seq[pos:], node)
                node.children[seq[pos]] = child
            else:
                k = _common(child.key, seq, pos)
                if k < len(child.key):
                    child = self._split(child, k)
            pos += len(child.key)
            if rank not in child.owners:
                self.tree_units[rank] += len(child.key)
            child.owners[rank] = now_us
            node = child

    def _new(self, key: Units, parent: Node) -> Node:
        n = Node(key, parent, seq=self.next_seq)
        self.next_seq += 1
        return n

    def _split(self, child: Node, k: int) -> Node:
        """Cut ``child``'s edge after ``k`` units; the new upper node inherits its owners and stamps."""
        parent = child.parent
        assert parent is not None
        upper = self._new(child.key[:k], parent)
        upper.owners = dict(child.owners)
        parent.children[child.key[0]] = upper
        child.key = child.key[k:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper  # owners' unit totals are unchanged: the edge's units were only redistributed

    def remove_owner(self, rank: int) -> None:
        """Forget every path the rank owns (it died, or dropped its prefix cache)."""
        self._evict_rank(rank, 0)

    def evict(self, max_units: int) -> None:
        for rank in range(self.dp_size):
            if self.tree_units[rank] > max_units:
                self._evict_rank(rank, max_units)

    def _evict_rank(self, rank: int, max_units: int) -> None:
        heap: list[tuple[int, int, int, Node]] = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            owned = [c for c in n.children.values() if rank in c.owners]
            if n is not self.root and not owned and rank in n.owners:
                heapq.heappush(heap, (n.owners[rank], -self._depth(n), n.seq, n))
            stack.extend(owned)
        while heap and self.tree_units[rank] > max_units:
            _, _, _, n = heapq.heappop(heap)
            del n.owners[rank]
            self.tree_units[rank] -= len(n.key)
            parent = n.parent
            assert parent is not None
            if not n.owners and not n.children:
                del parent.children[n.key[0]]
            if parent is not self.root and rank in parent.owners and \
                    not any(rank in c.owners for c in parent.children.values()):
                heapq.heappush(heap, (parent.owners[rank], -self._depth(parent), parent.seq, parent))

    @staticmethod
    def _depth(n: Node) -> int:
        d = 0
        while n.parent is not None:
            d, n = d + 1, n.parent
        return d
