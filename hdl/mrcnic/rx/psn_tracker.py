"""Receive PSN tracking (spec §5): :class:`PsnTracker` (``psn-tracker``).

The receive half of MRC's reliability, in :class:`~mrcnic.rx.mrc_rx.MrcRx` after the memory
check (:class:`~mrcnic.rx.memory_protect.MemoryProtect`): for every packet that arrives, in
any order and on any plane, it decides whether the packet is placed, keeps each QP's
cumulative ACK (CACK) and its bitmap of what arrived above it, and decides the SACKs and
NACKs to send back (to :class:`~mrcnic.rx.ack_generator.AckGenerator`) and the
WRITE-with-immediate completions to deliver.

Operation, decisions and measured figures: docs/blocks/psn-tracker.md.
"""

import functools
import operator
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base import proto

from mrcnic.base.records import ACK_DESC, QP_INDEX_BITS, COMPLETION, PKT_IN, VERDICT, Verdict
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.gates import assign, first_set, signed_fits
from mrcnic.base.proto import NackCode, Opcode, SackMode
from mrcnic.base.rules import SACK_BITMAP_BITS, SACK_OFFSET
from mrcnic.base.stream import meta_stream

__all__ = ["PsnTracker", "TRACKER_REGS",
           "SACK_OFFSET", "BITMAP_BITS", "LATE_SACK"]

PSN = proto.PSN_BITS
CHUNK = proto.MPR_UNIT_PSNS          # PSNs per block RAM word
# Chunks read from CACK + 1 for the advance and the SACK: 3 by default (at least 257 PSNs
# after CACK + 1, so a continuation is rare at any MPR); 2 is the small option (at least 129
# PSNs: the whole window when mpr_max is 1, a third less logic in stage E).
WINDOW_CHUNKS = (2, 3)
# Decision: a packet that fills the lowest hole while later PSNs have arrived (CACK moves
# past it) is SACKed at once. Without it, when the packets at the end of a burst arrive out
# of order, the one that completes them would wait for the next coalesced SACK, and with no
# more traffic the sender would time it out: a spurious retransmission and an EV wrongly
# taken for broken. (SACKing every packet that lands below the highest PSN seen would do
# too, but under spraying that is nearly every packet.)
LATE_SACK = "a packet that fills the lowest hole, CACK moving past it"
BITMAP_BITS = SACK_BITMAP_BITS
FIFO_DEPTH = 8
# A held WRITE-with-immediate completion.
POOL = data.StructLayout({"valid": 1, "qp": QP_INDEX_BITS, "psn": PSN, "imm": 32, "tag": 16})
# A record in the pipeline: the packet, or a continuation (cont) with its SACK decision (due);
# wbase is the first PSN of the window read for it.
OP = data.StructLayout({"pkt": PKT_IN, "cont": 1, "due": 1, "wbase": PSN})


COUNTERS = ["packets", *[v.name.lower() for v in Verdict], "sacks", "nacks", "completions",
            "continuations", "stall_cycles"]

TRACKER_REGS = RegisterMap("psn_tracker", [
    Register("config", [Field("sack_every", 8, "rw", reset=8,
                              desc="SACK every N placed packets of a QP (0: only on the "
                                   "other triggers)")]),
    Register("qp_select", [Field("qp", 16, "rw", desc="QP the next command acts on")]),
    Register("qp_start", [Field("psn", 24, "rw", desc="First PSN expected after open")]),
    Register("qp_mpr", [Field("mpr", 8, "rw", desc="Receive window in 128-PSN units, "
                                                   "1 .. mpr_max; 0 means mpr_max")]),
    Register("qp_command", [
        Field("open", 1, "w1p", desc="Open qp_select at qp_start with qp_mpr (its held "
                                     "completions are dropped)"),
        Field("close", 1, "w1p", desc="Close qp_select: its packets get verdict NO_QP"),
    ]),
    Register("status", [
        Field("busy", 1, "ro", desc="A QP command, or the sweep that opens every QP after "
                                    "reset, is in progress (the input waits)"),
        Field("held", 8, "ro", desc="WRITE-with-immediate completions held"),
    ]),
    Register("error", [
        Field("bad_qp", 1, "w1c", desc="A command named a QP >= qps; it was refused"),
        Field("bad_mpr", 1, "w1c", desc="An open asked for MPR > mpr_max; it was refused"),
        Field("busy", 1, "w1c", desc="A command came while status.busy; it was refused"),
    ]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("packets", "Records in"),
        ("place", "Packets placed (new PSN in the window)"),
        ("duplicate", "Duplicates (at or before CACK, or already arrived): SACKed"),
        ("out_of_window", "PSNs beyond CACK + MPR x 128: NACK 0x0B"),
        ("trimmed", "Trimmed packets: NACK 0x01 / 0x02"),
        ("no_qp", "Records for a QP index out of range or not open"),
        ("bad_opcode", "Records with an opcode other than WRITE or probe"),
        ("no_resource", "WRITE-with-immediate refused, completions full: NACK 0x0A"),
        ("probe", "Probes answered"),
        ("sacks", "SACK descriptors"),
        ("nacks", "NACK descriptors"),
        ("completions", "WRITE-with-immediate completions"),
        ("continuations", "CACK advances or SACKs finished by a continuation"),
        ("stall_cycles", "Cycles a record waited at the input"),
    ]],
])


