"""The held WRITE-with-immediate completions in :class:`~mrcnic.rx.psn_tracker.PsnTracker`'s
stages: whether the pool will be full (stage F) and its update, admission or release
(stage U)."""

import functools
import operator

from amaranth.hdl import Cat, Mux, Signal

from mrcnic.base.gates import assign

__all__ = ["PoolStages"]


class PoolStages:
    """Stage F's and stage U's work on the held completions (``mem.pool``, registers, and
    the distributed RAM beside them). Mixed into the tracker beside
    :class:`~mrcnic.rx.psn_tracker.stages.TrackerStages`."""

    def _pool_full(self, mem, st):
        """Whether the held completions, with those being admitted, fill the pool in the
        next cycle (when this record is in D): the pool as it will be counted then, the
        admission of the record now in U (then in A), and that of the record now in D (then
        in U; unknown yet): without it and with it."""
        N, pool, u = self.max_wimm_dest, mem.pool, st.u
        held = sum(pool[i].valid for i in range(N))
        a_adm = u.admit
        out = []
        for u_adm in (0, 1):
            full = (held >= N) | ((held >= N - 1) & (a_adm | u_adm))
            full |= (held >= N - 2) & a_adm & u_adm if N >= 2 else a_adm & u_adm
            out.append(full)
        return Cat(*out)

    def _pool_update(self, m, mem, st, ctl, qd, wb):
        """Stage U's held completions: the packet's admitted, or those the new CACK passes
        released (all after the old CACK, so at or after the window base: a 9-bit compare
        with the run's end) to the drain."""
        u, N, pool = st.u, self.max_wimm_dest, mem.pool
        # The first free slot (one-hot); the store is never full when a packet is admitted.
        free = [~pool[i].valid for i in range(N)]
        slot = Signal(N, name="u_pool_slot")
        m.d.comb += slot.eq(Cat(*(free[i] & ~Cat(*free[:i]).any() if i else free[0]
                                  for i in range(N))))
        admit = u.admit
        for i in range(N):
            with m.If(admit & slot[i]):
                m.d.sync += assign(pool[i], valid=1, qpi=u.qpi, psn=u.op.psn)
        m.d.comb += [mem.pool_w.addr.eq(functools.reduce(operator.or_, (
                         Mux(slot[i], i, 0) for i in range(N)))),
                     mem.pool_w.en.eq(admit),
                     assign(mem.pool_w.data, imm=qd.imm, tag=qd.tag)]
        release = Signal(N, name="u_release")
        pos = [u.rel[i] for i in range(N)]
        for i in range(N):
            m.d.comb += release[i].eq(u.valid & u.adv & u.cand[i] & (u.rel[i] <= u.run))
        # While no drain runs (nothing is in stage U while one does: the stages behind the
        # release were flushed, and nothing is issued), its registers follow stage U, so
        # that the release's compares drive their data alone, not an enable too.
        with m.If(~ctl.drain_busy):
            m.d.sync += [ctl.drain_busy.eq(release.any()), ctl.drain_mask.eq(release),
                         ctl.drain_ordered.eq(0),
                         *[ctl.drain_pos[i].eq(pos[i]) for i in range(N)]]
