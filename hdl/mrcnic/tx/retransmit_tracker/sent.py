"""The sent path of :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`:
stage S1 (``sent_s1_*``) and the ring write (``sent_ring_*``).

Reads: the ``sent`` input; the QP's CACK, next PSN and error (read ports ``ctx_rs``,
``nxt_rs``, ``err``), its congestion window; stage W's registers (``w_*``).
Leaves: the ring write (``ring_we``, ``ring_addr``), the next PSN written (``nxt_w``),
whether stage S1 holds a record and may go (``s1_valid``, ``s_cond``), the credit query's
view of it, and stage W's CACK and error as forwarded (``sack_w_fwd_*``).

Latency: a record taken in cycle t is judged in t+1 (stage S1) and written into the
per-PSN rings in t+2, from registers. Throughput: one record a cycle across QPs, and for one
QP whose SACKs arrive back to back, one every two cycles.

Forwarding: stage W's CACK and error of the same QP, from W's registers (the record is
compared with both CACKs, W's and the stored one, and the forwarding picks one at the end).
Stall: a record waits in S1 while stage E holds an ack record of its QP (E's decision is
not forwarded, to keep it off this path); a retransmission also while stage E holds any
record, stage W one it does not apply this cycle, or the hole engine a SACK of its QP."""

from amaranth.hdl import Const, Mux, Signal, Value
from amaranth.utils import ceil_log2

from mrcnic.base.gates import assign, take as _take
from mrcnic.tx.retransmit_tracker.common import PSN, REC

__all__ = ["SentPath"]


