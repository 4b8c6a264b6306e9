"""The stages of :class:`~mrcnic.rx.psn_tracker.PsnTracker`'s pipeline, R to A, and the
constants and record layouts they share with the tracker's top (issue, queue, engines).

Each stage is a method of :class:`TrackerStages` (mixed into the tracker) that reads the
registers of the stage before it and loads those of the next (:meth:`_stage_registers`,
named ``<stage>_<field>`` so that a timing report names the stage); its docstring says what
it decides and what it forwards. The pipeline and its hazards: docs/blocks/psn-tracker.md.
"""

import functools
import operator
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Mux, Signal
from amaranth.lib import data
from amaranth.utils import ceil_log2

from mrcnic.base import proto
from mrcnic.base.records import (
    ACK_DESC, QP_INDEX_BITS, COMPLETION, PKT_IN, VERDICT, Verdict)
from mrcnic.base.gates import assign, first_set, signed_fits
from mrcnic.base.proto import NackCode, Opcode, SackMode
from mrcnic.base.rules import SACK_BITMAP_BITS, SACK_OFFSET

__all__ = ["TrackerStages", "PSN", "CHUNK", "HALF", "WORD", "WINDOW_CHUNKS", "LATE_SACK",
           "BITMAP_BITS", "QUEUE_DEPTH", "FIFO_DEPTH", "IN_FLIGHT", "POOL", "OP", "ACK_BODY",
           "ACK_TAIL",
           "VERDICT_NAMES"]

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
IN_FLIGHT = 10                        # records issued, or about to be, not yet in the FIFOs
# A held WRITE-with-immediate completion.
POOL = data.StructLayout({"valid": 1, "qp": QP_INDEX_BITS, "psn": PSN, "imm": 32, "tag": 16})
# A record in the pipeline: the fields of a packet its decisions need, and its place in the
# input queue (``idx``; the rest of the packet is read there in stage U); or a continuation
# (``cont``) of a packet's CACK advance with its SACK decision (``due``), whose ``psn`` is
# the first PSN after the window searched before (its search starts at it, a packet's after
# its PSN), the packet itself being held in the continuation register.
VERDICT_NAMES = [v.name.lower() for v in Verdict]     # the verdict flags, by code
# A descriptor in two parts: the body, written in stage U, and the tail, three cycles later
# (the bitmap read after the record's write, and the figures worked out beside it).
ACK_TAIL = data.StructLayout({"bitmap": BITMAP_BITS, "ooo_count": 15, "ack_psn_offset": 16})
ACK_BODY = data.StructLayout({name: f.shape for name, f in ACK_DESC
                              if name not in ("bitmap", "ooo_count", "ack_psn_offset")})
OP = data.StructLayout({"qp": QP_INDEX_BITS, "psn": PSN, "opcode": 8, "ack_req": 1, "rtx": 1,
                        "ce": 1, "trimmed": 1, "lasthop": 1, "cont": 1, "due": 1,
                        "idx": ceil_log2(QUEUE_DEPTH)})




