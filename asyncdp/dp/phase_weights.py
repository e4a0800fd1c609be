"""The phase weights of asyncdp's policy: how a prompt no rank holds weighs the ranks' loads, how far the weights
apply (the share of recent prompts that were new), their rotation over the ranks, and, with several routers, the
others' new prompts a router assumes go where its own go (docs/discussion/routing-policy.md, "New prompts: phase
weights"). A base of :class:`~.asyncdp_state.AsyncdpState`, which holds the fields and recomputes the costs
(``update_all``) when the weights change."""

from __future__ import annotations

from asyncdp.dp.asyncdp_records import CostWeights

RESEND_WINDOW_US = 1_000_000  # [ours] a dispatch this soon after an unmatched completion may be its client's resend
RESEND_SHARE_STEP = 1.0 / 32.0  # the EMA step of resend_share, per dispatch
NEW_SHARE_WINDOW = 256.0  # the cluster's dispatches over which the share of prompts no rank held is averaged
NEW_SHARE_MIN_OWN = 16.0  # ... but over at least this many of the router's own, however many routers there are
PHASE_STEP = 0.125  # phase_scale moves in steps of this


class PhaseWeights:
    """The phase weights' methods; the fields are :class:`~.asyncdp_state.AsyncdpState`'s."""

    n: int
    num_routers: int
    weights: CostWeights
    epoch: int  # the rotation's epoch: clock_us // phase_period_us
    phases: list[float]  # phase(i) for the current epoch
    new_share: float  # EMA of the share of dispatched prompts no rank held (note_new)
    phase_scale: float  # the share of phase_spread in force (note_new)
    mirror: list[float]  # the others' new prompts this router assumes (mirror_new)
    resend_credit: int  # completions not matched to a dispatch yet (note_finish, note_resend)
    last_finish_us: int  # the hooks' clock at the last completion, -1 before the first
    resend_share: float  # EMA of the share of dispatches that could be a completed request's resend (note_resend)

    def update_all(self, *, resum: bool) -> None:
        raise NotImplementedError

    def phase(self, i: int) -> float:
        """Rank i's phase weight in this epoch: ``spread·(2·((i + epoch) mod n)/(n - 1) - 1)``, equal steps from
        ``-spread`` to ``+spread`` over the ranks, rotated by one rank every ``phase_period_us``. A prompt no rank
        holds compares ``base + phase·hbase`` (its load weighted by ``1 + phase``), so ranks that would be equally
        loaded carry loads a few per cent apart. Closed-loop clients with equal lengths on equally loaded ranks
        finish in the same steps and resend together, burst after burst (W9, guidellm's concurrency mode); ranks a
        few per cent apart step at slightly different speeds, so their clients drift out of step and the bursts
        spread. The rotation gives every rank every weight in turn: no rank is favoured over time.

        ``spread`` is ``phase_spread·phase_scale``: the weights apply in full where at least 90 % of the recent
        prompts were new to every rank, not at all where half or fewer were (:meth:`note_new`). Where new prompts
        are followed by others with the same prefix (W1's groups, W3, sessions), where a new prompt goes decides
        where its followers go, so its placement keeps the balance; where most prompts share nothing (W9),
        placement has no cache consequence."""
        w = self.weights
        if not w.phase_spread or not self.phase_scale or self.n < 2:
            return 0.0
        return w.phase_spread * self.phase_scale * (2.0 * ((i + self.epoch) % self.n) / (self.n - 1) - 1.0)

    def note_new(self, new: bool, now_us: int) -> None:
        """A dispatch at ``now_us`` (counted first by :meth:`note_resend`): count whether no rank held its prompt's
        first block in ``new_share`` (an average over about
        ``NEW_SHARE_WINDOW`` of the cluster's dispatches: this router sees one in ``num_routers`` of them, so over
        ``NEW_SHARE_WINDOW / num_routers`` of its own, and never fewer than ``NEW_SHARE_MIN_OWN``), and move
        ``phase_scale`` to ``(new_share - 0.5)/0.4`` clipped to [0, 1] in steps of 1/8, once it is 3/32 away (so
        the costs are recomputed a few times as the share changes, not on every dispatch).

        Averaged over 256 of its own dispatches, each of four routers took four times as long as one router to
        see that W9's prompts share nothing: the weights reached full spread after 32 of the quick run's 60 s,
        and its mean TTFT read 2.4 x one router's."""
        self.note_resend(now_us)
        step = 1.0 / max(NEW_SHARE_WINDOW / self.num_routers, NEW_SHARE_MIN_OWN)
        m = self.new_share = self.new_share + ((1.0 if new else 0.0) - self.new_share) * step
        target = min(1.0, max(0.0, (m - 0.5) / 0.4)) * self.resend_share
        if abs(target - self.phase_scale) >= PHASE_STEP * 0.75:
            self.phase_scale = round(target / PHASE_STEP) * PHASE_STEP
            self.phases = [self.phase(i) for i in range(self.n)]
            self.update_all(resum=False)

    def note_finish(self, now_us: int) -> None:
        """A request of this router completed: its client may resend (:meth:`note_resend`)."""
        self.resend_credit += 1
        self.last_finish_us = now_us

    def note_resend(self, now_us: int) -> None:
        """A dispatch (from :meth:`note_new`): whether it could be the resend of a completion this router saw
        within ``RESEND_WINDOW_US`` and has not matched to an earlier dispatch, averaged into ``resend_share``,
        which scales the phase weights.

        The weights exist for closed-loop clients, whose resends follow their completions; their cost is an uneven
        split of a burst (a burst of 400 from idle split by loads weighed 0.9 to 1.1 gives the ranks 45 to 55 each,
        and the burst lasts as long as its busiest rank: W9@onoff's goodput read 0.973 x vllm's). An open-loop
        burst after a quiet spell follows no completion, so it is split evenly; steady open-loop traffic, whose
        completions and arrivals interleave, keeps most of the weights. Before the first completion nothing is
        counted: a run's opening burst may be closed-loop clients' first sends, and W9's desynchronisation starts
        there (its burst of 800 split evenly, W9's mean TTFT read 1.27 x; the share starts at 1)."""
        if self.last_finish_us < 0:
            return  # no completion yet: the opening burst says nothing of the clients (the share stays at 1)
        if now_us - self.last_finish_us > RESEND_WINDOW_US:
            self.resend_credit = 0  # completions long past: their clients are not resending now
        resend = self.resend_credit > 0
        if resend:
            self.resend_credit -= 1
        self.resend_share += ((1.0 if resend else 0.0) - self.resend_share) * RESEND_SHARE_STEP

    def mirror_new(self, i: int, prefill: float) -> None:
        """With several routers and the phase weights in full, this router sent a new prompt of ``prefill`` tokens
        to rank i: count ``R - 1`` more there in its miss costs until the next snapshot (``mirror``, weighed by the
        rank's phase like the rest of its load).

        New prompts are not claimed while the phases hold in full (:meth:`.SeveralRouters.claim_hashes`), so until
        the next snapshot a router sees none of the other routers' new prompts. In a burst they all see the same
        loads and phases and send where this router does: at the start of W9 at full scale (800 clients at once,
        16 API servers over 8 ranks) each router counted only its own ~50 prompts, and the ranks the phases favour
        got 184 and 149 of the 800 prompts against 68 on the least favoured (one router: 110 against 91); the
        burst's p99 TTFT read 7.45 s against 4.41 s. Counting the others as mirroring this router, its own burst
        follows the phases as one router's would (114 against 95)."""
        if self.num_routers > 1 and self.phase_scale >= 1.0 and self.weights.phase_spread:
            self.mirror[i] += (self.num_routers - 1) * prefill

    def rotate_phases(self, now_us: int) -> None:
        """At a new epoch (every ``phase_period_us`` of the hooks' clock) the weights rotate by one rank."""
        if self.weights.phase_spread and (epoch := now_us // self.weights.phase_period_us) != self.epoch:
            self.epoch = epoch
            phases = [self.phase(i) for i in range(self.n)]
            if phases != self.phases:
                self.phases = phases
                self.update_all(resum=False)
