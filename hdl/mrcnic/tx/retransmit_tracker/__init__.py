"""Sender reliability (spec §4): :class:`RetransmitTracker` (``retransmit-tracker``).

The sender's half of MRC's reliability, in :class:`~mrcnic.tx.mrc_tx.MrcTx`: it records
every packet put on the wire, takes the peer's SACKs and NACKs, and decides what to
retransmit (SACK holes past a reorder guard, NACKs, timeouts), what to tell the path
selector about each EV, which descriptors the sender may free, and whether a QP may send
its next PSN (send credit).

The tracker is one component whose stages live in this package, one file per path, each a
class of methods mixed into :class:`RetransmitTracker` (every method reads what earlier
stages left in a shared namespace and leaves what later ones use; each file states its
stages, their registers, latency and what they forward):

- ``common.py``: constants, record layouts and the bit-search helpers the stages share;
- ``sent.py`` (:class:`~.sent.SentPath`): the sent records, stage S1;
- ``ack.py`` (:class:`~.ack.AckStages`): the SACK/NACK path, stages A, E and W;
- ``holes.py`` (:class:`~.holes.HoleEngine`): a SACK's holes requested, stages G and J;
- ``timer.py`` (:class:`~.timer.TimerStages`): the timeout scan, stages S1, S2 and S3;
- ``pending.py`` (:class:`~.pending.PendingTable`): the retransmissions requested and not
  yet resent;
- this file: the context, bitmap and ring memories, the output FIFOs, QP opens and the
  reset sweep, credit, errors and retries, registers and counters.

Operation, decisions and measured figures: docs/blocks/retransmit-tracker.md.
"""


from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base.bram import BlockRam
from mrcnic.base.records import (
    ACK_DESC, QP_INDEX_BITS, CWND_IN, QP_ERROR, EV_FEEDBACK, TIME_BITS, release_layout,
    rtx_layout, sent_layout)
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.gates import assign, take as _take
from mrcnic.base.rules import MAX_TIMEOUT_EXP, RETRY_FOREVER, timeout_ticks
from mrcnic.base.stream import meta_stream
from mrcnic.tx.retransmit_tracker.ack import AckStages
from mrcnic.tx.retransmit_tracker.common import (
    COUNTER_NAMES, COUNTERS, CREDIT_RULE, EPOCH_BITS, FIFO_DEPTH, HOLE_RULE, MAX_PENDING,
    PENDING_RULE, PSN, REC, TIME_RULE, WORD)
from mrcnic.tx.retransmit_tracker.holes import HoleEngine
from mrcnic.tx.retransmit_tracker.pending import PendingTable
from mrcnic.tx.retransmit_tracker.sent import SentPath
from mrcnic.tx.retransmit_tracker.timer import TimerStages

__all__ = ["RetransmitTracker", "RT_REGS", "MAX_TIMEOUT_EXP", "RETRY_FOREVER", "timeout_ticks",
           "COUNTERS", "MAX_PENDING", "PENDING_RULE", "TIME_RULE", "HOLE_RULE",
           "CREDIT_RULE"]


RT_REGS = RegisterMap("retransmit_tracker", [
    Register("config", [
        Field("reorder_guard", 16, "rw", reset=3,
              desc="PSNs past a hole that must be acknowledged before it counts as lost"),
        Field("timeout_exp", 5, "rw", reset=7,
              desc="t: timeout = 1.024 us x 2^t (t <= 24)"),
        Field("retry_linear", 3, "rw", reset=7,
              desc="Retries at a constant interval before backoff doubles"),
        Field("pmtu_log2", 4, "rw", reset=12, offset=28,
              desc="log2 of the PMTU in bytes, for bytes in flight (a window counts in "
                   "packets of the PMTU set when it is written)"),
    ]),
    Register("config2", [
        Field("retry_max", 5, "rw", reset=RETRY_FOREVER,
              desc="Timeouts of the oldest PSN before the QP goes to error (25: never)"),
        Field("initial_mpr", 8, "rw", reset=8, offset=8,
              desc="MPR (128-PSN units) a QP starts with, until its first SACK"),
        Field("reorder_time", 16, "rw", reset=0, offset=16,
              desc="Ticks a hole must have been sent before the SACK's trigger PSN to "
                   "count as lost (0: no time guard)"),
    ]),
    Register("qp_select", [Field("qp", 16, "rw", desc="QP the next command acts on")]),
    Register("qp_start", [Field("psn", 24, "rw", desc="First PSN to send after open")]),
    Register("qp_command", [Field("open", 1, "w1p",
                                  desc="Open qp_select at qp_start: clears its error")]),
    Register("status", [Field("busy", 1, "ro", desc="A QP open or the reset sweep is in "
                                                    "progress (inputs held)")]),
    Register("error", [Field("bad_qp", 1, "w1c", desc="An open named a QP >= qps")]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in COUNTERS],
])


