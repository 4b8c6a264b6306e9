"""Logic the stages of :class:`~mrcnic.rx.psn_tracker.PsnTracker` share: named levels of a
wide function, a select of one bit among many, the search of a word for its
first set bit, a thermometer of a position; and the tests of a PSN against a CACK split over stages
(:class:`PsnTests`: the offset from a base worked out stages ahead, a short carry chain
against the run after), mixed into :class:`~mrcnic.rx.psn_tracker.stages.TrackerStages`.
"""

from amaranth.hdl import Cat, Const, Mux, Signal

from mrcnic.base import proto
from mrcnic.base.gates import plus_not

__all__ = ["named", "select_bit", "first_of_four", "word_search", "at_or_above", "PsnTests"]

PSN = proto.PSN_BITS


def named(m, value, name, keep=False):
    """``value`` in a Signal named ``name``: a level of a wide function written out (each
    at most about six inputs of the one before), which a timing report then names; with
    ``keep``, kept as a boundary of LUT mapping (which otherwise, area first, may chain
    the levels)."""
    sig = Signal(len(value), name=name, attrs={"keep": 1} if keep else {})
    m.d.comb += sig.eq(value)
    return sig


def select_bit(m, vec, sel, name):
    """Bit ``sel`` of ``vec``: a tree of 4:1 multiplexers (one LUT level each)."""
    level, i = vec, 0
    while len(level) > 1:
        s = sel[i:i + 2]
        nxt = Cat(*(Cat(*(level[g + k] if g + k < len(level) else Const(0, 1)
                          for k in range(4))).bit_select(s, 1)
                    for g in range(0, len(level), 4)))
        level = named(m, nxt, f"{name}_{i // 2}", keep=True) if len(nxt) > 1 else nxt
        i += 2
    return level


def first_of_four(flags):
    """``(any, index)`` of the first set bit of up to four bits (a 2-bit index)."""
    n = len(flags)
    idx = Const(n - 1, 2)
    for i in reversed(range(n - 1)):
        idx = Mux(flags[i], i, idx)
    return Cat(*flags).any(), idx


def word_search(m, holes, name):
    """``(found, index)`` of the first set bit of a 16-bit vector: each nibble's, then the
    first nibble that has one (three LUT levels)."""
    nib = [first_of_four([holes[4 * n + i] for i in range(4)]) for n in range(4)]
    nf = named(m, Cat(*(f for f, _ in nib)), f"{name}_nib", keep=True)
    ni = named(m, Cat(*(i for _, i in nib)), f"{name}_nibidx", keep=True)
    half = named(m, Cat(Mux(nf[0], ni[0:2], ni[2:4]), Mux(nf[2], ni[4:6], ni[6:8])),
                f"{name}_half", keep=True)
    found, which = first_of_four([nf[n] for n in range(4)])
    return found, Cat(Mux(nf[0] | nf[1], half[0:2], half[2:4]), which)


def at_or_above(m, value, name):
    """Bit i of the result: ``value`` >= i, for i below 2^len(``value``) (a thermometer),
    in two LUT levels: the high bits' order against each value they can take (above,
    equal) and the low four bits' (at or above), named, then one three-input function per
    bit."""
    n, lo_bits = 1 << len(value), min(4, len(value))
    lo, hi = value[:lo_bits], value[lo_bits:]
    # (The comparisons that always hold or fail written as constants: a Verilog lint flags
    # a constant comparison.)
    ge = named(m, Cat(Const(1, 1), *(lo >= k for k in range(1, 1 << lo_bits))),
               f"{name}_lo_ge", keep=True)
    if not len(hi):
        return ge
    top = (n >> lo_bits) - 1
    above = named(m, Cat(*(hi > k for k in range(top)), Const(0, 1)), f"{name}_hi_gt",
                  keep=True)
    at = named(m, Cat(*(hi == k for k in range(n >> lo_bits))), f"{name}_hi_eq", keep=True)
    return Cat(*(above[i >> lo_bits] | (at[i >> lo_bits] & ge[i & ((1 << lo_bits) - 1)])
                 for i in range(n)))