class SentPath:
    """Stage S1 of the sent path and the ring write; mixed into the tracker."""

    @staticmethod
    def _credit_tests(O):
        """``(credit, credit_lt)``: whether a QP with ``n_out`` PSNs outstanding may send
        its next PSN (``credit``), or one more (``credit_lt``), given its MPR and window."""
        # The tests compare n_out, the PSNs outstanding (n - CACK, against the stored CACK
        # or stage W's), with each bound on the low log2(outstanding) + 1 bits alone: a
        # QP's n - CACK is 0 .. outstanding + 1 (as the ring-full test in _sent_path uses),
        # so a bound at or above 2^(log2(outstanding) + 1) always holds and the others
        # compare exactly there.
        nb = ceil_log2(O) + 1

        def small(x, n_out, strict):
            x = Value.cast(x)
            lo = (n_out[:nb] < x[:nb]) if strict else (n_out[:nb] <= x[:nb])
            return lo if len(x) <= nb else (x[nb:].any() | lo)

        def credit(n_out, mpr, cw, strict=False):
            # n_out x 2^pmtu_log2 <= cwnd, as n_out <= floor(cwnd / 2^pmtu_log2): the table
            # keeps the window in packets (the shift on the cwnd input, not after a read).
            return (small(mpr << 7, n_out, strict) & small(Const(O, nb), n_out, strict) &
                    small(cw, n_out, strict))

        def credit_lt(n_out, mpr, cw):
            # credit(n_out + 1, ...): each bound compared strictly.
            return credit(n_out, mpr, cw, strict=True)

        return credit, credit_lt

    def _sent_path(self, m, v):
        """The sent path, stage S1: each record judged against the stored CACK and stage
        W's (forwarded), recorded or refused."""
        (cmd_busy, e_valid, qb, qidx, ctx_rs, nxt_rs, err_of, O, cwnd, qps, rec_w,
         rec_addr, tag_w, nxt_w, ev, w_valid, w_go, w_q, epoch) = _take(v, """
            cmd_busy e_valid qb qidx ctx_rs nxt_rs err_of O cwnd qps rec_w rec_addr tag_w
            nxt_w ev w_valid w_go w_q epoch""")
        e_go = Signal(name="sack_e_go")
        # Stage S1 (sent_s1_*): the input record in a register, with its QP's index, so that
        # the judgement starts from flip-flops; the record is judged (and counts as sent)
        # in the cycle it leaves the register (take_s). The ack input takes no record while
        # one waits here, so an ack record sees exactly the sent records taken before its
        # own cycle (and, in the same cycle, comes before the sent record taken with it).
        s = Signal.like(self.sent.payload, name="sent_s1_rec")
        s1_valid = Signal(name="sent_s1_valid")
        s1_qp_ok = Signal(name="sent_s1_qp_ok")
        s_cond = Signal(name="sent_s1_go_ok")       # the record may be judged this cycle
        take_s = Signal(name="sent_s1_go")
        m.d.comb += [take_s.eq(s1_valid & s_cond),
                     self.sent.ready.eq(~s1_valid | s_cond)]
        qs = Signal(qb, name="sent_s1_q")
        with m.If(self.sent.valid & self.sent.ready):
            m.d.sync += [s.eq(self.sent.payload), qs.eq(qidx(self.sent.payload.qp)),
                         s1_qp_ok.eq(self.sent.payload.qp < qps)]
        with m.If(self.sent.valid & self.sent.ready):
            m.d.sync += s1_valid.eq(1)
        with m.Elif(take_s):
            m.d.sync += s1_valid.eq(0)
        # While stage E holds a record, the sent records of its QP wait (stage E decides
        # from the QP's next PSN, and a sent record judged after it must see its CACK,
        # which only stage W's registers forward).
        # A retransmission taken frees a slot of the shared pending table, which stage W
        # looks up: while stage E holds a record or stage W one it does not apply in this
        # cycle, every retransmission waits. While a SACK is in stage E or W or the hole
        # engine reads the records of its holes, a retransmission on that QP waits, so
        # that a hole request carries the EV of the transmission the SACK saw lost.
        h_busy_qp = Signal()
        m.d.comb += [ctx_rs.addr.eq(qs), nxt_rs.addr.eq(qs)]
        e_q = Signal(qb, name="sack_e_q")
        m.d.comb += s_cond.eq(
            ~cmd_busy & ~(e_valid & ((qs == e_q) | s.rtx)) &
            ~(w_valid & ~w_go & s.rtx) & ~(h_busy_qp & s.rtx))
        # Stage W writes CACK and error at the end of the cycle it goes: both forwarded from
        # its registers, so a sent record sees every ack record taken before the cycle it
        # is judged in.
        w_fwd_we, w_fwd_cack, w_fwd_fatal = (Signal(name="sack_w_fwd_we"),
                                             Signal(PSN, name="sack_w_fwd_cack"),
                                             Signal(name="sack_w_fwd_fatal"))
        # Stage W advances CACK only to its SACK's CACK, so the sent record is judged
        # against both CACKs at once (sent_s1_*_w: stage W's, *_c: the stored one) and the
        # forwarding picks one at the end: a multiplexer after the comparisons instead of
        # a stage in front of them.
        s_fwd_w = Signal(name="sent_s1_fwd_w")
        m.d.comb += s_fwd_w.eq(w_fwd_we & (w_q == qs))
        s_err = err_of(qs) | (w_fwd_fatal & (w_q == qs))
        s_n = nxt_rs.data

        credit, credit_lt = self._credit_tests(O)

        cwnd_rs = cwnd.read_port(domain="comb")
        m.d.comb += cwnd_rs.addr.eq(qs)

        def judge(cack, tag):
            out = Signal(PSN, name=f"sent_s1_out_{tag}")     # PSNs outstanding once n is sent
            dp = Signal(PSN, name=f"sent_s1_dp_{tag}")
            m.d.comb += [out.eq(s_n - cack), dp.eq(s.psn - cack)]
            # The ring is full for a new PSN (the record's PSN is n) when psn - CACK passes
            # outstanding. A QP's n - CACK is 1 .. outstanding + 1 (a new PSN is taken only
            # while it is at most outstanding, CACK never passes n - 1, an open makes it 1):
            # so full is n - CACK = outstanding + 1, from dp's bits 0 and log2(outstanding)
            # (the low end of its carry chain; outstanding is a power of two).
            ob = ceil_log2(O)
            full = dp[ob] & dp[0]
            # In the window, 0 < dp < out: as out is at most outstanding + 1, dp below it
            # has no bit above the low log2(outstanding) + 1, where the two compare exactly
            # (a short comparison beside the test of dp's high bits, not a 24-bit one after
            # the two subtractions).
            nb = ob + 1
            below = ~dp[nb:].any() & (dp[:nb] < out[:nb])
            return (full, (dp != 0) & below, (dp == 0) | dp[-1],
                    credit(out, ctx_rs.data.mpr, cwnd_rs.data))

        j_w, j_c = judge(w_fwd_cack, "w"), judge(ctx_rs.data.cack, "c")
        over, in_win, behind = (Mux(s_fwd_w, b, c) for b, c in zip(j_w[:3], j_c[:3]))
        s_ok = take_s & s1_qp_ok & ~s_err
        s_new = s_ok & ~s.rtx & (s.psn == s_n)
        s_full = s_new & over
        s_new_ok = s_new & ~s_full
        s_rtx_ok = s_ok & s.rtx & in_win
        # The record and tag rings are written a cycle after the decision, from registers
        # (sent_ring_*), so that the decision ends at flip-flops and not at the block
        # RAMs' write enables. Their readers see the write in flight: the SACK path's and
        # the hole engine's read ports are transparent to it, and the timer scan takes a
        # PSN whose write is in flight as stale (scan_s3_stale).
        ring_we = Signal(name="sent_ring_we")
        ring_tag_we = Signal(name="sent_ring_tag_we")
        ring_addr = Signal.like(rec_w.addr, name="sent_ring_addr")
        ring_rec = Signal(REC, name="sent_ring_rec")
        ring_tag = Signal.like(tag_w.data, name="sent_ring_tag")
        # (The record carries the QP's epoch: stage W takes a trigger PSN's record as this
        # open's only with it.)
        m.d.comb += epoch.rj.addr.eq(qs)
        m.d.sync += [ring_we.eq(s_new_ok | s_rtx_ok), ring_tag_we.eq(s_new_ok),
                     ring_addr.eq(rec_addr(qs, s.psn)),
                     *assign(ring_rec, ev=s.ev, time=s.time, rtx=s.rtx, epoch=epoch.rj.data),
                     ring_tag.eq(s.tag)]
        m.d.comb += [rec_w.addr.eq(ring_addr), rec_w.en.eq(ring_we), rec_w.data.eq(ring_rec),
                     tag_w.addr.eq(ring_addr), tag_w.en.eq(ring_tag_we),
                     tag_w.data.eq(ring_tag)]
        # The next PSN's address and value do not wait for the decision (an open, while
        # no record is judged, overrides them below): only the write enable does.
        # The enable leaves out the ring-full test (a carry chain after the next PSN's
        # read): a new PSN refused as the ring is full writes its own PSN back, unchanged.
        # (Both kept as signals: without, synthesis folds the data's choice into the
        # distributed RAM's write enable, a carry chain and the context's read deep.)
        # The enable leaves out the QP's error too (the error flag and stage W's fatal
        # verdict): an errored QP's next PSN is read by no one until an open rewrites it
        # (the SACK path, the timer and the credit query test the error first), and
        # without the retransmission's waits of s_cond, written out for a new PSN.
        nxt_we = Signal(name="sent_s1_nxt_we", attrs={"keep": 1})
        nxt_wd = Signal(PSN, name="sent_s1_nxt_wd", attrs={"keep": 1})
        s_new_we = (s1_valid & ~s.rtx & ~cmd_busy & ~(e_valid & (qs == e_q)) & s1_qp_ok &
                    (s.psn == s_n))
        m.d.comb += [nxt_we.eq(s_new_we), nxt_wd.eq(Mux(over, s.psn, s.psn + 1)),
                     nxt_w.addr.eq(qs), nxt_w.data.eq(nxt_wd), nxt_w.en.eq(nxt_we)]
        self._sent_events(m, ev, s, s_ok, s_new_ok, s_n, s_fwd_w, over, in_win, behind,
                          j_w[3], j_c[3])

        vars(v).update(
            credit=credit, credit_lt=credit_lt, e_go=e_go, e_q=e_q, h_busy_qp=h_busy_qp, qs=qs,
            s=s, s_err=s_err,
            s_rtx_ok=s_rtx_ok, take_s=take_s, ring_we=ring_we, ring_addr=ring_addr,
            s1_valid=s1_valid, s1_qp_ok=s1_qp_ok, s_cond=s_cond, w_fwd_cack=w_fwd_cack,
            w_fwd_fatal=w_fwd_fatal,
            w_fwd_we=w_fwd_we)

    @staticmethod
    def _sent_events(m, ev, s, s_ok, s_new_ok, s_n, s_fwd_w, over, in_win, behind, credit_w,
                     credit_c):
        """The sent record's events, counted the cycle after its judgement from its parts
        registered (``sent_s2_*``)."""
        # A new PSN taken without credit is counted a cycle later, from the two credit
        # tests and the forwarding's pick registered (the tests end at flip-flops, not at
        # the counters' adders).
        oc_new, oc_fwd = Signal(name="sent_s2_oc_new"), Signal(name="sent_s2_oc_fwd")
        oc_w, oc_c = Signal(name="sent_s2_credit_w"), Signal(name="sent_s2_credit_c")
        over_credit = oc_new & ~Mux(oc_fwd, oc_w, oc_c)
        m.d.sync += [oc_new.eq(s_new_ok), oc_fwd.eq(s_fwd_w), oc_w.eq(credit_w), oc_c.eq(credit_c)]
        # The other events of the sent record are counted a cycle later too, from its
        # judgement's parts registered (sent_s2_ev_*): the judgement ends at flip-flops, not
        # at the event logic in front of the counters.
        r_ok, r_rtx, r_next, r_over, r_in, r_behind = (
            Signal(name=f"sent_s2_ev_{n}") for n in ("ok", "rtx", "next", "over", "in_win",
                                                      "behind"))
        m.d.sync += [r_ok.eq(s_ok), r_rtx.eq(s.rtx), r_next.eq(s.psn == s_n), r_over.eq(over),
                     r_in.eq(in_win), r_behind.eq(behind)]
        r_new = r_ok & ~r_rtx & r_next
        r_rtx_ok, r_rtx_acked = r_ok & r_rtx & r_in, r_ok & r_rtx & r_behind
        m.d.comb += [
            ev.sent_new.eq(r_new & ~r_over),
            ev.sent_rtx.eq(r_rtx_ok),
            ev.sent_acked.eq(r_rtx_acked),
            ev.sent_ring_full.eq(r_new & r_over),
            ev.sent_over_credit.eq(over_credit),
            ev.sent_bad.eq(r_ok & ~r_new & ~r_rtx_ok & ~r_rtx_acked),
        ]