class TrackerStages:
    """Stages R (read), F (fetch), D (decide), U (update) and A (answer) of
    :class:`~mrcnic.rx.psn_tracker.PsnTracker`, and the registers between them. Mixed into
    the tracker: the methods read its parameters (``window_chunks``, ``mpr_max``, ...)."""

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
        """The registers each stage hands the next, by stage (``r``, ``f``, ``d``, ``u``,
        ``a``); ``w``, the context stage U wrote (forwarded); ``kill`` and ``commit``."""
        CTX, qbits, nw, W, C = (self._ctx_layout, self._qbits, self.words, self.window,
                                self.window_chunks)

        def stage(prefix, **shapes):
            return SimpleNamespace(**{k: Signal(v, name=f"{prefix}_{k}")
                                      for k, v in shapes.items()})
        common = dict(valid=1, op=OP, qpi=qbits, qp_in=1)
        st = SimpleNamespace()
        st.r = stage("r", **common)
        st.f = stage("f", **common, fwd_hit=nw, fwd_bsel=WORD, fwd_val=C, fwd_own=1,
                     fwd_next=1, next_pos=7, next_in1=1,
                     phys_en=1, phys_bit=6, phys_raw=1, par=C, therm=CHUNK, own=CHUNK)
        st.d = stage("d", **common, ctx=CTX, sel=1, held=1, arrived=1, nextbit=1, raw=HALF,
                     allones=nw, fzw=data.ArrayLayout(WORD_BITS, nw))
        st.u = stage("u", **common, ctx=CTX, qp_ok=1, place=1, adv=1, fz=range(W + 1),
                     cp1=PSN, verdict=3, pkt_op=1, emit_sack=1, emit_nack=1, reason=8,
                     due=1, need_cont=1, above_hi=1, admit=1, own_cpl=1, raw=HALF,
                     cand=self.max_wimm_dest,
                     events=data.StructLayout({n: 1 for n in VERDICT_NAMES}))
        st.a = stage("a", valid=1, admit=1, qpi=qbits, base=PSN, cack=PSN, pbase=PSN,
                     psn=PSN, plain=1, nack=1)
        tail = dict(valid=1, shift=6, half=1, par0=1, par1=1, nack=1, tail=ACK_TAIL)
        st.b = stage("b", **tail)
        st.c = stage("c", **tail, lo=HALF, hi=HALF)
        # The packet's own completion, written in stage U.
        st.own = stage("own", valid=1, cpl=COMPLETION)
        st.w = stage("w", valid=1, qpi=qbits, ctx=CTX)
        st.kill = Signal(name="d_kill")
        st.commit = Signal(name="u_commit")
        return st

    # --- Stage R: read ---------------------------------------------------------------------

    def _stage_r_read(self, m, mem, st):
        """Stage R: addresses the window's chunks from the packet's own; works out how the
        record now in D (in U next cycle, when its ring write is one this read misses)
        forwards to this one: the window words that are its bank word (any lap) and the
        value its bit will read there, and whether it is this packet's own bank word (for
        the write back); the masks of the search."""
        r, f, d = st.r, st.f, st.d
        C, cbits = self.window_chunks, self._cbits
        op = r.op
        pars, chunks = [], []
        for j in range(C):
            chunk = Signal(PSN - 7, name=f"r_chunk{j}")
            m.d.comb += chunk.eq(op.psn[7:] + j)
            addr = self._ring_addr(r.qpi, chunk)
            m.d.comb += [mem.lo.win[j].addr.eq(addr), mem.hi.win[j].addr.eq(addr)]
            pars.append(self._chunk_parity(chunk))
            chunks.append(chunk)
        same = d.valid & ~d.op.cont & (d.qpi == r.qpi) & d.qp_in & r.qp_in
        a_psn = d.op.psn
        a_raw = ~self._parity(a_psn)
        hit = []
        for j in range(C):
            chunk_hit = same & ((chunks[j][:cbits] == a_psn[7:7 + cbits]) if cbits else 1)
            hit += [chunk_hit & (a_psn[WORD_BITS:7] == k) for k in range(CHUNK // WORD)]
        s0 = Signal(8, name="r_start")           # first window position searched
        m.d.comb += s0.eq(op.psn[:7] + ~op.cont)
        m.d.sync += [
            f.valid.eq(r.valid & ~st.kill), f.op.eq(op), f.qpi.eq(r.qpi), f.qp_in.eq(r.qp_in),
            f.fwd_hit.eq(Cat(*hit)),
            # The record ahead writes this packet's own position, or the next (any lap).
            f.fwd_own.eq(same & ((a_psn[:7 + cbits] == op.psn[:7 + cbits]) if cbits else
                                 (a_psn[:7] == op.psn[:7]))),
            f.fwd_next.eq(same & ((a_psn[:7 + cbits] == (op.psn + 1)[:7 + cbits]))),
            f.next_pos.eq(op.psn[:7] + 1), f.next_in1.eq(op.psn[:7] == CHUNK - 1),
            f.fwd_bsel.eq(Const(1, WORD) << a_psn[:WORD_BITS]),
            f.fwd_val.eq(Cat(*(a_raw ^ pars[j] for j in range(C)))),
            f.phys_en.eq(same & (a_psn[6:7 + cbits] == op.psn[6:7 + cbits])),
            f.phys_bit.eq(a_psn[:6]),
            f.phys_raw.eq(a_raw),
            f.par.eq(Cat(*pars)),
            f.therm.eq(Cat(*(Const(i, 8) < s0 for i in range(CHUNK)))),
            f.own.eq(Mux(op.cont, 0, Const(1, CHUNK) << op.psn[:7])),
        ]

    # --- Stage F: fetch --------------------------------------------------------------------

    def _stage_f_fetch(self, m, mem, st):
        """Stage F: the QP's context; the window (lap parity removed), positions before the
        search start read as arrived and later laps of the packet's own position as not,
        with the bit of the record ahead (now in U) forwarded if it placed its packet, searched
        per 16-bit word (all arrived, or the first that is not). The
        packet's own bit and the next; the raw bank word of its own bit for the write
        back."""
        f, d, u = st.f, st.d, st.u
        C, nw = self.window_chunks, self.words
        m.d.comb += mem.ctx_r.addr.eq(f.qpi)
        # Each window bit is one function of six inputs: the bit read, the chunk's lap
        # parity, the search mask, and the forward: its word (with the record ahead's
        # placement, a register of stage U), its bit, its value.
        hitw = Signal(nw, name="f_fwd_words")
        m.d.comb += hitw.eq(f.fwd_hit & u.place.replicate(nw))
        parts = []
        arr0 = []
        for j in range(C):
            raw = Cat(mem.lo.win[j].data, mem.hi.win[j].data)
            hit = Cat(*(Mux(hitw[k], f.fwd_bsel, 0)
                        for k in range(j * CHUNK // WORD, (j + 1) * CHUNK // WORD)))
            arr = raw ^ f.par[j].replicate(CHUNK)
            if j < 2:
                arr0.append(arr)
            vec = (arr & ~hit) | (f.fwd_val[j].replicate(CHUNK) & hit)
            if j == 0:
                vec = vec | f.therm
            if j in self._lap_chunks:
                vec = vec & ~f.own
            parts.append(vec)
        vec = Signal(self.window, name="f_search")
        m.d.comb += vec.eq(Cat(*parts))
        allones, fzw = [], []
        for k in range(nw):
            holes = Signal(WORD, name=f"f_holes{k}")
            m.d.comb += holes.eq(~vec[k * WORD:(k + 1) * WORD])
            found, idx = first_set(holes)
            allones.append(~found)
            fzw.append(idx)
        p = f.op
        rel7 = p.psn[:7]
        # The packet's own bit and the next, as read (a 128:1 mux each), or the value the
        # record ahead wrote there.
        now0, now1 = Signal(CHUNK, name="f_own_chunk"), Signal(CHUNK, name="f_next_chunk")
        m.d.comb += [now0.eq(arr0[0]), now1.eq(arr0[1])]
        own_bit = now0.bit_select(rel7, 1)
        next_bit = Mux(f.next_in1, now1[0], now0.bit_select(f.next_pos, 1))
        fwd_own_val = f.fwd_val[0]
        fwd_next_val = Mux(f.next_in1, f.fwd_val[1], f.fwd_val[0])
        raw_own = Signal(HALF, name="f_raw_own")
        m.d.comb += raw_own.eq(Mux(p.psn[6], mem.hi.win[0].data, mem.lo.win[0].data))
        phys = Signal(HALF, name="f_phys_mask")
        m.d.comb += phys.eq(Mux(f.phys_en & u.place, Const(1, HALF) << f.phys_bit, 0))
        m.d.sync += [
            d.valid.eq(f.valid & ~st.kill), d.op.eq(f.op), d.qpi.eq(f.qpi),
            d.qp_in.eq(f.qp_in), d.ctx.eq(mem.ctx_r.data),
            d.sel.eq(u.valid & u.qp_ok & (u.qpi == f.qpi)),
            # Held completions of the QP: in the pool, or being admitted by the record in U.
            d.held.eq(Cat(*(mem.pool[i].valid & (mem.pool[i].qp[:self._qbits] == f.qpi)
                            for i in range(self.max_wimm_dest))).any() |
                      (u.valid & u.admit & (u.qpi == f.qpi))),
            d.allones.eq(Cat(*allones)),
            *[d.fzw[k].eq(fzw[k]) for k in range(nw)],
            d.arrived.eq(Mux(f.fwd_own & u.place, fwd_own_val, own_bit)),
            d.nextbit.eq(Mux(f.fwd_next & u.place, fwd_next_val, next_bit)),
            d.raw.eq((raw_own & ~phys) | (f.phys_raw.replicate(HALF) & phys)),
        ]

    # --- Stage D: decide -------------------------------------------------------------------

    def _stage_d_decide(self, m, f, mem, st, ctl):
        """Stage D: the verdict against the (forwarded) context, the search combined over
        the words, the SACK triggers; a continuation or a possible release of held
        completions sets ``kill``, which flushes the stages behind next cycle."""
        d, u, w = st.d, st.u, st.w
        N, W, nw = self.max_wimm_dest, self.window, self.words
        op = d.op
        live = Signal(name="d_live")
        m.d.comb += live.eq(d.valid & ~st.kill)
        c = Signal(self._ctx_layout, name="d_context")
        m.d.comb += c.eq(Mux(d.sel, w.ctx, d.ctx))
        # PSN distances to CACK: dd = psn - CACK, dm = psn - CACK - 1, both carry chains.
        dd, dm = Signal(PSN, name="d_dist"), Signal(PSN, name="d_dist_m1")
        m.d.comb += [dd.eq(op.psn - c.cack), dm.eq(op.psn + ~c.cack)]
        before = (dd == 0) | dd[-1]
        cbits = self._cbits
        in_win = ~before & (dm[7 + cbits:] == 0)
        if cbits:
            in_win = in_win & (dm[7:7 + cbits] <= c.mpr_m1)
        immediate = dm == 0
        is_probe = op.opcode == Opcode.PROBE
        is_write = (op.opcode >= Opcode.WRITE_FIRST) & (op.opcode <= Opcode.WRITE_ONLY_IMM)
        wimm = (op.opcode == Opcode.WRITE_LAST_IMM) | (op.opcode == Opcode.WRITE_ONLY_IMM)
        # Held completions: those in the pool, and the admissions of the two records ahead.
        a_adm, u_adm = st.a.admit, u.valid & u.admit
        held = mem.held
        pool_full = (held >= N) | ((held >= N - 1) & (a_adm | u_adm))
        pool_full |= (held >= N - 2) & a_adm & u_adm if N >= 2 else a_adm & u_adm
        qp_ok = d.qp_in & c.open
        pkt_op = live & ~op.cont
        data_ok = qp_ok & ~is_probe & ~op.trimmed & is_write
        cand = data_ok & in_win & ~d.arrived
        refuse = wimm & ~immediate & pool_full
        v = {
            "no_qp": pkt_op & ~qp_ok,
            "probe": pkt_op & qp_ok & is_probe,
            "trimmed": pkt_op & qp_ok & ~is_probe & op.trimmed,
            "bad_opcode": pkt_op & qp_ok & ~is_probe & ~op.trimmed & ~is_write,
            "duplicate": pkt_op & data_ok & (before | (in_win & d.arrived)),
            "out_of_window": pkt_op & data_ok & ~before & ~in_win,
            "no_resource": pkt_op & cand & refuse,
            "place": pkt_op & cand & ~refuse,
        }
        place = Signal(name="d_place")
        m.d.comb += place.eq(v["place"])
        # The search, combined: the first word not all arrived (one-hot), and its first
        # position (an AND-OR of the words' results; W when every PSN of the window arrived).
        first = Signal(nw, name="d_first_word")
        for k in range(nw):
            m.d.comb += first[k].eq(~d.allones[k] & d.allones[:k].all() if k else ~d.allones[0])
        found = ~d.allones.all()
        fz = Signal(range(W + 1), name="d_first_hole")
        m.d.comb += fz.eq(functools.reduce(operator.or_, (
            Mux(first[k], Cat(d.fzw[k], Const(k, len(fz) - WORD_BITS)), 0)
            for k in range(nw))) | Mux(found, 0, W))
        adv = Signal(name="d_advance")
        m.d.comb += adv.eq(live & qp_ok & ((place & immediate) | op.cont))
        need_cont = Signal(name="d_need_cont")
        m.d.comb += need_cont.eq(adv & ~found)
        # SACK triggers.
        dh = Signal(PSN, name="d_dist_hi")
        m.d.comb += dh.eq(op.psn - c.hi)
        above_hi = (dh != 0) & ~dh[-1]
        new_hole = above_hi & (dh != 1)
        fills = immediate & d.nextbit                # LATE_SACK: CACK moves past the packet
        sack_every = f["config"]["sack_every"]
        every = (sack_every != 0) & (c.since + 1 >= sack_every)
        due = Signal(name="d_due")
        m.d.comb += due.eq(Mux(op.cont, op.due,
                               v["probe"] | v["duplicate"] |
                               (place & (op.ack_req | op.rtx | op.ce | new_hole | fills |
                                         every))))
        # The NACK's reason, valid when one is sent (each NACK verdict excludes the others).
        reason = Signal(8)
        m.d.comb += reason.eq(Mux(op.trimmed,
                                  Mux(op.lasthop, NackCode.TRIMMED_LASTHOP, NackCode.TRIMMED),
                                  Mux(in_win, NackCode.NO_RESOURCE,
                                      NackCode.PSN_OUT_OF_WINDOW)))
        # The verdict's code: each bit an OR of the (exclusive) verdicts that have it.
        verdict = Signal(3)
        for bit in range(3):
            m.d.comb += verdict[bit].eq(functools.reduce(operator.or_, (
                sig for name, sig in v.items() if Verdict[name.upper()] >> bit & 1)))
        wb = op.psn & ~(CHUNK - 1)
        # Held completions the advance may release: the QP's, within 512 PSNs of the window
        # base (the pool as it is now: the record ahead, of another QP, admits only its own).
        cand = []
        for i in range(N):
            pool_i = mem.pool[i]
            rel = Signal(PSN, name=f"d_held_pos{i}")
            m.d.comb += rel.eq(pool_i.psn - wb)
            cand.append(pool_i.valid & (pool_i.qp[:self._qbits] == d.qpi) & (rel[9:] == 0))
        m.d.sync += [
            u.valid.eq(live), u.op.eq(op), u.qpi.eq(d.qpi), u.qp_in.eq(d.qp_in),
            u.ctx.eq(c), u.qp_ok.eq(qp_ok), u.place.eq(place), u.adv.eq(adv), u.fz.eq(fz),
            u.cp1.eq(c.cack + 1), u.verdict.eq(verdict), u.pkt_op.eq(pkt_op),
            u.emit_sack.eq(live & due & ~need_cont),
            u.emit_nack.eq(v["trimmed"] | v["out_of_window"] | v["no_resource"]),
            u.reason.eq(reason), u.due.eq(due), u.need_cont.eq(need_cont),
            u.above_hi.eq(above_hi), u.cand.eq(Cat(*cand)),
            u.admit.eq(place & wimm & ~immediate), u.own_cpl.eq(place & wimm & immediate),
            u.raw.eq(d.raw),
            *[getattr(u.events, name).eq(sig) for name, sig in v.items()],
            st.kill.eq(need_cont | (adv & d.held)),
        ]
        # A continuation takes up the advance where the window ended (the packet's fields
        # are kept by stage U).
        with m.If(need_cont):
            m.d.sync += [ctl.cont_valid.eq(1),
                         assign(ctl.cont_op, qp=op.qp, psn=wb + W, cont=1, due=due)]

    # --- Stage U: update -------------------------------------------------------------------

    def _stage_u_update(self, m, mem, fifos, st, ctl, q):
        """Stage U: the new CACK and context (written, and forwarded in ``w``); the ring bit
        written back into its bank word; the packet's completion held, or the held ones the
        new CACK passes released; the ring read at SACK_BASE (the bank word holding it and
        the next, after this write); the verdict, completion and descriptor handed to A."""
        u, a, w = st.u, st.a, st.w
        N = self.max_wimm_dest
        op, c = u.op, u.ctx
        pool = mem.pool
        # The packet: from the input queue, or for a continuation its register.
        p = Signal(PKT_IN, name="u_packet")
        m.d.comb += [p.eq(Mux(op.cont, ctl.cont_pkt, q.at_u.data)),
                     st.commit.eq(u.valid & ~op.cont)]
        with m.If(u.valid & ~op.cont & u.need_cont):
            m.d.sync += ctl.cont_pkt.eq(q.at_u.data)
        wb = op.psn & ~(CHUNK - 1)
        base = Signal(PSN, name="u_sack_base")           # CACK + 1
        m.d.comb += base.eq(Mux(u.adv, wb + u.fz, u.cp1))
        cack = Signal(PSN, name="u_cack")
        m.d.comb += cack.eq(base - 1)
        new = Signal(self._ctx_layout, name="u_context")
        m.d.comb += [new.eq(c), new.cack.eq(cack)]
        with m.If(u.pkt_op & u.due):
            m.d.comb += new.since.eq(0)
        with m.Elif(u.place):
            m.d.comb += new.since.eq(c.since + 1)
        with m.If(u.place & u.above_hi):
            m.d.comb += new.hi.eq(op.psn)
        # The statistics: read, updated and written here, so no record sees them stale.
        m.d.comb += mem.stats_r.addr.eq(u.qpi)
        stats = mem.stats_r.data
        new_stats = Signal(self._stats_layout, name="u_stats")
        m.d.comb += [new_stats.pbase.eq(stats.pbase + u.place),
                     new_stats.bytes.eq(stats.bytes + Mux(u.place, p.length, 0))]
        # For formal checks: the context write and the placement (see ``probe``).
        self.probe = SimpleNamespace(cack_write=mem.ctx_w.en, cack=mem.ctx_w.data.cack,
                                     place=u.valid & u.place, place_psn=op.psn)
        with m.If(u.valid & u.qp_ok):
            m.d.comb += [mem.ctx_w.addr.eq(u.qpi), mem.ctx_w.data.eq(new),
                         mem.ctx_w.en.eq(1),
                         mem.stats_w.addr.eq(u.qpi), mem.stats_w.data.eq(new_stats),
                         mem.stats_w.en.eq(1)]
        m.d.sync += [w.valid.eq(u.valid & u.qp_ok), w.qpi.eq(u.qpi), w.ctx.eq(new)]
        # The packet's bit, written back into its bank word (the word as read, with the
        # bit of the record ahead forwarded).
        own = Const(1, HALF) << op.psn[:6]
        word = (u.raw & ~own) | ((~self._parity(op.psn)).replicate(HALF) & own)
        addr = self._ring_addr(u.qpi, op.psn[7:])
        with m.If(u.valid & u.place):
            for bank, sel in ((mem.lo, ~op.psn[6]), (mem.hi, op.psn[6])):
                m.d.comb += [bank.w.addr.eq(addr), bank.w.data.eq(word), bank.w.en.eq(sel)]
        # Held completions: admit the packet's, or release those the new CACK passes (all
        # after the old CACK, so at or after the window base: a 9-bit compare).
        free = Signal(N, name="u_pool_free")
        m.d.comb += free.eq(Cat(*(~pool[i].valid for i in range(N))))
        free_found, free_idx = first_set(free)
        with m.If(u.valid & u.admit):
            m.d.sync += assign(pool[free_idx], valid=1, qp=p.qp, psn=p.psn, imm=p.imm,
                               tag=p.tag)
        release = Signal(N, name="u_release")
        pos = []
        for i in range(N):
            rel = Signal(9, name=f"u_release_pos{i}")
            m.d.comb += rel.eq(pool[i].psn[:9] - wb[:9])
            m.d.comb += release[i].eq(u.valid & u.adv & u.cand[i] & (rel < u.fz))
            pos.append(rel)
        with m.If(release.any()):
            m.d.sync += [ctl.drain_busy.eq(1), ctl.drain_mask.eq(release),
                         ctl.drain_ordered.eq(0),
                         *[ctl.drain_pos[i].eq(pos[i]) for i in range(N)]]
        # The verdict, the packet's own completion and the descriptor (but for the part that
        # waits for the bitmap, stage C) into their FIFOs; to stage A, what that part needs.
        is_probe = p.opcode == Opcode.PROBE
        body = Signal(ACK_BODY, name="u_ack_body")
        ack = {"nack": u.emit_nack, "qp": p.qp, "cack": cack, "mpr": c.mpr_m1 + 1,
               "rcvd_bytes": new_stats.bytes[8:], "entropy": p.entropy,
               "timestamp": p.timestamp}
        with m.If(u.emit_nack):
            m.d.comb += assign(body, **ack, reason=u.reason, psn=p.psn)
        with m.Else():
            m.d.comb += assign(body, **ack, sack_offset=SACK_OFFSET,
                               m=Mux(p.ce, SackMode.SKIP_ONCE, SackMode.NONE), pr=is_probe,
                               psn=Mux(is_probe, 0, p.psn))
        verdict = Signal(VERDICT, name="u_verdict_record")
        m.d.comb += [
            assign(verdict, qp=op.qp, psn=op.psn, verdict=u.verdict, tag=p.tag),
            fifos["verdict"].w_en.eq(u.pkt_op), fifos["verdict"].w_data.eq(verdict),
            st.own.valid.eq(u.valid & u.own_cpl),
            assign(st.own.cpl, qp=op.qp, psn=op.psn, imm=p.imm, tag=p.tag),
            fifos["ack"].w_en.eq(u.emit_sack | u.emit_nack),
            fifos["ack"].w_data.eq(body),
        ]
        m.d.sync += [
            a.valid.eq(u.emit_sack | u.emit_nack), a.admit.eq(u.valid & u.admit),
            a.qpi.eq(u.qpi), a.base.eq(base + SACK_OFFSET - 1), a.cack.eq(cack),
            a.pbase.eq(new_stats.pbase), a.psn.eq(body.psn), a.nack.eq(u.emit_nack),
            a.plain.eq(u.emit_nack | is_probe),
        ]

    # --- Stages A, B and C: the SACK's bitmap ----------------------------------------------

    def _stage_a_sack_read(self, m, mem, st):
        """Stage A: reads the ring at SACK_BASE (the bank word holding it and the next),
        after this record's own write and before the next record of the QP writes;
        ``ack_psn_offset`` and ``ooo_count``."""
        a, b = st.a, st.b
        chunk = a.base[7:]
        chunk1 = Signal(PSN - 7, name="a_sack_chunk_next")
        m.d.comb += [chunk1.eq(chunk + 1),
                     mem.lo.sack.addr.eq(self._ring_addr(a.qpi, Mux(a.base[6], chunk1, chunk))),
                     mem.hi.sack.addr.eq(self._ring_addr(a.qpi, chunk))]
        trigger = Signal(PSN, name="a_trigger")
        ooo = Signal(PSN, name="a_ooo")
        m.d.comb += [trigger.eq(a.psn - a.cack), ooo.eq(a.pbase - a.cack)]
        m.d.sync += [
            b.valid.eq(a.valid), b.shift.eq(a.base[:6]), b.half.eq(a.base[6]),
            b.par0.eq(self._chunk_parity(chunk)), b.par1.eq(self._chunk_parity(chunk1)),
            b.nack.eq(a.nack),
            b.tail.ooo_count.eq(Mux(ooo[15:] != 0, (1 << 15) - 1, ooo[:15])),
            b.tail.ack_psn_offset.eq(Mux(a.plain | ~signed_fits(trigger, 16), 0,
                                         trigger[:16])),
        ]

    def _stage_b_sack_data(self, m, mem, st):
        """Stage B: the two bank words as read, into registers (a block RAM's output feeds
        nothing else)."""
        b, c = st.b, st.c
        m.d.sync += [c.valid.eq(b.valid), c.shift.eq(b.shift), c.half.eq(b.half),
                     c.par0.eq(b.par0), c.par1.eq(b.par1), c.nack.eq(b.nack),
                     c.tail.eq(b.tail), c.lo.eq(mem.lo.sack.data), c.hi.eq(mem.hi.sack.data)]

    def _stage_c_bitmap(self, m, fifos, st):
        """Stage C: the bitmap from SACK_BASE (lap parity removed, shifted), into the tail
        of the descriptor's FIFO."""
        c = st.c
        arr = Signal(CHUNK, name="c_arrived")
        m.d.comb += arr.eq(Mux(c.half,
                               Cat(c.hi ^ c.par0.replicate(HALF), c.lo ^ c.par1.replicate(HALF)),
                               Cat(c.lo ^ c.par0.replicate(HALF), c.hi ^ c.par0.replicate(HALF))))
        bitmap = Signal(BITMAP_BITS, name="c_bitmap")
        m.d.comb += bitmap.eq((arr >> c.shift)[:BITMAP_BITS])
        tail = Signal(ACK_TAIL)
        m.d.comb += [tail.eq(c.tail), tail.bitmap.eq(Mux(c.nack, 0, bitmap)),
                     fifos["ack_tail"].w_data.eq(tail), fifos["ack_tail"].w_en.eq(c.valid)]
