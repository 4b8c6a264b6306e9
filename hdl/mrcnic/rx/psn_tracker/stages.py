"""The stages of :class:`~mrcnic.rx.psn_tracker.PsnTracker`'s pipeline, R to U (their work
on the held completions is :mod:`mrcnic.rx.psn_tracker.pool`; A to T, the SACK's bitmap,
:mod:`mrcnic.rx.psn_tracker.sack`), the registers of every stage, and the constants and
record layouts they share with the tracker's top (issue, queue, engines).

Each stage is a method of :class:`TrackerStages` (mixed into the tracker) that reads the
registers of the stage before it and loads those of the next (:meth:`_stage_registers`,
named ``<stage>_<field>`` so that a timing report names the stage); its docstring says what
it decides and what it forwards. The pipeline and its hazards: docs/blocks/psn-tracker.md.
"""

import functools
import operator
from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Mux, Signal
from amaranth.lib import data
from amaranth.utils import ceil_log2

from mrcnic.base import proto
from mrcnic.base.records import ACK_DESC, COMPLETION, VERDICT, Verdict
from mrcnic.base.gates import assign, register_copies
from mrcnic.base.proto import NackCode, SackMode
from mrcnic.base.rules import SACK_BITMAP_BITS, SACK_OFFSET
from mrcnic.rx.psn_tracker.logic import PsnTests, at_or_above, named, select_bit, word_search

__all__ = ["TrackerStages", "PSN", "CHUNK", "HALF", "WORD", "WINDOW_CHUNKS", "LATE_SACK",
           "BITMAP_BITS", "QUEUE_DEPTH", "FIFO_DEPTH", "IN_FLIGHT", "POOL_DATA", "OP", "CONT",
           "ACK_BODY", "ACK_TAIL", "VERDICT_NAMES"]

PSN = proto.PSN_BITS
CHUNK = proto.MPR_UNIT_PSNS          # PSNs per ring chunk (two bank words)
HALF = CHUNK // 2                     # PSNs per ring bank word
WORD = 16                             # bits a search word covers (stage F), then combined (D)
WORD_BITS = 4
# Chunks read from the packet's PSN for the CACK advance: 3 by default (a run of at least
# 257 PSNs after the packet is found in one pass), 2 the small option (at least 129).
WINDOW_CHUNKS = (2, 3)
# Decision: a packet that fills the lowest hole while later PSNs have arrived (CACK moves
# past it) is SACKed at once. Without it, when the packets at the end of a burst arrive out
# of order, the one that completes them would wait for the next coalesced SACK, and with no
# more traffic the sender would time it out: a spurious retransmission and an EV wrongly
# taken for broken. (SACKing every packet that lands below the highest PSN seen would do
# too, but under spraying that is nearly every packet.)
LATE_SACK = "a packet that fills the lowest hole, CACK moving past it"
BITMAP_BITS = SACK_BITMAP_BITS
QUEUE_DEPTH = 16                      # input queue: records accepted, not yet past stage U
FIFO_DEPTH = 16                       # each output FIFO
# Records that may still enter an output FIFO after its level was registered: one in each
# of stages R to U, and those issued in that cycle and the next (7); one more for margin.
IN_FLIGHT = 8
# A held WRITE-with-immediate completion: what only its release reads, in distributed RAM
# (its QP, PSN and valid flag are registers, compared every cycle).
POOL_DATA = data.StructLayout({"imm": 32, "tag": 16})
# A record in the pipeline: the fields of a packet its decisions need (the opcode as the
# three classes they test; ``asks``: BTH A, rtx or ECN CE, any of which asks for a SACK),
# and its place in the input queue (``idx``; the rest of the packet is read there in stage
# U); or a continuation (``cont``) of a packet's CACK advance with its SACK decision
# (``due``), whose ``psn`` is the first PSN after the window searched before (its search
# starts at it, a packet's after its PSN), the packet itself being held in the continuation
# register (:data:`CONT`).
OP = data.StructLayout({"psn": PSN, "probe": 1, "write": 1, "wimm": 1, "asks": 1,
                        "trimmed": 1, "lasthop": 1, "cont": 1, "due": 1,
                        "idx": ceil_log2(QUEUE_DEPTH)})
# What a continuation's descriptor takes from its packet.
CONT = data.StructLayout({"qp": 16, "psn": PSN, "ce": 1, "entropy": 32, "timestamp": 16})
VERDICT_NAMES = [v.name.lower() for v in Verdict]     # the verdict flags, by code
# A descriptor in two parts: the body, written in stage U, and the tail, four cycles later
# (the bitmap read after the record's write, and the figures worked out beside it).
ACK_TAIL = data.StructLayout({"bitmap": BITMAP_BITS, "ooo_count": 15, "ack_psn_offset": 16})
ACK_BODY = data.StructLayout({name: f.shape for name, f in ACK_DESC
                              if name not in ("bitmap", "ooo_count", "ack_psn_offset")})


