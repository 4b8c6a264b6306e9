"""The hole engine of :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`
(``hole_*``): the holes one SACK found, requested oldest first, one a cycle.

Reads: stage W's hole vector and first PSN (``holes``, ``p0``) the cycle W goes; the
per-PSN rings (read port ``rec_rh``, ``tag_rh``); the pending table's lookup (``p_hit``,
compared a cycle ahead); ``reorder_time``. Leaves: the request (``h_rtx``, stage J's
``j_valid``, ``j_psn``), the engine's busy flag and QP (``h_busy_qp``, ``hole_busy``) on
which the ack input and stages E and W wait, the mark written back (``hole_mark_*``).

Stages: the group search (``hole_vec``, ``hole_rest``, ``hole_cur``; a 16-bit lowest-bit
search after registers picks the hole), its PSN registered (``hole_r_*``: the rings'
address), the block RAMs' read (``hole_m_*``) and their output registers (``hole_d_*``),
then stage J (``hole_j_*``) registers the hole's records with its age, judges the time guard
from registers and writes the retransmit request; the mark moves to the first hole too young
the cycle after J. Latency: SACK taken to its first request 11 cycles, then one a cycle
with no idle cycle between groups. Forwarding: the pending table's insertions of the
cycles in flight are part of its lookup (a hole already requested is skipped, taking its
cycle)."""

from amaranth.hdl import Cat, Mux, Signal

from mrcnic.base.records import RtxCause, TIME_BITS
from mrcnic.base.gates import assign, take as _take
from mrcnic.tx.retransmit_tracker.common import (
    HOLE_GROUP, PSN, WORD, _or_index, at_most_one, lowest_set)

__all__ = ["HoleEngine"]