class PsnTests:
    """The PSN tests of stages R, W and F that use the tracker's parameters
    (``_adv_bits``, ``_adv_layout``, ``_cbits``, set by
    :meth:`~mrcnic.rx.psn_tracker.stages.TrackerStages._stage_registers`)."""

    @staticmethod
    def _select4(vec, sel):
        """Every fourth bit of ``vec`` from bit ``sel`` (2 bits): a 4:1 level of a wide
        select."""
        return Cat(*(vec[g:g + 4].bit_select(sel, 1) for g in range(0, len(vec), 4)))

    @staticmethod
    def _every(since, cfg, more=(1, 2)):
        """``since`` + k at or past ``sack_every``, for each k in ``more`` (by default one
        and two: the count since the last SACK, with one or two more packets placed). As
        ``since`` >= ``sack_every`` - k: the count (a register, or read from distributed
        RAM) goes straight into one compare with a register (``cfg``,
        :meth:`PsnTracker._sack_every_regs`)."""
        return Cat(*(cfg.le[k] | (since >= cfg.thr[k]) for k in more))

    def _adv_lw(self, lo, mpr_m1):
        """``lo`` less the window (``mpr_m1`` + 1 chunks of 128), for F's window test: its
        bits from 7 up and a sign bit (its low 7 bits are ``lo``'s)."""
        M = self._adv_bits
        return plus_not(Cat(lo[7:M], Const(0, 1)), mpr_m1)[:M - 6]

    def _adv_offset(self, m, name, psn, base, psn_m1=None, hi_m1=None, mpr_m1=None,
                    lo_zero=None):
        """The offset of ``psn`` from ``base`` (a PSN whose low 7 bits are 0), for F's tests
        of the PSN against ``base`` plus a run less than 2^``_adv_bits``
        (:meth:`_adv_tests`), as a value of ``_adv_layout``: its low bits, whether its high
        bits are 0 or 1, and the sign of the offset and of the offset less 2^``_adv_bits``
        (a borrow out of the low bits); and of the offset less one, the low bits and
        whether the high bits are 0 (the PSN just after base plus run is where they equal
        the run). With ``psn_m1`` (``psn`` - 1) and ``hi_m1`` (``psn``'s bits from
        ``_adv_bits`` up, less one), registers, and a base whose low ``_adv_bits`` bits
        are 0, only the high bits are subtracted (:meth:`_adv_offset_hi`; ``lo_zero``, a
        register, if given: ``psn``'s low ``_adv_bits`` bits are 0). With ``mpr_m1``
        (a register), the offset's low bits less the window too (:meth:`_adv_lw`; else
        left 0, to be worked out a stage on)."""
        M = self._adv_bits
        adv = Signal(self._adv_layout, name=name)
        if psn_m1 is None:
            off, off1 = Signal(PSN, name=f"{name}_off"), Signal(PSN, name=f"{name}_off_m1")
            m.d.comb += [off.eq(psn - base), off1.eq(plus_not(psn, base))]
            up, up0 = off[M:], off[M:] == 0
            # (The sign of the high bits less one, without a second carry chain: they are
            # 0, or negative but for the most negative value.)
            m.d.comb += [adv.up0.eq(up0), adv.up1.eq(up == 1), adv.s0.eq(off[-1]),
                         adv.s1.eq(up0 | (up[-1] & (up[:-1] != 0))),
                         adv.z1.eq(off1[M:] == 0), adv.lo.eq(off[:M]), adv.lo1.eq(off1[:M])]
        else:
            self._adv_offset_hi(m, name, adv, psn, psn_m1, hi_m1, base[M:],
                                psn[:M] == 0 if lo_zero is None else lo_zero)
        if mpr_m1 is not None:
            m.d.comb += adv.lw.eq(self._adv_lw(adv.lo, mpr_m1))
        return adv

    def _adv_offset_hi(self, m, name, adv, psn, psn_m1, hi_m1, base_hi, lo_zero):
        """:meth:`_adv_offset` when only the high bits are subtracted (``base_hi``, read
        from distributed RAM a LUT level before): the signs of the high bits' offset less
        0, 1 and 2 (``c0``, ``c1``, ``c2``), three short carry chains side by side, so that
        every flag is one LUT level after them (the offset is 0 where ``c0`` is clear and
        ``c1`` set, 1 where ``c1`` is clear and ``c2`` set; the most negative offset, less
        one, wraps positive, which the sign of the offset less one has always read). The
        offset less one has the same high bits unless the low bits are 0, when they lose
        one."""
        M, n = self._adv_bits, PSN - self._adv_bits
        hi = psn[M:]
        c = [named(m, (hi - base_hi)[n - 1], f"{name}_c0"),
             named(m, plus_not(hi, base_hi)[n - 1], f"{name}_c1"),
             named(m, plus_not(hi_m1, base_hi)[n - 1], f"{name}_c2")]
        up0, up1 = ~c[0] & c[1], ~c[1] & c[2]
        m.d.comb += [adv.up0.eq(up0), adv.up1.eq(up1), adv.s0.eq(c[0]), adv.s1.eq(c[1]),
                     adv.z1.eq(Mux(lo_zero, up1, up0)),
                     adv.lo.eq(psn[:M]), adv.lo1.eq(psn_m1[:M])]

    def _hi_tests(self, m, psn, psn_m1, hi, name):
        """``psn`` above ``hi`` (the highest PSN seen, or a PSN placed), and above it by
        more than one (a new hole), each the sign of one subtraction (``psn`` - ``hi`` - 1
        >= 0, ``psn`` - ``hi`` - 2 >= 0) on the low 9 + log2(``mpr_max``) bits alone: no
        compare after the carry chain. Exact for the PSNs these tests steer, which are in
        the window: they and ``hi`` lie within ``mpr_max`` x 128 of CACK (``hi`` at or
        after it), so their difference, less two, fits that many bits with its sign."""
        B = min(PSN, 9 + self._cbits)
        d1, d2 = Signal(B, name=f"{name}_dist_m1"), Signal(B, name=f"{name}_dist_m2")
        m.d.comb += [d1.eq(plus_not(psn[:B], hi[:B])), d2.eq(plus_not(psn_m1[:B], hi[:B]))]
        return Cat(~d1[-1], ~d2[-1])

    # --- Stage W: the runs -----------------------------------------------------------------

    def _w_run_flags(self, m, mem, st):
        """Stage W's share of F's tests against the CACK read and against the one the
        record in U writes if it advances (then past U): the PSN's low bits against each
        run (:meth:`_run_flags`: the low bits of the CACK read, a register loaded in R; the
        run of the record in U, a register), into registers, so that F tests from
        registers alone but against the CACK the record in U writes (whose run D decides
        as F's record is in W). The offsets' low bits from that record's window base: the
        PSN's below bit 7, and above it a subtraction of a few bits (no carry chain)."""
        w, f, u = st.w, st.f, st.u
        M, psn = self._adv_bits, w.op.psn

        def low(p):
            return Cat(p[:7], (p[7:M] - u.op.psn[7:M])[:M - 7])
        lo, lo1 = low(psn), low(w.psn_m1)
        m.d.sync += [
            f.ram_run.eq(self._run_flags(m, "w_ram", psn[:M],
                                         self._adv_lw(psn[:M], w.ctx.mpr_m1),
                                         w.psn_m1[:M], w.ctx.cack[:M])),
            f.uw_run.eq(self._run_flags(m, "w_uw", lo, self._adv_lw(lo, w.ctx.mpr_m1), lo1,
                                        u.run)),
        ]

    # --- Stage F: fetch --------------------------------------------------------------------

    def _adv_tests(self, m, adv, run, name="f_adv"):
        """The PSN's tests against a CACK (before: at or before it, in_win: in the window
        above it, imm: just after it; as the signs and zeros of PSN - CACK and PSN - CACK -
        1 on 24 bits would give them) for CACK = base + ``run``, from ``off`` the PSN's
        offset from the base
        (worked out stages ahead, :meth:`_adv_offset`: a window base in R, the CACK read
        less its low bits in W) and ``run`` < 2^M (M = ``_adv_bits``): with M-bit carry
        chains rather than 24-bit subtractions (:meth:`_run_flags`, then
        :meth:`_run_tests`). (Checked against the 24-bit tests in
        sim/rx/test_psn_tracker.py: runs, offsets near 0, 2^M and 2^23, random ones.)"""
        return self._run_tests(adv, self._run_flags(m, name, adv.lo, adv.lw, adv.lo1, run))

    def _run_flags(self, m, name, lo, lw, lo1, run):
        """What the tests of :meth:`_adv_tests` take from the run (as a value of
        ``_run_layout``): ``lo`` - ``run`` - 1 by a carry chain, whose carry is ``lo`` >
        ``run``; beside it whether they are equal; the window's end, a second chain beside
        the first, from ``lo`` less the window (``lw``, :meth:`_adv_lw`): T = ``lo`` -
        window - ``run`` - 1 on M + 2 bits, its top two bits; and whether ``lo1`` (the
        offset less one's low bits) equals the run. Registered a stage before the tests
        where the run is known then."""
        M = self._adv_bits
        run_m = Cat(run, Const(0, M - len(run)))
        flags = Signal(self._run_layout, name=f"{name}_run")
        low_m = Signal(M + 1, name=f"{name}_low_m1")
        t = Signal(M + 2, name=f"{name}_win")
        m.d.comb += [low_m.eq(plus_not(lo, run_m)),
                     t.eq(plus_not(Cat(lo[:7], lw, lw[-1]), run_m))]
        eq, imm = (named(m, Cat(*(v[i:i + 2] == run_m[i:i + 2] for i in range(0, M, 2))),
                         f"{name}_{n}", keep=True).all()
                   for v, n in ((lo, "eq"), (lo1, "imm_eq")))
        m.d.comb += [flags.gt.eq(low_m[M]), flags.same.eq(eq), flags.t1.eq(t[M + 1]),
                     flags.t0.eq(t[M]), flags.imm.eq(imm)]
        return flags

    @staticmethod
    def _run_tests(adv, run):
        """The tests of :meth:`_adv_tests` from the offset's flags (``adv``) and the run's
        (``run``, :meth:`_run_flags`). With ``lo`` >= ``run`` the offset's high bits are
        as they are, 0 at or before; else they lose one: before is the offset's sign, or
        with ``lo`` < ``run`` that of its high bits less one (``at_eq``, ``lo`` = ``run``:
        0 or negative). In the window: the offset less one (``lo`` - ``run`` - 1, or 2^M
        more when the high bits are 1) below the window: T below 0, or below -2^M when 2^M
        is to add. Just after: the offset less one equals the run."""
        at_eq = Mux(run.same, adv.s0 | adv.up0, adv.s1)
        before = Mux(run.gt, adv.s0, at_eq)
        in_win = Mux(run.gt, ~adv.s0 & adv.up0 & run.t1,
                     ~at_eq & adv.up1 & run.t1 & ~run.t0)
        return Cat(before, in_win, run.imm & adv.z1)
