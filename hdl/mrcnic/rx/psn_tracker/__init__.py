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
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base.bram import BlockRam
from mrcnic.base.records import ACK_DESC, QP_INDEX_BITS, COMPLETION, PKT_IN, VERDICT, Verdict
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.gates import assign
from mrcnic.base.proto import Opcode
from mrcnic.base.rules import SACK_OFFSET
from mrcnic.base.stream import meta_stream
from mrcnic.rx.psn_tracker.stages import (
    ACK_BODY, ACK_TAIL, BITMAP_BITS, CHUNK, CONT, FIFO_DEPTH, HALF, IN_FLIGHT, LATE_SACK, OP,
    POOL_DATA, PSN, QUEUE_DEPTH, WINDOW_CHUNKS, WORD, VERDICT_NAMES, TrackerStages)
from mrcnic.rx.psn_tracker.pool import PoolStages
from mrcnic.rx.psn_tracker.sack import SackStages

__all__ = ["PsnTracker", "TRACKER_REGS", "WINDOW_CHUNKS",
           "SACK_OFFSET", "BITMAP_BITS", "LATE_SACK"]

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


class PsnTracker(TrackerStages, PoolStages, SackStages, wiring.Component):
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
        128-PSN chunks read from the packet's own chunk for the CACK advance, one of
        :data:`WINDOW_CHUNKS`: 3 (default: a run of at least 257 PSNs after the packet in
        one pass) or 2 (a third less search logic; at least 129).
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
        SACK and NACK descriptors to send, in the order of their records.
    cpl : stream of :data:`~mrcnic.base.records.COMPLETION`, out
        WRITE-with-immediate completions, in PSN order per QP.
    s_axil : AXI4-Lite, in
        Registers, :data:`TRACKER_REGS`.
    latency : int
        Cycles from a ``pkt`` handshake to its verdict on ``verdict`` (idle tracker).
    ack_latency : int
        Cycles from a ``pkt`` handshake to its SACK or NACK on ``ack`` (idle tracker).

    Pipeline
    --------
    Records wait in a :data:`QUEUE_DEPTH`-entry input queue until they have passed stage U,
    and flow through stages that each do one job in one cycle (their signals carry the
    stage's prefix; stages R to U are :mod:`mrcnic.rx.psn_tracker.stages` and
    :mod:`~mrcnic.rx.psn_tracker.pool`, A to T :mod:`~mrcnic.rx.psn_tracker.sack`, the
    logic they share :mod:`~mrcnic.rx.psn_tracker.logic`):

    * ``i_`` issue: a continuation, else the queue's next record, unless it is of the QP
      issued in the cycle before (the one stall: a QP's records are two cycles apart);
      addresses the ``window_chunks`` ring chunks from the packet's own (block RAM, two
      64-bit banks, :class:`~mrcnic.base.bram.BlockRam`: the words out of its register two
      cycles later);
    * ``r_`` read: the block RAM reads; how the ring write of the record in D would reach
      the window; the PSN's position plus one; the PSN's offset from the window base of
      the record in F (split into low bits and flags for F's short tests two stages on);
      the QP's window (distributed RAM);
    * ``w_`` window: the bank words, out of the block RAM's register with the two writes
      after the address forwarded (as a read in R transparent to its cycle's write), lap
      parity removed, into registers, and the first two levels of the own and next bit's
      selects; which
      ring write the read missed reaches this window (that of the record in U or of the
      one in D) and where, and whether it is made (the record in D's placement registered
      as D decides it, a stage ahead of the search it steers); the positions up to the
      packet's own as a mask; the PSN against the record in D's; the QP's context (distributed
      RAM) into registers, the offsets' low bits less the window (for F's window test), and
      the PSN tested against the highest PSN seen in it and in the context the record in U
      writes;
    * ``f_`` fetch: the PSN tested against the context (or the one the record past U
      wrote) and against the CACK the record in U writes if it advances, and the tests
      that hold picked; whether the pool will be full; the window, each position one
      function of five registers (the write it missed forwarded), searched per 16-bit
      word; the packet's own bit and the next;
    * ``d_`` decide: the verdict, the search combined (the first word with a hole, its
      number and index, by a tree of priority merges), the SACK triggers, the ring
      write's address; the QP's highest PSN seen read (for W's tests); a
      continuation or an advance on a QP holding completions flushes stages I to D (a
      registered flag, next cycle) and the queue re-issues their records;
    * ``u_`` update: the context read, the new CACK and context written (and forwarded),
      the ring bit, the held completions admitted or released; the verdict, the packet's
      own completion and the descriptor's body into their FIFOs;
    * ``a_``, ``b_``, ``c_``, ``t_``: the ring read at SACK_BASE (after this record's write,
      before the next of its QP writes), its words out of the block RAM's register in C,
      and shifted to the bitmap in two stages: the descriptor's tail, with ``ooo_count`` and
      ``ack_psn_offset``, into a second FIFO; ``ack`` carries a descriptor when both its
      parts are in.

    Every block RAM read leaves the RAM's own output register, and every search or compare
    wider than a LUT is split across stages or precomputed. A QP's ring writes reach the
    records two and three behind by forwarding (the window's read forwards U's writes up to
    the one in R's cycle, which the record four behind reads); its context write reaches the
    records two and three behind by forwarding (F's tests against the records in U and past
    it, their runs and windows), the later ones by the read in W.

    For formal checks, :meth:`elaborate` sets ``probe``: the context write (``cack_write``,
    ``cack``) and the placement decided in U (``place``, ``place_psn``).

    Latency
    -------
    :attr:`latency` = 7 cycles to the verdict (and to the packet's own completion),
    :attr:`ack_latency` = 11 to the SACK or NACK, with the queue empty and the outputs ready.

    Throughput
    ----------
    One record per cycle while consecutive records are of different QPs; a record of the QP
    of the one just before waits one cycle (one record every two cycles for one QP alone).
    The exceptions flush the stages behind them and cost about 5 cycles each: a CACK advance
    that runs past the window read for it (a continuation, at least 257 PSNs each; 129 with
    ``window_chunks`` 2), and an advance on a QP that holds completions (plus one cycle per
    completion released). The input also waits while a QP command, or the sweep after reset
    (``qps`` x (``mpr_max`` + 1) cycles), runs. Every output comes from a
    :data:`FIFO_DEPTH`-entry FIFO in distributed RAM; a record is issued only while every
    output FIFO has room for the records in flight, so nothing is ever dropped.

    Raises
    ------
    ValueError
        If ``qps`` is not an int in 1 .. 65536; ``mpr_max`` is not a power of two in
        1 .. 64; ``max_wimm_dest`` is not an int in 1 .. 32; ``window_chunks`` is not 2 or
        3 (:data:`WINDOW_CHUNKS`); or ``counter_width`` is not 0, 16 or 32.
    """

    latency = 7
    ack_latency = 11

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
        self.words = self.window // WORD
        self.ring = mpr_max * CHUNK
        self.lap_bit = ceil_log2(self.ring)          # PSN bit giving the lap parity
        self._qbits = max(1, ceil_log2(qps))       # QP index bits of the memory addresses
        self._cbits = ceil_log2(mpr_max)            # chunk bits of a ring address
        # Window chunks that hold a later lap of the packet's own chunk (a ring shorter
        # than the window): the packet's position there must read "not arrived".
        self._lap_chunks = [j for j in range(1, window_chunks) if j % mpr_max == 0]
        # A QP's context: what the decisions read (forwarded between the stages), and what
        # only its SACKs report (read and written in stage U alone). `pbase` is the CACK at
        # open plus the packets placed since (mod 2^24): the out-of-order count is
        # pbase - CACK.
        self._ctx_layout = data.StructLayout({
            "cack": PSN, "hi": PSN, "mpr_m1": max(1, self._cbits), "open": 1, "since": 8})
        self._stats_layout = data.StructLayout({"pbase": PSN, "bytes": 32})
        self._pool_layout = data.StructLayout({"valid": 1, "qpi": self._qbits, "psn": PSN})
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
        # State: per-QP context, the arrival ring's two banks, the held completions.
        mem = self._memories(m)
        # Output FIFOs, and whether each has room for the records in flight.
        fifos, room = self._output_fifos(m)
        # The registers between the stages, and of the continuation, drain and commands.
        st = self._stage_registers()
        st.sack_every = self._sack_every_regs(m, f["config"]["sack_every"])
        ctl = self._control_regs(m)
        # The input queue; stage I issues from it.
        q = self._queue(m, st, ctl)
        self._stage_i_issue(m, q, mem, st, ctl, room)
        self._stage_r_read(m, mem, st)
        self._stage_w_window(m, mem, st)
        self._stage_f_fetch(m, f, mem, st)
        self._stage_d_decide(m, mem, st, ctl, q)
        self._stage_u_update(m, mem, fifos, st, ctl, q)
        self._stage_a_sack_read(m, mem, st)
        self._stage_b_sack_data(m, mem, st)
        self._stage_c_bitmap(m, mem, st)
        self._stage_t_tail(m, fifos, st)
        # Held completions released, oldest PSN first, into the cpl FIFO.
        self._completion_drain(m, mem, st, ctl, fifos["cpl"])
        # QP commands: accept or refuse; rewrite the QP's ring and context (and the sweep).
        self._qp_command_accept(m, f, ctl)
        self._qp_command_run(m, mem, st, ctl, q)
        self._status(m, f, mem, ctl)
        self._counters(m, f, st, fifos["cpl"])
        return m

    # --- State -----------------------------------------------------------------------------

    def _registers(self, m):
        """The CSR block on ``s_axil``; returns its fields."""
        m.submodules.csr = csr = CsrBlock(TRACKER_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        return csr.fields

    def _memories(self, m):
        """Per-QP context (distributed RAM), the arrival ring in two banks of 64-bit words
        (block RAM: even halves of each chunk in ``lo``, odd in ``hi``), the held
        completions."""
        qps, mpr_max, N = self.qps, self.mpr_max, self.max_wimm_dest
        # Reset: every QP open, CACK = 2^24 - 1 (PSN 0 expected), MPR = mpr_max.
        ctx_init = {"cack": (1 << PSN) - 1, "hi": (1 << PSN) - 1, "mpr_m1": mpr_max - 1,
                    "open": 1}
        m.submodules.ctx = ctx = Memory(shape=self._ctx_layout, depth=qps, init=[ctx_init] * qps)
        ctx_w = ctx.write_port()
        ctx_u = ctx.read_port(domain="comb")
        # (Stage D's read of the highest PSN seen, for W's tests against what U writes.)
        ctx_d = ctx.read_port(domain="comb")
        # (Stage R's read, into W's registers.)
        ctx_rd = ctx.read_port(domain="comb")
        m.submodules.stats = stats = Memory(shape=self._stats_layout, depth=qps,
                                            init=[{"pbase": (1 << PSN) - 1}] * qps)
        stats_w = stats.write_port()
        stats_r = stats.read_port(domain="comb")
        banks = {}
        C = self.window_chunks
        for name in ("lo", "hi"):
            # Read ports 0 .. C - 1 the window (addressed in stage I, the words out in W:
            # forwarded the two writes after the address, that is, up to the one in the
            # cycle of stage R, as a read in R would see them); port C the SACK's (in A, out
            # in C: nothing forwarded, as no write to its word can come before C, the next
            # record of the QP being at least two behind).
            m.submodules[f"ring_{name}"] = banks[name] = BlockRam(
                HALF, max(2, qps * mpr_max), forward=(2,) * C + (0,))
        # Held completions: what is compared every cycle in registers, the rest (written
        # when one is admitted, read when it is released) in distributed RAM.
        pool = Signal(data.ArrayLayout(self._pool_layout, N), name="pool")
        m.submodules.pool_data = pool_data = Memory(shape=POOL_DATA, depth=N, init=[])
        held = Signal(range(N + 1), name="pool_held")
        m.d.sync += held.eq(sum(pool[i].valid for i in range(N)))
        return SimpleNamespace(ctx_w=ctx_w, ctx_u=ctx_u, ctx_d=ctx_d, ctx_rd=ctx_rd,
                               stats_w=stats_w,
                               stats_r=stats_r,
                               lo=banks["lo"], hi=banks["hi"], pool=pool, held=held,
                               pool_w=pool_data.write_port(),
                               pool_r=pool_data.read_port(domain="comb"))

    @staticmethod
    def _sack_every_regs(m, field):
        """What the decisions compare with ``config.sack_every``, worked out from it into
        registers (a write takes effect a cycle later): ``thr[k]`` = sack_every - k and
        ``le[k]`` = sack_every <= k for k = 1, 2, 3, ``is1`` and ``nz``; a count then goes
        straight into one compare."""
        reset = field.init
        cfg = SimpleNamespace(
            thr={k: Signal(8, name=f"cfg_every_thr{k}", init=max(0, reset - k))
                 for k in (1, 2, 3)},
            le={k: Signal(name=f"cfg_every_le{k}", init=reset <= k) for k in (1, 2, 3)},
            is1=Signal(name="cfg_every_is1", init=reset == 1),
            nz=Signal(name="cfg_every_nz", init=reset != 0))
        m.d.sync += [*[cfg.thr[k].eq((field - k)[:8]) for k in (1, 2, 3)],
                     *[cfg.le[k].eq(field <= k) for k in (1, 2, 3)],
                     cfg.is1.eq(field == 1), cfg.nz.eq(field != 0)]
        return cfg

    def _output_fifos(self, m):
        """The output FIFOs (distributed RAM, read as it stands: no output register), by
        port name, and ``room`` (a register): each can take the records in flight."""
        fifos = {}
        for name, layout in (("verdict", VERDICT), ("ack", ACK_BODY), ("ack_tail", ACK_TAIL),
                             ("cpl", COMPLETION)):
            fifo = SyncFIFO(width=layout.size, depth=FIFO_DEPTH)
            m.submodules[f"{name}_fifo"] = fifo
            fifos[name] = fifo
        for name in ("verdict", "cpl"):
            port, fifo = getattr(self, name), fifos[name]
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]
        # A descriptor leaves when both its parts are in (the tail comes four cycles after
        # the body).
        body, tail = fifos["ack"], fifos["ack_tail"]
        body_v, tail_v = Signal(ACK_BODY), Signal(ACK_TAIL)
        m.d.comb += [body_v.eq(body.r_data), tail_v.eq(tail.r_data),
                     *[getattr(self.ack.payload, name).eq(getattr(body_v, name))
                       for name, _ in ACK_BODY],
                     *[getattr(self.ack.payload, name).eq(getattr(tail_v, name))
                       for name, _ in ACK_TAIL],
                     self.ack.valid.eq(body.r_rdy & tail.r_rdy),
                     body.r_en.eq(self.ack.ready & tail.r_rdy),
                     tail.r_en.eq(self.ack.ready & body.r_rdy)]
        # The body's FIFO holds at least as many records as the tail's.
        room = Signal(name="i_room")
        m.d.sync += room.eq(Cat(*(fifos[name].level < FIFO_DEPTH - IN_FLIGHT
                                  for name in ("verdict", "ack", "cpl"))).all())
        return fifos, room

    def _control_regs(self, m):
        """Registers of the continuation, drain and QP command (and sweep) engines."""
        mpr_max, N, qbits, cbits = self.mpr_max, self.max_wimm_dest, self._qbits, self._cbits
        return SimpleNamespace(
            cont_valid=Signal(name="cont_valid"), cont_op=Signal(OP, name="cont_op"),
            cont_pkt=Signal(CONT, name="cont_pkt"), cont_qpi=Signal(qbits, name="cont_qpi"),
            drain_busy=Signal(name="drain_busy"), drain_mask=Signal(N, name="drain_mask"),
            drain_pos=Signal(data.ArrayLayout(9, N), name="drain_pos"),
            drain_older=Signal(N * N, name="drain_older"),
            drain_ordered=Signal(name="drain_ordered"),
            emit_valid=Signal(name="drain_emit_valid"), emit_sel=Signal(N, name="drain_emit_sel"),
            # After reset, a sweep opens every QP at PSN 0 with MPR mpr_max (block RAM keeps
            # its contents through a reset): qps x (mpr_max + 1) cycles, nothing issued.
            sweep=Signal(init=1, name="cmd_sweep"), cmd_busy=Signal(init=1, name="cmd_busy"),
            cmd_open=Signal(init=1, name="cmd_open"), cmd_qp=Signal(qbits, name="cmd_qp"),
            cmd_start=Signal(PSN, name="cmd_start"), cmd_j=Signal(cbits + 1, name="cmd_j"),
            # The start's position in its chunk as word and bit masks (see _qp_command_run),
            # loaded with it (reset: PSN 0).
            cmd_word_gt=Signal(CHUNK // WORD, name="cmd_word_gt",
                               init=(1 << CHUNK // WORD) - 2),
            cmd_word_eq=Signal(CHUNK // WORD, name="cmd_word_eq", init=1),
            cmd_bit_ge=Signal(WORD, name="cmd_bit_ge", init=(1 << WORD) - 1),
            cmd_mpr_m1=Signal(max(1, cbits), init=mpr_max - 1, name="cmd_mpr_m1"),
            # A command's write of the context and statistics (stage U's write ports, which
            # the command's QP index reaches through ``u_qpi``), and when it runs.
            cmd_run=Signal(name="cmd_run"), cmd_ctx_we=Signal(name="cmd_ctx_we"),
            # (The stages are empty and no record can reach U next cycle: see
            # _qp_command_run.)
            cmd_idle=Signal(init=1, name="cmd_idle"),
            # Copies of it that pick the context's and the statistics' write data (each a
            # reset kind of its own, so that synthesis keeps them apart: see
            # :func:`~mrcnic.base.gates.register_copies`; no write is made in the cycle
            # after a reset, whatever they hold then).
            cmd_idle_ctx=Signal(init=1, reset_less=True, name="cmd_idle_ctx"),
            cmd_idle_stats=Signal(reset_less=True, name="cmd_idle_stats"),
            cmd_ctx=Signal(self._ctx_layout, name="cmd_ctx"),
            cmd_stats=Signal(self._stats_layout, name="cmd_stats"))

    def _queue(self, m, st, ctl):
        """The input queue: records are written as they are accepted and kept until they
        leave stage U (``commit``), so that a flush can re-issue them (``issue`` rewinds to
        ``commit``) and stage U reads the fields the stages before it do not carry.
        ``pkt.ready`` is a register: room, and no QP command waiting."""
        depth = QUEUE_DEPTH
        m.submodules.queue = mq = Memory(shape=PKT_IN, depth=depth, init=[])
        qw = mq.write_port()
        qr, qu = mq.read_port(domain="comb"), mq.read_port(domain="comb")
        # The payload length again, read in stage D (for U's byte count, from registers).
        m.submodules.queue_len = ml = Memory(shape=16, depth=depth, init=[])
        lw, ld = ml.write_port(), ml.read_port(domain="comb")
        pbits = ceil_log2(depth) + 1
        wr = Signal(pbits, name="queue_wr")
        iss = Signal(pbits, name="queue_issue")
        cmt = Signal(pbits, name="queue_commit")
        ready = Signal(name="queue_ready")
        take = Signal()
        # The ring chunks of the window after the packet's own (its chunk plus 1, 2, mod
        # mpr_max), worked out as it is accepted: stage I addresses the window's block RAM
        # reads with no adder between this memory and them.
        cb, later = self._cbits, range(1, self.window_chunks)
        m.submodules.queue_chunks = mc = Memory(shape=max(1, cb * len(later)), depth=depth,
                                                init=[])
        cw, ci = mc.write_port(), mc.read_port(domain="comb")
        psn_in = self.pkt.payload.psn
        m.d.comb += [cw.addr.eq(wr[:pbits - 1]), cw.en.eq(take), ci.addr.eq(iss[:pbits - 1]),
                     cw.data.eq(Cat(*((psn_in[7:7 + cb] + j)[:cb] for j in later)) if cb
                                else 0)]
        m.d.comb += [
            self.pkt.ready.eq(ready),
            take.eq(self.pkt.valid & ready),
            qw.addr.eq(wr[:pbits - 1]), qw.data.eq(self.pkt.payload), qw.en.eq(take),
            qr.addr.eq(iss[:pbits - 1]), qu.addr.eq(st.u.op.idx),
            lw.addr.eq(wr[:pbits - 1]), lw.data.eq(self.pkt.payload.length), lw.en.eq(take),
            ld.addr.eq(st.d.op.idx),
        ]
        wr_next, cmt_next = Signal(pbits), Signal(pbits)
        m.d.comb += [wr_next.eq(wr + take), cmt_next.eq(cmt + st.commit)]
        # From registers only: room for this cycle's record and the next.
        m.d.sync += [wr.eq(wr_next), cmt.eq(cmt_next),
                     ready.eq(((wr - cmt)[:pbits] < depth - 2) & ~ctl.cmd_busy)]
        return SimpleNamespace(rd=qr, at_u=qu, len_at_d=ld, chunks=ci.data, wr=wr, iss=iss,
                               cmt=cmt, cmt_next=cmt_next, take=take,
                               empty=(cmt == wr), pending=(iss != wr))

    # --- Stage I: issue --------------------------------------------------------------------

    def _stage_i_issue(self, m, q, mem, st, ctl, room):
        """Stage I: a continuation, else the queue's next record unless it is of the QP
        issued in the cycle before; nothing while the stages behind a deferral are flushed
        (``kill``), held completions drain, or an output FIFO lacks room. The opcode leaves
        as the classes the decisions test."""
        qps, qbits, r = self.qps, self._qbits, st.r
        rec = q.rd.data
        qop = Signal(OP)
        m.d.comb += assign(
            qop, psn=rec.psn, probe=rec.opcode == Opcode.PROBE,
            write=(rec.opcode >= Opcode.WRITE_FIRST) & (rec.opcode <= Opcode.WRITE_ONLY_IMM),
            wimm=(rec.opcode == Opcode.WRITE_LAST_IMM) | (rec.opcode == Opcode.WRITE_ONLY_IMM),
            asks=rec.ack_req | rec.rtx | rec.ce, trimmed=rec.trimmed, lasthop=rec.lasthop,
            idx=q.iss[:len(qop.idx)])
        hazard = r.valid & (rec.qp[:qbits] == r.qpl)
        go = ~ctl.drain_busy & room
        issue_cont = Signal()
        issue_q = Signal()
        # A continuation goes in the cycle its flush clears the stages behind, unless held
        # completions may be released then (the drain goes first).
        m.d.comb += [issue_cont.eq(go & ctl.cont_valid & ~st.kill_held),
                     issue_q.eq(go & ~st.kill & ~ctl.cont_valid & q.pending & ~hazard)]
        op = Signal(OP, name="i_op")
        qpl = Signal(qbits, name="i_qpl")
        m.d.comb += [op.eq(Mux(ctl.cont_valid, ctl.cont_op, qop)),
                     qpl.eq(Mux(ctl.cont_valid, ctl.cont_qpi, rec.qp[:qbits]))]
        # The window's read (its words leave the block RAM in stage W): the chunks of the
        # continuation, or those the queue keeps for its record.
        cb = self._cbits
        if cb:
            cont_c, rec_c = ctl.cont_op.psn[7:7 + cb], rec.psn[7:7 + cb]
            chunks = [Mux(ctl.cont_valid, cont_c, rec_c)] + [
                Mux(ctl.cont_valid, (cont_c + j)[:cb], q.chunks[(j - 1) * cb:j * cb])
                for j in range(1, self.window_chunks)]
        else:
            chunks = [Const(0, 1)] * self.window_chunks
        self._window_read(m, mem, qpl, chunks)
        in_range = rec.qp < qps
        m.d.sync += [r.valid.eq(issue_cont | issue_q), r.op.eq(op),
                     r.qpl.eq(qpl),
                     r.qp_in.eq(ctl.cont_valid | in_range),
                     r.qpi.eq(Mux(ctl.cont_valid, ctl.cont_qpi,
                                  Mux(in_range, rec.qp[:qbits], 0)))]
        with m.If(issue_cont):
            m.d.sync += ctl.cont_valid.eq(0)
        with m.If(st.kill):
            m.d.sync += q.iss.eq(q.cmt_next)
        with m.Elif(issue_q):
            m.d.sync += q.iss.eq(q.iss + 1)

    def _window_read(self, m, mem, qpi, chunks):
        """The window's chunks from the packet's own (``chunks``: their ring chunk numbers,
        mod ``mpr_max``), addressed in stage I (``qpi``: the record being issued, or offered
        when it is not) on the ring's window ports; their words leave the block RAM in W
        with the writes up to the one in R's cycle."""
        for j, c in enumerate(chunks):
            chunk = Signal(self._cbits or 1, name=f"i_chunk{j}")
            m.d.comb += chunk.eq(c)
            addr = self._ring_addr(qpi, chunk)
            m.d.comb += [mem.lo.r_addr[j].eq(addr), mem.hi.r_addr[j].eq(addr)]

    # --- Engines beside the pipeline -------------------------------------------------------

    def _completion_drain(self, m, mem, st, ctl, cpl_fifo):
        """Release of held completions, oldest PSN first, one a cycle into the cpl FIFO: the
        order of the released entries (their window positions) is compared once, then each
        step picks the oldest left and the next cycle writes it. Nothing is issued
        meanwhile."""
        N, pool = self.max_wimm_dest, mem.pool
        mask, older = ctl.drain_mask, ctl.drain_older
        with m.If(ctl.drain_busy & ~ctl.drain_ordered):
            m.d.sync += [older[i * N + j].eq(ctl.drain_pos[i] < ctl.drain_pos[j])
                         for i in range(N) for j in range(N)]
            m.d.sync += ctl.drain_ordered.eq(1)
        best = Signal(N, name="drain_best")
        for i in range(N):
            m.d.comb += best[i].eq(mask[i] & Cat(*(~mask[j] | older[i * N + j]
                                                   for j in range(N) if j != i)).all()
                                   if N > 1 else mask[i])
        step = Signal(name="drain_step")
        own = st.own.valid
        m.d.comb += step.eq(ctl.drain_busy & ctl.drain_ordered & mask.any() &
                            (cpl_fifo.level < FIFO_DEPTH - 2) & ~(ctl.emit_valid & own))
        with m.If(step):
            m.d.sync += [mask.eq(mask & ~best), ctl.emit_sel.eq(best), ctl.emit_valid.eq(1)]
        with m.Elif(~(ctl.emit_valid & own)):
            m.d.sync += ctl.emit_valid.eq(0)
        entry = Signal(self._pool_layout, name="drain_entry")
        m.d.comb += [entry.eq(functools.reduce(operator.or_, (
                         Mux(ctl.emit_sel[i], pool[i].as_value(), 0) for i in range(N)))),
                     mem.pool_r.addr.eq(functools.reduce(operator.or_, (
                         Mux(ctl.emit_sel[i], i, 0) for i in range(N))))]
        emit = ctl.emit_valid & ~own
        cpl_rec = Signal(COMPLETION)
        # Plain expressions, not an If chain: an Icarus always-block that no input has woken
        # yet stays X after reset, and an X write enable would poison the counter.
        m.d.comb += [*assign(cpl_rec, qp=entry.qpi, psn=entry.psn, imm=mem.pool_r.data.imm,
                             tag=mem.pool_r.data.tag),
                     cpl_fifo.w_data.eq(Mux(own, st.own.cpl, cpl_rec)),
                     cpl_fifo.w_en.eq(own | emit)]
        with m.If(emit):
            for i in range(N):
                with m.If(ctl.emit_sel[i]):
                    m.d.sync += pool[i].valid.eq(0)
        with m.If(ctl.drain_busy & ctl.drain_ordered & ~mask.any() & ~ctl.emit_valid):
            m.d.sync += ctl.drain_busy.eq(0)

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
        # While no command runs, its registers follow the fields (nothing reads them then):
        # on the edge a command is accepted they take its fields, and the acceptance, after
        # the checks, drives only ``cmd_busy``.
        with m.If(~cmd_busy):
            m.d.sync += [ctl.cmd_open.eq(f["qp_command"]["open"]),
                         ctl.cmd_qp.eq(sel_qp), ctl.cmd_start.eq(f["qp_start"]["psn"]),
                         *self._start_masks(ctl, f["qp_start"]["psn"]),
                         ctl.cmd_mpr_m1.eq(Mux(req_mpr == 0, mpr_max - 1, req_mpr - 1))]
        with m.If(start_cmd & ~cmd_busy & (sel_qp < qps) &
                  ~(f["qp_command"]["open"] & (req_mpr > mpr_max))):
            m.d.sync += cmd_busy.eq(1)

    @staticmethod
    def _start_masks(ctl, start):
        """The masks of the start's position in its chunk: the words after its word, its
        word, and the bits of a word at or after its bit. (The comparisons that cannot fail
        or hold, word 0 after it and the last bit at or after it, written as constants: a
        Verilog lint flags a constant comparison.)"""
        return [ctl.cmd_word_gt.eq(Cat(Const(0, 1), *(k > start[4:7]
                                                      for k in range(1, CHUNK // WORD)))),
                ctl.cmd_word_eq.eq(Cat(*(k == start[4:7] for k in range(CHUNK // WORD)))),
                ctl.cmd_bit_ge.eq(Cat(*(b >= start[:4] for b in range(WORD - 1)),
                                      Const(1, 1)))]

    def _qp_command_run(self, m, mem, st, ctl, q):
        """QP commands, once every record accepted before them is done and the pipeline is
        idle: rewrite the ring (a chunk a cycle), then the context, drop held completions.
        The sweep after reset runs them for every QP in turn."""
        qps, mpr_max, N = self.qps, self.mpr_max, self.max_wimm_dest
        cbits, lap = self._cbits, self.lap_bit
        parity = self._parity
        pool = mem.pool
        cmd_qp, cmd_start, cmd_j = ctl.cmd_qp, ctl.cmd_start, ctl.cmd_j
        # Idle: nothing in the queue or the pipeline, and nothing accepted (the input is
        # closed while a command waits), so still idle in the next cycle: registered.
        idle = ctl.cmd_idle
        idle_next = (ctl.cmd_busy & q.empty & ~q.take & ~st.r.valid & ~st.w.valid &
                     ~st.f.valid & ~st.d.valid & ~st.u.valid & ~st.a.valid &
                     ~ctl.cont_valid & ~ctl.drain_busy)
        m.d.sync += [idle.eq(idle_next), ctl.cmd_idle_ctx.eq(idle_next),
                     ctl.cmd_idle_stats.eq(idle_next)]
        cmd_run = ctl.cmd_run
        m.d.comb += cmd_run.eq(ctl.cmd_busy & idle)
        # Held completions of the QP (the pool does not change while a command waits).
        drop = Signal(N, name="cmd_drop")
        m.d.sync += drop.eq(Cat(*(pool[i].qpi == cmd_qp for i in range(N))))
        # A chunk of a fresh ring reads "not arrived" for every PSN of the first window:
        # positions at or after the start's belong to its lap, those before to the next.
        # Position (chunk j, bit 16 h + b) is at or after the start's (chunk s, bit
        # 16 sh + sb) when j > s, or j = s and h > sh, or h = sh and b >= sb.
        s_hi = cmd_start[7:lap] if lap > 7 else Const(0, 1)
        # The chunk is written a cycle after its number is counted, from registers (the
        # address in stage U's, which no record uses while the pipeline is idle): per word
        # h of the chunk, the value of its bits at or after the start's bit (``fresh_ge``)
        # and before it (``fresh_lt``), so that each bit of the banks' write data is one
        # function of five registers (these two, the bit's ``cmd_bit_ge``, ``w_valid`` and
        # stage U's word), the banks' data pins a LUT level from registers.
        w_valid = Signal(name="cmd_ring_w_valid")
        j = cmd_j[:cbits] if cbits else Const(0, 1)
        after, here = j > s_hi, j == s_hi
        nwc = CHUNK // WORD
        fresh_ge, fresh_lt = Signal(nwc, name="cmd_fresh_ge"), Signal(nwc, name="cmd_fresh_lt")
        par = parity(cmd_start)
        m.d.sync += [w_valid.eq(0),
                     *[fresh_ge[h].eq(Mux(after | (here & (ctl.cmd_word_gt[h] |
                                                           ctl.cmd_word_eq[h])), par, ~par))
                       for h in range(nwc)],
                     *[fresh_lt[h].eq(Mux(after | (here & ctl.cmd_word_gt[h]), par, ~par))
                       for h in range(nwc)]]
        with m.If(idle):
            m.d.sync += [st.u.ring_addr.eq(self._ring_addr(cmd_qp, cmd_j)),
                         st.u.qpi.eq(cmd_qp)]
        start_m1 = (cmd_start - 1)[:PSN]
        m.d.comb += [*assign(ctl.cmd_ctx, cack=start_m1, hi=start_m1, mpr_m1=ctl.cmd_mpr_m1,
                             open=ctl.cmd_open),
                     *assign(ctl.cmd_stats, pbase=start_m1)]
        fresh = Signal(CHUNK, name="cmd_fresh")
        for k in range(CHUNK):
            h, b = k // WORD, k % WORD
            m.d.comb += fresh[k].eq(Mux(ctl.cmd_bit_ge[b], fresh_ge[h], fresh_lt[h]))
        with m.If(w_valid):
            m.d.comb += [mem.lo.w_data.eq(fresh[:HALF]), mem.lo.w_en.eq(1),
                         mem.hi.w_data.eq(fresh[HALF:]), mem.hi.w_en.eq(1)]
        with m.If(cmd_run):
            with m.If(cmd_j < mpr_max):
                m.d.sync += [cmd_j.eq(cmd_j + 1), w_valid.eq(1)]
            with m.Else():
                m.d.comb += ctl.cmd_ctx_we.eq(1)
                for i in range(N):
                    with m.If(drop[i]):
                        m.d.sync += pool[i].valid.eq(0)
                # The sweep after reset: on to the next QP until every one is open.
                with m.If(ctl.sweep & (cmd_qp != qps - 1)):
                    m.d.sync += [cmd_qp.eq(cmd_qp + 1), cmd_j.eq(0)]
                with m.Else():
                    # (The chunk count is left at 0 for the next command: its acceptance
                    # then loads only the command's own registers.)
                    m.d.sync += [ctl.cmd_busy.eq(0), ctl.sweep.eq(0), cmd_j.eq(0)]

    def _status(self, m, f, mem, ctl):
        """The status register: a command or the sweep in progress, completions held."""
        m.d.comb += [f["status"]["busy"].eq(ctl.cmd_busy), f["status"]["held"].eq(mem.held)]

    def _counters(self, m, f, st, cpl_fifo):
        """The event counters (:data:`COUNTERS`), cleared by ``control.clear``, from the
        decisions stage D registered into U."""
        u = st.u
        ev = Signal(data.StructLayout({n: 1 for n in COUNTERS}))
        m.d.comb += [
            ev.packets.eq(u.pkt_op),
            *[getattr(ev, name).eq(u.valid & getattr(u.events, name))
              for name in VERDICT_NAMES],
            ev.sacks.eq(st.sack),
            ev.nacks.eq(u.emit_nack),
            ev.completions.eq(cpl_fifo.w_en),
            ev.continuations.eq(u.valid & u.need_cont),
            ev.stall_cycles.eq(self.pkt.valid & ~self.pkt.ready),
        ]
        # The counts' high bits in distributed RAM (read exactly over AXI4-Lite): the
        # flip-flops they free hold pipeline registers.
        event_counters(m, f, ev, COUNTERS, f["control"]["clear"], width=self.counter_width,
                       storage="ram")