class PsnTracker(wiring.Component):
    """The receive PSN tracker: a verdict per packet, the SACKs and NACKs to send, and
    WRITE-with-immediate completions in PSN order.

    Each ``pkt`` record gives one ``verdict`` record, in order; the first check that applies
    decides (:class:`~mrcnic.base.records.Verdict`): a QP index >= ``qps`` or a QP not open,
    NO_QP (nothing answered); a probe (0xDE), PROBE (a SACK with pr = 1, no PSN consumed);
    trimmed (flagged upstream from the DSCP), TRIMMED (NACK TRIMMED or TRIMMED_LASTHOP); not
    a WRITE opcode, BAD_OPCODE (nothing answered); at or before CACK or already arrived,
    DUPLICATE (a SACK); beyond CACK + MPR x 128, OUT_OF_WINDOW (NACK PSN_OUT_OF_WINDOW); a
    WRITE-with-immediate not at CACK + 1 while ``max_wimm_dest`` completions are held,
    NO_RESOURCE (NACK NO_RESOURCE, not placed: the one at CACK + 1 is always taken, so held
    completions can always drain); otherwise PLACE: its bit is set, CACK advances over the
    run of arrived PSNs and the completions held up to the new CACK leave in PSN order. A
    placed packet is SACKed when it asks (BTH A), is a retransmission, carries ECN CE (then
    M = SKIP_ONCE), opens a new hole, fills the lowest hole while later PSNs have arrived
    (:data:`LATE_SACK`), or is the ``sack_every``-th placed packet of its QP since the QP's
    last SACK. A SACK's bitmap starts at SACK_BASE = CACK + 1
    (:data:`~mrcnic.base.rules.SACK_OFFSET`). After reset a sweep opens every QP at PSN 0
    with MPR = ``mpr_max``; the ``qp_*`` registers open and close QPs.

    Parameters
    ----------
    qps : int
        QPs tracked, 1 .. 65536. Default 64.
    mpr_max : int
        Largest receive window in 128-PSN units (the size of each QP's arrival bitmap ring),
        a power of two 1 .. 64. Default 8 (1024 PSNs).
    max_wimm_dest : int
        WRITE-with-immediate completions held at once, 1 .. 32. Default 8.
    window_chunks : int
        128-PSN chunks read from CACK + 1 each cycle, one of :data:`WINDOW_CHUNKS`: 3
        (default) or 2 (a third less stage-E logic, the board option; with ``mpr_max`` 1 it
        still covers the whole window, otherwise continuations come sooner).
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    pkt : stream of :data:`~mrcnic.base.records.PKT_IN`, in
        One record per received packet: QP index, PSN, opcode, BTH A and rtx, ECN CE, the
        trimmed and last-hop-trimmed flags, payload length, the EV echoed as ``entropy``,
        the TSETH timestamp, the immediate, and a free ``tag`` returned with the verdict.
        ``pkt.ready`` is a register.
    verdict : stream of :data:`~mrcnic.base.records.VERDICT`, out
        One per ``pkt`` record, in order: ``qp``, ``psn``, ``verdict``, ``tag``.
    ack : stream of :data:`~mrcnic.base.records.ACK_DESC`, out
        SACK and NACK descriptors to send.
    cpl : stream of :data:`~mrcnic.base.records.COMPLETION`, out
        WRITE-with-immediate completions, in PSN order per QP.
    s_axil : AXI4-Lite, in
        Registers, :data:`TRACKER_REGS`.
    latency : int
        Cycles from a ``pkt`` handshake to its verdict on ``verdict``.

    Every output comes from an 8-entry FIFO; the input is taken only while every output
    FIFO has room for the records in flight, so nothing is ever dropped.

    Latency
    -------
    :attr:`latency` = 4 cycles: a record accepted in cycle t has its verdict (and its SACK
    or NACK, and its own completion) written into the output FIFOs at the end of cycle
    t + 2, out at t + 4 (the FIFOs register their outputs).

    Throughput
    ----------
    One packet per cycle, any mix of QPs, back-to-back packets of one QP included. The
    exceptions cost 2 cycles each: a CACK advance that runs past the window read for it (a
    continuation, at least 257 PSNs each; 129 with ``window_chunks`` 2), and a release of
    held completions (plus one cycle per completion). The input also waits while a QP
    command, or the sweep after reset (``qps`` x (``mpr_max`` + 1) cycles), runs.

    Raises
    ------
    ValueError
        If ``qps`` is not an int in 1 .. 65536; ``mpr_max`` is not a power of two in
        1 .. 64; ``max_wimm_dest`` is not an int in 1 .. 32; ``window_chunks`` is not 2 or
        3 (:data:`WINDOW_CHUNKS`); or ``counter_width`` is not 0, 16 or 32.
    """

    latency = 4

    def __init__(self, qps=64, mpr_max=8, max_wimm_dest=8, window_chunks=3, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        if not (isinstance(qps, int) and 1 <= qps <= 1 << QP_INDEX_BITS):
            raise ValueError(f"qps must be 1 .. {1 << QP_INDEX_BITS}, not {qps!r}")
        if not (isinstance(mpr_max, int) and 1 <= mpr_max <= 64
                and mpr_max & (mpr_max - 1) == 0):
            raise ValueError(f"mpr_max must be a power of two 1 .. 64, not {mpr_max!r}")
        if not (isinstance(max_wimm_dest, int) and 1 <= max_wimm_dest <= 32):
            raise ValueError(f"max_wimm_dest must be 1 .. 32, not {max_wimm_dest!r}")
        if window_chunks not in WINDOW_CHUNKS:
            raise ValueError(f"window_chunks must be one of {WINDOW_CHUNKS}, not "
                             f"{window_chunks!r}")
        self.qps, self.mpr_max, self.max_wimm_dest = qps, mpr_max, max_wimm_dest
        self.window_chunks, self.window = window_chunks, window_chunks * CHUNK
        self.ring = mpr_max * CHUNK
        self.lap_bit = ceil_log2(self.ring)          # PSN bit giving the lap parity
        self._qbits = max(1, ceil_log2(qps))       # QP index bits of the memory addresses
        self._cbits = ceil_log2(mpr_max)            # chunk bits of a ring address
        # A QP's context. `placed` counts placed packets (mod 2^24) and `start_m1` is the CACK
        # at open: the out-of-order count is placed - (CACK - start_m1), worked out after
        # stage E so that nothing but the new CACK itself waits for the window search.
        self._ctx_layout = data.StructLayout({
            "cack": PSN, "hi": PSN, "mpr_m1": max(1, self._cbits), "open": 1, "since": 8,
            "placed": PSN, "start_m1": PSN, "bytes": 32})
        super().__init__({
            "pkt": In(meta_stream(PKT_IN)),
            "verdict": Out(meta_stream(VERDICT)),
            "ack": Out(meta_stream(ACK_DESC)),
            "cpl": Out(meta_stream(COMPLETION)),
            "s_axil": In(AxiLiteSignature(TRACKER_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        # Registers: the CSR block on s_axil; the engines below read and drive its fields.
        f = self._registers(m)
        # State: per-QP context, the arrival bitmap ring, the pool of held completions.
        mem = self._memories(m)
        # Output FIFOs, and whether each has room for the records in flight.
        fifos, room = self._output_fifos(m)
        # Control registers: continuation, replay, drain, QP command (and the reset sweep).
        ctl = self._control_regs(m)
        # Stage I: choose the record, read its context, address the ring reads.
        stage_i = self._stage_i_read(m, mem, ctl, room)
        # Stage E: the record (killed behind a deferral) and its context, forwarded if stale.
        rec = self._stage_e_record(m, stage_i)
        # Stage E: the verdict.
        cls = self._stage_e_classify(m, mem, rec)
        # Stage E: window arithmetic; the search for the new CACK.
        window = self._stage_e_window(m, mem, stage_i, rec, cls)
        # Stage E: SACK or NACK, and whether a continuation must finish the record.
        dec = self._stage_e_ack_decide(m, f, rec, cls, window)
        # Stage E: the QP's new context.
        new_ctx = self._stage_e_new_context(m, rec, cls, window, dec)
        # Stage E: completions: the packet's own, admitted to the pool, released by CACK.
        held = self._stage_e_completions(m, mem, rec, cls, window, dec)
        # Stage E: write the context, the forwarding copy, the ring bit, the pool entry.
        self._stage_e_state_writes(m, mem, rec, cls, window, held, new_ctx)
        # Stage E: load the replay, continuation and release registers.
        self._stage_e_deferrals(m, ctl, stage_i, rec, window, dec, held)
        # Stage E into E2: the verdict, the completion, the descriptor so far.
        e2 = self._stage_e_to_e2(m, rec, cls, window, dec, held, new_ctx)
        # Stage E2: finish the SACK/NACK descriptor; write the verdict and ack FIFOs.
        self._stage_e2_output(m, fifos, e2)
        # Completion drain: held completions released, oldest PSN first, into the cpl FIFO.
        self._completion_drain(m, mem, ctl, fifos["cpl"], e2)
        # QP command engine: accept or refuse an open / close.
        self._qp_command_accept(m, f, ctl)
        # QP command engine: rewrite the QP's ring and context; the sweep after reset.
        self._qp_command_run(m, mem, ctl, stage_i)
        # Status register: busy, completions held.
        self._status(m, f, mem, ctl)
        # Event counters.
        self._counters(m, f, cls, dec, fifos["cpl"])
        return m

    def _ring_addr(self, qp, chunk):
        """Ring word of QP ``qp``'s chunk ``chunk`` (PSN bits 7 and up, taken mod mpr_max)."""
        cbits, qbits = self._cbits, self._qbits
        return Cat(chunk[:cbits], qp[:qbits]) if cbits else qp[:qbits]

    def _parity(self, psn):
        """The lap parity of ``psn``: its ring bit XOR this reads "arrived"."""
        lap = self.lap_bit
        return psn[lap] if lap < PSN else Const(0, 1)

    def _registers(self, m):
        """The CSR block on ``s_axil``; returns its fields."""
        m.submodules.csr = csr = CsrBlock(TRACKER_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        return csr.fields

    def _memories(self, m):
        """Per-QP context (distributed RAM), arrival ring (block RAM), held-completion pool."""
        qps, mpr_max, N = self.qps, self.mpr_max, self.max_wimm_dest
        # Reset: every QP open, CACK = 2^24 - 1 (PSN 0 expected), MPR = mpr_max.
        ctx_init = {"cack": (1 << PSN) - 1, "hi": (1 << PSN) - 1, "mpr_m1": mpr_max - 1,
                    "open": 1, "start_m1": (1 << PSN) - 1}
        m.submodules.ctx = ctx = Memory(shape=self._ctx_layout, depth=qps, init=[ctx_init] * qps)
        ctx_w = ctx.write_port()
        # Read once, in stage I; stage E takes the registered copy, or the context the record
        # ahead wrote in the cycle of that read when it is the same QP (the only write the
        # read can miss). No memory read sits on stage E's path.
        ctx_ri = ctx.read_port(domain="comb")

        m.submodules.ring = ring = Memory(shape=unsigned(CHUNK), depth=qps * mpr_max,
                                          init=[0] * (qps * mpr_max))
        ring_w = ring.write_port()
        rd_p = ring.read_port(transparent_for=(ring_w,))
        rd_w = [ring.read_port(transparent_for=(ring_w,)) for _ in range(self.window_chunks)]

        pool = Signal(data.ArrayLayout(POOL, N))
        return SimpleNamespace(ctx_w=ctx_w, ctx_ri=ctx_ri, ring_w=ring_w, rd_p=rd_p, rd_w=rd_w,
                               pool=pool)

    def _output_fifos(self, m):
        """The output FIFOs, by port name, and ``room``: each can take the records in flight."""
        fifos = {}
        for name, layout in (("verdict", VERDICT), ("ack", ACK_DESC), ("cpl", COMPLETION)):
            fifo = SyncFIFOBuffered(width=layout.size, depth=FIFO_DEPTH)
            m.submodules[f"{name}_fifo"] = fifo
            port = getattr(self, name)
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]
            fifos[name] = fifo
        # Records in I, E and E2 may each still write one record into every FIFO.
        room = Signal()
        m.d.comb += room.eq(Cat(*(fi.level <= FIFO_DEPTH - 4 for fi in fifos.values())).all())
        return fifos, room

    def _control_regs(self, m):
        """Registers of the continuation, replay, drain and QP command (and sweep) engines."""
        mpr_max, N, qbits, cbits = self.mpr_max, self.max_wimm_dest, self._qbits, self._cbits
        cont_valid, cont_op = Signal(name="cont_valid"), Signal(OP, name="cont_op")
        replay_valid, replay_op = Signal(name="replay_valid"), Signal(OP, name="replay_op")
        drain_busy = Signal(name="drain_busy")
        drain_mask, drain_ref = Signal(N, name="drain_mask"), Signal(PSN, name="drain_ref")
        # After reset, a sweep opens every QP at PSN 0 with MPR mpr_max (block RAM keeps its
        # contents through a reset): qps x (mpr_max + 1) cycles with the input held.
        sweep = Signal(init=1)
        cmd_busy = Signal(init=1, name="cmd_busy")
        cmd_open = Signal(init=1, name="cmd_open")
        cmd_qp = Signal(qbits, name="cmd_qp")
        cmd_start, cmd_j = Signal(PSN, name="cmd_start"), Signal(cbits + 1, name="cmd_j")
        cmd_mpr_m1 = Signal(max(1, cbits), init=mpr_max - 1)
        return SimpleNamespace(
            cont_valid=cont_valid, cont_op=cont_op, replay_valid=replay_valid,
            replay_op=replay_op, drain_busy=drain_busy, drain_mask=drain_mask,
            drain_ref=drain_ref, sweep=sweep, cmd_busy=cmd_busy, cmd_open=cmd_open,
            cmd_qp=cmd_qp, cmd_start=cmd_start, cmd_j=cmd_j, cmd_mpr_m1=cmd_mpr_m1)

    def _stage_i_read(self, m, mem, ctl, room):
        """Stage I: a continuation, else a replay, else the input; reads its context, addresses
        the ring reads (its chunk, the window from CACK + 1); registers all into stage E."""
        qps, qbits, cbits = self.qps, self._qbits, self._cbits
        CTX, cont_valid, cont_op = self._ctx_layout, ctl.cont_valid, ctl.cont_op
        replay_valid, replay_op = ctl.replay_valid, ctl.replay_op
        ctx_ri, rd_p, rd_w = mem.ctx_ri, mem.rd_p, mem.rd_w
        e_valid, e_op = Signal(name="e_valid"), Signal(OP, name="e_op")
        i_op = Signal(OP)
        i_valid = Signal()
        take_in = Signal()
        in_ok = ~cont_valid & ~replay_valid & ~ctl.drain_busy & ~ctl.cmd_busy & room
        m.d.comb += [
            self.pkt.ready.eq(in_ok),
            take_in.eq(self.pkt.valid & in_ok),
        ]
        pkt_op_in = Signal(OP)
        m.d.comb += [
            pkt_op_in.pkt.eq(self.pkt.payload),
            i_op.eq(Mux(cont_valid, cont_op, Mux(replay_valid, replay_op, pkt_op_in))),
            i_valid.eq(((cont_valid | replay_valid) & ~ctl.drain_busy) | take_in),
        ]
        i_qp = Signal(qbits)
        m.d.comb += i_qp.eq(Mux(i_op.pkt.qp < qps, i_op.pkt.qp, 0))
        m.d.comb += ctx_ri.addr.eq(i_qp)
        cack_i = ctx_ri.data.cack
        wbase = Signal(PSN)
        m.d.comb += wbase.eq((cack_i + 1)[:PSN] & ~(CHUNK - 1))
        m.d.comb += [
            rd_p.addr.eq(self._ring_addr(i_qp, i_op.pkt.psn[7:])),
            *[rd_w[j].addr.eq(self._ring_addr(i_qp, (wbase[7:] + j)[:max(cbits, 1)]))
              for j in range(self.window_chunks)],
        ]
        e_wbm1 = Signal(PSN, name="e_wbm1")
        e_ctx_read = Signal(CTX, name="e_ctx_read")
        m.d.sync += [e_valid.eq(i_valid), e_op.eq(i_op), e_op.wbase.eq(wbase),
                     e_wbm1.eq(wbase - 1), e_ctx_read.eq(ctx_ri.data)]
        return SimpleNamespace(i_valid=i_valid, e_valid=e_valid, e_op=e_op, e_wbm1=e_wbm1,
                               e_ctx_read=e_ctx_read)

    def _stage_e_record(self, m, stage_i):
        """Stage E's input: the record, live unless killed, and its (forwarded) context."""
        qps, qbits = self.qps, self._qbits
        CTX = self._ctx_layout
        # When the record ahead deferred (a continuation or a release), the record in E read
        # a stale window: it is killed and replayed. `kill` is a register so that the long
        # window search ends at a few flip-flops, not at the replay register's enables.
        kill = Signal(name="kill")
        e_live = Signal(name="e_live")
        m.d.comb += e_live.eq(stage_i.e_valid & ~kill)
        op = stage_i.e_op
        p = op.pkt
        e_qp = Signal(qbits)
        m.d.comb += e_qp.eq(Mux(p.qp < qps, p.qp, 0))
        fwd_valid, fwd_qp = Signal(name="fwd_valid"), Signal(qbits, name="fwd_qp")
        fwd_ctx = Signal(CTX, name="fwd_ctx")
        c = Signal(CTX, name="e_ctx")
        m.d.comb += c.eq(Mux(fwd_valid & (fwd_qp == e_qp), fwd_ctx, stage_i.e_ctx_read))
        return SimpleNamespace(kill=kill, e_live=e_live, op=op, p=p, e_qp=e_qp,
                               fwd_valid=fwd_valid, fwd_qp=fwd_qp, fwd_ctx=fwd_ctx, c=c)

    def _stage_e_classify(self, m, mem, rec):
        """Stage E: the record's verdict, one flag per :class:`~mrcnic.base.records.Verdict`
        in ``v`` (the first check that applies decides), and the terms it is made of."""
        qps, N = self.qps, self.max_wimm_dest
        op, p, c = rec.op, rec.p, rec.c
        pool = mem.pool
        cack = c.cack
        d = Signal(PSN)
        m.d.comb += d.eq(p.psn - cack)
        before = (d == 0) | d[-1]
        win = Signal(PSN)
        m.d.comb += win.eq((c.mpr_m1 + 1) << 7)
        in_win = ~before & (d <= win)
        is_probe = p.opcode == Opcode.PROBE
        is_write = (p.opcode >= Opcode.WRITE_FIRST) & (p.opcode <= Opcode.WRITE_ONLY_IMM)
        wimm = (p.opcode == Opcode.WRITE_LAST_IMM) | (p.opcode == Opcode.WRITE_ONLY_IMM)
        kp = p.psn[:7]
        arrived_p = mem.rd_p.data.bit_select(kp, 1) ^ self._parity(p.psn)
        pool_full = Cat(*(pool[i].valid for i in range(N))).all()
        immediate = d == 1

        qp_ok = (p.qp < qps) & c.open
        pkt_op = rec.e_live & ~op.cont
        v = {name: Signal(name=f"v_{name}") for name in
             ("no_qp", "probe", "trimmed", "bad_opcode", "duplicate", "out_of_window",
              "no_resource", "place")}
        data_ok = qp_ok & ~is_probe & ~p.trimmed & is_write
        cand = data_ok & in_win & ~arrived_p
        m.d.comb += [
            v["no_qp"].eq(pkt_op & ~qp_ok),
            v["probe"].eq(pkt_op & qp_ok & is_probe),
            v["trimmed"].eq(pkt_op & qp_ok & ~is_probe & p.trimmed),
            v["bad_opcode"].eq(pkt_op & qp_ok & ~is_probe & ~p.trimmed & ~is_write),
            v["duplicate"].eq(pkt_op & data_ok & (before | (in_win & arrived_p))),
            v["out_of_window"].eq(pkt_op & data_ok & ~before & ~in_win),
            v["no_resource"].eq(pkt_op & cand & wimm & ~immediate & pool_full),
            v["place"].eq(pkt_op & cand & ~(wimm & ~immediate & pool_full)),
        ]
        return SimpleNamespace(v=v, place=v["place"], pkt_op=pkt_op, qp_ok=qp_ok,
                               data_ok=data_ok, in_win=in_win, is_probe=is_probe, wimm=wimm,
                               immediate=immediate, pool_full=pool_full, kp=kp)

    def _stage_e_window(self, m, mem, stage_i, rec, cls):
        """Stage E: the window read in stage I with this packet's bit; ``fz``, the position of
        the first PSN not arrived at or after CACK + 1; the new CACK."""
        WINDOW = self.window
        op, p, c = rec.op, rec.p, rec.c
        rd_w = mem.rd_w
        parity = self._parity
        wimm, immediate, pool_full = cls.wimm, cls.immediate, cls.pool_full
        cack = c.cack
        # The window: arrival of the WINDOW PSNs from op.wbase, with this packet's bit.
        wb = op.wbase
        arr = Signal(WINDOW)
        m.d.comb += arr.eq(Cat(*(rd_w[j].data ^ parity((wb + j * CHUNK)[:PSN]).replicate(CHUNK)
                                 for j in range(self.window_chunks))))
        rel_p = Signal(PSN)
        m.d.comb += rel_p.eq(p.psn - wb)
        # The packet's own bit, set whenever it may be placed: for a duplicate the bit is set
        # already, so the condition need not wait for the block RAM's read of it.
        may_place = Signal()
        m.d.comb += may_place.eq(cls.pkt_op & cls.data_ok & cls.in_win &
                                 ~(wimm & ~immediate & pool_full))
        own = Signal(WINDOW)
        m.d.comb += own.eq(Mux(may_place & (rel_p < WINDOW), Const(1, WINDOW) << rel_p[:9], 0))
        # With a ring shorter than the window (mpr_max 1 or 2), the window's later laps of
        # the packet's position read its bit from before this write: "arrived" for a packet
        # not yet placed. Those positions read "not arrived", as after the write (the next
        # lap's PSN there has not arrived; the one after is beyond any window).
        laps = Signal(WINDOW)
        later = [Cat(Const(0, k * self.ring), own)[:WINDOW]
                 for k in range(1, -(-WINDOW // self.ring))]
        if later:
            m.d.comb += laps.eq(functools.reduce(operator.or_, later))
        arr_own = Signal(WINDOW)
        m.d.comb += arr_own.eq((arr | own) & ~laps)
        o = Signal(PSN)
        m.d.comb += o.eq(cack + 1 - wb)
        o_ok = o < WINDOW
        holes = Signal(WINDOW)
        m.d.comb += holes.eq(~arr_own & Cat(*(o[:9] <= i for i in range(WINDOW))))
        found, first = first_set(holes)
        fz = Signal(range(WINDOW + 1))        # window position of the new CACK + 1
        m.d.comb += fz.eq(Mux(found, first, WINDOW))
        adv_ok = rec.e_live & cls.qp_ok & (op.cont | cls.place) & o_ok
        new_cack = Signal(PSN)
        m.d.comb += new_cack.eq(Mux(adv_ok, stage_i.e_wbm1 + fz, cack))
        return SimpleNamespace(wb=wb, rel_p=rel_p, may_place=may_place, arr_own=arr_own,
                               o_ok=o_ok, found=found, fz=fz, adv_ok=adv_ok, new_cack=new_cack)

    def _stage_e_ack_decide(self, m, f, rec, cls, window):
        """Stage E: SACK (the triggers, :data:`LATE_SACK` among them) or NACK and why; if the
        window read falls short, a continuation finishes the record's advance and SACK."""
        WINDOW = self.window
        op, p, c = rec.op, rec.p, rec.c
        v, place = cls.v, cls.place
        fz = window.fz
        # SACK triggers.
        rel_hi = Signal(PSN)
        m.d.comb += rel_hi.eq(p.psn - c.hi)
        above_hi = (rel_hi != 0) & ~rel_hi[-1]
        new_hole = above_hi & (rel_hi != 1)
        fills = cls.immediate & (fz > window.rel_p + 1)  # LATE_SACK: CACK moves past the packet
        since_next = Signal(9)
        m.d.comb += since_next.eq(c.since + 1)
        every = (f["config"]["sack_every"] != 0) & (since_next >= f["config"]["sack_every"])
        due = Signal()
        m.d.comb += due.eq(Mux(op.cont, op.due,
                               v["probe"] | v["duplicate"] |
                               (place & (p.ack_req | p.rtx | p.ce | new_hole | fills |
                                         every))))
        need_cont = Signal()
        m.d.comb += need_cont.eq(rec.e_live & cls.qp_ok & ~v["no_qp"] &
                                 (op.cont | place | v["duplicate"] | v["probe"]) &
                                 (~window.o_ok | ~window.found |
                                  (due & (fz > WINDOW - BITMAP_BITS))))
        emit_sack = rec.e_live & due & ~need_cont
        nack_reason = Signal(8)
        with m.If(v["trimmed"]):
            m.d.comb += nack_reason.eq(Mux(p.lasthop, NackCode.TRIMMED_LASTHOP,
                                           NackCode.TRIMMED))
        with m.Elif(v["out_of_window"]):
            m.d.comb += nack_reason.eq(NackCode.PSN_OUT_OF_WINDOW)
        with m.Elif(v["no_resource"]):
            m.d.comb += nack_reason.eq(NackCode.NO_RESOURCE)
        emit_nack = v["trimmed"] | v["out_of_window"] | v["no_resource"]
        return SimpleNamespace(above_hi=above_hi, since_next=since_next, due=due,
                               need_cont=need_cont, emit_sack=emit_sack,
                               nack_reason=nack_reason, emit_nack=emit_nack)

    def _stage_e_new_context(self, m, rec, cls, window, dec):
        """Stage E: the new context: CACK, highest PSN, placed packets and bytes, since."""
        p, c = rec.p, rec.c
        place = cls.place
        new_ctx = Signal(self._ctx_layout)
        m.d.comb += [
            new_ctx.eq(c),
            new_ctx.cack.eq(window.new_cack),
            new_ctx.placed.eq(c.placed + place),
        ]
        with m.If(place):
            m.d.comb += new_ctx.bytes.eq(c.bytes + p.length)
            with m.If(dec.above_hi):
                m.d.comb += new_ctx.hi.eq(p.psn)
        with m.If(cls.pkt_op & dec.due):
            m.d.comb += new_ctx.since.eq(0)
        with m.Elif(place):
            m.d.comb += new_ctx.since.eq(dec.since_next)
        return new_ctx

    def _stage_e_completions(self, m, mem, rec, cls, window, dec):
        """Stage E: completions: the packet's own, one admitted to the pool, and the held ones
        the new CACK passes (released); a continuation or a release kills the next record."""
        N = self.max_wimm_dest
        p = rec.p
        pool = mem.pool
        place, wimm, immediate = cls.place, cls.wimm, cls.immediate
        own_cpl = place & wimm & immediate
        admit = place & wimm & ~immediate
        # A held completion of the QP is past CACK and so at or after the window base: it is
        # released when its window position is below the new CACK's (fz), a 9-bit compare
        # on the search result instead of a 24-bit one after the new CACK's adder.
        release = Signal(N)
        for i in range(N):
            pos = Signal(PSN, name=f"rel_pos{i}")
            m.d.comb += pos.eq(pool[i].psn - window.wb)
            m.d.comb += release[i].eq(window.adv_ok & pool[i].valid & (pool[i].qp == p.qp) &
                                      (pos[9:] == 0) & (pos[:9] < window.fz))
        free_found, free_idx = first_set(Cat(*(~pool[i].valid for i in range(N))))
        drain_start = release.any()
        m.d.sync += rec.kill.eq(rec.e_live & (dec.need_cont | drain_start))
        return SimpleNamespace(own_cpl=own_cpl, admit=admit, release=release,
                               free_idx=free_idx, drain_start=drain_start)

    def _stage_e_state_writes(self, m, mem, rec, cls, window, held, new_ctx):
        """Stage E: writes the context (and its forwarded copy), ring bit and pool entry."""
        p, e_qp = rec.p, rec.e_qp
        ctx_w, ring_w, rd_p, pool = mem.ctx_w, mem.ring_w, mem.rd_p, mem.pool
        kp = cls.kp
        with m.If(rec.e_live & cls.qp_ok):
            m.d.comb += [ctx_w.addr.eq(e_qp), ctx_w.data.eq(new_ctx), ctx_w.en.eq(1)]
        m.d.sync += [rec.fwd_valid.eq(rec.e_live & cls.qp_ok), rec.fwd_qp.eq(e_qp),
                     rec.fwd_ctx.eq(new_ctx)]
        with m.If(window.may_place):
            # Idempotent for a duplicate: the bit is forced to "arrived", not flipped.
            m.d.comb += [ring_w.addr.eq(self._ring_addr(e_qp, p.psn[7:])),
                         ring_w.data.eq((rd_p.data & ~(Const(1, CHUNK) << kp)) |
                                        ((~self._parity(p.psn)).as_unsigned() << kp)),
                         ring_w.en.eq(1)]
        with m.If(held.admit):
            m.d.sync += assign(pool[held.free_idx], valid=1, qp=p.qp, psn=p.psn, imm=p.imm,
                               tag=p.tag)

    def _stage_e_deferrals(self, m, ctl, stage_i, rec, window, dec, held):
        """Stage E: loads the replay register (a killed record), the continuation register
        (a record whose window read fell short) and the drain of released completions."""
        i_valid = stage_i.i_valid
        cont_valid, replay_valid = ctl.cont_valid, ctl.replay_valid
        # A killed record is always a packet (input or replay), never a continuation: nothing
        # live enters E between a deferral and its continuation.
        with m.If(rec.kill & stage_i.e_valid):
            m.d.sync += [replay_valid.eq(1), ctl.replay_op.eq(stage_i.e_op)]
        with m.Elif(i_valid & ~cont_valid & replay_valid):
            m.d.sync += replay_valid.eq(0)
        # The continuation and release registers load on every live record (enables from
        # registers); only their valid flags depend on this cycle's search.
        with m.If(rec.e_live):
            m.d.sync += [ctl.cont_op.eq(rec.op), ctl.cont_op.cont.eq(1),
                         ctl.cont_op.due.eq(dec.due), ctl.drain_mask.eq(held.release),
                         ctl.drain_ref.eq(window.new_cack)]
        with m.If(dec.need_cont):
            m.d.sync += cont_valid.eq(1)
        with m.Elif(i_valid & cont_valid):
            m.d.sync += cont_valid.eq(0)
        with m.If(held.drain_start):
            m.d.sync += ctl.drain_busy.eq(1)

    def _stage_e_to_e2(self, m, rec, cls, window, dec, held, new_ctx):
        """Stage E into E2: registers the verdict, the packet's own completion, and the SACK or
        NACK descriptor but for what stage E2 works out (bitmap, offset, out-of-order count)."""
        WINDOW = self.window
        p, c = rec.p, rec.c
        v, is_probe = cls.v, cls.is_probe
        emit_nack = dec.emit_nack
        e2_verdict_valid = Signal(name="e2_verdict_valid")
        e2_verdict = Signal(VERDICT, name="e2_verdict")
        e2_ack_valid, e2_ack = Signal(name="e2_ack_valid"), Signal(ACK_DESC, name="e2_ack")
        e2_arr, e2_fz = Signal(WINDOW, name="e2_arr"), Signal(range(WINDOW + 1), name="e2_fz")
        e2_placed, e2_start_m1 = Signal(PSN, name="e2_placed"), Signal(PSN, name="e2_start_m1")
        e2_cpl_valid, e2_cpl = Signal(name="e2_cpl_valid"), Signal(COMPLETION, name="e2_cpl")
        verdict_code = Signal(3)
        for name, sig in v.items():
            with m.If(sig):
                m.d.comb += verdict_code.eq(Verdict[name.upper()])
        m.d.sync += [
            e2_verdict_valid.eq(cls.pkt_op),
            *assign(e2_verdict, qp=p.qp, psn=p.psn, verdict=verdict_code, tag=p.tag),
            e2_cpl_valid.eq(held.own_cpl),
            *assign(e2_cpl, qp=p.qp, psn=p.psn, imm=p.imm, tag=p.tag),
            e2_ack_valid.eq(dec.emit_sack | emit_nack),
            e2_arr.eq(window.arr_own),
            e2_fz.eq(window.fz),
            e2_placed.eq(new_ctx.placed),
            e2_start_m1.eq(c.start_m1),
        ]
        ack = {
            "nack": emit_nack, "qp": p.qp, "cack": window.new_cack, "mpr": c.mpr_m1 + 1,
            "rcvd_bytes": new_ctx.bytes[8:], "entropy": p.entropy, "timestamp": p.timestamp,
        }
        with m.If(emit_nack):
            m.d.sync += assign(e2_ack, **ack, reason=dec.nack_reason, psn=p.psn)
        with m.Else():
            m.d.sync += assign(
                e2_ack, **ack, sack_offset=SACK_OFFSET,
                m=Mux(p.ce, SackMode.SKIP_ONCE, SackMode.NONE), pr=is_probe,
                psn=Mux(is_probe, 0, p.psn))
        return SimpleNamespace(verdict_valid=e2_verdict_valid, verdict=e2_verdict,
                               ack_valid=e2_ack_valid, ack=e2_ack, arr=e2_arr, fz=e2_fz,
                               placed=e2_placed, start_m1=e2_start_m1,
                               cpl_valid=e2_cpl_valid, cpl=e2_cpl)

    def _stage_e2_output(self, m, fifos, e2):
        """Stage E2: bitmap, ack_psn_offset, ooo_count; writes the verdict and ack FIFOs."""
        e2_ack = e2.ack
        bitmap = Signal(BITMAP_BITS)
        m.d.comb += bitmap.eq((e2.arr >> e2.fz)[:BITMAP_BITS])
        # ack_psn_offset: the triggering PSN less the new CACK (0 for a probe, or when it does
        # not fit 16 signed bits); computed here, off stage E's path.
        trigger = Signal(PSN)
        m.d.comb += trigger.eq(e2_ack.psn - e2_ack.cack)
        # ooo_count: placed packets above the new CACK (saturating at 15 bits).
        ooo = Signal(PSN)
        m.d.comb += ooo.eq(e2.placed - (e2_ack.cack - e2.start_m1))
        ack_out = Signal(ACK_DESC)
        m.d.comb += [ack_out.eq(e2_ack), ack_out.bitmap.eq(Mux(e2_ack.nack, 0, bitmap)),
                     ack_out.ooo_count.eq(Mux(ooo[15:] != 0, (1 << 15) - 1, ooo[:15])),
                     ack_out.ack_psn_offset.eq(
                         Mux(e2_ack.nack | e2_ack.pr | ~signed_fits(trigger, 16), 0,
                             trigger[:16]))]
        m.d.comb += [
            fifos["verdict"].w_data.eq(e2.verdict), fifos["verdict"].w_en.eq(e2.verdict_valid),
            fifos["ack"].w_data.eq(ack_out), fifos["ack"].w_en.eq(e2.ack_valid),
        ]

    def _completion_drain(self, m, mem, ctl, cpl_fifo, e2):
        """Release of held completions, oldest PSN first: one a cycle into the cpl FIFO, in
        the cycles stage E2 writes no completion of its own."""
        N, lap = self.max_wimm_dest, self.lap_bit
        pool = mem.pool
        drain_busy, drain_mask, drain_ref = ctl.drain_busy, ctl.drain_mask, ctl.drain_ref
        best = Signal(range(max(N, 2)))
        keys = [Signal(lap + 1, name=f"drain_key{i}") for i in range(N)]
        for i in range(N):
            m.d.comb += keys[i].eq((drain_ref - pool[i].psn)[:lap + 1])
        # Linear scan over N entries (N <= 32): the release is off the packet path.
        # All entries of one release belong to one QP and differ in PSN: the oldest is the
        # one further behind drain_ref than every other.
        for i in range(N):
            older = Cat(*(~drain_mask[j] | (keys[j] < keys[i]) for j in range(N) if j != i))
            with m.If(drain_mask[i] & (older.all() if N > 1 else 1)):
                m.d.comb += best.eq(i)
        drain_go = Signal()
        m.d.comb += drain_go.eq(drain_busy & ~e2.cpl_valid & cpl_fifo.w_rdy & drain_mask.any())
        entry = pool[best]
        cpl_rec = Signal(COMPLETION)
        # Plain expressions, not an If chain: an Icarus always-block that no input has woken
        # yet stays X after reset, and an X write enable would poison the counter.
        m.d.comb += [*assign(cpl_rec, qp=entry.qp, psn=entry.psn, imm=entry.imm,
                             tag=entry.tag),
                     cpl_fifo.w_data.eq(Mux(e2.cpl_valid, e2.cpl, cpl_rec)),
                     cpl_fifo.w_en.eq(e2.cpl_valid | drain_go)]
        with m.If(drain_go):
            m.d.sync += [drain_mask.bit_select(best, 1).eq(0),
                         pool[best].valid.eq(0)]
        with m.If(drain_busy & ~drain_mask.any()):
            m.d.sync += drain_busy.eq(0)

    def _qp_command_accept(self, m, f, ctl):
        """QP commands: a write of ``qp_command.open`` or ``.close`` loads the command
        registers, or is refused and flagged in ``error`` (bad QP, bad MPR, busy)."""
        qps, mpr_max = self.qps, self.mpr_max
        cmd_busy = ctl.cmd_busy
        sel_qp = f["qp_select"]["qp"]
        req_mpr = f["qp_mpr"]["mpr"]
        start_cmd = f["qp_command"]["open"] | f["qp_command"]["close"]
        m.d.comb += [
            f["error"]["bad_qp_set"].eq(start_cmd & (sel_qp >= qps)),
            f["error"]["bad_mpr_set"].eq(f["qp_command"]["open"] & (sel_qp < qps) &
                                         (req_mpr > mpr_max)),
            f["error"]["busy_set"].eq(start_cmd & cmd_busy),
        ]
        with m.If(start_cmd & ~cmd_busy & (sel_qp < qps) &
                  ~(f["qp_command"]["open"] & (req_mpr > mpr_max))):
            m.d.sync += [cmd_busy.eq(1), ctl.cmd_open.eq(f["qp_command"]["open"]),
                         ctl.cmd_qp.eq(sel_qp), ctl.cmd_start.eq(f["qp_start"]["psn"]),
                         ctl.cmd_mpr_m1.eq(Mux(req_mpr == 0, mpr_max - 1, req_mpr - 1)),
                         ctl.cmd_j.eq(0)]

    def _qp_command_run(self, m, mem, ctl, stage_i):
        """QP commands, the pipeline idle: rewrite the ring (a chunk a cycle), then context,
        drop held completions. The sweep after reset runs them for every QP in turn."""
        qps, mpr_max, N = self.qps, self.mpr_max, self.max_wimm_dest
        cbits, lap = self._cbits, self.lap_bit
        parity = self._parity
        ctx_w, ring_w, pool = mem.ctx_w, mem.ring_w, mem.pool
        cmd_qp, cmd_start, cmd_j = ctl.cmd_qp, ctl.cmd_start, ctl.cmd_j
        idle = (~stage_i.e_valid & ~ctl.cont_valid & ~ctl.replay_valid & ~ctl.drain_busy &
                ~stage_i.i_valid)
        cmd_run = ctl.cmd_busy & idle
        # A chunk of a fresh ring reads "not arrived" for every PSN of the first window:
        # positions at or after the start's belong to its lap, those before to the next.
        r0 = cmd_start[:lap] if lap else Const(0, 1)
        fresh = Signal(CHUNK)
        for k in range(CHUNK):
            pos = Cat(Const(k, 7), cmd_j[:cbits]) if cbits else Const(k, 7)
            m.d.comb += fresh[k].eq(Mux(pos >= r0, parity(cmd_start), ~parity(cmd_start)))
        with m.If(cmd_run):
            with m.If(cmd_j < mpr_max):
                m.d.comb += [ring_w.addr.eq(self._ring_addr(cmd_qp, cmd_j)),
                             ring_w.data.eq(fresh), ring_w.en.eq(1)]
                m.d.sync += cmd_j.eq(cmd_j + 1)
            with m.Else():
                start_m1 = (cmd_start - 1)[:PSN]
                m.d.comb += [ctx_w.addr.eq(cmd_qp), ctx_w.en.eq(1),
                             *assign(ctx_w.data, cack=start_m1, hi=start_m1, start_m1=start_m1,
                                     mpr_m1=ctl.cmd_mpr_m1, open=ctl.cmd_open)]
                for i in range(N):
                    with m.If(pool[i].qp == cmd_qp):
                        m.d.sync += pool[i].valid.eq(0)
                # The sweep after reset: on to the next QP until every one is open.
                with m.If(ctl.sweep & (cmd_qp != qps - 1)):
                    m.d.sync += [cmd_qp.eq(cmd_qp + 1), cmd_j.eq(0)]
                with m.Else():
                    m.d.sync += [ctl.cmd_busy.eq(0), ctl.sweep.eq(0)]

    def _status(self, m, f, mem, ctl):
        """The status register: a command or the sweep in progress, completions held."""
        N, pool = self.max_wimm_dest, mem.pool
        m.d.comb += [f["status"]["busy"].eq(ctl.cmd_busy),
                     f["status"]["held"].eq(sum(pool[i].valid for i in range(N)))]

    def _counters(self, m, f, cls, dec, cpl_fifo):
        """The event counters (:data:`COUNTERS`), cleared by ``control.clear``."""
        ev = Signal(data.StructLayout({n: 1 for n in COUNTERS}))
        m.d.comb += [
            ev.packets.eq(cls.pkt_op),
            *[getattr(ev, name).eq(sig) for name, sig in cls.v.items()],
            ev.sacks.eq(dec.emit_sack),
            ev.nacks.eq(dec.emit_nack),
            ev.completions.eq(cpl_fifo.w_en),
            ev.continuations.eq(dec.need_cont),
            ev.stall_cycles.eq(self.pkt.valid & ~self.pkt.ready),
        ]
        event_counters(m, f, ev, COUNTERS, f["control"]["clear"], width=self.counter_width)
