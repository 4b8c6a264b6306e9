"""The pending table of :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`
(``pend_*``): the (QP, PSN) of each retransmission requested and not yet resent, so that
none is requested twice (:data:`~.common.PENDING_RULE`).

Three requesters, never in the same cycle, each look their key up a cycle ahead of their
decision (``hole_j_pmatch``, ``sack_w_pmatch``, ``scan_s3_*``): the hole engine's stage J,
stage W (a NACK) and the timer's stage S3; the lookup covers the insertion of the cycle in
flight (``*_pins``). A retransmission sent (stage S1 of the sent path) removes its entry
the cycle after it is judged (``pend_rm_*``); CACK passing a PSN, an open and an error
remove the QP's entries (retries exhausted: a cycle later, with the QP's error flag,
``qp_err_timer``). Leaves ``p_hit`` (stage W), ``t_phit`` (timer) and stage J's hit.
A request made while the table is full goes out anyway, not remembered (``pending_full``)."""

from amaranth.hdl import Cat, Mux, Signal

from mrcnic.base.gates import take as _take

__all__ = ["PendingTable"]


class PendingTable:
    """The pending-retransmission table; mixed into the tracker."""

    def _pending_table(self, m, v):
        """The pending table: (QP, PSN) of the retransmissions requested, not yet resent."""
        (qb, j_valid, h_q, j_psn, w_valid, w_q, w, s3_q, s3_p, p_hit, nack_ok, h_old,
         t_timeout, s_rtx_ok, qs, s, fatal, sack_ok, err_late, err_late_q, cmd_qp, cmd_apply,
         e_go, w_go, ev, ob, s2_q, s2_p, t_phit, h_dv_psn, e_q, e_base) = _take(v, """
            qb j_valid h_q j_psn w_valid w_q w s3_q s3_p p_hit nack_ok h_old t_timeout
            s_rtx_ok qs s fatal sack_ok err_late err_late_q cmd_qp cmd_apply e_go w_go ev ob
            s2_q s2_p t_phit h_dv_psn e_q e_base""")
        # --- Pending retransmissions: (QP, PSN) requested, not yet resent ------------------
        # Three requesters, which never request in the same cycle, each with its lookup
        # (below): the hole engine (its stage J), stage W (a NACK needs w_go) and the timer
        # (its t_fire needs neither; the key written into a free slot is the requester's).
        P = self.pending
        pv = Signal(P, name="pend_valid")
        # A slot freed by a retransmission taken while a SACK's holes are still to be
        # requested stays taken for those requests (the model applies that SACK whole,
        # before the retransmission): "zombie" until the next SACK or NACK goes (w_go).
        pz = Signal(P, name="pend_zombie")
        # An entry's PSN is kept as its low log2(outstanding) + 1 bits: every PSN the table
        # holds or is asked about (a request's, a retransmission's taken) is after its QP's
        # CACK and before its next PSN, a window of at most ``outstanding`` PSNs, in which
        # those bits tell PSNs apart and their difference to CACK keeps its sign.
        PB = ob + 1
        pq = [Signal(qb, name=f"pend_qp{i}", reset_less=True) for i in range(P)]
        pp = [Signal(PB, name=f"pend_psn{i}", reset_less=True) for i in range(P)]
        k_q, k_p = Signal(qb, name="pend_key_q"), Signal(PB, name="pend_key_p")
        with m.If(j_valid):
            m.d.comb += [k_q.eq(h_q), k_p.eq(j_psn[:PB])]
        with m.Elif(w_valid):
            m.d.comb += [k_q.eq(w_q), k_p.eq(w.base[:PB])]
        with m.Else():
            m.d.comb += [k_q.eq(s3_q), k_p.eq(s3_p[:PB])]
        # An insert in two steps, so that no request decision ends in the table: the key is
        # written into the lowest free slot every cycle (a free slot's key is not looked
        # at), and the decision to insert is registered (pend_ins_*) with that slot, which
        # counts as valid from the next cycle on (pend_live) and is not free meanwhile.
        ins_valid = Signal(name="pend_ins_valid")
        ins_slot = Signal(P, name="pend_ins_slot")
        live = Signal(P, name="pend_live")
        m.d.comb += live.eq(pv | Mux(ins_valid, ins_slot, 0))
        # The hole engine's and the timer's lookups a stage ahead: the entries are compared
        # with the PSN the stage will hold a cycle later (hole_j_pmatch as the hole's records
        # leave the block RAMs, scan_s3_pmatch in the timer's stage S2), and so is the key
        # written this
        # cycle into the slot that an insert decided now makes live in that later cycle
        # (*_pins, the only entry whose key changes meanwhile). The match is masked then by
        # what is live: the same answer as a lookup in that cycle. (Live but for the slot an
        # insert makes live is ``pv``: an insert's slot was free, so not valid, when chosen.)
        def ahead(name, q, psn):
            pmatch, pins = Signal(P, name=f"{name}_pmatch"), Signal(name=f"{name}_pins")
            m.d.sync += [pmatch.eq(Cat(*((pq[i] == q) & (pp[i] == psn[:PB])
                                         for i in range(P)))),
                         pins.eq((k_q == q) & (k_p == psn[:PB]))]
            return (pmatch & pv).any() | (ins_valid & pins)
        j_hit = Signal(name="hole_j_phit")
        m.d.comb += [j_hit.eq(ahead("hole_j", h_q, h_dv_psn)),
                     t_phit.eq(ahead("scan_s3", s2_q, s2_p))]
        # Stage W's lookup (a NACK's PSN) the same way, compared with the record stage W
        # holds in the next cycle: stage E's as it goes on, else stage W's own.
        def compare(q, psn):
            return (Cat(*((pq[i] == q) & (pp[i] == psn[:PB]) for i in range(P))),
                    (k_q == q) & (k_p == psn[:PB]))
        (e_cmp, e_pins), (w_cmp, w_pins_now) = compare(e_q, e_base), compare(w_q, w.base)
        w_pmatch, w_pins = Signal(P, name="sack_w_pmatch"), Signal(name="sack_w_pins")
        m.d.sync += [w_pmatch.eq(Mux(e_go, e_cmp, w_cmp)), w_pins.eq(Mux(e_go, e_pins, w_pins_now))]
        w_hit = Signal(name="sack_w_phit")
        m.d.comb += w_hit.eq((w_pmatch & pv).any() | (ins_valid & w_pins))
        m.d.comb += p_hit.eq(Mux(j_valid, j_hit, w_hit))
        # (The timer's t_timeout is decided on its own lookup, scan_s3_phit.)
        p_want = ((nack_ok | h_old) & ~p_hit) | t_timeout
        p_free = Signal(P)
        m.d.comb += p_free.eq(~live & ~Mux(j_valid, pz, 0))
        p_slot = Signal(P)                     # one-hot: the lowest free slot
        m.d.comb += p_slot.eq(p_free & (~p_free + 1)[:P])
        p_ins = p_want & p_free.any()
        m.d.sync += [ins_valid.eq(p_ins), ins_slot.eq(p_slot)]
        # Entries leave when their retransmission is taken, when CACK passes them, and when
        # their QP is opened or goes to error. A retransmission taken leaves the table from
        # a register (pend_rm_*), the cycle after it is taken: it is taken only while stage
        # E is empty and stage W holds no record it does not apply in that cycle, so no
        # record after it looks the table up sooner. Only the entries live when it was
        # taken leave (pend_rm_live): a request decided in that cycle or after comes after
        # the retransmission, and keeps its entry. (The fields are loaded every cycle: only
        # the decision to take it reaches rm_valid.)
        rm_valid = Signal(name="pend_rm_valid")
        rm_q, rm_p = Signal(qb, name="pend_rm_q"), Signal(PB, name="pend_rm_p")
        rm_live = Signal(P, name="pend_rm_live")
        rm_now = rm_valid
        m.d.sync += [rm_valid.eq(s_rtx_ok), rm_q.eq(qs), rm_p.eq(s.psn[:PB]),
                     rm_live.eq(live)]
        rm_sent = Signal(P)
        rm_qp = Signal(P)
        for i in range(P):
            at_c = ~(w.cack[:PB] - pp[i])[PB - 1]  # at or before the SACK's CACK
            m.d.comb += [
                rm_sent[i].eq(live[i] & rm_live[i] & rm_now & (pq[i] == rm_q) &
                              (pp[i] == rm_p)),
                rm_qp[i].eq(((pq[i] == w_q) & (fatal | (sack_ok & w.adv & at_c))) |
                            ((pq[i] == err_late_q) & err_late) |
                            ((pq[i] == cmd_qp) & cmd_apply)),
            ]
            with m.If(p_slot[i]):
                m.d.sync += [pq[i].eq(k_q), pp[i].eq(k_p)]
        m.d.sync += [pv.eq(live & ~rm_sent & ~rm_qp),
                     pz.eq(rm_sent | Mux(w_go, 0, pz))]
        m.d.comb += [ev.rtx_pending_skip.eq((nack_ok | h_old) & p_hit),
                     ev.pending_full.eq(p_want & ~p_free.any())]
