"""The timeout scan of :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`:
stages S1, S2 (``scan_s2_*``) and S3 (``scan_s3_*``), and what the scan writes.

The scan visits each QP's unacknowledged PSNs in turn. **S1** reads the per-PSN rings, the
bitmap words, the QP's retry count and epoch and works out how far the count is past
``retry_linear``; **S2** tests what was read, works out the timeout exponent and the time
elapsed since the PSN was sent, places the PSN against the QP's CACK and next PSN and looks
it up in the pending table; **S3** tests lateness from registers (the elapsed time against
2^k) and decides: end the visit, go back to CACK + 1, try the PSN again, step, or
time it out (fired mark, retransmit request, feedback, error at the retry limit).

Reads: the context and ring read ports ``ctx_rt``, ``nxt_rt``, ``rec_rh``; stage E's and
W's occupancy; the sent path's ring write; the hole engine's requests (the scan yields the
shared ports to them). Leaves: S3's decision (``t_timeout``, ``t_exhaust``, ``t_retry``,
``t_end``), the retry-count writes (``r_written*``) and the output FIFOs' write enables of
every requester (stage W, the hole engine, the timer).

Nothing is forwarded into the scan: a PSN whose words, ring entry or context were written
while it was in flight is stale (``scan_s2_wstale``, ``scan_s2_kstale``, S3's hold) and is
tried again, which costs the scan cycles, never a wrong decision. One pass over 2 QPs with
100 + 60 PSNs outstanding takes 170 cycles: a QP's visit, its outstanding PSNs and 5 (the
first PSN's way through stages S0 to S3, and the end of the visit)."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Mux, Signal, Value, signed

from mrcnic.base.records import ErrorCause, RtxCause, FeedbackKind, TIME_BITS
from mrcnic.base.gates import assign, take as _take
from mrcnic.base.rules import MAX_TIMEOUT_EXP, RETRY_FOREVER
from mrcnic.tx.retransmit_tracker.common import EPOCH_BITS, PSN, REC, _eq_parts, ge_mask

__all__ = ["TimerStages"]


class TimerStages:
    """The timeout scan's stages S1, S2 and S3 and its writes; mixed into the tracker."""

    def _timer_scan(self, m, v):
        """The timer scan's stages S1 and S2, which visit each QP's unacknowledged PSNs for
        timeouts: S1 reads the block RAMs and works out the QP's timeout, S2 tests what was
        read, places the PSN against the QP's CACK and next PSN, and (in the pending table)
        looks it up, into registers for stage S3 (:meth:`_timer_decide`)."""
        (qb, cmd_busy, rec_addr, rec_rh, h_emit, h_q, h_psn, tag_rh, rq_r, banks, bank_addr,
         retries, t_exp, r_lin, r_max, epoch, e_valid, e_q, WORDL, wq, ob, take_s, s,
         ctx_rt, nxt_rt, qs, w_valid, w_q, ring_we, ring_addr, qa, err, err_late) = _take(v, """
            qb cmd_busy rec_addr rec_rh h_emit h_q h_psn tag_rh rq_r banks bank_addr retries
            t_exp r_lin r_max epoch e_valid e_q WORDL wq ob take_s s ctx_rt nxt_rt qs w_valid w_q
            ring_we ring_addr qa err err_late""")
        # --- Timer scan ---------------------------------------------------------------------
        # Stage S0 (sc_*): the PSN whose record and timeout mark are read, addressed from
        # registers, their words out of the block RAMs in stage S2; its tag is read in S1,
        # and out in S3. (The hole engine takes the record and tag ports in the cycles it
        # reads a hole's: the PSN is then tried again, s*_port.)
        sc_q, sc_p, sc_on = Signal(qb), Signal(PSN), Signal()
        s1_valid, s1_q, s1_p, s1_port = (
            Signal(name="scan_s1_valid"), Signal(qb, name="scan_s1_q"),
            Signal(PSN, name="scan_s1_p"), Signal(name="scan_s1_port"))
        s2_valid, s2_q, s2_p, s2_port = (
            Signal(name="scan_s2_valid"), Signal(qb, name="scan_s2_q"),
            Signal(PSN, name="scan_s2_p"), Signal(name="scan_s2_port"))
        issue = sc_on & ~cmd_busy
        sc_addr = rec_addr(sc_q, sc_p)
        s_w = s1_p[6:]
        m.d.comb += [
            rec_rh.addr.eq(Mux(h_emit, rec_addr(h_q, h_psn), sc_addr)),
            tag_rh.addr.eq(Mux(h_emit, rec_addr(h_q, h_psn), rec_addr(s1_q, s1_p))),
            rq_r.addr.eq(sc_addr),
            banks[0][2].addr.eq(bank_addr(s1_q, s_w)),
            banks[1][2].addr.eq(bank_addr(s1_q, s_w)),
        ]
        m.d.sync += [s1_valid.eq(issue), s1_q.eq(sc_q), s1_p.eq(sc_p), s1_port.eq(~h_emit),
                     s2_valid.eq(s1_valid), s2_q.eq(s1_q), s2_p.eq(s1_p),
                     s2_port.eq(s1_port & ~h_emit)]
        # Stage S1 (the issue cycle) works out the QP's timeout from its retry count: the
        # exponent k (timeout = 2^k ticks), whether the count is at retry_max, and the QP's
        # epoch, registered for stage S2. A retry count written in this cycle for the QP
        # (scan_s2_kstale) makes stage S2 try the PSN again.
        m.d.comb += [retries.rs.addr.eq(s1_q), epoch.rs.addr.eq(s1_q)]
        r_s1 = retries.rs.data
        # The exponent k = min(timeout_exp + max(0, r - retry_linear), MAX_TIMEOUT_EXP) here,
        # from the count r read: three short carry chains side by side against registers
        # that follow the configuration a cycle late (r <= retry_linear; r + timeout_exp -
        # retry_linear; r past the count at which that sum passes MAX_TIMEOUT_EXP), then a
        # pick. (S2 decodes it into the mask of 2^k and above beside the time elapsed.)
        k_c = Signal(signed(8), name="scan_k_c")        # timeout_exp - retry_linear
        k_thr = Signal(signed(8), name="scan_k_thr")    # MAX_TIMEOUT_EXP - k_c
        k_e0 = Signal(5, name="scan_k_exp0")            # min(timeout_exp, MAX_TIMEOUT_EXP)
        m.d.sync += [k_c.eq(t_exp - r_lin), k_thr.eq(MAX_TIMEOUT_EXP - (t_exp - r_lin)),
                     k_e0.eq(Mux(t_exp > MAX_TIMEOUT_EXP, MAX_TIMEOUT_EXP, t_exp))]
        k_sum = Signal(signed(8), name="scan_s1_ksum")
        m.d.comb += k_sum.eq(r_s1 + k_c)
        t_k = Signal(5, name="scan_s2_kexp")
        t_rmax = Signal(name="scan_s2_rmax")
        t_epoch = Signal(EPOCH_BITS, name="scan_s2_epoch")
        t_kstale = Signal(name="scan_s2_kstale")
        r_written = Signal()
        # Stage W writing the QP's bitmap words in the cycle S1 reads them (the read gives
        # the old words, while S2 reads the context after the write): the PSN is stale.
        t_wstale = Signal(name="scan_s2_wstale")
        m.d.sync += [t_k.eq(Mux(r_s1 <= r_lin, k_e0,
                                Mux(r_s1 > k_thr, MAX_TIMEOUT_EXP, k_sum[:5]))),
                     t_rmax.eq(r_s1 == r_max), t_epoch.eq(epoch.rs.data),
                     t_kstale.eq(r_written), t_wstale.eq(w_valid & (w_q == s1_q))]
        # Stage S2 works out what the memories read say about the PSN (acknowledged, late,
        # its request already fired) into registers for stage S3, with the record's fields
        # a request needs (its tag leaves the block RAM in S3).
        s2w = s2_p[6:]
        t_word = Signal(WORDL)
        m.d.comb += t_word.eq(Mux(s2w[0], banks[1][2].data, banks[0][2].data))
        rq_d = rq_r.data
        s3_valid, s3_q, s3_p = (Signal(name="scan_s3_valid"), Signal(qb, name="scan_s3_q"),
                                Signal(PSN, name="scan_s3_p"))
        s3 = SimpleNamespace(**{n: Signal(name=f"scan_s3_{n}") for n in (
            "port", "kstale", "rmax", "acked", "late", "fired", "stale", "behind", "in_win",
            "head", "err")})
        s3.r_sat = Signal(name="scan_s3_retries_sat")     # the retry count at 31
        s3.r_inc = Signal(5, name="scan_s3_retries_inc")  # the retry count plus one
        m.d.comb += retries.rt.addr.eq(s2_q)
        # The PSN against its QP's CACK and next PSN, read here (a write to them in this
        # cycle, by stage W or a sent record of this PSN, makes the PSN stale in S3).
        m.d.comb += [ctx_rt.addr.eq(s2_q), nxt_rt.addr.eq(s2_q)]
        s3_cack = Signal(PSN, name="scan_s3_cack")
        t_dp, t_dn = Signal(PSN, name="scan_s2_dp"), Signal(PSN, name="scan_s2_dn")
        m.d.comb += [t_dp.eq(s2_p - ctx_rt.data.cack), t_dn.eq(nxt_rt.data - ctx_rt.data.cack)]
        t_behind = (s2_p == ctx_rt.data.cack) | t_dp[-1]
        m.d.sync += [s3_cack.eq(ctx_rt.data.cack), s3.behind.eq(t_behind),
                     # (t_dn is at most outstanding + 1: the comparison on the low
                     # log2(outstanding) + 1 bits, beside the test of t_dp's high ones.)
                     s3.in_win.eq(~t_behind & ~t_dp[ob + 1:].any() &
                                  (t_dp[:ob + 1] < t_dn[:ob + 1])),
                     s3.head.eq(t_dp == 1)]
        s3_epoch = Signal(EPOCH_BITS, name="scan_s3_epoch")
        s3_rec = Signal(REC, name="scan_s3_rec")
        n_pairs = (len(Value.cast(rq_d)) + 1) // 2
        s3_fired_parts = Signal((n_pairs + 7) // 8, name="scan_s3_fired_parts")
        m.d.comb += s3.fired.eq(s3_fired_parts.all())
        # Late: the time elapsed (now less the send time, as the block RAM gives it) at or
        # above 2^k. S2 ANDs it with the mask of 2^k and above (decoded from S1's exponent,
        # beside the subtraction) and ORs the result by bytes; S3 ORs the 4 parts.
        t_el = Signal(TIME_BITS, name="scan_s2_elapsed")
        t_kmask = Signal(TIME_BITS, name="scan_s2_kmask")
        m.d.comb += [t_el.eq(self.now - rec_rh.data.time), t_kmask.eq(ge_mask(t_k, TIME_BITS))]
        s3_late_parts = Signal(TIME_BITS // 8, name="scan_s3_late_parts")
        m.d.comb += s3.late.eq(s3_late_parts.any())
        s3_squash = Signal()                  # stage S3 sends the scan elsewhere
        r_written2 = Signal()                 # the retry count of s2_q written this cycle
        m.d.sync += [
            s3_valid.eq(s2_valid & ~cmd_busy & ~s3_squash), s3_q.eq(s2_q), s3_p.eq(s2_p),
            s3_epoch.eq(t_epoch), s3_rec.eq(rec_rh.data),
            s3_late_parts.eq(Cat(*((t_el & t_kmask)[i:i + 8].any()
                                   for i in range(0, TIME_BITS, 8)))),
            s3.port.eq(s2_port), s3.kstale.eq(t_kstale | r_written2),
            s3.rmax.eq(t_rmax),
            # The QP's error flag, read here (S3 adds the one its own timeout set a cycle
            # before, qp_err_timer, not yet written: the PSN behind it is of the same QP;
            # stage W's fatal NACK of the QP holds S3).
            s3.err.eq(err.bit_select(s2_q, 1) | err_late),
            # The QP's retry count, for the write of a timeout of its oldest PSN.
            s3.r_sat.eq(retries.rt.data == 31), s3.r_inc.eq(retries.rt.data + 1),
            s3.acked.eq((t_word.lap == s2w[wq:]) & (t_word.epoch == t_epoch) &
                        t_word.bits.bit_select(s2_p[:6], 1)),
            # The fired mark's fields against the record's, as partial equalities of 16
            # bits each (three LUTs after the block RAMs), ANDed in S3 (one LUT).
            s3_fired_parts.eq(_eq_parts(
                Cat(rq_d.valid, rq_d.rtx, rq_d.time, rq_d.lap, rq_d.epoch),
                Cat(Const(1, 1), rec_rh.data.rtx, rec_rh.data.time, s2_p[ob:], t_epoch),
                group=8)),
            # What S1 read may be stale in S3, which reads the context: stage W held a record
            # of the QP as S1 read, stage E or W holds one (W may have written its context
            # and bitmap words), or a sent record of this PSN was taken (its record written,
            # and for a new PSN the next PSN; or in the cycle before, its ring write in
            # flight as S1 read). The same registers say whether stage E or W will hold a
            # record of the QP while the PSN is in S3 (S3's hold): W will hold what E or W
            # holds now, E what it holds or the record at the input (valid, taken or not: a
            # superset, which only makes the scan try the PSN again), so S3 compares no QP.
            s3.stale.eq(t_wstale | (e_valid & (e_q == s2_q)) | (w_valid & (w_q == s2_q)) |
                        (self.ack.valid & (qa == s2_q)) |
                        (take_s & (qs == s2_q) & (s.psn == s2_p)) |
                        (ring_we & (ring_addr == rec_addr(s2_q, s2_p)))),
        ]
        vars(v).update(
            issue=issue, r_written=r_written, r_written2=r_written2, s2_q=s2_q, s2_p=s2_p,
            s1_q=s1_q, s1_valid=s1_valid,
            s3_cack=s3_cack,
            s2_valid=s2_valid, s3=s3, s3_epoch=s3_epoch, s3_p=s3_p, s3_q=s3_q, s3_rec=s3_rec,
            s3_squash=s3_squash, s3_valid=s3_valid, sc_on=sc_on, sc_p=sc_p, sc_q=sc_q)

    def _timer_decide(self, m, v):
        """The timer scan's stage S3: the PSN against the QP's context, the decision (end
        the visit, go back to CACK + 1, try the PSN again, step, or time it out), and where
        the scan goes next."""
        (qb, cmd_busy, r_max, room3, qps, ctx,
         issue, s2_valid, s3, s3_p, s3_q, s3_squash, s3_valid, sc_on, sc_p, sc_q, w_valid,
         s3_cack, s1_valid, h_flight, err_late, err_late_q) = _take(v, """
            qb cmd_busy r_max room3 qps ctx issue
            s2_valid s3 s3_p s3_q s3_squash s3_valid sc_on sc_p sc_q w_valid s3_cack
            s1_valid h_flight err_late err_late_q""")
        # The pending table looked up for S3's PSN in S2 (scan_s3_pmatch, pending table)
        t_phit = Signal(name="scan_s3_phit")
        # Stage S3 decides. It holds (tries the PSN again) while stage E or W holds a record
        # of its QP (W may write the QP's context and bitmap words at the end of this
        # cycle): no value is forwarded from the SACK path into the scan. Whether they
        # may is worked out in S2 (scan_s3_stale, above).
        t_hold = Signal(name="scan_s3_hold")
        m.d.comb += t_hold.eq(s3.stale)
        t_cack = s3_cack
        t_behind = s3.behind
        t_in = s3.in_win
        # The QP's error: read in S2, or set by the timeout S3 fired the cycle before (the
        # PSN in S2 then is of the same QP: the scan visits one QP at a time).
        t_err = s3.err | err_late
        expired = ~s3.acked & s3.late & ~s3.fired
        head = s3.head
        exhaust = expired & head & s3.rmax & (r_max < RETRY_FOREVER)
        # The outputs are another's while stage W holds a record or a hole request is in
        # the engine's stages (whose room was counted without the timer's record).
        busy_out = w_valid | h_flight | ~room3
        s3_live = s3_valid & ~cmd_busy
        s3_go = s3_live & ~t_hold
        # What stage S3 does: end the visit, go back to CACK + 1, retry the PSN, or step.
        t_end = s3_go & (t_err | (~t_behind & ~t_in))
        t_rewind = s3_go & ~t_err & t_behind
        t_eval = s3_go & ~t_err & t_in
        t_retry = (s3_live & t_hold) | (t_eval & (~s3.port | s3.kstale | (expired & busy_out)))
        # The pending lookup below is keyed on (s3_q, s3_p) when neither the hole engine nor
        # stage W uses it (~busy_out): an expired PSN whose resend is pending just steps on.
        t_fire = t_eval & s3.port & ~s3.kstale & expired & ~busy_out & ~t_phit
        t_timeout = t_fire & ~exhaust
        t_exhaust = t_fire & exhaust
        m.d.sync += [err_late.eq(t_exhaust), err_late_q.eq(s3_q)]
        next_q = Mux(sc_q == qps - 1, 0, sc_q + 1)[:qb]
        start_ctx = ctx.read_port(domain="comb")
        m.d.comb += start_ctx.addr.eq(sc_q)
        # A redirect drops the PSNs in stages S1 and S2 too (S0 then issues the new one).
        m.d.comb += s3_squash.eq(t_end | t_rewind | t_retry)
        with m.If(t_end):
            m.d.sync += [sc_on.eq(0), s1_valid.eq(0), s2_valid.eq(0), sc_q.eq(next_q)]
        with m.Elif(t_rewind):
            m.d.sync += [sc_p.eq(t_cack + 1), s1_valid.eq(0), s2_valid.eq(0)]
        with m.Elif(t_retry):
            m.d.sync += [sc_p.eq(s3_p), s1_valid.eq(0), s2_valid.eq(0)]
        with m.Elif(~sc_on & ~cmd_busy & ~s1_valid & ~s2_valid & ~s3_valid):
            m.d.sync += [sc_on.eq(1), sc_p.eq(start_ctx.data.cack + 1)]
        with m.Elif(issue):
            m.d.sync += sc_p.eq(sc_p + 1)

        vars(v).update(
            busy_out=busy_out, exhaust=exhaust, expired=expired, head=head, t_end=t_end,
            t_phit=t_phit,
            t_eval=t_eval, t_exhaust=t_exhaust, t_retry=t_retry, t_timeout=t_timeout)

    def _timer_writes(self, m, v):
        """What the timer writes: the fired mark of a PSN timed out, its retransmit request,
        feedback and error records, and the output FIFOs' write enables (with stage W's and
        the hole engine's) and the events the scan and the inputs count."""
        (rec_addr, rq_w, ob, w_valid, j_valid, tag_rh, rtx_rec, fb_rec, err_rec, fifos, e_rtx,
         h_rtx, w_go, e_fb, e_err, ev, take_s, s1_qp_ok, w, take_c, s_err, qps, s3,
         s3_epoch, s3_p, s3_q, s3_rec, busy_out, exhaust, expired, t_end, t_eval, t_exhaust,
         t_retry, t_timeout) = _take(v, """
            rec_addr rq_w ob w_valid j_valid tag_rh rtx_rec fb_rec err_rec fifos e_rtx h_rtx w_go
            e_fb e_err ev take_s s1_qp_ok w take_c s_err qps s3 s3_epoch s3_p s3_q s3_rec
            busy_out exhaust expired t_end t_eval t_exhaust t_retry t_timeout""")
        # The PSN's request marked as fired whether or not the pending table holds it (a
        # pending PSN's entry leaves only when it is resent, acknowledged or its QP is
        # reopened or in error, each of which makes the mark moot): the pending lookup
        # does not reach the memory's write enable. Its address and data are stage S3's
        # registers, whether or not it writes: only the enable waits for the decision.
        m.d.comb += [rq_w.addr.eq(rec_addr(s3_q, s3_p)),
                     rq_w.en.eq(t_eval & s3.port & ~s3.kstale & expired & ~busy_out & ~exhaust),
                     *assign(rq_w.data, valid=1, time=s3_rec.time,
                             rtx=s3_rec.rtx, lap=s3_p[ob:], epoch=s3_epoch)]
        # (The timer writes only while stage W and the hole engine hold no record.)
        with m.If(~w_valid & ~j_valid):
            m.d.comb += [
                *assign(rtx_rec, qp=s3_q, psn=s3_p, tag=tag_rh.data, ev=s3_rec.ev,
                        cause=RtxCause.TIMEOUT),
                *assign(fb_rec, qp=s3_q, ev=s3_rec.ev, kind=FeedbackKind.TIMEOUT),
            ]
        with m.If(~w_valid):
            m.d.comb += assign(err_rec, qp=s3_q, cause=ErrorCause.RETRIES)
        m.d.comb += [
            fifos["rtx"].w_en.eq(e_rtx | h_rtx | t_timeout),
            fifos["feedback"].w_en.eq((w_go & e_fb) | t_timeout),
            fifos["qp_error"].w_en.eq(e_err | t_exhaust),
            ev.feedback.eq(fifos["feedback"].written),
            ev.rtx_timeout.eq(t_timeout),
            ev.retries_exhausted.eq(t_exhaust),
            ev.scan_visits.eq(t_end),
            ev.scan_yields.eq(t_retry),
            ev.no_qp.eq((take_s & ~s1_qp_ok) + (w_go & ~w.qp_ok) +
                        (take_c & (self.cwnd.payload.qp >= qps))),
            ev.in_error.eq((take_s & s1_qp_ok & s_err) + (w_go & w.qp_ok & w.in_err)),
        ]
