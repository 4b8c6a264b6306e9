"""Sender reliability (spec §4): :class:`RetransmitTracker` (``retransmit-tracker``).

The sender's half of MRC's reliability, in :class:`~mrcnic.tx.mrc_tx.MrcTx`: it records
every packet put on the wire, takes the peer's SACKs and NACKs, and decides what to
retransmit (SACK holes past a reorder guard, NACKs, timeouts), what to tell the path
selector about each EV, which descriptors the sender may free, and whether a QP may send
its next PSN (send credit).

Operation, decisions and measured figures: docs/blocks/retransmit-tracker.md.
"""


from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base import proto

from mrcnic.base.records import (
    ACK_DESC, QP_INDEX_BITS, CWND_IN, ErrorCause, QP_ERROR, RtxCause, EV_FEEDBACK,
    EV_INDEX_BITS, RESOURCE_NACKS, FeedbackKind, TIME_BITS, release_layout, rtx_layout,
    sent_layout)
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.gates import assign
from mrcnic.base.proto import NackCode, SackMode
from mrcnic.base.rules import (MAX_TIMEOUT_EXP, RETRANSMIT_COUNTER_NAMES, RETRANSMIT_COUNTERS,
                               RETRY_FOREVER, timeout_ticks)
from mrcnic.base.stream import meta_stream

__all__ = ["RetransmitTracker", "RT_REGS", "MAX_TIMEOUT_EXP", "RETRY_FOREVER", "timeout_ticks",
           "COUNTERS", "MAX_PENDING", "PENDING_RULE", "TIME_RULE"]

PSN = proto.PSN_BITS
HALF = 1 << (PSN - 1)
WORD = 64                   # PSNs per bitmap word; a SACK's 64 bits straddle two
BITMAP_BITS = 64
FIFO_DEPTH = 16
HOLE_GROUP = 16             # bits of the two words the hole engine searches a cycle
MAX_PENDING = 64            # entries of the pending-retransmission table, at most
EPOCH_BITS = 4              # opens of a QP told apart in its bitmap words and timer marks
CREDIT_RULE = "bytes in flight = (next PSN - CACK) x 2^pmtu_log2, at most cwnd"
HOLE_RULE = ("a hole is requested once, when a PSN reorder_guard or more after it is "
             "acknowledged; then only by its timeout")

TIME_RULE = ("with reorder_time > 0, a hole counts as lost only when it was sent at least "
             "reorder_time ticks before the PSN whose arrival triggered the SACK; the first "
             "hole that was not stays the QP's mark, so later SACKs judge it again")

PENDING_RULE = ("a hole, NACK or timeout request for a PSN whose retransmission is already "
                "requested and not yet resent is not made")






REC = data.StructLayout({"ev": EV_INDEX_BITS, "time": TIME_BITS, "rtx": 1})

COUNTERS = RETRANSMIT_COUNTERS
COUNTER_NAMES = RETRANSMIT_COUNTER_NAMES