class TrackerStages(PsnTests):
    """Stages R (read), W (window), F (fetch), D (decide) and U (update) of
    :class:`~mrcnic.rx.psn_tracker.PsnTracker`, and the registers between all its stages
    (those of A, B, C and T, :class:`~mrcnic.rx.psn_tracker.sack.SackStages`, too). Mixed
    into the tracker: the methods read its parameters (``window_chunks``,
    ``mpr_max``, ...)."""

    # --- Helpers ---------------------------------------------------------------------------

    def _ring_addr(self, qp, chunk):
        """Ring word of QP ``qp``'s chunk ``chunk`` (PSN bits 7 and up, taken mod mpr_max)."""
        cbits, qbits = self._cbits, self._qbits
        return Cat(chunk[:cbits], qp[:qbits]) if cbits else qp[:qbits]

    def _parity(self, psn):
        """The lap parity of ``psn``: its ring bit XOR this reads "arrived"."""
        lap = self.lap_bit
        return psn[lap] if lap < PSN else Const(0, 1)

    def _chunk_parity(self, chunk):
        """The lap parity of the PSNs of chunk number ``chunk`` (PSN bits 7 and up)."""
        lap = self.lap_bit
        return chunk[lap - 7] if lap < PSN else Const(0, 1)

    def _stage_registers(self):
        """The registers each stage hands the next, by stage (``r`` .. ``c``); ``uw``, what
        of the context stage U wrote its next record of the QP needs (forwarded); ``kill``
        and ``commit``."""
        CTX, qbits, nw, C = self._ctx_layout, self._qbits, self.words, self.window_chunks
        # The low bits of the PSN's offset from a window base that F's tests against an
        # advancing CACK compute with (see _adv_tests): the ring's, and at least the run's.
        self._adv_bits = max(7 + self._cbits, ceil_log2(self.window))
        self._adv_layout = data.StructLayout({"lo": self._adv_bits, "up0": 1, "up1": 1,
                                              "s0": 1, "s1": 1, "lo1": self._adv_bits,
                                              "z1": 1, "lw": self._adv_bits - 6})
        # The PSN's low bits against a run (see _run_flags).
        self._run_layout = data.StructLayout({"gt": 1, "same": 1, "t1": 1, "t0": 1, "imm": 1})

        def stage(prefix, **shapes):
            return SimpleNamespace(**{k: Signal(v, name=f"{prefix}_{k}")
                                      for k, v in shapes.items()})
        common = dict(valid=1, op=OP, qpi=qbits, qp_in=1)
        # Flags of a PSN against a CACK (stage D picks the set that holds): at or before
        # it, in the window above it, just after it.
        cmp = dict(before=1, in_win=1, imm=1)
        st = SimpleNamespace()
        st.r = stage("r", **common, qpl=qbits)
        # The forwarding flags of a ring write against this record's window (stages R, W).
        self._fwd_layout = data.StructLayout({
            "hit": C * CHUNK // WORD, "bsel": WORD, "val": C, "own": 1, "next": 1,
            "phys_en": 1, "phys_bit": 6, "phys_raw": 1})
        st.w = stage("w", **common, same_u=1, same_d=1, fwd_u=self._fwd_layout,
                     next_low=7 + self._cbits, psn_m1=PSN, hi_m1=PSN - self._adv_bits,
                     lo_zero=1,
                     par=C, adv=self._adv_layout, ctx=CTX)
        st.f = stage("f", **common, lo=data.ArrayLayout(HALF, C), hi=data.ArrayLayout(HALF, C),
                     ctx=CTX, ctx_uw=1, uw_adv=1, sel=1, sel_adv=1, every=2,
                     ram_run=self._run_layout, uw_run=self._run_layout,
                     act=1, fwd=self._fwd_layout,
                     next_par=1, next_val=1, own_act=1, next_act=1,
                     par=C, lap_own=CHUNK, forced=CHUNK,
                     adv=self._adv_layout,
                     pp_above=1, pp_new_hole=1, hi_ram=2, hi_uw=2,
                     own_pre=CHUNK // 4, next_pre=CHUNK // 4)
        st.d = stage("d", **common, held=1, arrived=1, nextbit=1, pos0=1,
                     qp_ok=1, data=1, trig=1, pool_full=2,
                     raw=HALF, found=nw, found_last=1, idx=data.ArrayLayout(WORD_BITS, nw),
                     t=data.StructLayout(cmp), above_hi=1)
        # ``ring_addr``, ``ring_lo``/``ring_hi``: the packet's ring write, decided in D (the
        # write port's address and enables come from registers).
        st.u = stage("u", **common, qp_ok=1, place=1, adv=1, run=range(self.window),
                     ring_addr=qbits + self._cbits, ring_lo=1, ring_hi=1,
                     verdict=3, pkt_op=1, emit_sack=1, emit_nack=1, reason=8,
                     due=1, need_cont=1, above_hi=1, admit=1, own_cpl=1, word=HALF,
                     cand=self.max_wimm_dest, rel=data.ArrayLayout(9, self.max_wimm_dest),
                     events=data.StructLayout({n: 1 for n in VERDICT_NAMES}),
                     stats=self._stats_layout, length=16, hi_rd=min(PSN, 9 + self._cbits),
                     since_rd=8, ctx_we=1)
        st.a = stage("a", valid=1, admit=1, qpi=qbits, cack=PSN, pbase=PSN,
                     psn=PSN, plain=1, nack=1)
        # Registers loaded alike with others, kept apart (synthesis merges registers loaded
        # alike unless their resets differ) so that each drives its own stage's logic: the
        # ring's write address (the QP index in it is ``u_qpi``, which addresses the
        # context), the run's end for F's tests (U's feeds its CACK, the releases and the
        # descriptor).
        st.u.ring_addr = Signal(qbits + self._cbits, name="u_ring_addr", reset_less=True)
        st.u.run_f, = register_copies(st.u.run, ["f"])
        # The window words the forwarded write lands in, when it is made: cleared by the
        # write's decision through the flip-flops' set/reset input, with no reset of its
        # own to share that input (F's results are used only for a valid record).
        st.f.hit = Signal(C * CHUNK // WORD, name="f_fwd_hit", reset_less=True)
        tail = dict(valid=1, shift=6, half=1, par0=1, par_next=1, nack=1, tail=ACK_TAIL)
        st.b = stage("b", valid=1, shift=6, half=1, par0=1, par_next=1, nack=1, plain=1,
                     trigger=PSN, ooo=PSN)
        st.c = stage("c", **tail)
        st.t = stage("t", valid=1, shift=4, nack=1, tail=ACK_TAIL, coarse=BITMAP_BITS + 15)
        # The packet's own completion, written in stage U.
        st.own = stage("own", valid=1, cpl=COMPLETION)
        st.uw = stage("uw", run=range(self.window), every=2)
        # The packet's 4-bit group in its chunk, for the select of its own bit alone, the
        # same for the select of the next PSN's bit, and the PSN's offset from a window base
        # (whose low seven bits are the position again): registers loaded alike with the
        # PSN's bits, which drive much else, each kept apart from them by a reset of its own
        # (synthesis merges registers bit by bit where their loads and resets agree: see
        # :func:`~mrcnic.base.gates.register_copies`).
        st.f.own_pos = Signal(5, name="f_own_pos", init=(1 << 5) - 1)
        st.f.next_pos = Signal(5, name="f_next_pos", reset_less=True, init=(1 << 5) - 1)
        st.f.adv = Signal(self._adv_layout, name="f_adv", reset_less=True)
        # (The same split of the PSN against the CACK read in W: its low bits are the
        # PSN's as in ``f_adv``, which share them.)
        st.f.ram_adv = Signal(self._adv_layout, name="f_ram_adv", reset_less=True)
        # (And against the window base of the record in U when this one is in W.)
        st.f.uw_adv_off = Signal(self._adv_layout, name="f_uw_adv_off", reset_less=True)
        st.w.adv = Signal(self._adv_layout, name="w_adv", reset_less=True)
        st.f.bsel_copies = register_copies(Signal(WORD, name="f_fwd_bsel"),
                                           [f"c{j}" for j in range(1, C)])
        st.kill = Signal(name="d_kill")
        # (The search's word flags again, for the OR that tells a hole inside the window.)
        st.d.found_c = Signal(nw, name="d_found_c", reset_less=True)
        st.d.found_last_c = Signal(name="d_found_last_c", reset_less=True)
        # (The flush and stage D's window tests again, for W's forwarding decision: kept
        # apart as those above.)
        st.kill_w, = register_copies(st.kill, ["w"])
        st.d.t_w = data.View(st.d.t.shape(), register_copies(st.d.t.as_value(), ["w"])[0])
        # Stage D's placement, before its register (stage W registers the forwarding it
        # steers a cycle ahead).
        st.d_place = Signal(name="d_place")
        # (And its advance, kept as a boundary of LUT mapping: the flush takes it in its one
        # level after the hole flags.)
        st.d_adv = Signal(name="d_advance", attrs={"keep": 1})
        st.kill_held = Signal(name="d_kill_held")
        st.commit = Signal(name="u_commit")
        st.sack = Signal(name="u_sack")             # a SACK sent (stage U)
        return st

    # --- Stage R: read ---------------------------------------------------------------------

    def _stage_r_read(self, m, mem, st):
        """Stage R: the block RAM reads the window (addressed in I); how the ring write of
        the record now in D (in U when this one is in W) would reach this window."""
        r, w, d = st.r, st.w, st.d
        chunks = []
        for j in range(self.window_chunks):
            chunk = Signal(PSN - 7, name=f"r_chunk{j}")
            m.d.comb += chunk.eq(r.op.psn[7:] + j)
            chunks.append(chunk)
        same = d.valid & ~d.op.cont & d.qp_in & (d.qpi == r.qpi) & r.qp_in
        f = st.f
        # The QP's context, read here into W's registers with the write on this edge (the
        # record in U's) forwarded: what a read in W would give, from flip-flops. (A QP
        # command's writes, through the same port, are not forwarded: no record is in R
        # while one runs.)
        cw = mem.ctx_w
        u_we = st.u.ctx_we
        m.d.comb += mem.ctx_rd.addr.eq(r.qpi)
        m.d.sync += [w.valid.eq(r.valid & ~st.kill), w.op.eq(r.op), w.qpi.eq(r.qpi),
                     w.ctx.eq(Mux(u_we & (cw.addr == r.qpi), cw.data, mem.ctx_rd.data)),
                     w.qp_in.eq(r.qp_in), w.same_u.eq(same),
                     # The record in F is of this QP (in D when this one is in W: W
                     # forwards its write, then checked valid, from this register).
                     w.same_d.eq(~f.op.cont & f.qp_in & (f.qpi == r.qpi) & r.qp_in),
                     # (The next PSN's ring position, which W compares with the write's.)
                     w.next_low.eq(r.op.psn[:len(w.next_low)] + 1),
                     # (The PSN less one, for W's new-hole tests.)
                     w.psn_m1.eq(r.op.psn - 1),
                     # (And its bits above the run's less one, for W's tests against CACK.)
                     w.hi_m1.eq(r.op.psn[self._adv_bits:] - 1),
                     w.lo_zero.eq(r.op.psn[:self._adv_bits] == 0),
                     # (The lap parity of each window chunk, which W removes from the words.)
                     w.par.eq(Cat(*(self._chunk_parity(c) for c in chunks))),
                     # (The PSN's offset from the window base of the record in F, in D when
                     # this one is in W, and in U when it is in F.)
                     w.adv.eq(self._adv_offset(m, "r_adv", r.op.psn,
                                               Cat(Const(0, 7), f.op.psn[7:]))),
                     w.fwd_u.eq(self._fwd_flags(m, "r", r.op.psn, chunks, d.op.psn))]

    def _fwd_flags(self, m, prefix, psn, chunks, a_psn, next_low=None):
        """How a ring write of PSN ``a_psn`` of the same QP reaches the window of ``psn``
        (chunks ``chunks``): the window words it lands in (any lap), its bit in the word and
        the value it reads there by chunk, whether it is the packet's own bit or the next,
        or in the bank word of the packet's own bit (for the write back)."""
        C, cbits = self.window_chunks, self._cbits
        flags = Signal(self._fwd_layout, name=f"{prefix}_fwd")
        a_raw = ~self._parity(a_psn)
        hit = []
        for j in range(C):
            chunk_hit = (chunks[j][:cbits] == a_psn[7:7 + cbits]) if cbits else 1
            hit += [chunk_hit & (a_psn[WORD_BITS:7] == k) for k in range(CHUNK // WORD)]
        m.d.comb += [
            flags.hit.eq(Cat(*hit)),
            flags.bsel.eq(Const(1, WORD) << a_psn[:WORD_BITS]),
            flags.val.eq(Cat(*(a_raw ^ self._chunk_parity(chunks[j]) for j in range(C)))),
            flags.own.eq(a_psn[:7 + cbits] == psn[:7 + cbits]),
            flags.next.eq(a_psn[:7 + cbits] ==
                          ((psn + 1)[:7 + cbits] if next_low is None else next_low)),
            flags.phys_en.eq(a_psn[6:7 + cbits] == psn[6:7 + cbits]),
            flags.phys_bit.eq(a_psn[:6]),
            flags.phys_raw.eq(a_raw),
        ]
        return flags

    # --- Stage W: window -------------------------------------------------------------------

    def _stage_w_window(self, m, mem, st):
        """Stage W: the window's bank words, lap parity removed, into registers;
        beside them, how the ring writes this read misses reach it: that of the record in U
        (its placement known now) or of the record in D (its placement decided now,
        ``d_place``), whichever is of this QP (never both: they are a cycle apart). Whether
        the write is made and the window words it lands in (any lap), registered with that
        decision so that F's search starts from registers alone; the value its bit will read
        there, whether it is this packet's own bit or the next, or its bank word (for the
        write back); the search masks (the positions up to the packet's own in its chunk,
        the words before its word); the PSN against the record in D's PSN, and its offset
        from that record's window base (worked out in R, :meth:`_adv_offset`) passed on,
        against which stage F tests the highest PSN and CACK that record will write. The
        QP's context (read in R, as a read here would give it) passed on, and the PSN's
        offset from its CACK less the low bits; whether the record in U (whose context
        write that read misses) or the one in D is of this QP, and the PSN's offset from
        the window base of the record in U if it advances CACK (F tests the PSN against the
        CACK it wrote); the PSN against the highest PSN seen in the context read and in the one the
        record in U writes now (F picks)."""
        w, f, d, u = st.w, st.f, st.d, st.u
        C = self.window_chunks
        op = w.op
        psn = op.psn
        from_u, from_d = Signal(name="w_fwd_from_u"), Signal(name="w_fwd_from_d")
        m.d.comb += [from_u.eq(u.place & w.same_u),
                     from_d.eq(d.valid & w.same_d)]
        chunks = []
        for j in range(C):
            chunk = Signal(PSN - 7, name=f"w_chunk{j}")
            m.d.comb += chunk.eq(psn[7:] + j)
            chunks.append(chunk)
        fwd_d = self._fwd_flags(m, "w", psn, chunks, d.op.psn, w.next_low)
        pars = list(w.par)
        fwd = Signal(self._fwd_layout, name="w_fwd")
        m.d.comb += fwd.eq(Mux(from_u, w.fwd_u, fwd_d))
        # (D's placement, ``d_place``, written again here from D's registers in two kept
        # halves, so that the register it steers is three LUT levels from them.)
        # (``d_data`` is a live record's: D's valid is not an input of its own.)
        d_fresh = named(m, w.same_d & ~st.kill_w & d.data & ~d.arrived & d.t_w.in_win,
                        "w_fwd_d_fresh", keep=True)
        d_refuse = named(m, d.op.wimm & ~d.t_w.imm &
                         Mux(u.admit, d.pool_full[1], d.pool_full[0]),
                         "w_fwd_d_refuse", keep=True)
        act = Signal(name="w_fwd_act")
        m.d.comb += act.eq(from_u | (d_fresh & ~d_refuse))
        rel7 = psn[:7]
        raw = [Cat(mem.lo.r_data[j], mem.hi.r_data[j]) for j in range(2)]
        m.d.sync += [
            f.valid.eq(w.valid & ~st.kill), f.op.eq(op), f.qpi.eq(w.qpi), f.qp_in.eq(w.qp_in),
            # The words with the lap parity removed: a bit reads 1 for "arrived".
            *[f.lo[j].eq(mem.lo.r_data[j] ^ pars[j].replicate(HALF)) for j in range(C)],
            *[f.hi[j].eq(mem.hi.r_data[j] ^ pars[j].replicate(HALF)) for j in range(C)],
            # (The forwarded write's bit in the word, a copy for each chunk but the first:
            # each a share of the window's loads.)
            *[b.eq(fwd.bsel) for b in f.bsel_copies],
            # Whether the write is there, known a cycle ahead: the record in U placed its
            # packet, or the record in D places it now (its decision, ``d_place``).
            f.act.eq(act),
            f.fwd.eq(fwd),
            # The window words the write lands in (any lap), when it is there.
            f.hit.eq(Mux(act, fwd.hit, 0)),
            # The packet's position (for the selects of its bit and the next), the next
            # PSN's lap parity and the value the forwarded write gives it; whether that
            # write, when it is there, is at the packet's own position or the next.
            f.next_pos.eq(psn[2:7]), f.own_pos.eq(psn[2:7]),
            # The first 4:1 level of the selects of the packet's own bit and the next (by
            # the position's two low bits), the one level after the block RAM's output
            # and its forwarding: F selects among the 32 left.
            f.own_pre.eq(self._select4(raw[0], psn[:2])),
            f.next_pre.eq(self._select4(Cat(raw[0][1:], raw[1][0]), psn[:2])),
            f.next_par.eq(Mux(psn[:7] == CHUNK - 1, pars[1], pars[0])),
            f.next_val.eq(Mux(psn[:7] == CHUNK - 1, fwd.val[1], fwd.val[0])),
            f.own_act.eq(act & fwd.own),
            f.next_act.eq(act & fwd.next),
            f.par.eq(Cat(*pars)),
            # Positions up to the packet's own read as arrived (the search starts after it).
            # Position 0 is not forced: the search does not read it (a continuation's first).
            f.forced.eq(Cat(Const(0, 1), at_or_above(m, rel7, "w_forced")[1:])),
            f.adv.eq(w.adv), f.adv.lw.eq(self._adv_lw(w.adv.lo, w.ctx.mpr_m1)),
            # The QP's context as of this cycle; the write it misses (that of the record now
            # in U) changes only its CACK (F tests against it, ``uw_adv``), its highest PSN
            # (tested below) and its count since the last SACK (``uw_every``).
            f.ctx.eq(w.ctx),
            # The PSN against that CACK, its high bits subtracted here (F takes the low bits
            # as the run).
            f.ram_adv.eq(self._adv_offset(
                m, "w_ram_adv", psn, Cat(Const(0, self._adv_bits),
                                         w.ctx.cack[self._adv_bits:]),
                psn_m1=w.psn_m1, hi_m1=w.hi_m1, lo_zero=w.lo_zero)),
            f.every.eq(self._every(w.ctx.since, st.sack_every)),
            f.ctx_uw.eq(u.ctx_we & (u.qpi == w.qpi)),
            # And the record in U advances CACK: the PSN's offset from its window base.
            f.uw_adv.eq(u.ctx_we & (u.qpi == w.qpi) & u.adv),
            f.uw_adv_off.eq(self._adv_offset(m, "w_uw_adv", psn,
                                             Cat(Const(0, 7), u.op.psn[7:]))),
            # The record in D is of this QP (in U next cycle, unless the stages are
            # flushed, this record with them).
            f.sel.eq(d.valid & d.qp_ok & (d.qpi == w.qpi)),
            # (And it advances CACK: D's decision, taken as it is made, so that F's pick of
            # the tests that hold is steered by a register.)
            f.sel_adv.eq(d.valid & d.qp_ok & (d.qpi == w.qpi) & st.d_adv),
        ]
        if self._lap_chunks:
            m.d.sync += f.lap_own.eq(Mux(op.cont, 0, Const(1, CHUNK) << rel7))
        # The PSN against the one the record in D places (the highest PSN seen if it places
        # above it).
        m.d.sync += Cat(f.pp_above, f.pp_new_hole).eq(
            self._hi_tests(m, psn, w.psn_m1, d.op.psn, "w_pp"))
        # The tests against the highest PSN seen, here rather than in F: against the
        # context read, and against the one the record in U writes now: its PSN when it
        # places above the highest, else what it read (both tested, picked after).
        hi_tests = functools.partial(self._hi_tests, m, psn, w.psn_m1)
        u_hi = Mux(u.place & u.above_hi, hi_tests(u.op.psn, "w_hi_u"),
                   hi_tests(u.hi_rd, "w_hi_uread"))
        m.d.sync += [f.hi_ram.eq(hi_tests(w.ctx.hi, "w_hi")), f.hi_uw.eq(u_hi)]
        self._w_run_flags(m, mem, st)

    def _stage_f_fetch(self, m, f_regs, mem, st):
        """Stage F: the tests of this packet's PSN against the QP's context, and against the
        CACK the record in U writes if it advances, the ones that hold picked; whether the
        pool will be full; the window, each position one function of six registers (lap
        parity removed, the write the read missed forwarded), positions up to the
        packet's own reading as arrived and later laps of its own position as not, searched
        per :data:`WORD`-bit word from the position after the packet's for the first that
        has not arrived; the packet's own bit and the next; the raw bank word of its own
        bit for the write back."""
        f, d, u = st.f, st.d, st.u
        C, nw, W = self.window_chunks, self.words, self.window
        nwc = CHUNK // WORD
        # Each position from registers in one function of five: the bit as read (lap parity
        # removed in W), or the value the forwarded write gives it (the write there, known
        # in W);
        # positions up to the packet's own read as arrived (``forced``).
        hitw, forced = f.hit, f.forced
        parts = []
        for j in range(C):
            a = Cat(f.lo[j], f.hi[j])
            bsel = f.fwd.bsel if j == 0 else f.bsel_copies[j - 1]
            hit = Cat(*(Mux(hitw[k], bsel, 0) for k in range(j * nwc, (j + 1) * nwc)))
            vec = (a & ~hit) | (f.fwd.val[j].replicate(CHUNK) & hit)
            if j in self._lap_chunks:
                vec = vec & ~f.lap_own
            if j == 0:
                vec = Cat(vec[0], vec[1:] | forced[1:])
            parts.append(named(m, vec, f"f_arrived{j}", keep=True))
        full = Cat(*parts)
        # Search position i stands for window position i + 1: the search finds the end of
        # the run of arrived PSNs (the last before the first hole), which is the new CACK;
        # the window's last word ends at the position after the window, taken as a hole.
        srch = Signal(W, name="f_search")
        m.d.comb += srch.eq(Cat(full[1:], Const(0, 1)))
        # Each word's index of its first hole, and apart from it whether it has one (two
        # levels: a kept nibble level, which no index logic shares).
        found, idx = [], []
        for k in range(nw):
            word = srch[k * WORD:(k + 1) * WORD]
            _, ik = word_search(m, ~word, f"f_word{k}")
            found.append(named(m, ~word.all(), f"f_hole{k}", keep=True))
            idx.append(ik)
        found_last = ~srch[(nw - 1) * WORD:W - 1].all()
        op = f.op
        # The packet's own bit and the next, as read (the last three levels of a 128:1 mux
        # each, the first taken in W; parity removed after), or the value the record ahead
        # wrote there.
        own_raw = select_bit(m, f.own_pre, f.own_pos, "f_own_sel")
        # (The next bit: position p + 1 of the chunk and the next chunk's first, selected
        # by p, 128 inputs.)
        next_raw = select_bit(m, f.next_pre, f.next_pos, "f_next_sel")
        own_act, next_act, act = f.own_act, f.next_act, f.act
        raw_own = Signal(HALF, name="f_raw_own")
        m.d.comb += raw_own.eq(Mux(op.psn[6], f.hi[0], f.lo[0]) ^ f.par[0].replicate(HALF))
        phys = Signal(HALF, name="f_phys_mask")
        m.d.comb += phys.eq(Mux(f.fwd.phys_en & act, Const(1, HALF) << f.fwd.phys_bit, 0))
        m.d.sync += [
            d.valid.eq(f.valid & ~st.kill), d.op.eq(op), d.qpi.eq(f.qpi),
            d.qp_in.eq(f.qp_in),
            # Held completions of the QP: in the pool, or being admitted by the record in U.
            d.pool_full.eq(self._pool_full(mem, st)),
            # (Each term a named level: LUT-area mapping would chain the compares.)
            d.held.eq(Cat(*(named(m, mem.pool[i].valid & (mem.pool[i].qpi == f.qpi),
                                  f"f_held{i}", keep=True)
                            for i in range(self.max_wimm_dest)),
                          named(m, u.admit & (u.qpi == f.qpi), "f_held_u",
                                keep=True)).any()),
            d.found.eq(Cat(*found)), d.found_last.eq(found_last),
            d.found_c.eq(Cat(*found)), d.found_last_c.eq(found_last),
            *[d.idx[k].eq(idx[k]) for k in range(nw)],
            d.arrived.eq(Mux(own_act, f.fwd.val[0], own_raw ^ f.par[0])),
            d.nextbit.eq(Mux(next_act, f.next_val, next_raw ^ f.next_par)),
            # A continuation's search starts at its window's first position.
            d.pos0.eq(~op.cont | parts[0][0]),
            d.raw.eq((raw_own & ~phys) | (f.fwd.phys_raw.replicate(HALF) & phys)),
        ]
        self._context_tests(m, f_regs, mem, st)

    def _context_tests(self, m, f_regs, mem, st):
        """Stage F's tests of the packet's PSN: against the context read in W or, when the
        record now past U is of this QP, what it wrote (CACK, packets since the last SACK;
        the highest PSN seen was tested against both in W), and against the CACK the record
        in U writes if it advances; each CACK as a base and a run (a window base plus the
        end of the run, or the CACK read less its low bits plus them: the PSN's offset from
        the base taken stages ahead, less the run, :meth:`_adv_tests`); the tests that hold
        picked by what the records in U and past it do when they are of this QP, and the
        SACK triggers known here."""
        f, d, u = st.f, st.d, st.u
        # The count since the last SACK, one more and two more, against sack_every (worked
        # out with the context read, or written).
        every = Mux(f.ctx_uw, st.uw.every, f.every)
        psn = f.op.psn
        # (Whether the QP is open and its window, from the context read in W alone: stage U
        # writes them back as it read them, and only a QP command, which runs with the
        # stages empty, changes them.)
        is_open = f.ctx.open

        # Against the highest PSN seen: both contexts tested in W, picked here.
        hi_t = Mux(f.ctx_uw, f.hi_uw, f.hi_ram)
        cfg = st.sack_every
        op = f.op
        # What the record in U changes in this QP's context, picked here: its CACK (if it
        # advances), its highest PSN (if it places above it), its count since the last SACK.
        fwd_adv, fwd_hi = f.sel_adv, f.sel & u.place & u.above_hi
        fwd_sack, fwd_inc = f.sel & u.pkt_op & u.due, f.sel & u.place
        t = Signal(d.t.shape(), name="f_tests")
        m.d.comb += t.eq(Mux(fwd_adv, self._adv_tests(m, f.adv, u.run_f),
                             # (Against the CACK the record past U wrote if it advanced,
                             # else against the CACK read, which it did not change: the
                             # runs' flags worked out in W.)
                             Mux(f.uw_adv, self._run_tests(f.uw_adv_off, f.uw_run),
                                 self._run_tests(f.ram_adv, f.ram_run))))
        m.d.sync += [
            # The QP is open; and the record is a WRITE (not a probe, not trimmed) to it.
            d.qp_ok.eq(f.qp_in & is_open),
            # ``data``: and the record is a packet going on to D.
            d.data.eq(f.valid & ~st.kill & ~op.cont &
                      f.qp_in & is_open & ~op.probe & ~op.trimmed & op.write),
            d.t.eq(t), d.t_w.eq(t),
            d.above_hi.eq(Mux(fwd_hi, f.pp_above, hi_t[0])),
            # The SACK triggers known here: the packet asks (BTH A, a retransmission, ECN
            # CE), opens a new hole, or is the sack_every-th since the last SACK (with the
            # count read, one more: the record in U placed its packet, or 0: it was SACKed).
            d.trig.eq(op.asks |
                      Mux(fwd_hi, f.pp_new_hole, hi_t[1]) |
                      Mux(fwd_sack, cfg.is1, cfg.nz & Mux(fwd_inc, every[1], every[0]))),
        ]

    # --- Stage D: decide -------------------------------------------------------------------

    def _stage_d_decide(self, m, mem, st, ctl, q):
        """Stage D: the verdict, from F's tests, the SACK triggers, the search combined over
        the words, the ring write's address and enables; a continuation or a possible
        release of held completions sets ``kill``, which flushes the stages behind next
        cycle."""
        d, u = st.d, st.u
        N = self.max_wimm_dest
        op = d.op
        live = Signal(name="d_live")
        m.d.comb += live.eq(d.valid & ~st.kill)
        t, above_hi = d.t, d.above_hi
        # Held completions: those in the pool, and the admissions of the two records ahead
        # (worked out in F, but for the admission of the record now in U).
        pool_full = named(m, Mux(u.admit, d.pool_full[1], d.pool_full[0]),
                          "d_pool_full")
        qp_ok = d.qp_ok
        pkt_op = live & ~op.cont
        # A packet that may be placed: a WRITE to an open QP, not arrived (the window tests
        # and the pool decide).
        fresh = named(m, d.data & ~d.arrived, "d_fresh")
        cand = fresh & t.in_win
        refuse = op.wimm & ~t.imm & pool_full
        v = {
            "no_qp": pkt_op & ~qp_ok,
            "probe": pkt_op & qp_ok & op.probe,
            "trimmed": pkt_op & qp_ok & ~op.probe & op.trimmed,
            "bad_opcode": pkt_op & qp_ok & ~op.probe & ~op.trimmed & ~op.write,
            "duplicate": ~st.kill & d.data & (t.before | (t.in_win & d.arrived)),
            "out_of_window": ~st.kill & d.data & ~t.before & ~t.in_win,
            "no_resource": ~st.kill & cand & refuse,
            "place": ~st.kill & cand & ~refuse,
        }
        place = st.d_place
        m.d.comb += place.eq(v["place"])
        run, found = self._combine(m, d)
        # A packet placed at CACK + 1 (then in the window, and never refused) or a
        # continuation whose window starts with an arrived PSN moves CACK.
        adv = st.d_adv
        m.d.comb += adv.eq(~st.kill & (named(m, d.valid & op.cont & qp_ok & d.pos0,
                                             "d_cont_adv") | (fresh & t.imm)))
        need_cont = named(m, adv & ~found, "d_need_cont")
        # SACK triggers (fills: LATE_SACK, CACK moves past the packet).
        trig = named(m, d.trig | (t.imm & d.nextbit), "d_sack_trigger")
        answer = named(m, v["probe"] | v["duplicate"], "d_answer")
        due = Signal(name="d_due")
        m.d.comb += due.eq(Mux(op.cont, op.due, answer | (place & trig)))
        # The NACK's reason, valid when one is sent (each NACK verdict excludes the others).
        reason = Signal(8)
        m.d.comb += reason.eq(Mux(op.trimmed,
                                  Mux(op.lasthop, NackCode.TRIMMED_LASTHOP, NackCode.TRIMMED),
                                  Mux(t.in_win, NackCode.NO_RESOURCE,
                                      NackCode.PSN_OUT_OF_WINDOW)))
        # The verdict's code: each bit an OR of the (exclusive) verdicts that have it.
        verdict = Signal(3)
        for bit in range(3):
            m.d.comb += verdict[bit].eq(functools.reduce(operator.or_, (
                sig for name, sig in v.items() if Verdict[name.upper()] >> bit & 1)))
        wb = op.psn & ~(CHUNK - 1)
        own = Signal(HALF, name="d_own_bit")
        m.d.comb += own.eq(Const(1, HALF) << op.psn[:6])
        # Held completions the advance may release: the QP's, within 512 PSNs of the window
        # base (the pool as it is now: the record ahead, of another QP, admits only its own).
        rel_cand, rels = [], []
        for i in range(N):
            pool_i = mem.pool[i]
            rel = Signal(PSN, name=f"d_held_pos{i}")
            m.d.comb += rel.eq(pool_i.psn - wb)
            rel_cand.append(pool_i.valid & (pool_i.qpi == d.qpi) & (rel[9:] == 0))
            rels.append(rel[:9])
        # The QP's statistics and the packet's length, for U's counts (no write to come
        # before U can change them: the record in U now is of another QP).
        m.d.comb += [mem.stats_r.addr.eq(d.qpi), mem.ctx_d.addr.eq(d.qpi)]
        m.d.sync += [
            # (The QP's highest PSN seen, for W's tests against what U writes, and its count
            # since the last SACK, for U's: the record in U now is of another QP.)
            u.hi_rd.eq(mem.ctx_d.data.hi), u.since_rd.eq(mem.ctx_d.data.since),
            u.stats.eq(mem.stats_r.data), u.length.eq(q.len_at_d.data),
            u.valid.eq(live), u.op.eq(op), u.qpi.eq(d.qpi), u.qp_in.eq(d.qp_in),
            u.qp_ok.eq(qp_ok), u.place.eq(place),
            # (U's context write, live and of an open QP, a register of its own.)
            u.ctx_we.eq(live & qp_ok),
            u.adv.eq(adv), u.run.eq(run), u.run_f.eq(run), u.verdict.eq(verdict),
            u.pkt_op.eq(pkt_op),
            # (Not after a continuation's advance: U clears it then, ``sack``.)
            # (A SACK: a probe, a duplicate, a placement that triggers one, or a
            # continuation's due; written flat, the placement's terms folded in.)
            u.emit_sack.eq(~st.kill & (
                (d.valid & op.cont & op.due) | (d.valid & qp_ok & op.probe) |
                (d.data & (t.before | (t.in_win & (d.arrived | (~refuse & trig))))))),
            u.emit_nack.eq(v["trimmed"] | v["out_of_window"] | v["no_resource"]),
            u.reason.eq(reason), u.due.eq(due), u.need_cont.eq(need_cont),
            u.above_hi.eq(above_hi), u.cand.eq(Cat(*rel_cand)),
            *[u.rel[i].eq(rels[i]) for i in range(N)],
            # (A placement is a live record's: ``admit`` alone says U admits.)
            u.admit.eq(place & op.wimm & ~t.imm), u.own_cpl.eq(place & op.wimm & t.imm),
            u.ring_addr.eq(self._ring_addr(d.qpi, op.psn[7:])),
            u.ring_lo.eq(place & ~op.psn[6]), u.ring_hi.eq(place & op.psn[6]),
            # The bank word to write back: as read (with the write ahead forwarded), with
            # the packet's bit set.
            u.word.eq((d.raw & ~own) | ((~self._parity(op.psn)).replicate(HALF) & own)),
            *[getattr(u.events, name).eq(sig) for name, sig in v.items()],
            st.kill.eq(adv & (~found | d.held)), st.kill_w.eq(adv & (~found | d.held)),
            st.kill_held.eq(adv & d.held),
        ]
        # A continuation takes up the advance where the window ended, issued while the
        # stages behind are flushed (the packet's fields are kept by stage U).
        # (Its registers follow stage D while none waits, so that only ``cont_valid``
        # waits for the search's verdict: no continuation can be due while one waits, as
        # the flush before it empties D.)
        with m.If(need_cont):
            m.d.sync += ctl.cont_valid.eq(1)
        with m.If(~ctl.cont_valid):
            m.d.sync += [ctl.cont_qpi.eq(d.qpi),
                         assign(ctl.cont_op, psn=wb + self.window, cont=1, due=due)]

    def _combine(self, m, d):
        """The search combined over the words: the window position of the end of the run
        (the search position of the first hole: the first word with one, its number and
        index) by a tree of priority merges, and whether a hole was found inside the
        window (the last word always has one: the position after the window) as an
        OR."""
        nw = self.words
        wbits = ceil_log2(nw)
        run = Signal(range(self.window), name="d_run_end")
        # Pairs of (any hole, the first hole's position) merged three by three, the
        # earliest first: each bit of a merge one function of five inputs (a LUT5: two
        # LUT4s and the slice's multiplexer, with no routing between them),
        # ceil(log3(words)) levels (three for 24 words, where merging by two took five). (A
        # carry chain isolating the first word would gather the 24 word registers, spread
        # over the search's logic, into one column of the fabric: routing, not logic, set
        # that path.)
        level = [(d.found[k], Cat(d.idx[k], Const(k, wbits))) for k in range(nw)]
        i = 0
        while len(level) > 1:
            merged = []
            for g in range(0, len(level), 3):
                group = level[g:g + 3]
                if len(group) == 1:
                    merged.append(group[0])
                    continue
                name = f"d_first{i}_{g // 3}"
                pos = group[-1][1]
                for fk, xk in reversed(group[:-1]):
                    pos = Mux(fk, xk, pos)
                merged.append((named(m, Cat(*(fk for fk, _ in group)).any(), f"{name}_any",
                                     keep=True),
                               named(m, pos, f"{name}_pos", keep=True)))
            level = merged
            i += 1
        m.d.comb += run.eq(level[0][1])
        # A hole inside the window: an OR of the words' flags, from a copy of their
        # registers (from the same registers, synthesis would work the OR out of the merges'
        # outputs, whose word numbers encode the flags, and chain through them), the last
        # word's before the window's end.
        # (Down to two flags: their OR is taken with the advance, in one level with it.)
        found = Cat(d.found_c[:nw - 1], d.found_last_c)
        while len(found) > 2:
            found = Cat(*(named(m, found[g:g + 4].any(), f"d_found_hole{len(found)}_{g // 4}",
                                keep=True) for g in range(0, len(found), 4)))
        return run, found.any()

    # --- Stage U: update -------------------------------------------------------------------

    def _stage_u_update(self, m, mem, fifos, st, ctl, q):
        """Stage U: the QP's context, read (the record before it has written), the new CACK
        and context (written; the run and the count since the last SACK forwarded in
        ``uw``); the ring bit
        written back in its bank word; the packet's completion held, or the held ones the new
        CACK passes released; the packet kept for a continuation; the verdict, completion
        and descriptor's body into their FIFOs, and to A what its tail needs."""
        u, a, uw = st.u, st.a, st.uw
        op = u.op
        # The context, read here (the write of the record before is done).
        m.d.comb += mem.ctx_u.addr.eq(u.qpi)
        c = mem.ctx_u.data
        # The packet: from the input queue, or for a continuation what its register keeps.
        qd = q.at_u.data
        cont = ctl.cont_pkt
        p = SimpleNamespace(**{name: Mux(op.cont, getattr(cont, name), getattr(qd, name))
                               for name, _ in CONT})
        m.d.comb += st.commit.eq(u.valid & ~op.cont)
        wb = op.psn & ~(CHUNK - 1)
        # A continuation's packet: its fields are kept here.
        with m.If(u.valid & ~op.cont & u.need_cont):
            m.d.sync += [getattr(cont, name).eq(getattr(qd, name)) for name, _ in CONT]
        # (The CACK written: the advance's, its high bits the packet's chunk number plus the
        # run's chunk, each sum from registers and the run's high bits picking one; chosen
        # last, after the command's or the one read.)
        cack = Signal(PSN, name="u_cack")
        cack_w = Signal(PSN, name="u_cack_w")
        chunk_sums = [Signal(PSN - 7, name=f"u_chunk_plus{k}")
                      for k in range(self.window_chunks)]
        m.d.comb += [s_.eq(op.psn[7:] + k) for k, s_ in enumerate(chunk_sums)]
        adv_hi = Array(chunk_sums)[u.run[7:]]
        m.d.comb += [cack.eq(Mux(u.adv, Cat(u.run[:7], op.psn[7:] + u.run[7:]), c.cack)),
                     cack_w.eq(Mux(u.adv, Cat(u.run[:7], adv_hi),
                                   Mux(ctl.cmd_idle_ctx, ctl.cmd_ctx.cack, c.cack)))]
        new = Signal(self._ctx_layout, name="u_context")
        m.d.comb += [new.eq(c), new.cack.eq(cack)]
        with m.If(u.pkt_op & u.due):
            m.d.comb += new.since.eq(0)
        with m.Elif(u.place):
            m.d.comb += new.since.eq(u.since_rd + 1)
        with m.If(u.place & u.above_hi):
            m.d.comb += new.hi.eq(op.psn)
        # The statistics (read in D), updated and written here.
        new_stats = Signal(self._stats_layout, name="u_stats_new")
        # (Both sums from registers, the placement picking after them: no carry chain
        # behind the decision's register.)
        # What is written: the sums, or the command's statistics or those read, picked
        # before the placement's choice rather than after it (no record is in U while a
        # command runs).
        pbase1, bytes_sum = u.stats.pbase + 1, u.stats.bytes + u.length
        kept = Signal(self._stats_layout, name="u_stats_kept")
        m.d.comb += kept.eq(Mux(ctl.cmd_idle_stats, ctl.cmd_stats, u.stats))
        m.d.comb += [new_stats.pbase.eq(Mux(u.place, pbase1, u.stats.pbase)),
                     new_stats.bytes.eq(Mux(u.place, bytes_sum, u.stats.bytes))]
        # For formal checks: the context write and the placement (see ``probe``).
        self.probe = SimpleNamespace(cack_write=mem.ctx_w.en, cack=mem.ctx_w.data.cack,
                                     place=u.valid & u.place, place_psn=op.psn)
        # (A QP command writes through these ports too, at ``u_qpi``, with the stages
        # empty: see _qp_command_run.)
        we = u.ctx_we | ctl.cmd_ctx_we
        m.d.comb += [mem.ctx_w.addr.eq(u.qpi),
                     # (Picked by copies of the register ``cmd_idle``: its cycles are a
                     # command's, and the one after, in which nothing writes.)
                     mem.ctx_w.data.eq(Mux(ctl.cmd_idle_ctx, ctl.cmd_ctx, new)),
                     # (While a command runs, no record is in U: u_adv is 0.)
                     mem.ctx_w.data.cack.eq(cack_w),
                     mem.ctx_w.en.eq(we),
                     mem.stats_w.addr.eq(u.qpi),
                     mem.stats_w.data.pbase.eq(Mux(u.place, pbase1, kept.pbase)),
                     mem.stats_w.data.bytes.eq(Mux(u.place, bytes_sum, kept.bytes)),
                     mem.stats_w.en.eq(we)]
        # The new count against sack_every, from the count read (each case compared in
        # parallel): 0 after a SACK; one more (0 past 255) after a placement; else as read.
        se, since = st.sack_every, u.since_rd
        at_zero = Cat(se.le[1], se.le[2])
        every_new = Mux(u.pkt_op & u.due, at_zero,
                        Mux(u.place, Mux(since == 255, at_zero,
                                         self._every(since, se, (2, 3))),
                            self._every(since, se)))
        m.d.sync += [uw.run.eq(u.run), uw.every.eq(every_new)]
        # The packet's bit, written back in its bank word (made in D).
        # (Address and enables are registers, which a QP command's writes share.)
        for bank, en in ((mem.lo, u.ring_lo), (mem.hi, u.ring_hi)):
            m.d.comb += [bank.w_addr.eq(u.ring_addr), bank.w_data.eq(u.word), bank.w_en.eq(en)]
        self._pool_update(m, mem, st, ctl, qd, wb)
        # The verdict, the packet's own completion and the descriptor (but for the part that
        # waits for the bitmap, stage C) into their FIFOs; to stage A, what that part needs.
        body = Signal(ACK_BODY, name="u_ack_body")
        ack = {"nack": u.emit_nack, "qp": p.qp, "cack": cack, "mpr": c.mpr_m1 + 1,
               "rcvd_bytes": new_stats.bytes[8:], "entropy": p.entropy,
               "timestamp": p.timestamp}
        with m.If(u.emit_nack):
            m.d.comb += assign(body, **ack, reason=u.reason, psn=p.psn)
        with m.Else():
            m.d.comb += assign(body, **ack, sack_offset=SACK_OFFSET,
                               m=Mux(p.ce, SackMode.SKIP_ONCE, SackMode.NONE), pr=op.probe,
                               psn=Mux(op.probe, 0, p.psn))
        verdict = Signal(VERDICT, name="u_verdict_record")
        m.d.comb += [
            assign(verdict, qp=qd.qp, psn=op.psn, verdict=u.verdict, tag=qd.tag),
            fifos["verdict"].w_en.eq(u.pkt_op), fifos["verdict"].w_data.eq(verdict),
            st.own.valid.eq(u.valid & u.own_cpl),
            assign(st.own.cpl, qp=qd.qp, psn=op.psn, imm=qd.imm, tag=qd.tag),
            st.sack.eq(u.emit_sack & ~u.need_cont),
            fifos["ack"].w_en.eq(st.sack | u.emit_nack),
            fifos["ack"].w_data.eq(body),
        ]
        m.d.sync += [
            a.valid.eq(st.sack | u.emit_nack), a.admit.eq(u.admit),
            a.qpi.eq(u.qpi), a.cack.eq(cack),
            a.pbase.eq(new_stats.pbase), a.psn.eq(body.psn), a.nack.eq(u.emit_nack),
            a.plain.eq(u.emit_nack | op.probe),
        ]
