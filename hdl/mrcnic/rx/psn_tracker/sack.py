"""Stages A, B, C and T of :class:`~mrcnic.rx.psn_tracker.PsnTracker`'s pipeline: the
SACK's bitmap, read from the ring after the record's own write and shifted to SACK_BASE
(their registers are declared with the others, :meth:`TrackerStages._stage_registers`)."""

from amaranth.hdl import Cat, Const, Mux, Signal

from mrcnic.base.gates import signed_fits
from mrcnic.base.rules import SACK_BITMAP_BITS as BITMAP_BITS, SACK_OFFSET
from mrcnic.rx.psn_tracker.logic import named
from mrcnic.rx.psn_tracker.stages import HALF, PSN

__all__ = ["SackStages"]


class SackStages:
    """Stages A (the SACK read), B (the read), C and T (the shift) of
    :class:`~mrcnic.rx.psn_tracker.PsnTracker`. Mixed into the tracker beside
    :class:`~mrcnic.rx.psn_tracker.stages.TrackerStages`, whose helpers they use
    (``_ring_addr``, ``_chunk_parity``)."""

    def _stage_a_sack_read(self, m, mem, st):
        """Stage A: reads the ring at SACK_BASE = CACK + 1 (the bank word holding it and the
        next), after this record's own write and before the next record of the QP writes;
        the differences ``ack_psn_offset`` and ``ooo_count`` come from."""
        a, b, C = st.a, st.b, self.window_chunks
        base = Signal(PSN, name="a_sack_base")
        m.d.comb += base.eq(a.cack + SACK_OFFSET)
        chunk = base[7:]
        chunk1 = Signal(PSN - 7, name="a_sack_chunk_next")
        m.d.comb += [chunk1.eq(chunk + 1),
                     mem.lo.r_addr[C].eq(self._ring_addr(a.qpi, Mux(base[6], chunk1, chunk))),
                     mem.hi.r_addr[C].eq(self._ring_addr(a.qpi, chunk))]
        m.d.sync += [
            b.valid.eq(a.valid), b.shift.eq(base[:6]), b.half.eq(base[6]),
            # The parity of the second word: the next chunk's when it is the odd half.
            b.par0.eq(self._chunk_parity(chunk)),
            b.par_next.eq(Mux(base[6], self._chunk_parity(chunk1), self._chunk_parity(chunk))),
            b.nack.eq(a.nack), b.plain.eq(a.plain),
            # The differences; B saturates them.
            b.trigger.eq(a.psn - a.cack), b.ooo.eq(a.pbase - a.cack),
        ]

    def _stage_b_sack_data(self, m, mem, st):
        """Stage B: the block RAM reads the two bank words (they leave its output register
        in C); ``ack_psn_offset`` and ``ooo_count``, saturated, and what goes with the words,
        into registers."""
        b, c = st.b, st.c
        ooo, trigger = b.ooo, b.trigger
        m.d.sync += [c.valid.eq(b.valid), c.shift.eq(b.shift), c.half.eq(b.half),
                     c.par0.eq(b.par0), c.par_next.eq(b.par_next), c.nack.eq(b.nack),
                     c.tail.ooo_count.eq(Mux(ooo[15:] != 0, (1 << 15) - 1, ooo[:15])),
                     c.tail.ack_psn_offset.eq(Mux(b.plain | ~signed_fits(trigger, 16), 0,
                                                  trigger[:16]))]

    def _stage_c_bitmap(self, m, mem, st):
        """Stage C: the two bank words, out of the block RAM's register, in PSN order (when
        SACK_BASE is in the odd half, ``hi`` first and then ``lo``, the next chunk's even
        half), lap parity removed, shifted towards SACK_BASE by its position's upper two
        bits (a 4:1 step)."""
        c, t, C = st.c, st.t, self.window_chunks
        lo, hi = mem.lo.r_data[C], mem.hi.r_data[C]
        arr = named(m, Mux(c.half, Cat(hi, lo), Cat(lo, hi)) ^
                   Cat(c.par0.replicate(HALF), c.par_next.replicate(HALF)), "c_arrived")
        vec = arr
        for lo in (4,):
            vec = named(m, Cat(*(
                Cat(*(vec[i + (k << lo)] if i + (k << lo) < len(vec) else Const(0, 1)
                      for k in range(4))).bit_select(c.shift[lo:lo + 2], 1)
                for i in range(BITMAP_BITS + (1 << lo) - 1))), f"c_shift{lo}")
        m.d.sync += [t.valid.eq(c.valid), t.shift.eq(c.shift[:4]), t.nack.eq(c.nack),
                     t.tail.eq(c.tail), t.coarse.eq(vec)]

    def _stage_t_tail(self, m, fifos, st):
        """Stage T: the last two 4:1 steps of the shift give the bitmap (none for a NACK), into
        the tail of the descriptor's FIFO."""
        t = st.t
        step = named(m, Cat(*(t.coarse[i:i + 16:4].bit_select(t.shift[2:4], 1)
                              for i in range(BITMAP_BITS + 3))), "t_shift2")
        bitmap = Signal(BITMAP_BITS, name="t_bitmap")
        m.d.comb += bitmap.eq(Cat(*(step[i:i + 4].bit_select(t.shift[:2], 1)
                                    for i in range(BITMAP_BITS))))
        tail = Signal(t.tail.shape())
        m.d.comb += [tail.eq(t.tail), tail.bitmap.eq(Mux(t.nack, 0, bitmap)),
                     fifos["ack_tail"].w_data.eq(tail), fifos["ack_tail"].w_en.eq(t.valid)]