RT_REGS = RegisterMap("retransmit_tracker", [
    Register("config", [
        Field("reorder_guard", 16, "rw", reset=3,
              desc="PSNs past a hole that must be acknowledged before it counts as lost"),
        Field("timeout_exp", 5, "rw", reset=7,
              desc="t: timeout = 1.024 us x 2^t (t <= 24)"),
        Field("retry_linear", 3, "rw", reset=7,
              desc="Retries at a constant interval before backoff doubles"),
        Field("pmtu_log2", 4, "rw", reset=12, offset=28,
              desc="log2 of the PMTU in bytes, for bytes in flight"),
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


def _clamp(diff):
    """A PSN distance (mod 2^24) as a position 0 .. 128 in a two-word window: 0 when
    negative."""
    diff = Value.cast(diff)[:PSN]
    return Mux(diff[-1], 0, Mux(diff > 2 * WORD, 2 * WORD, diff))


def _or_index(onehot):
    """Index of the one set bit of ``onehot``: bit b is the OR of the positions with bit b
    set (no priority logic: the input has at most one bit set)."""
    n = len(onehot)
    bits = max(1, ceil_log2(n))
    masks = [sum(1 << j for j in range(n) if j >> b & 1) for b in range(bits)]
    return Cat(*((onehot & mask) != 0 for mask in masks))


def lowest_set(m, vec, name):
    """``(found, index)`` of the lowest set bit of ``vec``: isolate it (x & -x), then encode."""
    n = len(vec)
    iso = Signal(n, name=f"{name}_iso")
    m.d.comb += iso.eq(vec & (~vec + 1)[:n])
    return vec.any(), _or_index(iso), iso


def highest_set(m, vec, name):
    """``(found, index)`` of the highest set bit of ``vec`` (a multiple of 8 bits long), in
    two levels: per byte whether any bit is set and the index of its highest, then the
    highest byte with a bit set, whose index is taken (an AND-OR: the bytes' one-hot)."""
    n = len(vec)
    B = 8
    assert n % B == 0
    nb = n // B
    octets = [vec[k * B:(k + 1) * B] for k in range(nb)]
    any_ = Signal(nb, name=f"{name}_bytes")
    m.d.comb += any_.eq(Cat(*(o.any() for o in octets)))

    def top(bits):
        """One-hot of the highest set bit of ``bits`` (all zero if none)."""
        return Cat(*(bits[j] & ~bits[j + 1:].any() if j + 1 < len(bits) else bits[j]
                     for j in range(len(bits))))
    top_byte = Signal(nb, name=f"{name}_top_byte")
    m.d.comb += top_byte.eq(top(any_))
    low = Const(0, 3)
    for k, o in enumerate(octets):
        low = low | Mux(top_byte[k], _or_index(top(o)), 0)
    return any_.any(), Cat(low, _or_index(top_byte))


def _after(x, y):
    """PSN ``x`` after ``y`` (mod 2^24, within half the space)."""
    d = (x - y)[:PSN]
    return (d != 0) & ~d[-1]


def _clamp_signed(x):
    """A signed distance (a few bits wider than 8) as a position 0 .. 128: 0 when
    negative."""
    x = Value.cast(x).as_signed()
    # The tests read the bits (the sign, any bit above 128's, 128's with a lower one): no
    # comparator after the adder that makes x.
    over = x[8:-1].any() | (x[7] & x[:7].any())
    return Mux(x[-1], 0, Mux(over, 2 * WORD, x[:8]))


def ge_mask(pos, n):
    """Bits j of an n-bit mask set where j >= pos (pos 0 .. n), as a two-level decode (the
    high and the low bits of pos compared apart) rather than a shifter."""
    pos = Value.cast(pos)
    w = max(1, (n - 1).bit_length())
    top = pos[w:].any() if len(pos) > w else Const(0)
    x = pos[:w]
    lb = min(4, w)
    lo, hi = x[:lb], x[lb:]
    le_lo = [lo <= k for k in range(1 << lb)]
    if len(hi):
        lt_hi = [hi < k for k in range((n - 1 >> lb) + 1)]
        eq_hi = [hi == k for k in range((n - 1 >> lb) + 1)]
        bits = [lt_hi[j >> lb] | (eq_hi[j >> lb] & le_lo[j & ((1 << lb) - 1)])
                for j in range(n)]
    else:
        bits = [le_lo[j] for j in range(n)]
    return Cat(*(~top & b for b in bits))


def dist_ge_mask(diff, n):
    """``ge_mask(_clamp(diff), n)`` from the PSN distance itself: all ones when it is
    negative, none when it is n or more, else the bits at or above it (no clamp in
    front of the decode)."""
    diff = Value.cast(diff)[:PSN]
    return Mux(diff[-1], Const((1 << n) - 1, n), ge_mask(diff[:-1], n))


def dist_lt_mask(diff, n):
    """``lt_mask(_clamp(diff), n)``."""
    return ~dist_ge_mask(diff, n)


def lt_mask(pos, n):
    """Bits j set where j < pos."""
    return ~ge_mask(pos, n)


def _eq_parts(a, b):
    """``a == b`` in parts: one bit per two bits of each (a 4-input function), for a
    register between the parts and their AND."""
    a, b = Value.cast(a), Value.cast(b)
    return Cat(*(a[i:i + 2] == b[i:i + 2] for i in range(0, len(a), 2)))


def _take(v, names):
    """The values ``v`` (a namespace) holds under ``names`` (space separated), in order."""
    return [getattr(v, name) for name in names.split()]


class RetransmitTracker(wiring.Component):
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
    (receive window CACK + MPR x 128, ``outstanding``, ``cwnd``: :data:`CREDIT_RULE`). After
    reset a sweep opens every QP at PSN 0 (``qps`` cycles, inputs held).

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
    in t + 4 (:attr:`feedback_latency`), its first hole request in t + 8, then one per
    cycle. A timeout is seen at most one timer
    pass after it expires; a pass takes the sum over QPs of (outstanding PSNs + 3) cycles,
    at most ``qps`` x (``outstanding`` + 3), plus the cycles it yields to the output FIFOs.

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
    skipped as pending, after one to find the first: k + 2 cycles for a SACK that opens
    k holes) or an output FIFO is full; a retransmission record waits while stage E
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
    holds a record of the same QP, or stage W held one as stage S1 read the bitmap. Each output record is chosen
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

        m.submodules.csr = csr = CsrBlock(RT_REGS)
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
                    "mpr": RT_REGS["config2"].fields["initial_mpr"].reset}
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
        # Per QP in distributed RAM: the epoch (an open's count, kept through a reset: the
        # sweep after a reset must start a new epoch, since the block RAMs keep their
        # contents) and the retry count (zeroed by the sweep's opens). Each has one writer
        # a cycle: an open, stage W's CACK advance and the timer's timeout never coincide.
        m.submodules.epoch = epochm = Memory(shape=EPOCH_BITS, depth=qps, init=[0] * qps)
        epoch = SimpleNamespace(w=epochm.write_port(), ra=epochm.read_port(domain="comb"),
                                rs=epochm.read_port(domain="comb"),
                                rw=epochm.read_port(domain="comb"))
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
        m.submodules.rec = rec = Memory(shape=REC, depth=qps * O, init=[])
        rec_w = rec.write_port()
        # The SACK path reads a record as it leaves stage E: a sent record taken in that
        # cycle comes after it, and its write (a cycle later, sent_ring_*) is not seen; one
        # taken the cycle before is written on this edge, and seen (transparent).
        rec_ra = rec.read_port(transparent_for=(rec_w,))     # SACK path
        rec_rh = rec.read_port(transparent_for=(rec_w,))     # hole engine / timer scan
        m.submodules.tags = tags = Memory(shape=unsigned(W), depth=qps * O, init=[])
        tag_w = tags.write_port()
        tag_ra = tags.read_port(transparent_for=(tag_w,))
        tag_rh = tags.read_port(transparent_for=(tag_w,))
        m.submodules.rq = rqm = Memory(shape=RQ, depth=qps * O, init=[])
        rq_w = rqm.write_port()
        rq_r = rqm.read_port(transparent_for=(rq_w,))

        vars(v).update(
            banks=banks, ctx=ctx, ctx_rc=ctx_rc, ctx_re=ctx_re, ctx_rs=ctx_rs, ctx_rt=ctx_rt,
            ctx_w=ctx_w, cwnd=cwnd, cwnd_rc=cwnd_rc, cwnd_w=cwnd_w, epoch=epoch, err=err,
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
            if name == "release":
                m.d.comb += [fifo.w_en.eq(wr.w_en), fifo.w_data.eq(wr.w_data)]
            else:
                o_valid = Signal(name=f"out_{name}_valid")
                o_data = Signal(width, name=f"out_{name}_data")
                m.d.sync += [o_valid.eq(wr.w_en), o_data.eq(wr.w_data)]
                m.d.comb += [fifo.w_en.eq(o_valid), fifo.w_data.eq(o_data)]
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
        for name, wr in fifos.items():
            wr.room2 = Signal(name=f"out_{name}_room2")
            wr.room3 = Signal(name=f"out_{name}_room3")
            m.d.sync += [wr.room2.eq(wr.level <= FIFO_DEPTH - 4),
                         wr.room3.eq(wr.level <= FIFO_DEPTH - 5)]
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

    def _sent_path(self, m, v):
        """The sent path, stage S1: each record judged against the stored CACK and stage
        W's (forwarded), recorded or refused."""
        (cmd_busy, e_valid, qb, qidx, ctx_rs, nxt_rs, err, O, pmtu_log2, cwnd, qps, rec_w,
         rec_addr, tag_w, nxt_w, ev, w_valid, w_go, w_q) = _take(v, """
            cmd_busy e_valid qb qidx ctx_rs nxt_rs err O pmtu_log2 cwnd qps rec_w rec_addr tag_w
            nxt_w ev w_valid w_go w_q""")
        e_go = Signal(name="sack_e_go")
        # Stage S1 (sent_s1_*): the input record in a register, with its QP's index, so that
        # the judgement starts from flip-flops; the record is judged (and counts as sent)
        # in the cycle it leaves the register (take_s). The ack input takes no record while
        # one waits here, so an ack record sees exactly the sent records taken before its
        # own cycle (and, in the same cycle, comes before the sent record taken with it).
        s = Signal.like(self.sent.payload, name="sent_s1_rec")
        s1_valid = Signal(name="sent_s1_valid")
        s1_qp_ok = Signal(name="sent_s1_qp_ok")
        s_cond = Signal(name="sent_s1_go_ok")       # the record may be judged this cycle
        take_s = Signal(name="sent_s1_go")
        m.d.comb += [take_s.eq(s1_valid & s_cond),
                     self.sent.ready.eq(~s1_valid | s_cond)]
        qs = Signal(qb, name="sent_s1_q")
        with m.If(self.sent.valid & self.sent.ready):
            m.d.sync += [s.eq(self.sent.payload), qs.eq(qidx(self.sent.payload.qp)),
                         s1_qp_ok.eq(self.sent.payload.qp < qps)]
        with m.If(self.sent.valid & self.sent.ready):
            m.d.sync += s1_valid.eq(1)
        with m.Elif(take_s):
            m.d.sync += s1_valid.eq(0)
        # While stage E holds a record, the sent records of its QP wait (stage E decides
        # from the QP's next PSN, and a sent record judged after it must see its CACK,
        # which only stage W's registers forward).
        # A retransmission taken frees a slot of the shared pending table, which stage W
        # looks up: while stage E holds a record or stage W one it does not apply in this
        # cycle, every retransmission waits. While a SACK is in stage E or W or the hole
        # engine reads the records of its holes, a retransmission on that QP waits, so
        # that a hole request carries the EV of the transmission the SACK saw lost.
        h_busy_qp = Signal()
        m.d.comb += [ctx_rs.addr.eq(qs), nxt_rs.addr.eq(qs)]
        e_q = Signal(qb, name="sack_e_q")
        m.d.comb += s_cond.eq(
            ~cmd_busy & ~(e_valid & ((qs == e_q) | s.rtx)) &
            ~(w_valid & ~w_go & s.rtx) & ~(h_busy_qp & s.rtx))
        # Stage W writes CACK and error at the end of the cycle it goes: both forwarded from
        # its registers, so a sent record sees every ack record taken before the cycle it
        # is judged in.
        w_fwd_we, w_fwd_cack, w_fwd_fatal = (Signal(name="sack_w_fwd_we"),
                                             Signal(PSN, name="sack_w_fwd_cack"),
                                             Signal(name="sack_w_fwd_fatal"))
        # Stage W advances CACK only to its SACK's CACK, so the sent record is judged
        # against both CACKs at once (sent_s1_*_w: stage W's, *_c: the stored one) and the
        # forwarding picks one at the end: a multiplexer after the comparisons instead of
        # a stage in front of them.
        s_fwd_w = Signal(name="sent_s1_fwd_w")
        m.d.comb += s_fwd_w.eq(w_fwd_we & (w_q == qs))
        s_err = err.bit_select(qs, 1) | (w_fwd_fatal & (w_q == qs))
        s_n = nxt_rs.data

        def credit(n_out, mpr, cw):
            # n_out x 2^pmtu_log2 <= cw, as n_out <= floor(cw / 2^pmtu_log2): the shift
            # works on cw, beside the subtraction that makes n_out, not after it.
            return ((n_out <= (mpr << 7)) & (n_out <= O) &
                    (n_out <= (cw >> pmtu_log2)))

        cwnd_rs = cwnd.read_port(domain="comb")
        m.d.comb += cwnd_rs.addr.eq(qs)

        def judge(cack, tag):
            out = Signal(PSN, name=f"sent_s1_out_{tag}")     # PSNs outstanding once n is sent
            dp = Signal(PSN, name=f"sent_s1_dp_{tag}")
            m.d.comb += [out.eq(s_n - cack), dp.eq(s.psn - cack)]
            return (out > O, (dp != 0) & (dp < out), (dp == 0) | dp[-1],
                    credit(out, ctx_rs.data.mpr, cwnd_rs.data))

        j_w, j_c = judge(w_fwd_cack, "w"), judge(ctx_rs.data.cack, "c")
        over, in_win, behind, s_credit = (Mux(s_fwd_w, b, c) for b, c in zip(j_w, j_c))
        s_ok = take_s & s1_qp_ok & ~s_err
        s_new = s_ok & ~s.rtx & (s.psn == s_n)
        s_full = s_new & over
        s_new_ok = s_new & ~s_full
        s_rtx_ok = s_ok & s.rtx & in_win
        s_rtx_acked = s_ok & s.rtx & behind
        # The record and tag rings are written a cycle after the decision, from registers
        # (sent_ring_*), so that the decision ends at flip-flops and not at the block
        # RAMs' write enables. Their readers see the write in flight: the SACK path's and
        # the hole engine's read ports are transparent to it, and the timer scan takes a
        # PSN whose write is in flight as stale (scan_s3_stale).
        ring_we = Signal(name="sent_ring_we")
        ring_tag_we = Signal(name="sent_ring_tag_we")
        ring_addr = Signal.like(rec_w.addr, name="sent_ring_addr")
        ring_rec = Signal(REC, name="sent_ring_rec")
        ring_tag = Signal.like(tag_w.data, name="sent_ring_tag")
        m.d.sync += [ring_we.eq(s_new_ok | s_rtx_ok), ring_tag_we.eq(s_new_ok),
                     ring_addr.eq(rec_addr(qs, s.psn)),
                     *assign(ring_rec, ev=s.ev, time=s.time, rtx=s.rtx), ring_tag.eq(s.tag)]
        m.d.comb += [rec_w.addr.eq(ring_addr), rec_w.en.eq(ring_we), rec_w.data.eq(ring_rec),
                     tag_w.addr.eq(ring_addr), tag_w.en.eq(ring_tag_we),
                     tag_w.data.eq(ring_tag)]
        # The next PSN's address and value do not wait for the decision (an open, while
        # no record is judged, overrides them below): only the write enable does.
        m.d.comb += [nxt_w.addr.eq(qs), nxt_w.data.eq(s.psn + 1), nxt_w.en.eq(s_new_ok)]
        m.d.comb += [
            ev.sent_new.eq(s_new_ok),
            ev.sent_rtx.eq(s_rtx_ok),
            ev.sent_acked.eq(s_rtx_acked),
            ev.sent_ring_full.eq(s_full),
            ev.sent_over_credit.eq(s_new_ok & ~s_credit),
            ev.sent_bad.eq(s_ok & ~s_new & ~s_rtx_ok & ~s_rtx_acked),
        ]

        vars(v).update(
            credit=credit, e_go=e_go, e_q=e_q, h_busy_qp=h_busy_qp, qs=qs, s=s, s_err=s_err,
            s_rtx_ok=s_rtx_ok, take_s=take_s, ring_we=ring_we, ring_addr=ring_addr,
            s1_valid=s1_valid, s1_qp_ok=s1_qp_ok, s_cond=s_cond, w_fwd_cack=w_fwd_cack,
            w_fwd_fatal=w_fwd_fatal,
            w_fwd_we=w_fwd_we)

    def _cwnd_input(self, m, v):
        """The cwnd input: a QP's congestion window, written into its table."""
        (cmd_busy, qps, cwnd_w, qidx) = _take(v, """
            cmd_busy qps cwnd_w qidx""")
        # --- cwnd input -------------------------------------------------------------------
        m.d.comb += self.cwnd.ready.eq(~cmd_busy)
        take_c = self.cwnd.valid & self.cwnd.ready
        with m.If(take_c & (self.cwnd.payload.qp < qps)):
            m.d.comb += [cwnd_w.addr.eq(qidx(self.cwnd.payload.qp)), cwnd_w.en.eq(1),
                         cwnd_w.data.eq(self.cwnd.payload.cwnd)]

        vars(v).update(
            take_c=take_c)

    def _credit_query(self, m, v):
        """The credit query: may ``credit_qp`` send its next PSN."""
        (qb, qidx, ctx_rc, nxt_rc, cwnd_rc, qps, err, cmd_busy, credit, s, qs, s1_valid,
         s1_qp_ok) = _take(v, """
            qb qidx ctx_rc nxt_rc cwnd_rc qps err cmd_busy credit s qs s1_valid s1_qp_ok""")
        # --- Credit query -----------------------------------------------------------------
        qc = Signal(qb)
        m.d.comb += [qc.eq(qidx(self.credit_qp)), ctx_rc.addr.eq(qc), nxt_rc.addr.eq(qc),
                     cwnd_rc.addr.eq(qc)]
        # A new PSN of the QP waiting in the sent path's stage S1 counts as sent (whether
        # or not it will be accepted): the answer never lags the sent input.
        c_s1 = Signal(name="credit_s1")
        m.d.comb += c_s1.eq(s1_valid & s1_qp_ok & ~s.rtx & (qs == qc))
        c_out = Signal(PSN)
        m.d.comb += c_out.eq(nxt_rc.data - ctx_rc.data.cack + c_s1)
        m.d.sync += self.credit_ready.eq(
            (self.credit_qp < qps) & ~err.bit_select(qc, 1) & ~cmd_busy &
            credit(c_out, ctx_rc.data.mpr, cwnd_rc.data))


    def _ack_stage_a(self, m, v):
        """SACK/NACK path, stage A: the bitmap words read, and what needs no per-QP state
        worked out from the record alone."""
        (cmd_busy, hole_busy, e_valid, e_go, room2, qb, qidx, banks, bank_addr,
         guard, epoch, e_q, qps, s1_valid, s_cond) = _take(v, """
            cmd_busy hole_busy e_valid e_go room2 qb qidx banks bank_addr guard epoch e_q
            qps s1_valid s_cond""")
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
        w0 = a_base[6:]
        w1 = (w0 + 1)[:PSN - 6]
        e_base = Signal(PSN, name="sack_e_base")
        even = Mux(w0[0], w1, w0)
        odd = Mux(w0[0], w0, w1)
        # A record held in stage E reads its words again every cycle (sack_e_reread): the
        # read port is transparent, so it sees what stage W writes on the same edge.
        e_reread = Signal(name="sack_e_reread")
        e_w0 = e_base[6:]
        e_w1 = Signal(PSN - 6, name="sack_e_w1")
        e_even = Mux(e_w0[0], e_w1, e_w0)
        e_odd = Mux(e_w0[0], e_w0, e_w1)
        m.d.comb += [
            e_reread.eq(e_valid & ~e_go),
            banks[0][1].addr.eq(Mux(e_reread, bank_addr(e_q, e_even), bank_addr(qa, even))),
            banks[1][1].addr.eq(Mux(e_reread, bank_addr(e_q, e_odd), bank_addr(qa, odd))),
            banks[0][1].en.eq(take_a | e_reread), banks[1][1].en.eq(take_a | e_reread),
        ]
        # What does not depend on per-QP state is worked out here, from the input record,
        # so that stage E starts from registers: where CACK + 1 falls in the two words
        # (sack_e_lo), the highest PSN the SACK acknowledges (sack_a_hcand), and where the
        # SACK's own evidence (CACK and that PSN) puts the end of the hole search
        # (sack_e_ehx).
        a_found, a_hidx = highest_set(m, a.bitmap, "sack_a_hi")
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
        # base[6:] and base[6:] + 1, the first PSN's word number and the next, side by side.
        hi0, hi1 = Signal(PSN - 6, name="sack_a_word0"), Signal(PSN - 6, name="sack_a_word1")
        m.d.comb += [hi0.eq(a.cack[6:] + (off >> 6) + c6),
                     hi1.eq(a.cack[6:] + (off >> 6) + c6 + 1)]
        # The highest bit is after CACK when its index exceeds -sack_offset, worked out
        # beside the search and saturated to 7 bits.
        neg_off = Signal(signed(18), name="sack_a_neg_off")
        neg_off7 = Signal(7, name="sack_a_neg_off7")
        m.d.comb += [neg_off.eq(-off),
                     neg_off7.eq(Mux(neg_off < 0, 0, Mux(neg_off > WORD, WORD, neg_off[:7])))]
        a_after = Signal(name="sack_a_after")
        m.d.comb += a_after.eq(a_found & (a_hidx > neg_off7))
        # The highest PSN acknowledged, p0 + base[:6] + its bit (below 128: one carry into
        # the word number, which picks base[6:] or base[6:] + 1).
        s7 = Signal(7, name="sack_a_bit_pos")
        m.d.comb += s7.eq(b6 + a_hidx)
        # Where the end of the search falls, (the PSN hi) - (p0 + guard - 1), clamped:
        # from the SACK's highest bit, or from its CACK, the two worked out side by side.
        # (base[:6] - (guard - 1) beside the search for the highest bit, which it then meets
        # in one adder.)
        off_g, off_m1 = Signal(signed(18), name="sack_a_off_g"), Signal(signed(18), name="sack_a_off_m1")
        b6_g = Signal(signed(18), name="sack_a_base6_g")
        m.d.comb += [off_g.eq(off + gm1), off_m1.eq(off - 1), b6_g.eq(b6 - gm1)]
        # Stage E adds the highest bit's index to base[:6] - (guard - 1), saturated here to
        # -64 .. 129 (the clamp to 0 .. 128 after adding 0 .. 63 is the same).
        b6_g_sat = Signal(signed(9), name="sack_a_base6_g_sat")
        m.d.comb += b6_g_sat.eq(Mux(b6_g < -WORD, -WORD, Mux(b6_g > 2 * WORD + 1, 2 * WORD + 1,
                                                              b6_g[:9])))
        end_cack = Signal(8, name="sack_a_end_cack")
        m.d.comb += end_cack.eq(_clamp_signed(b6 - off_g))
        a_hcand = Signal(PSN, name="sack_a_hcand")
        a_lo = Signal(8, name="sack_a_lo")
        a_hx = Signal(PSN, name="sack_a_hx")
        a_pg = Signal(PSN, name="sack_a_pg")
        m.d.comb += [
            a_hcand.eq(Cat(s7[:6], Mux(s7[6], hi1, hi0))),
            a_lo.eq(_clamp_signed(b6 - off_m1)),
            a_hx.eq(Mux(a_after, a_hcand, a.cack)),
            # p0 + guard - 1, p0 = base less its low 6 bits.
            a_pg.eq(Cat(gm1[:6], (a.cack[6:] + (off >> 6) + c6 + (gm1 >> 6))[:PSN - 6])),
        ]
        e = Signal(ACK_DESC)
        e_trig1 = Signal(PSN, name="sack_e_trig1")
        e_found, e_hcand = Signal(name="sack_e_found"), Signal(PSN, name="sack_e_hcand")
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
        e_hx = Signal(PSN, name="sack_e_hx")
        e_qp_ok = Signal(name="sack_e_qp_ok")
        # The low PSN bits of the two ring reads stage W needs (the trigger's or the
        # NACK's record, CACK's tag), made when the record leaves stage E.
        e_rec_lo = Signal(PSN, name="sack_e_rec_psn")
        e_tag_lo = Signal(PSN, name="sack_e_tag_psn")
        with m.If(take_a):
            m.d.sync += [e.eq(a), e_base.eq(a_base), e_trig1.eq(a_trig + 1),
                         e_w1.eq(w1),
                         e_found.eq(a_found), e_hcand.eq(a_hcand),
                         e_pg.eq(a_pg), e_lo.eq(a_lo),
                         e_hidx.eq(a_hidx), e_b6g.eq(b6_g_sat), e_end_cack.eq(end_cack),
                         e_after.eq(a_after),
                         e_hx.eq(a_hx),
                         e_rec_lo.eq(Mux(a.nack, a.psn, a_trig)),
                         e_tag_lo.eq(Mux(a.nack, a.psn, a.cack)),
                         e_epoch.eq(epoch.ra.data), e_q.eq(qa), e_qp_ok.eq(a.qp < qps)]
        with m.If(take_a):
            m.d.sync += e_valid.eq(1)
        with m.Elif(e_go):
            m.d.sync += e_valid.eq(0)

        vars(v).update(
            e=e, e_base=e_base, e_ehx=e_ehx, e_epoch=e_epoch, e_found=e_found, e_hcand=e_hcand,
            e_hx=e_hx, e_lo=e_lo, e_pg=e_pg, e_qp_ok=e_qp_ok, e_rec_lo=e_rec_lo,
            e_tag_lo=e_tag_lo, e_trig1=e_trig1, e_w1=e_w1)

    def _ack_stage_e(self, m, v):
        """SACK/NACK path, stage E: the record against its QP's context, bitmap words, hole
        mark and next PSN (read here, written only by stage W), every check, and the
        bounds of the hole search, registered for stage W."""
        (e_go, e_valid, hole_busy, h_q, cmd_busy, ctx_re, e_q, nxt_re, mark_re, e_qp_ok, err,
         e_base, banks, WORDL, wq, e_epoch, e, e_hcand, e_found, e_pg, e_ehx, e_trig1, O,
         e_lo, e_hx, e_w1, w_valid, w_go, w_q, rec_ra, tag_ra, rec_addr, e_rec_lo,
         e_tag_lo) = _take(v, """
            e_go e_valid hole_busy h_q cmd_busy ctx_re e_q nxt_re mark_re e_qp_ok err e_base
            banks WORDL wq e_epoch e e_hcand e_found e_pg e_ehx e_trig1 O e_lo e_hx e_w1
            w_valid w_go w_q rec_ra tag_ra rec_addr e_rec_lo e_tag_lo""")
        # A record goes on to stage W when W is free or emptied on this edge, and neither
        # stage W nor the hole engine holds its QP: they may write its context, words or
        # mark on this edge, after which stage E reads them again (one cycle later).
        m.d.comb += [
            e_go.eq(e_valid & ~cmd_busy & (~w_valid | w_go) & ~(w_valid & (w_q == e_q)) &
                    ~(hole_busy & (h_q == e_q))),
            ctx_re.addr.eq(e_q), nxt_re.addr.eq(e_q), mark_re.addr.eq(e_q),
            rec_ra.addr.eq(rec_addr(e_q, e_rec_lo)), rec_ra.en.eq(e_go),
            tag_ra.addr.eq(rec_addr(e_q, e_tag_lo)), tag_ra.en.eq(e_go)]
        c = ctx_re.data
        n = nxt_re.data
        in_err = err.bit_select(e_q, 1)
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
        # The SACK's bitmap aligned to the two words, the bits at or before CACK dropped.
        e_vn = Signal(2 * WORD, name="sack_e_vn")
        m.d.comb += e_vn.eq((Cat(e.bitmap, Const(0, WORD)) << e_base[:6]) &
                            ge_mask(e_lo, 2 * WORD))
        # Whether the SACK sets a bit not yet set, per word (each word's test read apart
        # from its lap check, which picks one of them in stage W).
        fresh = Signal(4, name="sack_e_fresh")
        m.d.comb += fresh.eq(Cat((e_vn[:WORD] & ~d0.bits).any(), e_vn[:WORD].any(),
                                 (e_vn[WORD:] & ~d1.bits).any(), e_vn[WORD:].any()))
        # Highest acknowledged PSN: the larger of the stored one and the SACK's own (CACK
        # or its highest bit, stage A).
        h2 = Signal(PSN)
        m.d.comb += h2.eq(Mux(_after(e_hx, c.hi), e_hx, c.hi))
        # Holes: after CACK (lo), not before mark (mk), before n (hl), hi - psn >= guard
        # (before ehx or ehi: the end that the SACK's evidence or the stored hi gives), not
        # acknowledged: the search from max(lo, mk) to before min(max(ehx, ehi), hl).
        mk, hl, ehi = (Signal(8, name="sack_e_mk"), Signal(8, name="sack_e_hl"),
                       Signal(8, name="sack_e_ehi"))
        m.d.comb += [mk.eq(_clamp(mark_re.data - p0)), hl.eq(_clamp(n - p0)),
                     ehi.eq(_clamp(c.hi - e_pg))]
        end_raw = Signal(8, name="sack_e_end_raw")
        m.d.comb += end_raw.eq(Mux(e_ehx > ehi, e_ehx, ehi))
        s_pos = Signal(8, name="sack_e_start")
        m.d.comb += s_pos.eq(Mux(e_lo > mk, e_lo, mk))
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
            fresh=Signal(4, name="sack_w_fresh"), kind=Signal(4, name="sack_w_kind"),
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
        # Forwarded to the sent path: a sent record judged while stage W holds this record
        # comes after it (sent_s1_*_w).
        w_fwd_we, w_fwd_cack, w_fwd_fatal = _take(v, "w_fwd_we w_fwd_cack w_fwd_fatal")
        m.d.comb += [w_fwd_we.eq(w_valid & w.ok_u & w.adv), w_fwd_cack.eq(w.cack),
                     w_fwd_fatal.eq(w_valid & w.fatal_u)]
        vars(v).update(w=w)

    def _ack_stage_w(self, m, v):
        """SACK/NACK path, stage W: the record applied (context, bitmap words, hole mark)
        and its holes found, from what stage E decided."""
        (w, w_valid, w_go, w_q, hole_busy, cmd_busy, w_rdy, banks, bank_addr, wq, ctx_w,
         mark_w) = _take(v, """
            w w_valid w_go w_q hole_busy cmd_busy w_rdy banks bank_addr wq ctx_w mark_w""")
        m.d.comb += w_go.eq(w_valid & ~hole_busy & ~cmd_busy & w_rdy)
        live = w_go & w.qp_ok & ~w.in_err
        sack_ok = Signal(name="sack_w_ok")
        m.d.comb += sack_ok.eq(w.ok_u & w_go)
        # The SACK's bits are new in a word if it sets one not set there (or the word was
        # of another lap or epoch, and it sets any).
        changed = w.adv | Mux(w.ok0, w.fresh[0], w.fresh[1]) | Mux(w.ok1, w.fresh[2],
                                                                    w.fresh[3])
        after = w.after                     # the two words with the SACK's bits set
        new_cack = Signal(PSN)
        m.d.comb += new_cack.eq(Mux(w.adv, w.cack, w.old_cack))
        ww0 = w.base[6:]
        with m.If(sack_ok):
            m.d.comb += [ctx_w.addr.eq(w_q), ctx_w.en.eq(1),
                         *assign(ctx_w.data, cack=new_cack, hi=w.h2, mpr=w.mpr)]
            for b in range(2):
                wp = banks[b][0]
                mine = ww0[0] == b
                m.d.comb += [
                    wp.addr.eq(bank_addr(w_q, Mux(mine, ww0, w.w1))), wp.en.eq(1),
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
        k_end = Signal(8, name="sack_w_end")
        m.d.comb += k_end.eq(Mux(w.end_raw < w.hl, w.end_raw, w.hl))
        with m.If(sack_ok & (k_end > w.start)):
            m.d.comb += [mark_w.addr.eq(w_q), mark_w.en.eq(1),
                         mark_w.data.eq(Cat(Const(0, 6), ww0) + k_end)]
        vars(v).update(changed=changed, holes=holes, live=live, p0=Cat(Const(0, 6), ww0),
                       sack_ok=sack_ok)

    def _ack_stage_w_answer(self, m, v):
        """Stage W, continued: the records it answers (release, feedback, a NACK's
        retransmit request, an error) and the events it counts."""
        (w, w_valid, w_go, w_q, live, sack_ok, changed, rtx_rec, tag_ra, rec_ra, fb_rec,
         rel_rec, err_rec, fifos, ev) = _take(v, """
            w w_valid w_go w_q live sack_ok changed rtx_rec tag_ra rec_ra fb_rec rel_rec
            err_rec fifos ev""")
        is_sack = live & ~w.nack
        is_nack = live & w.nack
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
                *assign(rtx_rec, qp=w_q, psn=w.base, tag=tag_ra.data, ev=rec_ra.data.ev,
                        cause=RtxCause.NACK),
                *assign(fb_rec, qp=w_q, ev=rec_ra.data.ev, kind=w.kind, entropy=w.entropy),
                *assign(err_rec, qp=w_q, cause=ErrorCause.NACK_FATAL),
            ]
        m.d.comb += assign(rel_rec, qp=w_q, first=w.old_cack + 1, last=w.cack,
                           tag=tag_ra.data)
        m.d.comb += fifos["release"].w_en.eq(w_release)
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
                       p_hit=p_hit)

    def _hole_engine(self, m, v):
        """The hole engine: the holes one SACK found, requested oldest first, one a cycle.

        The search over the two words is split by groups of :data:`HOLE_GROUP` bits: when
        stage W goes, the engine keeps the holes (``hole_vec``) and which groups have one
        (``hole_rest``); one cycle later the lowest such group is its current group
        (``hole_cur``), whose lowest bit is requested each cycle. The cycle the current
        group's last bit is requested, the next group is taken from ``hole_rest`` (a
        priority over 8 bits and a word select, into registers), so groups follow each
        other with no idle cycle, and the request's address is a 16-bit search after
        registers."""
        (h_q, hole_busy, h_busy_qp, qs, s1_qp_ok, e_valid, e_q, fifos, w, w_valid, w_go, w_q,
         sack_ok,
         holes, p0, rec_ra, rtx_rec, tag_rh, rec_rh, r_time, p_hit, mark_w, ev) = _take(v, """
            h_q hole_busy h_busy_qp qs s1_qp_ok e_valid e_q fifos w w_valid w_go w_q sack_ok holes p0
            rec_ra rtx_rec tag_rh rec_rh r_time p_hit mark_w ev""")
        G = HOLE_GROUP
        NG = 2 * WORD // G
        h_vec = Signal(2 * WORD, name="hole_vec")
        h_rest = Signal(NG, name="hole_rest")      # groups with a hole, not yet current
        h_cur = Signal(G, name="hole_cur")         # the current group's holes left
        h_cur_g = Signal(range(NG), name="hole_cur_g")
        h_cur_v = Signal(name="hole_cur_valid")
        h_p0 = Signal(PSN, name="hole_p0")
        h_emit = Signal()                      # a request whose records are being read
        h_psn = Signal(PSN)
        # Whether the engine has a hole left to request, as a register of its own: the SACK
        # input, stages E and W and the sent input wait on it.
        h_nz = Signal(name="hole_nz")
        # Stage J (hole_j_*): the hole's records, read in the h_emit cycle, registered with
        # the time guard's verdict on them; the request, its pending lookup and the mark
        # write are decided from these registers the cycle after.
        j_valid = Signal(name="hole_j_valid")
        mk_we = Signal(name="hole_mark_we")     # the mark written back (stage J, below)
        m.d.comb += [hole_busy.eq(h_nz | h_emit | j_valid | mk_we),
                     h_busy_qp.eq(s1_qp_ok & ((hole_busy & (qs == h_q)) |
                                              (e_valid & (qs == e_q)) | (w_valid & (qs == w_q))))]
        h_issue = h_cur_v & fifos["rtx"].room3
        _, c_idx, c_iso = lowest_set(m, h_cur, "hole_cur")
        # The current group's last hole: no other bit set.
        c_last = Signal(name="hole_cur_last")
        m.d.comb += c_last.eq(~(h_cur & ~c_iso).any())
        # The hole's PSN, p0 + 16 x group + bit: p0 is 64-aligned, so its low 6 bits are
        # the group's low 2 bits and the bit's index, and above them p0's word number plus
        # the group's high bit (the request's block RAM address takes none of that carry at
        # outstanding = 128, a few bits of it above).
        h_next_psn = Signal(PSN)
        m.d.comb += h_next_psn.eq(Cat(c_idx, h_cur_g[:2], h_p0[6:] + h_cur_g[2]))
        # The next group: the lowest of those left, taken when the current one empties.
        _, r_idx, r_iso = lowest_set(m, h_rest, "hole_rest")
        refill = ~h_cur_v | (h_issue & c_last)
        # For the time guard (TIME_RULE): the trigger PSN's send time, to write the mark
        # back at the first hole too young to count as lost.
        h_ttime = Signal(TIME_BITS)
        h_tok = Signal()
        h_young_seen = Signal()
        with m.If(w_go):
            # Loaded whenever stage W goes (the engine is idle then): no enable behind the
            # hole search, which ends the longest path of stage W.
            m.d.sync += [h_vec.eq(holes), h_q.eq(w_q),
                         h_rest.eq(Mux(sack_ok, Cat(*(holes[g * G:(g + 1) * G].any()
                                                      for g in range(NG))), 0)),
                         h_cur_v.eq(0),
                         h_p0.eq(p0), h_ttime.eq(rec_ra.data.time), h_tok.eq(w.trig_ok),
                         h_young_seen.eq(0)]
            m.d.sync += h_nz.eq(sack_ok & holes.any())
        with m.Elif(refill):
            m.d.sync += [h_cur.eq(h_vec.word_select(r_idx, G)), h_cur_g.eq(r_idx),
                         h_cur_v.eq(h_rest.any()), h_rest.eq(h_rest & ~r_iso),
                         h_nz.eq(h_rest.any())]
        with m.Elif(h_issue):
            m.d.sync += h_cur.eq(h_cur & ~c_iso)
        m.d.sync += [h_emit.eq(h_issue), h_psn.eq(h_next_psn)]
        # Stage J registers the hole's records as the block RAMs give them, and judges
        # them against the time guard from those registers: the hole is young when its age
        # (the trigger's send time less its own, signed) is below reorder_time, that is
        # negative, or below 2^16 with its low half below reorder_time (two carry chains
        # side by side, not one after the other).
        j_psn = Signal(PSN, name="hole_j_psn")
        j_ev = Signal.like(rec_rh.data.ev, name="hole_j_ev")
        j_tag = Signal.like(tag_rh.data, name="hole_j_tag")
        j_time = Signal(TIME_BITS, name="hole_j_time")
        m.d.sync += [j_valid.eq(h_emit), j_psn.eq(h_psn), j_ev.eq(rec_rh.data.ev),
                     j_tag.eq(tag_rh.data), j_time.eq(rec_rh.data.time)]
        h_age = Signal(TIME_BITS, name="hole_j_age")
        m.d.comb += h_age.eq(h_ttime - j_time)
        rt_bits = len(r_time)
        h_young = Signal(name="hole_j_young")
        m.d.comb += h_young.eq((r_time != 0) & (~h_tok | h_age[-1] |
                                                (~h_age[rt_bits:].any() &
                                                 (h_age[:rt_bits] < r_time))))
        with m.If(j_valid):
            m.d.comb += assign(rtx_rec, qp=h_q, psn=j_psn, tag=j_tag, ev=j_ev,
                               cause=RtxCause.HOLE)
        h_old = j_valid & ~h_young             # a hole that counts as lost
        h_rtx = h_old & ~p_hit
        # The mark moves back to the first young hole the cycle after stage J (from
        # registers, hole_mark_*); the engine counts as busy until then. Stage W is idle
        # while the engine runs (w_go needs ~hole_busy), so the mark's write port is free.
        mk_psn = Signal(PSN, name="hole_mark_psn")
        m.d.sync += [mk_we.eq(j_valid & h_young & ~h_young_seen), mk_psn.eq(j_psn)]
        with m.If(j_valid & h_young):
            m.d.sync += h_young_seen.eq(1)
        with m.If(mk_we):
            m.d.comb += [mark_w.addr.eq(h_q), mark_w.en.eq(1), mark_w.data.eq(mk_psn)]
        m.d.comb += [ev.rtx_hole.eq(h_rtx), ev.hole_young.eq(j_valid & h_young)]

        vars(v).update(
            h_emit=h_emit, h_issue=h_issue, h_next_psn=h_next_psn, h_old=h_old, h_psn=h_psn,
            j_psn=j_psn,
            j_valid=j_valid, h_rtx=h_rtx)

    def _timer_scan(self, m, v):
        """The timer scan's stages S1 and S2, which visit each QP's unacknowledged PSNs for
        timeouts: S1 reads the block RAMs and works out the QP's timeout, S2 tests what was
        read, places the PSN against the QP's CACK and next PSN, and (in the pending table)
        looks it up, into registers for stage S3 (:meth:`_timer_decide`)."""
        (qb, cmd_busy, rec_addr, rec_rh, h_issue, h_q, h_next_psn, tag_rh, rq_r, banks, bank_addr,
         retries, t_exp, r_lin, r_max, epoch, e_valid, e_q, WORDL, wq, ob, take_s, s,
         ctx_rt, nxt_rt, qs, w_valid, w_q, ring_we, ring_addr) = _take(v, """
            qb cmd_busy rec_addr rec_rh h_issue h_q h_next_psn tag_rh rq_r banks bank_addr retries
            t_exp r_lin r_max epoch e_valid e_q WORDL wq ob take_s s ctx_rt nxt_rt qs w_valid w_q ring_we
            ring_addr""")
        # --- Timer scan ---------------------------------------------------------------------
        sc_q = Signal(qb)
        sc_p = Signal(PSN)
        sc_on = Signal()
        s2_valid, s2_q, s2_p, s2_port = (Signal(name="scan_s2_valid"), Signal(qb, name="scan_s2_q"),
                                          Signal(PSN, name="scan_s2_p"), Signal(name="scan_s2_port"))
        issue = sc_on & ~cmd_busy
        sc_addr = rec_addr(sc_q, sc_p)
        s_w = sc_p[6:]
        m.d.comb += [
            rec_rh.addr.eq(Mux(h_issue, rec_addr(h_q, h_next_psn), sc_addr)),
            tag_rh.addr.eq(Mux(h_issue, rec_addr(h_q, h_next_psn), rec_addr(s2_q, s2_p))),
            rq_r.addr.eq(sc_addr),
            banks[0][2].addr.eq(bank_addr(sc_q, s_w)),
            banks[1][2].addr.eq(bank_addr(sc_q, s_w)),
        ]
        m.d.sync += [s2_valid.eq(issue), s2_q.eq(sc_q), s2_p.eq(sc_p), s2_port.eq(~h_issue)]
        # Stage S1 (the issue cycle) works out the QP's timeout from its retry count: the
        # exponent k (timeout = 2^k ticks), whether the count is at retry_max, and the QP's
        # epoch, registered for stage S2. A retry count written in this cycle for the QP
        # (scan_s2_kstale) makes stage S2 try the PSN again.
        m.d.comb += [retries.rs.addr.eq(sc_q), epoch.rs.addr.eq(sc_q)]
        r_s1 = retries.rs.data
        k_sum = Signal(7)
        m.d.comb += k_sum.eq(t_exp + Mux(r_s1 > r_lin, r_s1 - r_lin, 0))
        t_k = Signal(5, name="scan_s2_k")
        t_rmax = Signal(name="scan_s2_rmax")
        t_epoch = Signal(EPOCH_BITS, name="scan_s2_epoch")
        t_kstale = Signal(name="scan_s2_kstale")
        r_written = Signal()
        # Stage W writing the QP's bitmap words in the cycle S1 reads them (the read gives
        # the old words, while S2 reads the context after the write): the PSN is stale.
        t_wstale = Signal(name="scan_s2_wstale")
        m.d.sync += [t_k.eq(Mux(k_sum > MAX_TIMEOUT_EXP, MAX_TIMEOUT_EXP, k_sum)),
                     t_rmax.eq(r_s1 == r_max), t_epoch.eq(epoch.rs.data),
                     t_kstale.eq(r_written), t_wstale.eq(w_valid & (w_q == sc_q))]
        # Stage S2 works out what the block RAMs read in S1 say about the PSN (acknowledged,
        # late, its request already fired) into registers for stage S3, with the record's
        # fields a request needs; the tag is read in S2 itself (tag_rh, free unless the hole
        # engine takes it), so that it leaves the RAM in S3.
        s2w = s2_p[6:]
        t_word = Signal(WORDL)
        m.d.comb += t_word.eq(Mux(s2w[0], banks[1][2].data, banks[0][2].data))
        rq_d = rq_r.data
        s3_valid, s3_q, s3_p = (Signal(name="scan_s3_valid"), Signal(qb, name="scan_s3_q"),
                                Signal(PSN, name="scan_s3_p"))
        s3 = SimpleNamespace(**{n: Signal(name=f"scan_s3_{n}") for n in (
            "port", "kstale", "rmax", "acked", "late", "fired", "stale", "behind", "in_win",
            "head")})
        # The PSN against its QP's CACK and next PSN, read here (a write to them in this
        # cycle, by stage W or a sent record of this PSN, makes the PSN stale in S3).
        m.d.comb += [ctx_rt.addr.eq(s2_q), nxt_rt.addr.eq(s2_q)]
        s3_cack = Signal(PSN, name="scan_s3_cack")
        t_dp, t_dn = Signal(PSN, name="scan_s2_dp"), Signal(PSN, name="scan_s2_dn")
        m.d.comb += [t_dp.eq(s2_p - ctx_rt.data.cack), t_dn.eq(nxt_rt.data - ctx_rt.data.cack)]
        t_behind = (s2_p == ctx_rt.data.cack) | t_dp[-1]
        m.d.sync += [s3_cack.eq(ctx_rt.data.cack), s3.behind.eq(t_behind),
                     s3.in_win.eq(~t_behind & (t_dp < t_dn)), s3.head.eq(t_dp == 1)]
        s3_epoch = Signal(EPOCH_BITS, name="scan_s3_epoch")
        s3_rec = Signal(REC, name="scan_s3_rec")
        # The record's send time leaves the block RAM into s3_rec; stage S3 tests it
        # against the time S2 saw (s3_now) and the timeout 2^k.
        s3_now = Signal(TIME_BITS, name="scan_s3_now")
        s3_fired_parts = Signal((len(Value.cast(rq_d)) + 1) // 2, name="scan_s3_fired_parts")
        m.d.comb += s3.fired.eq(s3_fired_parts.all())
        s3_k = Signal.like(t_k, name="scan_s3_k")
        t_el = Signal(TIME_BITS, name="scan_s3_elapsed")
        m.d.comb += [t_el.eq(s3_now - s3_rec.time),
                     s3.late.eq((t_el & ge_mask(s3_k, TIME_BITS)).any())]   # t_el >= 2^k
        s3_squash = Signal()                  # stage S3 sends the scan elsewhere
        r_written2 = Signal()                 # the retry count of s2_q written this cycle
        m.d.sync += [
            s3_valid.eq(s2_valid & ~cmd_busy & ~s3_squash), s3_q.eq(s2_q), s3_p.eq(s2_p),
            s3_epoch.eq(t_epoch), s3_rec.eq(rec_rh.data), s3_now.eq(self.now),
            s3_k.eq(t_k),
            s3.port.eq(s2_port & ~h_issue), s3.kstale.eq(t_kstale | r_written2),
            s3.rmax.eq(t_rmax),
            s3.acked.eq((t_word.lap == s2w[wq:]) & (t_word.epoch == t_epoch) &
                        t_word.bits.bit_select(s2_p[:6], 1)),
            # The fired mark's fields against the record's, as partial equalities of two
            # bits each (one LUT after the block RAMs), ANDed in S3.
            s3_fired_parts.eq(_eq_parts(
                Cat(rq_d.valid, rq_d.rtx, rq_d.time, rq_d.lap, rq_d.epoch),
                Cat(Const(1, 1), rec_rh.data.rtx, rec_rh.data.time, s2_p[ob:], t_epoch))),
            # What S1 read may be stale in S3, which reads the context: stage W held a record
            # of the QP as S1 read, stage E or W holds one (W may have written its context
            # and bitmap words), or a sent record of this PSN was taken (its record written,
            # and for a new PSN the next PSN; or in the cycle before, its ring write in
            # flight as S1 read).
            s3.stale.eq(t_wstale | (e_valid & (e_q == s2_q)) | (w_valid & (w_q == s2_q)) |
                        (take_s & (qs == s2_q) & (s.psn == s2_p)) |
                        (ring_we & (ring_addr == rec_addr(s2_q, s2_p)))),
        ]
        vars(v).update(
            issue=issue, r_written=r_written, r_written2=r_written2, s2_q=s2_q, s2_p=s2_p,
            s3_cack=s3_cack,
            s2_valid=s2_valid, s3=s3, s3_epoch=s3_epoch, s3_p=s3_p, s3_q=s3_q, s3_rec=s3_rec,
            s3_squash=s3_squash, s3_valid=s3_valid, sc_on=sc_on, sc_p=sc_p, sc_q=sc_q)

    def _timer_decide(self, m, v):
        """The timer scan's stage S3: the PSN against the QP's context, the decision (end
        the visit, go back to CACK + 1, try the PSN again, step, or time it out), and where
        the scan goes next."""
        (qb, cmd_busy, e_valid, e_q, err, r_max, j_valid, room3, qps, ctx,
         issue, s2_valid, s3, s3_p, s3_q, s3_squash, s3_valid, sc_on, sc_p, sc_q, w_valid,
         w_q, s3_cack) = _take(v, """
            qb cmd_busy e_valid e_q err r_max j_valid room3 qps ctx issue
            s2_valid s3 s3_p s3_q s3_squash s3_valid sc_on sc_p sc_q w_valid w_q s3_cack""")
        # The pending table looked up for S3's PSN in S2 (scan_s3_pmatch, pending table)
        t_phit = Signal(name="scan_s3_phit")
        # Stage S3 decides. It holds (tries the PSN again) while stage E or W holds a record
        # of its QP (W may write the QP's context and bitmap words at the end of this
        # cycle): no value is forwarded from the SACK path into the scan.
        t_hold = Signal(name="scan_s3_hold")
        m.d.comb += t_hold.eq((e_valid & (e_q == s3_q)) | (w_valid & (w_q == s3_q)) |
                              s3.stale)
        t_cack = s3_cack
        t_behind = s3.behind
        t_in = s3.in_win
        t_err = err.bit_select(s3_q, 1)
        expired = ~s3.acked & s3.late & ~s3.fired
        head = s3.head
        exhaust = expired & head & s3.rmax & (r_max < RETRY_FOREVER)
        busy_out = w_valid | j_valid | ~room3
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
        next_q = Mux(sc_q == qps - 1, 0, sc_q + 1)[:qb]
        start_ctx = ctx.read_port(domain="comb")
        m.d.comb += start_ctx.addr.eq(sc_q)
        # A redirect drops the PSN in stage S2 too (S1 then issues the new one).
        m.d.comb += s3_squash.eq(t_end | t_rewind | t_retry)
        with m.If(t_end):
            m.d.sync += [sc_on.eq(0), s2_valid.eq(0), sc_q.eq(next_q)]
        with m.Elif(t_rewind):
            m.d.sync += [sc_p.eq(t_cack + 1), s2_valid.eq(0)]
        with m.Elif(t_retry):
            m.d.sync += [sc_p.eq(s3_p), s2_valid.eq(0)]
        with m.Elif(~sc_on & ~cmd_busy & ~s2_valid & ~s3_valid):
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
        # does not reach the memory's write enable.
        with m.If(t_eval & s3.port & ~s3.kstale & expired & ~busy_out & ~exhaust):
            m.d.comb += [rq_w.addr.eq(rec_addr(s3_q, s3_p)), rq_w.en.eq(1),
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
            ev.feedback.eq((w_go & e_fb) | t_timeout),
            ev.rtx_timeout.eq(t_timeout),
            ev.retries_exhausted.eq(t_exhaust),
            ev.scan_visits.eq(t_end),
            ev.scan_yields.eq(t_retry),
            ev.no_qp.eq((take_s & ~s1_qp_ok) + (w_go & ~w.qp_ok) +
                        (take_c & (self.cwnd.payload.qp >= qps))),
            ev.in_error.eq((take_s & s1_qp_ok & s_err) + (w_go & w.qp_ok & w.in_err)),
        ]


    def _pending_table(self, m, v):
        """The pending table: (QP, PSN) of the retransmissions requested, not yet resent."""
        (qb, j_valid, h_q, j_psn, w_valid, w_q, w, s3_q, s3_p, p_hit, nack_ok, h_old,
         t_timeout, s_rtx_ok, qs, s, fatal, sack_ok, t_exhaust, cmd_qp, cmd_apply, e_go, w_go,
         ev, ob, s2_q, s2_p, t_phit, h_psn, e_q, e_base) = _take(v, """
            qb j_valid h_q j_psn w_valid w_q w s3_q s3_p p_hit nack_ok h_old t_timeout
            s_rtx_ok qs s fatal sack_ok t_exhaust cmd_qp cmd_apply e_go w_go ev ob s2_q s2_p
            t_phit h_psn e_q e_base""")
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
        ins_live = Signal(P)                   # the slot an insert makes live now
        m.d.comb += ins_live.eq(Mux(ins_valid, ins_slot, 0))
        # The hole engine's and the timer's lookups a stage ahead: the entries are compared
        # with the PSN the stage will hold a cycle later (hole_j_pmatch in the hole's read
        # cycle, scan_s3_pmatch in the timer's stage S2), and so is the key written this
        # cycle into the slot that an insert decided now makes live in that later cycle
        # (*_pins, the only entry whose key changes meanwhile). The match is masked then by
        # what is live: the same answer as a lookup in that cycle.
        def ahead(name, q, psn):
            pmatch, pins = Signal(P, name=f"{name}_pmatch"), Signal(name=f"{name}_pins")
            m.d.sync += [pmatch.eq(Cat(*((pq[i] == q) & (pp[i] == psn[:PB])
                                         for i in range(P)))),
                         pins.eq((k_q == q) & (k_p == psn[:PB]))]
            return (pmatch & live & ~ins_live).any() | (ins_valid & pins)
        j_hit = Signal(name="hole_j_phit")
        m.d.comb += [j_hit.eq(ahead("hole_j", h_q, h_psn)), t_phit.eq(ahead("scan_s3", s2_q, s2_p))]
        # Stage W's lookup (a NACK's PSN) the same way, compared with the record stage W
        # holds in the next cycle: stage E's as it goes on, else stage W's own.
        def compare(q, psn):
            return (Cat(*((pq[i] == q) & (pp[i] == psn[:PB]) for i in range(P))),
                    (k_q == q) & (k_p == psn[:PB]))
        (e_cmp, e_pins), (w_cmp, w_pins_now) = compare(e_q, e_base), compare(w_q, w.base)
        w_pmatch, w_pins = Signal(P, name="sack_w_pmatch"), Signal(name="sack_w_pins")
        m.d.sync += [w_pmatch.eq(Mux(e_go, e_cmp, w_cmp)), w_pins.eq(Mux(e_go, e_pins, w_pins_now))]
        w_hit = Signal(name="sack_w_phit")
        m.d.comb += w_hit.eq((w_pmatch & live & ~ins_live).any() | (ins_valid & w_pins))
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
                            ((pq[i] == s3_q) & t_exhaust) |
                            ((pq[i] == cmd_qp) & cmd_apply)),
            ]
            with m.If(p_slot[i]):
                m.d.sync += [pq[i].eq(k_q), pp[i].eq(k_p)]
        m.d.sync += [pv.eq(live & ~rm_sent & ~rm_qp),
                     pz.eq(rm_sent | Mux(w_go, 0, pz))]
        m.d.comb += [ev.rtx_pending_skip.eq((nack_ok | h_old) & p_hit),
                     ev.pending_full.eq(p_want & ~p_free.any())]


    def _error_and_retries(self, m, v):
        """Per-QP error flag and retry count."""
        (r_written, r_written2, cmd_apply, sack_ok, w, w_q, sc_q, t_timeout, head, s2_q, s3_q,
         qps, cmd_qp, err, retries, epoch, fatal, t_exhaust, t_eval, expired) = _take(v, """
            r_written r_written2 cmd_apply sack_ok w w_q sc_q t_timeout head s2_q s3_q qps
            cmd_qp err retries epoch fatal t_exhaust t_eval expired""")
        # --- Per-QP error and retry count --------------------------------------------------
        # A retry count maybe written this cycle for the QP of stage S1 (or S2): its timeout
        # is worked out again. (Maybe: a timeout of the QP's oldest PSN that stage S3
        # evaluates, whether or not it fires, which the pending table and the outputs
        # decide later in the cycle.)
        t_head = t_eval & expired & head
        m.d.comb += [r_written.eq(cmd_apply | (sack_ok & w.adv & (w_q == sc_q)) |
                                  (t_head & (s3_q == sc_q))),
                     r_written2.eq(cmd_apply | (sack_ok & w.adv & (w_q == s2_q)) |
                                   (t_head & (s3_q == s2_q)))]
        for i in range(qps):
            with m.If(cmd_apply & (cmd_qp == i)):
                m.d.sync += err[i].eq(0)
            with m.Elif((fatal & (w_q == i)) | (t_exhaust & (s3_q == i))):
                m.d.sync += err[i].eq(1)
        m.d.comb += [epoch.rw.addr.eq(cmd_qp), epoch.w.addr.eq(cmd_qp),
                     epoch.w.data.eq(epoch.rw.data + 1), epoch.w.en.eq(cmd_apply),
                     retries.rt.addr.eq(s3_q)]
        # The retry count's one write a cycle: an open zeroes it, and so does a CACK
        # advance; a timeout of the QP's oldest PSN counts one (saturating at 31).
        with m.If(cmd_apply):
            m.d.comb += [retries.w.addr.eq(cmd_qp), retries.w.data.eq(0), retries.w.en.eq(1)]
        with m.Elif(sack_ok & w.adv):
            m.d.comb += [retries.w.addr.eq(w_q), retries.w.data.eq(0), retries.w.en.eq(1)]
        with m.Else():
            m.d.comb += [retries.w.addr.eq(s3_q), retries.w.data.eq(retries.rt.data + 1),
                         retries.w.en.eq(t_timeout & head & (retries.rt.data != 31))]


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
                      "sent_go": v.take_s, "sent": v.s}