class HoleEngine:
    """The hole engine and its stage J; mixed into the tracker."""

    def _hole_engine(self, m, v):
        """The hole engine: the holes one SACK found, requested oldest first, one a cycle.

        The search over the two words is split by groups of :data:`HOLE_GROUP` bits: when
        stage W goes, the engine keeps the holes (``hole_vec``); one cycle later which groups
        have one (``hole_rest``, ``hole_load``); one more and the lowest such group is its
        current group
        (``hole_cur``), whose lowest bit is requested each cycle. The cycle the current
        group's last bit is requested, the next group is taken from ``hole_rest`` (its
        lowest group's one-hot kept in a register beside it, ``hole_rest_low``, and a word
        select by that one-hot, into registers), so groups follow each
        other with no idle cycle, and the request's address is a 16-bit search after
        registers."""
        (h_q, hole_busy, h_busy_qp, qs, s1_qp_ok, e_valid, e_q, fifos, w, w_valid, w_go, w_q,
         sack_ok,
         holes, k_nonempty, p0, w_rec, rtx_rec, tag_rh, rec_rh, r_time, p_hit, mark_w,
         ev, trig_rec) = _take(v, """
            h_q hole_busy h_busy_qp qs s1_qp_ok e_valid e_q fifos w w_valid w_go w_q sack_ok holes
            k_nonempty p0 w_rec rtx_rec tag_rh rec_rh r_time p_hit mark_w ev trig_rec""")
        G = HOLE_GROUP
        NG = 2 * WORD // G
        h_vec = Signal(2 * WORD, name="hole_vec")
        h_rest = Signal(NG, name="hole_rest")      # groups with a hole, not yet current
        h_cur = Signal(G, name="hole_cur")         # the current group's holes left
        h_cur_g = Signal(range(NG), name="hole_cur_g")
        h_cur_v = Signal(name="hole_cur_valid")
        h_p0 = Signal(PSN, name="hole_p0")
        # A request's records read: its PSN registered (hole_r_*), the rings addressed from
        # that register, their words out of the block RAMs' registers two cycles later
        # (hole_d_*), registered with the hole's age into stage J.
        h_emit = Signal(name="hole_r_valid")
        h_psn = Signal(PSN, name="hole_r_psn")
        # (Stages m and d carry the hole's place in the two words, 7 bits: its PSN is p0
        # plus that.)
        h_rd, h_rd_pos = Signal(name="hole_m_valid"), Signal(7, name="hole_m_pos")
        h_dv, h_dv_pos = Signal(name="hole_d_valid"), Signal(7, name="hole_d_pos")
        # Whether the engine has a hole left to request, as a register of its own: the SACK
        # input, stages E and W and the sent input wait on it.
        h_nz = Signal(name="hole_nz")
        # Stage J (hole_j_*): the hole's records, read in the h_emit cycle, registered with
        # the time guard's verdict on them; the request, its pending lookup and the mark
        # write are decided from these registers the cycle after.
        j_valid = Signal(name="hole_j_valid")
        mk_we = Signal(name="hole_mark_we")     # the mark written back (stage J, below)
        # The engine is busy (h_nz | h_emit | j_valid | mk_we) as a register of its own
        # (hole_busy_r, from those four's next values, below): the ack input's readiness
        # and stage E's and W's go start from one flip-flop.
        busy_r = Signal(name="hole_busy_r")
        m.d.comb += [hole_busy.eq(busy_r),
                     h_busy_qp.eq(s1_qp_ok & ((hole_busy & (qs == h_q)) |
                                              (e_valid & (qs == e_q)) | (w_valid & (qs == w_q))))]
        h_issue = h_cur_v & fifos["rtx"].room5
        _, c_idx, c_iso = lowest_set(m, h_cur, "hole_cur")
        # The current group's last hole: at most one bit set (from the group's bits, beside
        # the search, not after it).
        c_last = Signal(name="hole_cur_last")
        m.d.comb += c_last.eq(at_most_one(h_cur))
        # The hole's PSN, p0 + 16 x group + bit: p0 is 64-aligned, so its low 6 bits are
        # the group's low 2 bits and the bit's index, and above them p0's word number plus
        # the group's high bit (the request's block RAM address takes none of that carry at
        # outstanding = 128, a few bits of it above).
        h_next_psn = Signal(PSN)
        h_pos = Signal(7, name="hole_r_pos")
        m.d.comb += h_next_psn.eq(Cat(c_idx, h_cur_g[:2], h_p0[6:] + h_cur_g[2]))
        # The next group: the lowest of those left (hole_rest_low, a register kept with
        # hole_rest: its one-hot), taken when the current one empties.
        r_iso = Signal(NG, name="hole_rest_low")
        r_idx = _or_index(r_iso)
        refill = ~h_cur_v | (h_issue & c_last)
        # The next group's bits, taken by the one-hot (an AND-OR), not by its index.
        r_pick = Cat(*(Cat(*(r_iso[g] & h_vec[g * G + i] for g in range(NG))).any()
                       for i in range(G)))
        # The groups with a hole as hole_load finds them, and those left after the next
        # refill, each with its lowest group's one-hot.
        g_any = Cat(*(h_vec[g * G:(g + 1) * G].any() for g in range(NG)))
        r_left = Signal(NG, name="hole_rest_left")
        m.d.comb += r_left.eq(h_rest & ~r_iso)
        _, _, g_low = lowest_set(m, g_any, "hole_load_low", carry=False)
        _, _, r_low = lowest_set(m, r_left, "hole_rest_next", carry=False)
        # For the time guard (TIME_RULE): the trigger PSN's send time, to write the mark
        # back at the first hole too young to count as lost.
        h_ttime = Signal(TIME_BITS)
        h_tok = Signal()
        h_young_seen = Signal()
        # The groups with a hole are found the cycle after the holes are registered
        # (hole_load: hole_rest from hole_vec), not from stage W's masks in one cycle.
        h_load = Signal(name="hole_load")
        m.d.sync += h_load.eq(w_go & w.ok_u)
        with m.If(w_go):
            # Loaded whenever stage W goes (the engine is idle then): no enable behind the
            # hole search, which ends the longest path of stage W. (Its SACK is applied when
            # it goes: w.ok_u, not sack_ok, keeps W's go off the data.)
            m.d.sync += [h_vec.eq(holes), h_q.eq(w_q), h_rest.eq(0), r_iso.eq(0), h_cur_v.eq(0),
                         h_p0.eq(p0), h_ttime.eq(w_rec.time), h_tok.eq(trig_rec),
                         h_young_seen.eq(0)]
            # Busy while the search was not empty (a comparison of its bounds), not
            # whether it found a hole (an OR over 128 bits after the masks): a search
            # whose PSNs were all acknowledged keeps the engine two cycles, as its groups
            # are found empty (hole_load, then refill) and h_nz falls.
            m.d.sync += h_nz.eq(w.ok_u & k_nonempty)
        with m.Elif(h_load):
            m.d.sync += [h_rest.eq(g_any), r_iso.eq(g_low)]
        with m.Elif(refill):
            m.d.sync += [h_cur.eq(r_pick), h_cur_g.eq(r_idx),
                         h_cur_v.eq(h_rest.any()), h_rest.eq(r_left), r_iso.eq(r_low),
                         h_nz.eq(h_rest.any())]
        with m.Elif(h_issue):
            m.d.sync += h_cur.eq(h_cur & ~c_iso)
        m.d.sync += [h_emit.eq(h_issue), h_psn.eq(h_next_psn), h_pos.eq(Cat(c_idx, h_cur_g))]
        j_psn, j_ev, j_tag, h_young, h_dv_psn = self._hole_stage_j(
            m, rec_rh, tag_rh, r_time, h_ttime, h_tok, h_p0, h_emit, h_pos, j_valid,
            h_rd, h_rd_pos, h_dv, h_dv_pos)
        with m.If(j_valid):
            m.d.comb += assign(rtx_rec, qp=h_q, psn=j_psn, tag=j_tag, ev=j_ev,
                               cause=RtxCause.HOLE)
        h_old = j_valid & ~h_young             # a hole that counts as lost
        h_rtx = h_old & ~p_hit
        # The mark moves back to the first young hole the cycle after stage J (from
        # registers, hole_mark_*); the engine counts as busy until then. Stage W is idle
        # while the engine runs (w_go needs ~hole_busy), so the mark's write port is free.
        mk_psn = Signal(PSN, name="hole_mark_psn")
        m.d.sync += [mk_we.eq(j_valid & h_young & ~h_young_seen), mk_psn.eq(j_psn)]
        with m.If(j_valid & h_young):
            m.d.sync += h_young_seen.eq(1)
        with m.If(mk_we):
            m.d.comb += [mark_w.addr.eq(h_q), mark_w.en.eq(1), mark_w.data.eq(mk_psn)]
        m.d.comb += [ev.rtx_hole.eq(h_rtx), ev.hole_young.eq(j_valid & h_young)]
        h_nz_next = Signal(name="hole_nz_next")
        m.d.comb += h_nz_next.eq(Mux(w_go, w.ok_u & k_nonempty,
                                     Mux(~h_load & refill, h_rest.any(), h_nz)))
        m.d.sync += busy_r.eq(h_nz_next | h_issue | h_emit | h_rd | h_dv |
                              (j_valid & h_young & ~h_young_seen))

        vars(v).update(
            h_emit=h_emit, h_issue=h_issue, h_next_psn=h_next_psn, h_old=h_old, h_psn=h_psn,
            h_dv_psn=h_dv_psn, h_flight=h_emit | h_rd | h_dv | j_valid,
            j_psn=j_psn,
            j_valid=j_valid, h_rtx=h_rtx)

    @staticmethod
    def _hole_stage_j(m, rec_rh, tag_rh, r_time, h_ttime, h_tok, h_p0, h_emit, h_pos, j_valid,
                      h_rd, h_rd_pos, h_dv, h_dv_pos):
        """The hole engine's read of a hole's records (stages m and d) and its stage J:
        returns J's PSN, EV, tag and time-guard verdict, and stage d's PSN (the pending
        table's lookup a cycle ahead)."""
        # Stage J registers the hole's records as the block RAMs give them, with the time
        # guard's verdict: the hole is young when its age (the trigger's send time less
        # its own, signed) is below reorder_time, that is negative or, when it is not,
        # less reorder_time negative. The trigger's time less reorder_time is a register
        # (hole_trig_rt, a cycle after the trigger's time: the engine's first hole reaches
        # the block RAMs' output five cycles after it loads), so the two signs are two
        # carry chains side by side from the block RAM's output, registered.
        # (Exact: an age of 0 .. 2^31 - 1 less reorder_time, under 2^16, stays in range.)
        j_psn = Signal(PSN, name="hole_j_psn")
        j_ev = Signal.like(rec_rh.data.ev, name="hole_j_ev")
        j_tag = Signal.like(tag_rh.data, name="hole_j_tag")
        h_trt = Signal(TIME_BITS, name="hole_trig_rt")
        d_age, d_agert = (Signal(TIME_BITS, name="hole_d_age"),
                          Signal(TIME_BITS, name="hole_d_age_rt"))
        m.d.sync += h_trt.eq(h_ttime - r_time)
        m.d.comb += [d_age.eq(h_ttime - rec_rh.data.time), d_agert.eq(h_trt - rec_rh.data.time)]
        m.d.sync += [h_rd.eq(h_emit), h_rd_pos.eq(h_pos), h_dv.eq(h_rd), h_dv_pos.eq(h_rd_pos)]
        h_dv_psn = Signal(PSN, name="hole_d_psn")
        m.d.comb += h_dv_psn.eq(Cat(h_dv_pos[:6], h_p0[6:] + h_dv_pos[6]))
        h_young = Signal(name="hole_j_young")
        m.d.sync += [j_valid.eq(h_dv), j_psn.eq(h_dv_psn), j_ev.eq(rec_rh.data.ev),
                     j_tag.eq(tag_rh.data),
                     h_young.eq((r_time != 0) & (~h_tok | d_age[-1] | d_agert[-1]))]
        return j_psn, j_ev, j_tag, h_young, h_dv_psn
