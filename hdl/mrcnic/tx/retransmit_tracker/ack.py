"""The SACK/NACK path of :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`:
stages A (``sack_a_*``), E (``sack_e_*``, ``nack_e_*``) and W (``sack_w_*``).

- **A** reads the two 64-PSN bitmap words the SACK straddles (even and odd bank) and the
  QP's epoch, and works out from the record alone every bound that needs no per-QP state
  (where CACK + 1 falls, the highest PSN acknowledged, the terms of the hole search's
  end), each one adder from the record's fields.
- **E** tests the record against its QP's context, words, hole mark and next PSN (read
  here; written only by stage W) and registers every check and the bounds of the hole
  search.
- **W** writes the context, the words and the mark, finds the holes (the vector handed to
  the hole engine) and answers: the release, feedback, NACK retransmit and error records.

Reads: the ``ack`` input; the context, bitmap and ring read ports; the hole engine's busy
flag; the sent path's stage S1. Leaves: stage E's and W's registers (``e_*``, ``w``), the
holes and their first PSN (``holes``, ``p0``), what W decided (``sack_ok``, ``changed``,
``nack_ok``, ``fatal``) and the records it answers (``e_rtx``, ``e_fb``, ``e_err``).

Latency (cycles from the record taken): release 3 (``sack_latency``), feedback 4
(``feedback_latency``), a NACK's retransmit request 4. Throughput: one record a cycle
across QPs. Stall: a record of the QP stage W holds waits one cycle in E (E reads the
context and words after W's write; nothing is forwarded from W into E), and the input waits
while the hole engine works on a SACK's holes (k + 3 cycles for k holes; two cycles for a
search that is not empty and finds none)."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Mux, Signal, signed

from mrcnic.base.records import ACK_DESC, ErrorCause, RtxCause, RESOURCE_NACKS, FeedbackKind
from mrcnic.base.gates import assign, register_copies, take as _take
from mrcnic.base.proto import NackCode, SackMode
from mrcnic.tx.retransmit_tracker.common import (
    EPOCH_BITS, PSN, WORD, _after, _clamp, _clamp_max, _clamp_signed, _clamp_signed_less64,
    ge_mask, highest_set, lt_mask)

__all__ = ["AckStages"]


class AckStages:
    """Stages A, E and W of the SACK/NACK path; mixed into the tracker."""

    def _ack_stage_a_words(self, m, a, guard):
        """Stage A's sums from the record's fields: the offset, the guard less one (a
        register), the low bits of base and their carry, and the word numbers of the two
        words the record straddles."""
        # What does not depend on per-QP state is worked out here, from the input record,
        # so that stage E starts from registers: where CACK + 1 falls in the two words
        # (sack_e_lo), the highest PSN the SACK acknowledges (the index of its highest bit:
        # stage E adds it to the base's low bits and appends a word number), and where the
        # SACK's own evidence (CACK and that PSN) puts the end of the hole search
        # (sack_e_ehx).
        # For a SACK the bounds are small numbers: base = CACK + sack_offset, so relative to
        # the first PSN of the two words (p0 = base - base[:6]) CACK + 1 is base[:6] -
        # sack_offset + 1, the highest PSN acknowledged base[:6] + its bit, and that PSN is
        # after CACK when sack_offset + its bit > 0. (A NACK uses none of them.)
        # Each sum is one adder from the record's fields, registers and at most one sum
        # before it (terms that do not depend on each other are added side by side):
        # b6 and its carry c6 from the low bits; the guard less one from a register.
        off = a.sack_offset.as_signed()
        gm1 = Signal(signed(17), name="sack_a_guard_m1")   # follows reorder_guard a cycle late
        m.d.sync += gm1.eq(guard - 1)
        low = Signal(7, name="sack_a_low")
        m.d.comb += low.eq(a.cack[:6] + a.sack_offset[:6])
        b6, c6 = low[:6], low[6]
        # base[6:] and base[6:] + 1, the first PSN's word number and the next: CACK's word
        # number plus the offset's, plus 0, 1 or 2, each sum a carry chain of its own beside
        # the low bits' (x + 1 as x - ~y: the subtraction's carry in), picked by c6.
        cw, ow = a.cack[6:], Signal(PSN - 6, name="sack_a_off_word")
        x0, x1, x2 = (Signal(PSN - 6, name=f"sack_a_wsum{i}") for i in range(3))
        m.d.comb += [ow.eq(off >> 6),           # sign-extended
                     x0.eq(cw + ow), x1.eq(cw - ~ow), x2.eq(x1 + 1)]
        hi0, hi1 = Signal(PSN - 6, name="sack_a_word0"), Signal(PSN - 6, name="sack_a_word1")
        m.d.comb += [hi0.eq(Mux(c6, x1, x0)), hi1.eq(Mux(c6, x2, x1))]
        # The two words' numbers: for a SACK, base's word number and the next from the sums
        # above (no adder after the one that makes base); for a NACK, its PSN's.
        n_w1 = Signal(PSN - 6, name="sack_a_nack_w1")
        m.d.comb += n_w1.eq(a.psn[6:] + 1)
        w0, w1 = Signal(PSN - 6, name="sack_a_w0"), Signal(PSN - 6, name="sack_a_w1")
        m.d.comb += [w0.eq(Mux(a.nack, a.psn[6:], hi0)), w1.eq(Mux(a.nack, n_w1, hi1))]
        return off, gm1, b6, c6, x0, x1, w0, w1, hi0, hi1

    def _ack_stage_a_reads(self, m, v, qa, w0, w1):
        """Stage A's reads: the two bitmap words the record straddles (words ``w0`` and
        ``w1`` of QP ``qa``) and the two ring words stage W needs (the trigger's or the
        NACK's record, CACK's tag), addressed from the input record, or from stage E's
        registers each cycle a record waits there (``sack_e_reread``). Returns those
        registers of stage E, which stage A loads: the base, the second word's number, the
        reread flag and the low PSN bits of the two ring reads."""
        (e_valid, e_go, e_q, banks, bank_addr, rec_ra, tag_ra, rec_addr, ob) = _take(v, """
            e_valid e_go e_q banks bank_addr rec_ra tag_ra rec_addr ob""")
        a = self.ack.payload
        e_base = Signal(PSN, name="sack_e_base")
        # A record held in stage E reads its words again every cycle (sack_e_reread): the
        # banks' read port is transparent, so it sees what stage W writes on the same edge.
        e_reread = Signal(name="sack_e_reread")
        e_w0 = e_base[6:]
        e_w1 = Signal(PSN - 6, name="sack_e_w1")
        # The even bank holds the even one of words w0 and w1 = w0 + 1, the odd bank the
        # odd one: their addresses (a word number's bits above bit 0) are w1's and w0's,
        # whichever of the two is even (no choice on w0's bit 0).
        m.d.comb += [
            e_reread.eq(e_valid & ~e_go),
            banks[0][1].addr.eq(Mux(e_reread, bank_addr(e_q, e_w1), bank_addr(qa, w1))),
            banks[1][1].addr.eq(Mux(e_reread, bank_addr(e_q, e_w0), bank_addr(qa, w0))),
        ]
        # (The read ports read every cycle, with no enable: in a cycle where stage E neither
        # holds its record nor takes one, what they read is not used.)
        # The ring reads, addressed as the record enters stage E (the low PSN bits from the
        # record's fields) or again each cycle it waits there: their words leave the block
        # RAMs' registers as it enters stage W (two cycles after the address).
        e_rec_lo = Signal(PSN, name="sack_e_rec_psn")
        e_tag_lo = Signal(PSN, name="sack_e_tag_psn")
        a_rec_lo = Signal(ob, name="sack_a_rec_psn")
        m.d.comb += a_rec_lo.eq(Mux(a.nack, a.psn[:ob], a.cack[:ob] + a.ack_psn_offset[:ob]))
        a_tag_lo = Mux(a.nack, a.psn, a.cack)
        m.d.comb += [
            rec_ra.addr.eq(Mux(e_reread, rec_addr(e_q, e_rec_lo), rec_addr(qa, a_rec_lo))),
            tag_ra.addr.eq(Mux(e_reread, rec_addr(e_q, e_tag_lo), rec_addr(qa, a_tag_lo)))]
        return e_base, e_w1, e_reread, e_rec_lo, e_tag_lo

    def _ack_stage_a(self, m, v):
        """SACK/NACK path, stage A: the bitmap words read, and what needs no per-QP state
        worked out from the record alone."""
        (cmd_busy, hole_busy, e_valid, e_go, room2, qb, qidx, guard, epoch, e_q, qps,
         s1_valid, s_cond) = _take(v, """
            cmd_busy hole_busy e_valid e_go room2 qb qidx guard epoch e_q qps s1_valid
            s_cond""")
        a = self.ack.payload
        # No record is taken while a sent record waits in its stage S1 (it comes first).
        ready_a = (~cmd_busy & ~hole_busy & ~(e_valid & ~e_go) & room2 &
                   ~(s1_valid & ~s_cond))
        m.d.comb += self.ack.ready.eq(ready_a)
        take_a = self.ack.valid & ready_a
        qa = Signal(qb)
        m.d.comb += qa.eq(qidx(a.qp))
        m.d.comb += epoch.ra.addr.eq(qa)
        a_base = Signal(PSN)
        m.d.comb += a_base.eq(Mux(a.nack, a.psn, a.cack + a.sack_offset.as_signed()))
        a_trig = Signal(PSN)
        m.d.comb += a_trig.eq(a.cack + a.ack_psn_offset.as_signed())
        off, gm1, b6, c6, x0, x1, w0, w1, hi0, hi1 = self._ack_stage_a_words(m, a, guard)
        e_base, e_w1, e_reread, e_rec_lo, e_tag_lo = self._ack_stage_a_reads(m, v, qa, w0, w1)
        # The highest bit is after CACK when any bit is (bit j is for PSN CACK +
        # sack_offset + j, after CACK when sack_offset + j > 0: a mask from the offset
        # alone, the higher bits first): for an offset of 1 or more, any bit; for 0, any
        # but bit 0; for -64 or less, none; between, those at or above 65 less the
        # offset's low 6 bits. The offset's range from bit tests, each bit's test one
        # comparison of those low bits with a constant, beside the search for the highest
        # bit (not after it).
        off_near = Signal(name="sack_a_off_near")       # -64 .. -1
        m.d.comb += off_near.eq(off[-1] & off[6:].all())
        off_pos = ~off[-1] & off.any()
        off_zero = ~off.any()
        near_after = Cat(*(a.bitmap[j] & (a.sack_offset[:6] >= WORD + 1 - j)
                           for j in range(2, WORD)))
        # The highest PSN acknowledged, p0 + base[:6] + its bit (below 128: one carry into
        # the word number, which picks base[6:] or base[6:] + 1).
        a_found, a_hidx, _ = highest_set(m, a.bitmap, "sack_a_hi")
        a_after = Signal(name="sack_a_after")
        m.d.comb += a_after.eq((off_pos & a_found) | (off_zero & a.bitmap[1:].any()) |
                               (off_near & near_after.any()))
        # Where the end of the search falls, (the PSN hi) - (p0 + guard - 1), clamped:
        # from the SACK's highest bit, or from its CACK, the two worked out side by side.
        # (base[:6] - (guard - 1) beside the search for the highest bit, which it then meets
        # in one adder.)
        b6_g = Signal(signed(18), name="sack_a_base6_g")
        m.d.comb += b6_g.eq(b6 - gm1)
        # Stage E adds the highest bit's index to base[:6] - (guard - 1), saturated here to
        # -64 .. 129 (the clamp to 0 .. 128 after adding 0 .. 63 is the same).
        b6_g_sat = Signal(signed(9), name="sack_a_base6_g_sat")
        m.d.comb += b6_g_sat.eq(Mux(b6_g < -WORD, -WORD, Mux(b6_g > 2 * WORD + 1, 2 * WORD + 1,
                                                              b6_g[:9])))
        # Where CACK + 1 falls (lo) and the end of the search that CACK gives (lo - 1 -
        # (guard - 1)), from CACK's low bits and the offset's high ones: lo = CACK[:6] + 1 -
        # 64 x (sack_offset >> 6) - 64 x c6, the first two terms one field of bits
        # (sack_a_cack_off, CACK[:6] - 64 x (offset >> 6) - 64, the high bits inverted),
        # each bound one carry chain from it, with a constant or a register
        # (sack_a_end_k, 65 - guard); c6 picks the bound or the bound less 64, whose clamp
        # reads the same sum's bits.
        cack_off = Signal(signed(16), name="sack_a_cack_off")
        end_k = Signal(signed(19), name="sack_a_end_k")     # follows reorder_guard too
        lo0, en0 = Signal(signed(18), name="sack_a_lo0"), Signal(signed(20), name="sack_a_end0")
        m.d.sync += end_k.eq(65 - guard)
        m.d.comb += [cack_off.eq(Cat(a.cack[:6], ~a.sack_offset[6:16])),
                     lo0.eq(cack_off + 65), en0.eq(cack_off + end_k)]
        end_cack = Signal(8, name="sack_a_end_cack")
        m.d.comb += end_cack.eq(Mux(c6, _clamp_signed_less64(en0), _clamp_signed(en0)))
        a_lo = Signal(8, name="sack_a_lo")
        a_pg = Signal(PSN, name="sack_a_pg")
        m.d.comb += [
            a_lo.eq(Mux(c6, _clamp_signed_less64(lo0), _clamp_signed(lo0))),
            # p0 + guard - 1, p0 = base less its low 6 bits.
            a_pg.eq(Cat(gm1[:6], Mux(c6, x1 + (gm1 >> 6), x0 + (gm1 >> 6))[:PSN - 6])),
        ]
        e = Signal(ACK_DESC)
        # Copies of the QP index that address stage E's three distributed RAMs (context,
        # next PSN, mark), each its own register: each fans out to one memory's cells, not
        # to all three and every comparison with e_q (register_copies).
        e_q_rd = register_copies(e_q, ("ctx", "nxt", "mark"))
        e_trig1 = Signal(PSN, name="sack_e_trig1")
        e_found = Signal(name="sack_e_found")
        e_pg, e_ehx = Signal(PSN, name="sack_e_pg"), Signal(8, name="sack_e_ehx")
        e_hidx = Signal(6, name="sack_e_hidx")
        e_b6g = Signal(signed(9), name="sack_e_base6_g")
        e_end_cack = Signal(8, name="sack_e_end_cack")
        e_after = Signal(name="sack_e_after")
        # Where the SACK's own evidence puts the end of the search: from its highest bit,
        # or from its CACK (stage A worked out the terms).
        m.d.comb += e_ehx.eq(Mux(e_after, _clamp_signed(e_b6g + e_hidx), e_end_cack))
        e_epoch = Signal(EPOCH_BITS, name="sack_e_epoch")
        e_lo = Signal(8, name="sack_e_lo")
        e_qp_ok = Signal(name="sack_e_qp_ok")
        # Stage E's fields load whenever the stage is free on this edge, whether or not a
        # record is taken (e_valid says whether they hold one): their enable is then one
        # gate after stage E's own state, not the whole of the input's readiness.
        # The SACK's bits aligned to the two words here (shifted by base's low bits, the
        # sum b6), into registers (sack_e_vn_raw): stage E drops those at or before CACK
        # with a mask from where CACK + 1 falls (sack_e_lo), beside its reads.
        e_vn_raw = Signal(2 * WORD, name="sack_e_vn_raw")
        with m.If(~e_reread):
            m.d.sync += [e.eq(a), e_vn_raw.eq(Cat(a.bitmap, Const(0, WORD)) << b6),
                         e_base.eq(a_base), e_trig1.eq(a_trig + 1),
                         e_w1.eq(w1),
                         e_found.eq(a_found),
                         e_pg.eq(a_pg), e_lo.eq(a_lo),
                         e_hidx.eq(a_hidx), e_b6g.eq(b6_g_sat), e_end_cack.eq(end_cack),
                         e_after.eq(a_after),
                         e_rec_lo.eq(Mux(a.nack, a.psn, a_trig)),
                         e_tag_lo.eq(Mux(a.nack, a.psn, a.cack)),
                         e_epoch.eq(epoch.ra.data), e_q.eq(qa), e_qp_ok.eq(a.qp < qps),
                         *(q.eq(qa) for q in e_q_rd)]
        # The highest PSN the SACK acknowledges (hcand: its highest bit's index added to the
        # base's low bits, the first word's number or the next's above) and the PSN its own
        # evidence puts hi at (hx: that PSN, or CACK when no bit is after CACK), from E's
        # registers: the word numbers are the record's (base[6:] and w1 for a SACK).
        e_hcand, e_hx = Signal(PSN, name="sack_e_hcand"), Signal(PSN, name="sack_e_hx")
        e_s7 = Signal(7, name="sack_e_bit_pos")
        m.d.comb += [e_s7.eq(e_base[:6] + e_hidx),
                     e_hcand.eq(Cat(e_s7[:6], Mux(e_s7[6], e_w1, e_base[6:]))),
                     e_hx.eq(Mux(e_after, e_hcand, e.cack))]
        with m.If(take_a):
            m.d.sync += e_valid.eq(1)
        with m.Elif(e_go):
            m.d.sync += e_valid.eq(0)

        vars(v).update(
            e=e, e_q_rd=e_q_rd, e_base=e_base, e_vn_raw=e_vn_raw, e_ehx=e_ehx, e_epoch=e_epoch,
            e_found=e_found,
            e_hcand=e_hcand, e_hx=e_hx, e_lo=e_lo, e_pg=e_pg, e_qp_ok=e_qp_ok, e_rec_lo=e_rec_lo,
            qa=qa, e_tag_lo=e_tag_lo, e_trig1=e_trig1, e_w1=e_w1)

    def _ack_stage_e(self, m, v):
        """SACK/NACK path, stage E: the record against its QP's context, bitmap words, hole
        mark and next PSN (read here, written only by stage W), every check, and the
        bounds of the hole search, registered for stage W."""
        (e_go, e_valid, hole_busy, h_q, ctx_re, e_q, e_q_rd, nxt_re, mark_re, e_qp_ok, err_of,
         e_base, banks, WORDL, wq, e_epoch, e, e_hcand, e_found, e_pg, e_ehx, e_trig1, O,
         e_lo, e_hx, e_w1, w_valid, w_go, w_q, rec_ra, tag_ra, e_vn_raw) = _take(v, """
            e_go e_valid hole_busy h_q ctx_re e_q e_q_rd nxt_re mark_re e_qp_ok err_of e_base
            banks WORDL wq e_epoch e e_hcand e_found e_pg e_ehx e_trig1 O e_lo e_hx e_w1
            w_valid w_go w_q rec_ra tag_ra e_vn_raw""")
        # A record goes on to stage W when W is free or emptied on this edge, and neither
        # stage W nor the hole engine holds its QP: they may write its context, words or
        # mark on this edge, after which stage E reads them again (one cycle later).
        m.d.comb += [
            e_go.eq(e_valid & (~w_valid | w_go) & ~(w_valid & (w_q == e_q)) &
                    ~(hole_busy & (h_q == e_q))),
            ctx_re.addr.eq(e_q_rd[0]), nxt_re.addr.eq(e_q_rd[1]), mark_re.addr.eq(e_q_rd[2])]
        c = ctx_re.data
        n = nxt_re.data
        in_err = err_of(e_q)
        live_u = e_valid & e_qp_ok & ~in_err
        ew0 = e_base[6:]
        d_even, d_odd = banks[0][1].data, banks[1][1].data
        d0 = Signal(WORDL)
        d1 = Signal(WORDL)
        m.d.comb += [d0.eq(Mux(ew0[0], d_odd, d_even)), d1.eq(Mux(ew0[0], d_even, d_odd))]
        ok0, ok1 = Signal(name="sack_e_word0_ok"), Signal(name="sack_e_word1_ok")
        m.d.comb += [ok0.eq((d0.lap == ew0[wq:]) & (d0.epoch == e_epoch)),
                     ok1.eq((d1.lap == e_w1[wq:]) & (d1.epoch == e_epoch))]
        old = Signal(2 * WORD)
        m.d.comb += old.eq(Cat(Mux(ok0, d0.bits, 0), Mux(ok1, d1.bits, 0)))
        # A NACK's PSN acknowledged: its bit, picked from each bank's word as read, beside
        # the check of the first word.
        i0 = e_base[:6]
        nack_bit = Signal(name="nack_e_bit")
        m.d.comb += nack_bit.eq(ok0 & Mux(ew0[0], d_odd.bits.bit_select(i0, 1),
                                          d_even.bits.bit_select(i0, 1)))
        p0 = Cat(Const(0, 6), ew0)              # first PSN of the two words
        C = e.cack
        # Each PSN test a sign (a carry chain) beside an equality, not a test of a difference.
        dC, dnC, dhn = (Signal(PSN, name="sack_e_dcack"), Signal(PSN, name="sack_e_dnext"),
                        Signal(PSN, name="sack_e_dhigh"))
        m.d.comb += [dC.eq(C - c.cack), dnC.eq(n - C), dhn.eq(e_hcand - n)]
        stale = dC[-1]
        adv = (C != c.cack) & ~dC[-1]
        c_unsent = (n == C) | dnC[-1]
        # A bit for an unsent PSN: the highest bit the SACK sets is at or after n.
        b_unsent = e_found & ~dhn[-1]
        sack_ok_u = Signal(name="sack_e_ok_u")
        m.d.comb += sack_ok_u.eq(live_u & ~e.nack & ~stale & ~c_unsent & ~b_unsent)
        # The SACK's bits aligned to the two words (stage A), those at or before CACK
        # dropped: the positions before lo, where CACK + 1 falls.
        e_vn = Signal(2 * WORD, name="sack_e_vn")
        m.d.comb += e_vn.eq(e_vn_raw & ge_mask(e_lo, 2 * WORD))
        # Whether the SACK sets a bit not yet set, per word (each word's test read apart
        # from its lap check, which picks one of them in stage W).
        # (Per quarter of each word, the quarters' ORs in stage W: a 16-bit OR here.)
        Q = WORD // 4
        fresh = Signal(16, name="sack_e_fresh")
        m.d.comb += fresh.eq(Cat(*(
            Cat((e_vn[k * Q:(k + 1) * Q] & ~d.bits[(k % 4) * Q:(k % 4 + 1) * Q]).any(),
                e_vn[k * Q:(k + 1) * Q].any())
            for k, d in zip(range(8), [d0] * 4 + [d1] * 4))))
        # Highest acknowledged PSN: the larger of the stored one and the SACK's own (CACK
        # or its highest bit, stage A).
        h2 = Signal(PSN)
        m.d.comb += h2.eq(Mux(_after(e_hx, c.hi), e_hx, c.hi))
        # Holes: after CACK (lo), not before mark (mk), before n (hl), hi - psn >= guard
        # (before ehx or ehi: the end that the SACK's evidence or the stored hi gives), not
        # acknowledged: the search from max(lo, mk) to before min(max(ehx, ehi), hl).
        # Each bound is the larger of a position from the record and a clamped distance
        # from the QP's state (_clamp_max: the comparison beside the clamp, not after it).
        d_mk, d_hl, d_hi = (Signal(PSN, name="sack_e_dmark"), Signal(PSN, name="sack_e_dn0"),
                            Signal(PSN, name="sack_e_dhi"))
        m.d.comb += [d_mk.eq(mark_re.data - p0), d_hl.eq(n - p0), d_hi.eq(c.hi - e_pg)]
        hl = Signal(8, name="sack_e_hl")
        m.d.comb += hl.eq(_clamp(d_hl))
        end_raw = Signal(8, name="sack_e_end_raw")
        m.d.comb += end_raw.eq(_clamp_max(d_hi, e_ehx))
        s_pos = Signal(8, name="sack_e_start")
        m.d.comb += s_pos.eq(_clamp_max(d_mk, e_lo))
        trig_d = Signal(PSN)
        m.d.comb += trig_d.eq(n - e_trig1)
        # NACK: its PSN against CACK and n (for a NACK, e_base is its PSN).
        np_d, nn_d = Signal(PSN, name="nack_e_dp"), Signal(PSN, name="nack_e_dn")
        m.d.comb += [np_d.eq(e_base - c.cack), nn_d.eq(n - e_base)]
        m_kind = Mux(e.m == SackMode.SKIP_ONCE, int(FeedbackKind.SKIP_ONCE),
                     Mux(e.m == SackMode.ALWAYS_SKIP, int(FeedbackKind.ALWAYS_SKIP),
                         int(FeedbackKind.ACKED)))
        nk = Signal(4)
        known = Signal()
        with m.Switch(e.reason):
            with m.Case(NackCode.TRIMMED):
                m.d.comb += [nk.eq(FeedbackKind.TRIMMED), known.eq(1)]
            with m.Case(NackCode.TRIMMED_LASTHOP):
                m.d.comb += [nk.eq(FeedbackKind.TRIMMED_LASTHOP), known.eq(1)]
            with m.Case(*[int(r) for r in RESOURCE_NACKS]):
                m.d.comb += [nk.eq(FeedbackKind.RESOURCE), known.eq(1)]

        # --- Into stage W: what it writes and answers, decided ------------------------------
        w = SimpleNamespace(
            **{n_: Signal(name=f"sack_w_{n_}") for n_ in (
                "qp_ok", "in_err", "nack", "pr", "ok_u", "stale", "unsent", "adv", "trig_ok",
                "ok0", "ok1", "fatal_u", "known", "n_unsent", "n_acked")},
            fresh=Signal(16, name="sack_w_fresh"), kind=Signal(4, name="sack_w_kind"),
            entropy=Signal.like(e.entropy, name="sack_w_entropy"),
            mpr=Signal.like(e.mpr, name="sack_w_mpr"),
            cack=Signal(PSN, name="sack_w_cack"), old_cack=Signal(PSN, name="sack_w_old_cack"),
            h2=Signal(PSN, name="sack_w_hi"), base=Signal(PSN, name="sack_w_base"),
            w1=Signal(PSN - 6, name="sack_w_w1"), epoch=Signal(EPOCH_BITS, name="sack_w_epoch"),
            after=Signal(2 * WORD, name="sack_w_after"),
            lo=Signal(8, name="sack_w_lo"), start=Signal(8, name="sack_w_start"),
            end_raw=Signal(8, name="sack_w_end_raw"), hl=Signal(8, name="sack_w_hl"))
        with m.If(e_go):
            m.d.sync += [
                w_q.eq(e_q), w.qp_ok.eq(e_qp_ok), w.in_err.eq(in_err), w.nack.eq(e.nack),
                w.pr.eq(e.pr), w.ok_u.eq(sack_ok_u), w.stale.eq(stale),
                w.unsent.eq(c_unsent | b_unsent), w.adv.eq(adv), w.trig_ok.eq(trig_d < O),
                w.ok0.eq(ok0), w.ok1.eq(ok1),
                w.fatal_u.eq(live_u & e.nack & (e.reason == NackCode.UNEXPECTED_EVENT)),
                w.known.eq(known), w.n_unsent.eq((n == e_base) | nn_d[-1]),
                w.n_acked.eq((e_base == c.cack) | np_d[-1] | nack_bit),
                w.fresh.eq(fresh), w.kind.eq(Mux(e.nack, nk, m_kind)),
                w.entropy.eq(e.entropy), w.mpr.eq(e.mpr), w.cack.eq(C),
                w.old_cack.eq(c.cack), w.h2.eq(h2), w.base.eq(e_base), w.w1.eq(e_w1),
                w.epoch.eq(e_epoch), w.after.eq(old | e_vn), w.lo.eq(e_lo),
                w.start.eq(s_pos), w.end_raw.eq(end_raw), w.hl.eq(hl),
            ]
        with m.If(e_go):
            m.d.sync += w_valid.eq(1)
        with m.Elif(w_go):
            m.d.sync += w_valid.eq(0)
        # The ring words for stage W's record leave the block RAMs in its first cycle
        # (sack_w_ring_new); W holds them in registers of its own while it waits.
        w_new = Signal(name="sack_w_ring_new")
        w_rec_hold = Signal.like(rec_ra.data, name="sack_w_ring_rec")
        w_tag_hold = Signal.like(tag_ra.data, name="sack_w_ring_tag")
        w_rec, w_tag = Signal.like(w_rec_hold, name="sack_w_rec"), Signal.like(w_tag_hold,
                                                                             name="sack_w_tag")
        m.d.comb += [w_rec.eq(Mux(w_new, rec_ra.data, w_rec_hold)),
                     w_tag.eq(Mux(w_new, tag_ra.data, w_tag_hold))]
        m.d.sync += [w_new.eq(e_go), w_rec_hold.eq(w_rec), w_tag_hold.eq(w_tag)]
        # Forwarded to the sent path: a sent record judged while stage W holds this record
        # comes after it (sent_s1_*_w).
        w_fwd_we, w_fwd_cack, w_fwd_fatal = _take(v, "w_fwd_we w_fwd_cack w_fwd_fatal")
        m.d.comb += [w_fwd_we.eq(w_valid & w.ok_u & w.adv), w_fwd_cack.eq(w.cack),
                     w_fwd_fatal.eq(w_valid & w.fatal_u)]
        vars(v).update(w=w, w_rec=w_rec, w_tag=w_tag)

    def _ack_stage_w(self, m, v):
        """SACK/NACK path, stage W: the record applied (context, bitmap words, hole mark)
        and its holes found, from what stage E decided."""
        (w, w_valid, w_go, w_q, hole_busy, w_rdy, banks, bank_addr, wq, ctx_w,
         mark_w) = _take(v, """
            w w_valid w_go w_q hole_busy w_rdy banks bank_addr wq ctx_w mark_w""")
        m.d.comb += w_go.eq(w_valid & ~hole_busy & w_rdy)
        live = w_go & w.qp_ok & ~w.in_err
        sack_ok = Signal(name="sack_w_ok")
        m.d.comb += sack_ok.eq(w.ok_u & w_go)
        # The SACK's bits are new in a word if it sets one not set there (or the word was
        # of another lap or epoch, and it sets any).
        # (fresh: per quarter, whether the SACK sets a bit not set there, and any bit.)
        fr = [Cat(*(w.fresh[2 * k + b] for k in range(4 * h, 4 * h + 4))).any()
              for h in range(2) for b in range(2)]
        changed = w.adv | Mux(w.ok0, fr[0], fr[1]) | Mux(w.ok1, fr[2], fr[3])
        after = w.after                     # the two words with the SACK's bits set
        new_cack = Signal(PSN)
        m.d.comb += new_cack.eq(Mux(w.adv, w.cack, w.old_cack))
        ww0 = w.base[6:]
        # Every write's address and data come from stage W's registers whether or not it
        # goes (an open, while W is empty, overrides the context's): only the enables wait
        # for the decision.
        m.d.comb += [ctx_w.addr.eq(w_q), ctx_w.en.eq(sack_ok),
                     *assign(ctx_w.data, cack=new_cack, hi=w.h2, mpr=w.mpr)]
        for b in range(2):
            wp = banks[b][0]
            mine = ww0[0] == b
            m.d.comb += [
                # (The even bank's word is at w1's address, the odd bank's at w0's.)
                wp.addr.eq(bank_addr(w_q, w.w1 if b == 0 else ww0)), wp.en.eq(sack_ok),
                wp.data.lap.eq(Mux(mine, ww0[wq:], w.w1[wq:])),
                wp.data.epoch.eq(w.epoch),
                wp.data.bits.eq(Mux(mine, after[:WORD], after[WORD:])),
            ]
        # Holes: the search's bounds, each a mask of its own, ANDed with what is not
        # acknowledged.
        holes = Signal(2 * WORD)
        m.d.comb += holes.eq(~after & ge_mask(w.start, 2 * WORD) &
                             lt_mask(w.end_raw, 2 * WORD) & lt_mask(w.hl, 2 * WORD))
        # The hole mark moves to the end of a search that is not empty (stage E reads it;
        # a record of the QP waits there while this writes it).
        # The end is the nearer of end_raw and hl: the three comparisons side by side, and
        # the mark's word number picked from w0, w0 + 1 and w0 + 2 (the end is at most 128
        # past p0) rather than added after the choice.
        end_first = Signal(name="sack_w_end_first")
        k_end = Signal(8, name="sack_w_end")
        k_nonempty = Signal(name="sack_w_nonempty")
        m.d.comb += [end_first.eq(w.end_raw < w.hl),
                     k_end.eq(Mux(end_first, w.end_raw, w.hl)),
                     k_nonempty.eq(Mux(end_first, w.end_raw > w.start, w.hl > w.start))]
        w2 = Signal(PSN - 6, name="sack_w_w2")
        m.d.comb += w2.eq(w.w1 + 1)
        m.d.comb += [mark_w.addr.eq(w_q), mark_w.en.eq(sack_ok & k_nonempty),
                     mark_w.data.eq(Cat(k_end[:6], Mux(k_end[7], w2, Mux(k_end[6], w.w1, ww0))))]
        vars(v).update(changed=changed, holes=holes, k_nonempty=k_nonempty, live=live,
                       p0=Cat(Const(0, 6), ww0),
                       sack_ok=sack_ok)

    def _ack_stage_w_answer(self, m, v):
        """Stage W, continued: the records it answers (release, feedback, a NACK's
        retransmit request, an error) and the events it counts."""
        (w, w_valid, w_go, w_q, live, sack_ok, changed, rtx_rec, w_tag, w_rec, fb_rec,
         rel_rec, err_rec, fifos, ev) = _take(v, """
            w w_valid w_go w_q live sack_ok changed rtx_rec w_tag w_rec fb_rec rel_rec
            err_rec fifos ev""")
        is_sack = live & ~w.nack
        is_nack = live & w.nack
        # The trigger PSN's record is this open's: among the last outstanding sent, and
        # written in the QP's epoch (a PSN before the QP's first since its open was never
        # sent in it, and its ring slot holds an earlier open's record or none). The
        # epoch's test (after the block RAM's output) drops a SACK's feedback record as it
        # is written into its FIFO, the cycle after (``keep``), not in the decision.
        ep_ok = Signal(name="sack_w_trig_epoch_ok")
        trig_rec = Signal(name="sack_w_trig_rec")
        m.d.comb += [ep_ok.eq(w_rec.epoch == w.epoch), trig_rec.eq(w.trig_ok & ep_ok)]
        fatal = w.fatal_u & w_go
        nack_unknown = is_nack & ~fatal & ~w.known
        nack_unsent = is_nack & w.known & w.n_unsent
        nack_acked = is_nack & w.known & ~w.n_unsent & w.n_acked
        nack_ok = is_nack & w.known & ~w.n_unsent & ~w.n_acked
        sack_fb = sack_ok & changed & ~w.pr & w.trig_ok
        e_rtx = Signal()
        e_fb = Signal()
        e_err = Signal()
        p_hit = Signal()                       # the pending table holds the key (below)
        m.d.comb += [e_rtx.eq(nack_ok & ~p_hit), e_fb.eq(nack_ok | sack_fb), e_err.eq(fatal)]
        w_release = sack_ok & w.adv
        # Each record's fields are chosen by which stage holds a record (registers), not by
        # the decision to write it: W's here, the hole engine's and the timer's below.
        with m.If(w_valid):
            m.d.comb += [
                *assign(rtx_rec, qp=w_q, psn=w.base, tag=w_tag, ev=w_rec.ev,
                        cause=RtxCause.NACK),
                *assign(fb_rec, qp=w_q, ev=w_rec.ev, kind=w.kind, entropy=w.entropy),
                *assign(err_rec, qp=w_q, cause=ErrorCause.NACK_FATAL),
            ]
        m.d.comb += assign(rel_rec, qp=w_q, first=w.old_cack + 1, last=w.cack,
                           tag=w_tag)
        m.d.comb += [fifos["release"].w_en.eq(w_release),
                     fifos["feedback"].keep.eq(~(w_valid & sack_fb) | ep_ok)]
        m.d.comb += [
            ev.sacks.eq(sack_ok),
            ev.sack_stale.eq(is_sack & w.stale),
            ev.sack_unsent.eq(is_sack & ~w.stale & w.unsent),
            ev.sack_duplicate.eq(sack_ok & ~changed),
            ev.nacks.eq(nack_ok),
            ev.nack_acked.eq(nack_acked),
            ev.nack_unsent.eq(nack_unsent),
            ev.nack_unknown.eq(nack_unknown),
            ev.nack_fatal.eq(fatal),
            ev.releases.eq(w_release),
            ev.rtx_nack.eq(e_rtx),
        ]
        vars(v).update(e_err=e_err, e_fb=e_fb, e_rtx=e_rtx, fatal=fatal, nack_ok=nack_ok,
                       p_hit=p_hit, trig_rec=trig_rec)