class RetransmitTracker(SentPath, AckStages, HoleEngine, TimerStages, PendingTable,
                        wiring.Component):
    """The sender's reliability: records sent packets, takes SACKs and NACKs, asks for
    retransmissions, gives path feedback, releases and send credit.

    Every packet put on the wire is recorded per QP and PSN (EV, send time, descriptor tag)
    in a ring of ``outstanding`` entries. A SACK is checked (stale, unsent, duplicate: ignored
    and counted), ORed into the QP's acked bitmap and advances CACK; a CACK advance gives one
    ``release`` record, the SACK's M one ``feedback`` record for the EV of its trigger PSN
    (none for a probe answer, pr = 1). A PSN at least ``reorder_guard`` PSNs before the
    highest acknowledged one, not acknowledged (and, with ``reorder_time``, sent that long
    before the trigger PSN) is a hole and is requested once (:data:`HOLE_RULE`,
    :data:`TIME_RULE`); a TRIMMED, TRIMMED_LASTHOP or resource NACK requests its PSN at once;
    a timer scan requests PSNs that time out (2^``timeout_exp`` ticks, linear then
    exponential backoff per QP). A PSN whose retransmission is requested and not yet resent
    is not requested again (:data:`PENDING_RULE`, a table of ``pending`` entries). Retries
    exhausted or a NACK 0x19 put the QP in error (``qp_error``); it ignores every input
    until opened again. ``credit_ready`` says whether ``credit_qp`` may send its next PSN
    (receive window CACK + MPR x 128, ``outstanding``, ``cwnd``: :data:`CREDIT_RULE`). An
    open waits for the SACKs already taken (the ``ack`` input held meanwhile). After reset a
    sweep opens every QP at PSN 0 (``qps`` cycles, inputs held).

    Parameters
    ----------
    qps : int
        Queue pairs, 1 .. 65536. Default 64.
    outstanding : int
        PSNs outstanding per QP (the ring size), a power of two 128 .. 16384. Default 1024.
    tag_width : int
        Bits of the descriptor tag recorded per PSN (the sender's to define), 1 .. 64.
        Default 32.
    pending : int
        Entries of the pending-retransmission table, shared by all QPs, any count 1 .. 64
        (:data:`MAX_PENDING`). Default 16.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    sent : stream of :func:`~mrcnic.base.records.sent_layout` (``tag_width``), in
        One record per packet put on the wire: ``qp``, ``psn``, ``ev``, ``time`` (ticks of
        ``now``), ``tag``, ``rtx``. A new PSN (``rtx`` = 0) must be the QP's next PSN; a
        retransmission must name an outstanding PSN. Anything else is ignored and counted.
    ack : stream of :data:`~mrcnic.base.records.ACK_DESC`, in
        The peer's SACKs and NACKs, from the receive half.
    cwnd : stream of :data:`~mrcnic.base.records.CWND_IN`, in
        Congestion window of a QP in bytes; unlimited (2^32 - 1) after reset or an open.
        Kept in packets of the PMTU that ``config.pmtu_log2`` gives as it is written.
    now : Signal(:data:`~mrcnic.base.records.TIME_BITS`), in
        Free-running time base in ticks of 1.024 us
        (:data:`~mrcnic.base.records.TICK_NS`), wrapping.
    credit_qp : Signal(:data:`~mrcnic.base.records.QP_INDEX_BITS`), in
        The QP asked about.
    credit_ready : Signal(1), out
        QP ``credit_qp`` may send its next PSN; registered, one cycle after the question.
    rtx : stream of :func:`~mrcnic.base.records.rtx_layout` (``tag_width``), out
        Retransmit requests: ``qp``, ``psn``, ``tag``, ``ev`` (the EV that failed: avoid
        it), ``cause`` (:class:`~mrcnic.base.records.RtxCause`: NACK, HOLE, TIMEOUT).
    feedback : stream of :data:`~mrcnic.base.records.EV_FEEDBACK`, out
        Path feedback for the path selector.
    release : stream of :func:`~mrcnic.base.records.release_layout` (``tag_width``), out
        PSNs ``first`` .. ``last`` acknowledged (CACK passed them), with the tag of ``last``.
    qp_error : stream of :data:`~mrcnic.base.records.QP_ERROR`, out
        A QP put in error (:class:`~mrcnic.base.records.ErrorCause`: NACK_FATAL, RETRIES).
    s_axil : AXI4-Lite, in
        Registers, :data:`RT_REGS`.

    Every output comes from a 16-entry FIFO, written from a register that holds the record
    decided the cycle before; the inputs wait when one lacks room, so no output is ever
    dropped.

    Latency
    -------
    A NACK taken in cycle t has its retransmit request out of the FIFO in cycle t + 4
    (:attr:`nack_latency`); a SACK's release in t + 3 (:attr:`sack_latency`), its feedback
    in t + 4 (:attr:`feedback_latency`), its first hole request in t + 11
    (:attr:`hole_latency`), then one per
    cycle. A timeout is seen at most one timer
    pass after it expires; a pass takes the sum over QPs of (outstanding PSNs + 5) cycles,
    at most ``qps`` x (``outstanding`` + 5), plus the cycles it yields to the output FIFOs.

    A sent record is judged the cycle after it is taken (stage S1 holds it), and writes
    the record rings the cycle after that; an ack record sees every sent record taken in an
    earlier cycle, a sent record every ack record taken in an earlier cycle or the same one.

    Throughput
    ----------
    One ``sent`` record and one ``ack`` record per cycle, sustained, together, while
    consecutive records are of different QPs. An ack record right behind one of its own
    QP waits one cycle in stage E (stage W writes the QP's state); a sent record waits
    while stage E holds an ack record of its QP (and the ``ack`` input meanwhile): for one
    QP alone, one record every two cycles on each input (measured in
    ``sim/tx/test_retransmit_tracker.py``, with 4 QPs at random too). The ``ack`` input
    also pauses while the hole engine sends requests (one cycle per hole, requested or
    skipped as pending, after those to find the first and read its records: the next ack
    record is applied k + 7 cycles (:attr:`hole_pause` + k) after a SACK that opens k
    holes, 3 after one whose search is not empty but finds every PSN in it acknowledged)
    or an output FIFO is full; a retransmission record waits while stage E
    holds a record or stage W one it does not apply in that cycle, or a SACK of its QP is
    in stage E, W or the hole engine. The pending table adds no cycle and no pause.

    Stages
    ------
    Sent path: stage S1 (``sent_s1_*``) holds the record and its QP's index; the cycle it
    goes it is judged against the QP's stored state and stage W's CACK and error, and
    its ring writes are registered (``sent_ring_*``). It waits while a record ahead of it
    in flight decides what it needs (below); the ``ack`` input takes nothing meanwhile.
    SACK/NACK path: stage A (``sack_a_*``) takes the record, reads the bitmap words, and
    works out from the record alone where its CACK falls in the two words, the highest
    PSN it acknowledges and the end of the hole search that gives; stage E (``sack_e_*``)
    reads the QP's context, hole mark and next PSN, checks the record against them and
    against the words, aligns the SACK's bitmap and finds the bounds of the hole search;
    stage W (``sack_w_*``) applies the record (context, words, the hole mark moved to the
    end of a search that was not empty), answers it and finds its holes, each bound a
    mask of its own; the hole engine (``hole_*``) takes them by groups of 16 and reads
    their records one per cycle, and its stage J (``hole_j_*``) registers the records,
    judges each hole against the time guard, looks it up in the pending table (compared
    a cycle ahead, ``hole_j_pmatch``) and requests it (or moves the hole mark back to
    it). Only stage
    W writes what stage E reads: a record of the QP stage W (or the hole engine) holds
    waits in stage E and reads it all again the cycle after it is written (the words
    through a transparent read port). A hole found by one SACK is requested before the
    next ack record is applied: stage W waits while the engine runs. Stage W's CACK and
    error are forwarded from its registers to the sent path (a sent record judged while
    stage W holds an ack record sees it; one of stage E's QP waits); a retransmission
    leaves the pending table the cycle after it is judged (``pend_rm_*``). Nothing is
    forwarded to the timer scan, whose stage S3 tries its PSN again while stage E or W
    holds a record of the same QP, or stage W held one as stage S1 read the bitmap. Each
    output record is chosen
    by which stage holds one (stage W, the hole engine, the timer) and registered before
    its FIFO (``out_*``).

    Raises
    ------
    ValueError
        If ``qps`` is not an int in 1 .. 65536; ``outstanding`` is not a power of two in
        128 .. 16384; ``tag_width`` is not an int in 1 .. 64; ``pending`` is not an int in
        1 .. 64; or ``counter_width`` is not 0, 16 or 32.
    """

    nack_latency = 4
    sack_latency = 3
    feedback_latency = 4
    hole_latency = 11
    hole_pause = 7
    # The register map (a harness may put one with other reset values here:
    # RegisterMap.with_resets).
    regs = RT_REGS

    def __init__(self, qps=64, outstanding=1024, tag_width=32, pending=16, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        if not (isinstance(qps, int) and 1 <= qps <= 1 << QP_INDEX_BITS):
            raise ValueError(f"qps must be 1 .. {1 << QP_INDEX_BITS}, not {qps!r}")
        if not (isinstance(outstanding, int) and 128 <= outstanding <= 16384
                and outstanding & (outstanding - 1) == 0):
            raise ValueError(f"outstanding must be a power of two 128 .. 16384, "
                             f"not {outstanding!r}")
        if not (isinstance(tag_width, int) and 1 <= tag_width <= 64):
            raise ValueError(f"tag_width must be 1 .. 64, not {tag_width!r}")
        if not (isinstance(pending, int) and 1 <= pending <= MAX_PENDING):
            raise ValueError(f"pending must be 1 .. {MAX_PENDING}, not {pending!r}")
        self.qps, self.outstanding, self.tag_width = qps, outstanding, tag_width
        self.pending = pending
        super().__init__({
            "sent": In(meta_stream(sent_layout(tag_width))),
            "ack": In(meta_stream(ACK_DESC)),
            "cwnd": In(meta_stream(CWND_IN)),
            "now": In(TIME_BITS),
            "credit_qp": In(QP_INDEX_BITS),
            "credit_ready": Out(1),
            "rtx": Out(meta_stream(rtx_layout(tag_width))),
            "feedback": Out(meta_stream(EV_FEEDBACK)),
            "release": Out(meta_stream(release_layout(tag_width))),
            "qp_error": Out(meta_stream(QP_ERROR)),
            "s_axil": In(AxiLiteSignature(RT_REGS.addr_width)),
        })

    def elaborate(self, platform):
        # One method per stage or engine, in the order they were written as one body: each
        # takes what the earlier ones made from ``v`` (a namespace) and leaves there what
        # the later ones use.
        m = Module()
        v = SimpleNamespace()
        self._setup(m, v)
        self._state(m, v)
        self._output_fifos(m, v)
        self._qp_open(m, v)
        self._sent_path(m, v)
        self._cwnd_input(m, v)
        self._credit_query(m, v)
        self._ack_stage_a(m, v)
        self._ack_stage_e(m, v)
        self._ack_stage_w(m, v)
        self._ack_stage_w_answer(m, v)
        self._hole_engine(m, v)
        self._timer_scan(m, v)
        self._timer_decide(m, v)
        self._timer_writes(m, v)
        self._pending_table(m, v)
        self._error_and_retries(m, v)
        self._open_sweep_writes(m, v)
        return m

    def _setup(self, m, v):
        """Parameters derived, the register block, the helpers the sections share."""
        qps, O, W = self.qps, self.outstanding, self.tag_width
        qb = max(1, ceil_log2(qps))
        ob = ceil_log2(O)
        ring_bits = ob + 1                   # the bitmap ring holds 2 x outstanding PSNs
        wq = ring_bits - 6                   # log2 of words per QP (>= 2)
        lap_bits = PSN - ring_bits
        WORDL = data.StructLayout({"lap": lap_bits, "epoch": EPOCH_BITS, "bits": WORD})
        RQ = data.StructLayout({"valid": 1, "time": TIME_BITS, "rtx": 1, "lap": PSN - ob,
                                "epoch": EPOCH_BITS})

        m.submodules.csr = csr = CsrBlock(self.regs)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        f = csr.fields
        guard = f["config"]["reorder_guard"]
        t_exp = f["config"]["timeout_exp"]
        r_lin = f["config"]["retry_linear"]
        pmtu_log2 = f["config"]["pmtu_log2"]
        r_max = f["config2"]["retry_max"]
        r_time = f["config2"]["reorder_time"]

        def qidx(qp):
            # The table index of a QP number; a number >= qps is refused wherever it is
            # used, so with qps a power of two its low bits serve (no comparator in front
            # of the tables' read addresses).
            if qps == 1 << ceil_log2(qps):
                return qp[:qb]
            return Mux(qp < qps, qp, 0)[:qb]

        def rec_addr(qp, psn):
            return Cat(psn[:ob], qp)

        def bank_addr(qp, wnum):
            return Cat(wnum[1:wq], qp)

        vars(v).update(
            O=O, RQ=RQ, W=W, WORDL=WORDL, bank_addr=bank_addr, f=f, guard=guard, ob=ob,
            pmtu_log2=pmtu_log2, qb=qb, qidx=qidx, qps=qps, r_lin=r_lin, r_max=r_max,
            r_time=r_time, rec_addr=rec_addr, t_exp=t_exp, wq=wq)

    def _state(self, m, v):
        """State: per-QP context, CACK and next PSN, the mark, the bitmap banks, the per-PSN
        record rings and the epoch."""
        (qps, WORDL, wq, O, W, RQ) = _take(v, """
            qps WORDL wq O W RQ""")
        # --- State -------------------------------------------------------------------------
        CTX = data.StructLayout({"cack": PSN, "hi": PSN, "mpr": 8})
        init_ctx = {"cack": (1 << PSN) - 1, "hi": (1 << PSN) - 1,
                    "mpr": self.regs["config2"].fields["initial_mpr"].reset}
        m.submodules.ctx = ctx = Memory(shape=CTX, depth=qps, init=[init_ctx] * qps)
        ctx_w = ctx.write_port()
        # The hole mark in a memory of its own: stage E reads it, stage W writes it, and the
        # hole engine writes it alone (TIME_RULE) without the rest of the context.
        m.submodules.mark = markm = Memory(shape=PSN, depth=qps, init=[0] * qps)
        mark_w = markm.write_port()
        mark_re = markm.read_port(domain="comb")
        ctx_re = ctx.read_port(domain="comb")     # SACK path, stage E (stage W writes)
        ctx_rs = ctx.read_port(domain="comb")     # sent path
        ctx_rt = ctx.read_port(domain="comb")     # timer scan
        ctx_rc = ctx.read_port(domain="comb")     # credit
        m.submodules.nxt = nxt = Memory(shape=PSN, depth=qps, init=[0] * qps)
        nxt_w = nxt.write_port()
        nxt_re, nxt_rs, nxt_rt, nxt_rc = (nxt.read_port(domain="comb") for _ in range(4))
        m.submodules.cwnd = cwnd = Memory(shape=32, depth=qps, init=[(1 << 32) - 1] * qps)
        cwnd_w = cwnd.write_port()
        cwnd_rc = cwnd.read_port(domain="comb")

        err = Signal(qps, name="qp_err")
        # The timer scan's retries exhausted set a QP's flag a cycle late, from registers
        # (qp_err_timer, its QP qp_err_timer_q); meanwhile every reader sees it (err_of).
        err_late = Signal(name="qp_err_timer")
        err_late_q = Signal(max(1, ceil_log2(qps)), name="qp_err_timer_q")

        def err_of(q):
            return err.bit_select(q, 1) | (err_late & (err_late_q == q))
        # Per QP in distributed RAM: the epoch (an open's count, kept through a reset: the
        # sweep after a reset must start a new epoch, since the block RAMs keep their
        # contents) and the retry count (zeroed by the sweep's opens). Each has one writer
        # a cycle: an open, stage W's CACK advance and the timer's timeout never coincide.
        m.submodules.epoch = epochm = Memory(shape=EPOCH_BITS, depth=qps, init=[0] * qps)
        epoch = SimpleNamespace(w=epochm.write_port(), ra=epochm.read_port(domain="comb"),
                                rs=epochm.read_port(domain="comb"),
                                rw=epochm.read_port(domain="comb"),
                                rj=epochm.read_port(domain="comb"))
        m.submodules.retries = retriesm = Memory(shape=5, depth=qps, init=[0] * qps)
        retries = SimpleNamespace(w=retriesm.write_port(), rs=retriesm.read_port(domain="comb"),
                                  rt=retriesm.read_port(domain="comb"))

        banks = []
        for b in range(2):
            mem = Memory(shape=WORDL, depth=qps << (wq - 1), init=[])
            m.submodules[f"bits{b}"] = mem
            wp = mem.write_port()
            # The SACK path's read port is transparent: a record of the QP whose words stage
            # W writes waits in stage E and reads them again on the edge they are written.
            banks.append((wp, mem.read_port(transparent_for=(wp,)),
                          mem.read_port(transparent_for=(wp,))))
        # The per-PSN rings in block RAM, each read's word out of a register two cycles
        # after its address (:class:`~mrcnic.base.bram.BlockRam`): no decision follows a
        # block RAM's slow output. Read port 0 of the record and tag rings is the SACK
        # path's (addressed as the record enters stage E, the words out as it enters stage
        # W), port 1 the hole engine's and the timer scan's. Both forward the two writes
        # after the address (the sent path's, from registers), so a word shows every write
        # up to the clock edge that starts the cycle after its address: as a read at that
        # edge, transparent to the write, would.
        rec = BlockRam(REC.size, qps * O, forward=(2, 2))
        tags = BlockRam(W, qps * O, forward=(2, 2))
        # The timeout marks, read by the scan's stage S0 and written by its stage S3:
        # nothing forwarded, as no write to the word read comes at the edge that takes its
        # address or the next (stage S3 fires a PSN at least one behind the one S0 reads,
        # and at most three: the scan issues a PSN a cycle, and one redirected empties
        # S1 and S2, so that S3 holds none in the two cycles after).
        rqm = BlockRam(RQ.size, qps * O, forward=(0,))
        m.submodules.rec, m.submodules.tags, m.submodules.rq = rec, tags, rqm

        def ring_write(ram, layout):
            return SimpleNamespace(addr=ram.w_addr, en=ram.w_en,
                                   data=layout(ram.w_data) if layout else ram.w_data)

        def ring_read(ram, i, layout):
            return SimpleNamespace(addr=ram.r_addr[i],
                                   data=layout(ram.r_data[i]) if layout else ram.r_data[i])
        rec_w, tag_w, rq_w = ring_write(rec, REC), ring_write(tags, None), ring_write(rqm, RQ)
        rec_ra, rec_rh = ring_read(rec, 0, REC), ring_read(rec, 1, REC)
        tag_ra, tag_rh = ring_read(tags, 0, None), ring_read(tags, 1, None)
        rq_r = ring_read(rqm, 0, RQ)

        vars(v).update(
            banks=banks, ctx=ctx, ctx_rc=ctx_rc, ctx_re=ctx_re, ctx_rs=ctx_rs, ctx_rt=ctx_rt,
            ctx_w=ctx_w, cwnd=cwnd, cwnd_rc=cwnd_rc, cwnd_w=cwnd_w, epoch=epoch, err=err,
            err_of=err_of, err_late=err_late, err_late_q=err_late_q,
            mark_re=mark_re, mark_w=mark_w, nxt_rc=nxt_rc, nxt_re=nxt_re, nxt_rs=nxt_rs,
            nxt_rt=nxt_rt, nxt_w=nxt_w, rec_ra=rec_ra, rec_rh=rec_rh, rec_w=rec_w, retries=retries,
            rq_r=rq_r, rq_w=rq_w, tag_ra=tag_ra, tag_rh=tag_rh, tag_w=tag_w)

    def _output_fifos(self, m, v):
        """The output FIFOs and the records written into them."""
        W = v.W
        # --- Output FIFOs ------------------------------------------------------------------
        # Each record but a release is decided into a register (``out_<name>_*``) and
        # written into its FIFO the cycle after: no decision of the tracker ends in a
        # FIFO's pointers, and no block RAM output goes through a multiplexer into a FIFO's
        # storage. A release is written straight from stage W (its decision is two gates
        # after registers, its tag a block RAM output with nothing after it). The FIFOs
        # read their storage directly (an unbuffered queue), so a record leaves as early
        # as from a buffered queue written without the register. ``fifos[name]`` is the
        # writer: ``w_en`` and ``w_data``, the decision; ``level``, the FIFO's level, at
        # most one less than what it will hold when the register is written (every room
        # check below counts one more).
        fifos = {}
        for name in ("rtx", "feedback", "release", "qp_error"):
            port = getattr(self, name)
            width = len(port.payload.as_value())
            fifo = SyncFIFO(width=width, depth=FIFO_DEPTH)
            m.submodules[f"{name}_fifo"] = fifo
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]
            wr = SimpleNamespace(w_en=Signal(name=f"out_{name}_we"),
                                 w_data=Signal(width, name=f"out_{name}_rec"), level=fifo.level)
            # ``keep``: whether the record decided now is written, a test that a block RAM
            # output reaches (a feedback record's trigger read in stage W's cycle), applied
            # from a register with the write; ``written``, the write itself.
            wr.keep, wr.written = Signal(name=f"out_{name}_keep"), Signal()
            if name == "release":
                m.d.comb += [fifo.w_en.eq(wr.w_en), fifo.w_data.eq(wr.w_data),
                             wr.written.eq(wr.w_en)]
            else:
                o_valid = Signal(name=f"out_{name}_valid")
                o_keep = Signal(name=f"out_{name}_keep_r")
                o_data = Signal(width, name=f"out_{name}_data")
                m.d.sync += [o_valid.eq(wr.w_en), o_keep.eq(wr.keep), o_data.eq(wr.w_data)]
                m.d.comb += [wr.written.eq(o_valid & o_keep),
                             fifo.w_en.eq(wr.written), fifo.w_data.eq(o_data)]
            if name != "feedback":
                m.d.comb += wr.keep.eq(1)
            fifos[name] = wr
        # Room for 1, 2 and 3 more records in every FIFO, registered: worked out from the
        # levels of the cycle before, one more each (a level grows by at most one a cycle).
        w_rdy, room2, room3 = (Signal(name="out_room1"), Signal(name="out_room2"),
                               Signal(name="out_room3"))
        m.d.sync += [
            w_rdy.eq(Cat(*(fi.level <= FIFO_DEPTH - 3 for fi in fifos.values())).all()),
            room2.eq(Cat(*(fi.level <= FIFO_DEPTH - 4 for fi in fifos.values())).all()),
            room3.eq(Cat(*(fi.level <= FIFO_DEPTH - 5 for fi in fifos.values())).all()),
        ]
        # Room for 5 more in the retransmit FIFO: the hole engine's request decided while
        # four are in its stages and the output register.
        fifos["rtx"].room5 = Signal(name="out_rtx_room5")
        m.d.sync += fifos["rtx"].room5.eq(fifos["rtx"].level <= FIFO_DEPTH - 7)
        rtx_rec = Signal(rtx_layout(W))
        fb_rec = Signal(EV_FEEDBACK)
        rel_rec = Signal(release_layout(W))
        err_rec = Signal(QP_ERROR)
        m.d.comb += [fifos["rtx"].w_data.eq(rtx_rec), fifos["feedback"].w_data.eq(fb_rec),
                     fifos["release"].w_data.eq(rel_rec),
                     fifos["qp_error"].w_data.eq(err_rec)]

        ev = Signal(data.StructLayout({n: 2 for n in COUNTER_NAMES}))

        vars(v).update(
            err_rec=err_rec, ev=ev, fb_rec=fb_rec, fifos=fifos, rel_rec=rel_rec, room2=room2,
            room3=room3, rtx_rec=rtx_rec, w_rdy=w_rdy)

    def _qp_open(self, m, v):
        """QP open commands, and the sweep that opens every QP after reset."""
        (qb, f, qps) = _take(v, """
            qb f qps""")
        # --- QP open, and the reset sweep --------------------------------------------------
        cmd_busy = Signal(init=1)
        sweep = Signal(init=1)
        cmd_qp = Signal(qb)
        cmd_start = Signal(PSN)
        hole_busy = Signal()
        h_q = Signal(qb, name="hole_q")
        e_valid = Signal(name="sack_e_valid")
        w_valid = Signal(name="sack_w_valid")
        w_go = Signal(name="sack_w_go")
        w_q = Signal(qb, name="sack_w_q")
        cmd_apply = cmd_busy & ~e_valid & ~w_valid & ~hole_busy
        sel_qp = f["qp_select"]["qp"]
        m.d.comb += f["error"]["bad_qp_set"].eq(f["qp_command"]["open"] & (sel_qp >= qps))
        with m.If(f["qp_command"]["open"] & (sel_qp < qps) & ~cmd_busy):
            m.d.sync += [cmd_busy.eq(1), cmd_qp.eq(sel_qp), cmd_start.eq(f["qp_start"]["psn"])]
        m.d.comb += f["status"]["busy"].eq(cmd_busy)

        vars(v).update(
            cmd_apply=cmd_apply, cmd_busy=cmd_busy, cmd_qp=cmd_qp, cmd_start=cmd_start,
            e_valid=e_valid, h_q=h_q, hole_busy=hole_busy, sweep=sweep, w_go=w_go, w_q=w_q,
            w_valid=w_valid)

    def _cwnd_input(self, m, v):
        """The cwnd input: a QP's congestion window, written into its table in packets of
        the PMTU (``cwnd`` >> ``pmtu_log2``: the credit tests compare the PSNs outstanding
        with it, no shift after the table's read)."""
        (cmd_busy, qps, cwnd_w, qidx, pmtu_log2) = _take(v, """
            cmd_busy qps cwnd_w qidx pmtu_log2""")
        # --- cwnd input -------------------------------------------------------------------
        m.d.comb += self.cwnd.ready.eq(~cmd_busy)
        take_c = self.cwnd.valid & self.cwnd.ready
        with m.If(take_c & (self.cwnd.payload.qp < qps)):
            m.d.comb += [cwnd_w.addr.eq(qidx(self.cwnd.payload.qp)), cwnd_w.en.eq(1),
                         cwnd_w.data.eq(self.cwnd.payload.cwnd >> pmtu_log2)]

        vars(v).update(
            take_c=take_c)

    def _credit_query(self, m, v):
        """The credit query: may ``credit_qp`` send its next PSN."""
        (qb, qidx, ctx_rc, nxt_rc, cwnd_rc, qps, err_of, cmd_busy, credit, credit_lt, s, qs,
         s1_valid, s1_qp_ok) = _take(v, """
            qb qidx ctx_rc nxt_rc cwnd_rc qps err_of cmd_busy credit credit_lt s qs s1_valid
            s1_qp_ok""")
        # --- Credit query -----------------------------------------------------------------
        qc = Signal(qb)
        m.d.comb += [qc.eq(qidx(self.credit_qp)), ctx_rc.addr.eq(qc), nxt_rc.addr.eq(qc),
                     cwnd_rc.addr.eq(qc)]
        # A new PSN of the QP waiting in the sent path's stage S1 counts as sent (whether
        # or not it will be accepted): the answer never lags the sent input.
        c_s1 = Signal(name="credit_s1")
        m.d.comb += c_s1.eq(s1_valid & s1_qp_ok & ~s.rtx & (qs == qc))
        # PSNs outstanding, d, plus the one in stage S1: each test of d + 1 against a bound
        # is d against the bound less one (the bounds' own decrements, from registers and
        # reads, beside the subtraction that makes d), picked by c_s1 at the end.
        c_out = Signal(PSN, name="credit_out")
        m.d.comb += c_out.eq(nxt_rc.data - ctx_rc.data.cack)
        mpr, cw = ctx_rc.data.mpr, cwnd_rc.data
        m.d.sync += self.credit_ready.eq(
            (self.credit_qp < qps) & ~err_of(qc) & ~cmd_busy &
            Mux(c_s1, credit_lt(c_out, mpr, cw), credit(c_out, mpr, cw)))


    def _error_and_retries(self, m, v):
        """Per-QP error flag and retry count."""
        (r_written, r_written2, cmd_apply, sack_ok, w, w_q, s1_q, t_timeout, head, s2_q, s3_q,
         qps, cmd_qp, err, retries, epoch, fatal, err_late, err_late_q, t_eval, expired,
         s3, w_valid, cmd_busy) = _take(v, """
            r_written r_written2 cmd_apply sack_ok w w_q s1_q t_timeout head s2_q s3_q qps
            cmd_qp err retries epoch fatal err_late err_late_q t_eval expired s3 w_valid
            cmd_busy""")
        # --- Per-QP error and retry count --------------------------------------------------
        # A retry count maybe written this cycle for the QP of stage S1 (or S2): its timeout
        # is worked out again. (Maybe: a timeout of the QP's oldest PSN that stage S3
        # evaluates, whether or not it fires, which the pending table and the outputs
        # decide later in the cycle.)
        t_head = t_eval & expired & head
        m.d.comb += [r_written.eq(cmd_apply | (sack_ok & w.adv & (w_q == s1_q)) |
                                  (t_head & (s3_q == s1_q))),
                     r_written2.eq(cmd_apply | (sack_ok & w.adv & (w_q == s2_q)) |
                                   (t_head & (s3_q == s2_q)))]
        for i in range(qps):
            with m.If(cmd_apply & (cmd_qp == i)):
                m.d.sync += err[i].eq(0)
            with m.Elif((fatal & (w_q == i)) | (err_late & (err_late_q == i))):
                m.d.sync += err[i].eq(1)
        m.d.comb += [epoch.rw.addr.eq(cmd_qp), epoch.w.addr.eq(cmd_qp),
                     epoch.w.data.eq(epoch.rw.data + 1), epoch.w.en.eq(cmd_apply)]
        # The retry count's one write a cycle: an open zeroes it, and so does a CACK
        # advance; a timeout of the QP's oldest PSN counts one (saturating at 31: the count
        # read in stage S2, and its increment, are registers, scan_s3_retries_*; a write of
        # the count in between makes S3 try the PSN again, without a timeout).
        # Its address and data are picked by which stage holds a record (registers), not by
        # the decisions: an open comes while stage W is empty, and the timer's timeout only
        # while W is empty too (busy_out).
        m.d.comb += [
            retries.w.addr.eq(Mux(w_valid, w_q, Mux(cmd_busy, cmd_qp, s3_q))),
            retries.w.data.eq(Mux(w_valid | cmd_busy, 0, s3.r_inc)),
            retries.w.en.eq(cmd_apply | (sack_ok & w.adv) | (t_timeout & head & ~s3.r_sat)),
        ]


    def _open_sweep_writes(self, m, v):
        """The writes of a QP open or the sweep (inputs held, stages E and W and the hole
        engine empty); the counters; the probe for formal checks."""
        (sweep, cmd_start, cmd_apply, ctx_w, cmd_qp, mark_w, f, nxt_w, cwnd_w, qps, cmd_busy, ev,
         fifos, rtx_rec, rel_rec) = _take(v, """
            sweep cmd_start cmd_apply ctx_w cmd_qp mark_w f nxt_w cwnd_w qps cmd_busy ev fifos
            rtx_rec rel_rec""")
        # --- Open / sweep writes (inputs held, stages E, W and the hole engine empty) ----
        start = Mux(sweep, 0, cmd_start)
        with m.If(cmd_apply):
            m.d.comb += [
                ctx_w.addr.eq(cmd_qp), ctx_w.en.eq(1),
                mark_w.addr.eq(cmd_qp), mark_w.en.eq(1), mark_w.data.eq(start),
                *assign(ctx_w.data, cack=start - 1, hi=start - 1,
                        mpr=f["config2"]["initial_mpr"]),
                nxt_w.addr.eq(cmd_qp), nxt_w.data.eq(start), nxt_w.en.eq(1),
                cwnd_w.addr.eq(cmd_qp), cwnd_w.data.eq((1 << 32) - 1), cwnd_w.en.eq(1),
            ]
            with m.If(sweep & (cmd_qp != qps - 1)):
                m.d.sync += cmd_qp.eq(cmd_qp + 1)
            with m.Else():
                m.d.sync += [cmd_busy.eq(0), sweep.eq(0)]

        event_counters(m, f, ev, COUNTER_NAMES, f["control"]["clear"], width=self.counter_width,
                       storage="ram")
        # For formal checks: what enters the output FIFOs this cycle.
        self.probe = {"rtx_we": fifos["rtx"].w_en, "rtx": rtx_rec,
                      "release_we": fifos["release"].w_en, "release": rel_rec,
                      "open": cmd_apply, "applied": v.w_go,
                      "sent_go": v.take_s, "sent": v.s, "scan_end": v.t_end}


