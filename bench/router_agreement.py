"""How well R routers agree with no shared state, in a W1-style burst (gate G6's "R = 4 vs R = 1").

In W1's burst every request is routed at the same instant, so no snapshot, first token or finish can tell one
router what another did: each router decides from its own quarter of the stream. This benchmark replays that
decision problem without the engines (the policies' own ``select``/``on_dispatch``, requests dealt to routers by
``req_id % R`` as the simulator does) and prints, for each policy and R:

- ``prefills/group``: on how many ranks each group's shared system prompt lands (1 is ideal: every other request of
  the group is a hit there);
- ``max work / ideal``: the busiest rank's prefill tokens (one system prompt per group it holds, plus every
  request's own question) over an even split of the ideal work: the burst's TTFT grows with it.

Policies: ``asyncdp alone`` (the production policy with no shared state), ``blch``, a bounded-load consistent
hash on the prompt's first block (each group's probe order is a hash of that block; a request goes to the first
rank in it whose cost is at most (1 + eps)·mean + c·prompt), which makes routers agree by construction, and
``asyncdp + directory``: the production policy asking the coordinator's prefix directory
(:mod:`asyncdp.dp.prefix_directory`) about every prompt whose first block it never placed, through the same hooks
the API server uses (``claim_hashes``, the directory's ``claim``, ``on_prefix_owner``, the answer binding the
request). The point of the table: with no communication a router can either balance on its own view (balanced at
R = 1, about R copies of each group at R = R) or agree by hashing (one copy, but the hash's imbalance); neither
keeps R = 4 within 5 % of asyncdp's R = 1. The directory does: one copy, balanced. The full simulation of the same
runs is ``asyncdp bench routing --workload w1 --scale full --robustness``.

Usage: python bench/router_agreement.py [--groups 64] [--prompts 16] [--system 2048] [--question 128] [--dp 8]
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, AsyncdpState, prompt_hashes  # noqa: E402
from asyncdp.dp.policy import Decision, RequestView  # noqa: E402
from asyncdp.dp.prefix_directory import PrefixDirectory  # noqa: E402
from bench.serving import non_negative_int, positive_int  # noqa: E402

Chooser = Callable[[AsyncdpPolicy, AsyncdpState, RequestView, random.Random], int]


def _probe(key: int, n: int) -> Iterator[int]:
    """Distinct ranks in a pseudo-random order fixed by ``key`` (the same on every router)."""
    seen: set[int] = set()
    x = key
    while len(seen) < n:
        x = (x * 0x9E3779B97F4A7C15 + 12345) & 0xFFFF_FFFF_FFFF_FFFF
        r = (x >> 17) % n
        if r not in seen:
            seen.add(r)
            yield r


def asyncdp(pol: AsyncdpPolicy, st: AsyncdpState, req: RequestView, rng: random.Random) -> int:
    return pol.select(req, None, st, 0, rng).dp_rank


def blch(eps: float, c: float) -> Chooser:
    def choose(pol: AsyncdpPolicy, st: AsyncdpState, req: RequestView, rng: random.Random) -> int:
        key = prompt_hashes(req, st.block_size)[0]
        bound = sum(st.base) / st.n * (1 + eps) + c * len(req.tokens)
        for r in _probe(key, st.n):
            if st.base[r] <= bound:
                return r
        return st.pick
    return choose


class WithDirectory:
    """asyncdp, every router asking one shared :class:`PrefixDirectory` (:func:`run` gives each run a fresh one)."""

    def __init__(self) -> None:
        self.directory = PrefixDirectory(1)
        self.router: dict[int, int] = {}  # id(state) -> its client key

    def __call__(self, pol: AsyncdpPolicy, st: AsyncdpState, req: RequestView, rng: random.Random) -> int:
        hashes = pol.claim_hashes(st, req)
        pick = pol.select(req, None, st, 0, rng).dp_rank
        if not hashes:
            return pick
        client = self.router.setdefault(id(st), len(self.router))
        answer = self.directory.claim(hashes, pick, len(req.tokens), (0, st.n - 1), 0.0, client)
        pol.on_prefix_owner(st, answer.owner, hashes, answer.matched, answer.others)
        return answer.owner


def run(choose: Chooser, routers: int, ns: argparse.Namespace) -> tuple[float, float]:
    rng = random.Random(ns.seed)
    systems = [[rng.randrange(1, 32_000) for _ in range(ns.system)] for _ in range(ns.groups)]
    reqs = [(g, (*systems[g], 7, *(rng.randrange(1, 32_000) for _ in range(ns.question))))
            for g in range(ns.groups) for _ in range(ns.prompts)]
    rng.shuffle(reqs)
    pol = AsyncdpPolicy()
    states = [pol.init(ns.dp, j, routers, {"kv_blocks_per_rank": 28_000}) for j in range(routers)]
    if isinstance(choose, WithDirectory):
        choose.directory, choose.router = PrefixDirectory(ns.dp), {}
    where: dict[int, list[int]] = collections.defaultdict(list)
    for k, (g, tokens) in enumerate(reqs):
        st = states[k % routers]
        req = RequestView(f"r{k}", tokens, max_tokens=32)
        rank = choose(pol, st, req, rng)
        pol.on_dispatch(st, req, Decision(rank), 0)
        where[g].append(rank)
    work: collections.Counter[int] = collections.Counter()
    for ranks in where.values():
        for r in set(ranks):
            work[r] += ns.system
        for r in ranks:
            work[r] += ns.question + 1
    ideal = (ns.groups * ns.system + len(reqs) * (ns.question + 1)) / ns.dp
    return sum(len(set(v)) for v in where.values()) / ns.groups, max(work.values()) / ideal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=positive_int, default=64)
    ap.add_argument("--prompts", type=positive_int, default=16)
    ap.add_argument("--system", type=non_negative_int, default=2048)
    ap.add_argument("--question", type=non_negative_int, default=128)
    ap.add_argument("--dp", type=positive_int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ns = ap.parse_args()
    choosers: list[tuple[str, Chooser]] = [("asyncdp alone", asyncdp), ("asyncdp + directory", WithDirectory())]
    choosers += [(f"blch eps={e:g} c={c:g}", blch(e, c)) for e, c in ((0.1, 1.0), (0.25, 2.0), (0.5, 1.0))]
    print(f"W1-style burst: {ns.groups} groups x {ns.prompts} prompts, system {ns.system} + question "
          f"{ns.question} tokens, dp {ns.dp}, seed {ns.seed}")
    print(f"{'policy':22s} {'R':>2s} {'prefills/group':>15s} {'max work/ideal':>15s}")
    ref = None
    for name, choose in choosers:
        for routers in (1, 4):
            copies, skew = run(choose, routers, ns)
            ref = skew if ref is None else ref
            print(f"{name:22s} {routers:2d} {copies:15.2f} {skew:15.2f}   ({skew / ref:.2f} x asyncdp R=1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
