"""Work requests to packets, and packets again on request: :class:`TxSegmenter`
(``tx-segmenter``).

The transmit side's work-request engine, at the head of :class:`~mrcnic.tx.mrc_tx.MrcTx`:
it cuts WRITE work requests into packets, rebuilds a packet for each retransmit request of
the :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`, and retires the messages the
tracker's releases acknowledge, giving their send completions.

Operation, decisions and measured figures: docs/blocks/tx-segmenter.md.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto

from mrcnic.base.records import QP_INDEX_BITS, SEG_PKT, WR, WR_DONE, release_layout, rtx_layout
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import Opcode
from mrcnic.base.stream import MetaSkidBuffer, meta_stream, stream_fifo

__all__ = ["TxSegmenter", "TAG_SLOT_BITS", "SEG_REGS", "ACK_REQ_RULE",
           "PMTU_LOG2_DEFAULT"]

PSN = proto.PSN_BITS
PMTU_LOG2_DEFAULT = 12                  # 4096 bytes
PMTU_LOG2_RANGE = range(8, 15)          # 256 .. 16384 bytes
# Decision: BTH A (ask for an acknowledgement at once) on the last packet of each message;
# the receiver's other triggers (holes, every N packets, ECN) pace the rest.
ACK_REQ_RULE = "last packet of a message"

# The tag a packet carries through the retransmit tracker (32 bits): bits 7:0 its message's
# slot in the QP's ring, bits 8 and up the ring position's lap (the bits of the 9-bit ring
# position above the slot), the rest 0. The PSN the tracker returns with the tag gives the
# packet's place in its message.
TAG_SLOT_BITS = 8

_CTX = data.StructLayout({"psn": PSN, "rqmsn": 16, "msn": 16, "head": 9, "tail": 9})
_MSG = data.StructLayout({"wr_id": 16, "va": 64, "rkey": 32, "length": 32, "imm": 32,
                          "with_imm": 1, "psn": PSN, "last": PSN, "rqmsn": 16, "msn": 16})

COUNTERS = ["wrs", "packets", "retransmissions", "rtx_bad", "done", "release_bad", "wr_bad"]

SEG_REGS = RegisterMap("tx_segmenter", [
    Register("config", [Field("pmtu_log2", 4, "rw", reset=PMTU_LOG2_DEFAULT,
                              desc="PMTU = 2^pmtu_log2 payload bytes, 8 .. 14 (outside: "
                                   "the nearest legal value); change it only with no "
                                   "message in flight, since retransmissions rebuild "
                                   "packets with it")]),
    Register("qp_select", [Field("qp", QP_INDEX_BITS, "rw", desc="QP the next command acts on")]),
    Register("qp_start", [Field("psn", PSN, "rw", desc="First PSN of the QP after open")]),
    Register("qp_command", [Field("open", 1, "w1p",
                                  desc="Open qp_select at qp_start: MSNs 0, no message in "
                                       "flight (ignored when qp_select is not below qps)")]),
    Register("status", [Field("busy", 1, "ro", desc="The reset sweep or an open is running")]),
    Register("info", [Field("qps", 17, "ro", desc="QPs (the qps parameter)"),
                      Field("msgs", 9, "ro", desc="Messages in flight per QP")]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("wrs", "Work requests taken"),
        ("packets", "Packets of work requests"),
        ("retransmissions", "Packets rebuilt for retransmit requests"),
        ("rtx_bad", "Retransmit requests naming no message in flight, or a PSN outside it"),
        ("done", "Messages retired (send completions)"),
        ("release_bad", "Releases for a QP not below qps"),
        ("wr_bad", "Work requests for a QP not below qps: refused"),
    ]],
])


class TxSegmenter(wiring.Component):
    """Work requests to packets, retransmit requests to packets again, releases to send
    completions.

    One operation at a time, in this order of priority. A ``release`` retires, oldest
    first, every message of its QP whose last PSN is at or before ``last``, one ``done``
    record each. An ``rtx`` request rebuilds the packet it names (the message by the tag's
    slot and lap, :data:`TAG_SLOT_BITS`; the packet by its PSN) from the message's stored
    entry and emits it with ``rtx`` = 1 and ``avoid`` = the EV that failed; a tag naming no
    message in flight, or a PSN outside it, is dropped and counted (``rtx_bad``). A ``wr``
    takes the QP's next message slot and next PSNs and leaves as ceil(length / PMTU) packets
    (one for length 0): WRITE_ONLY[_IMM], or WRITE_FIRST, WRITE_MIDDLE..., WRITE_LAST[_IMM],
    each with its own RETH address (``va`` + k x PMTU), the whole length as DMA length, the
    message's METH ``rqmsn``/``msn``, and BTH A on the last packet (:data:`ACK_REQ_RULE`).
    A work request waits while its QP has ``msgs`` messages not yet acknowledged. The PMTU
    is the register ``config.pmtu_log2`` (2^8 .. 2^14 bytes). After reset a sweep opens
    every QP at PSN 0 (``qps`` cycles, inputs held); ``qp_command.open`` opens one QP at
    ``qp_start``, forgetting its messages.

    Parameters
    ----------
    qps : int
        Queue pairs, 1 .. 65536. Default 64.
    msgs : int
        Messages in flight per QP, a power of two 2 .. 256. Default 16.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    wr : stream of :data:`~mrcnic.base.records.WR`, in
        Work requests: a WRITE (``with_imm`` = 0) or WRITE-with-immediate of ``length``
        bytes (0 .. 2^32 - 1) at remote address ``va``. A request for a QP not below
        ``qps`` is refused and counted (``wr_bad``).
    rtx : stream of :func:`~mrcnic.base.records.rtx_layout` (32-bit tag), in
        Retransmit requests from the retransmit tracker.
    release : stream of :func:`~mrcnic.base.records.release_layout` (32-bit tag), in
        PSNs up to ``last`` acknowledged for QP ``qp``, from the retransmit tracker.
    pkt : stream of :data:`~mrcnic.base.records.SEG_PKT`, out
        Packets: a :data:`~mrcnic.base.records.TX_DESC` without the entropy (the path
        selector gives it), plus ``tag``, ``wr_id``, ``offset`` (the payload's byte offset
        in its message, what the payload request asks the host for) and ``avoid``. The
        consumer decides when a packet may go (send credit).
    done : stream of :data:`~mrcnic.base.records.WR_DONE`, out
        Send completions (``qp``, ``wr_id``), one per message retired.
    s_axil : AXI4-Lite, in
        Registers, :data:`SEG_REGS`.

    Every input ready is a register (skid buffers); ``pkt`` and ``done`` come from FIFOs.

    Latency
    -------
    A work request's first packet leaves ``pkt`` 5 cycles after the request's handshake
    (input slice, the IDLE state, the FIFO). A retransmit request takes 5 cycles of the
    block (read the message, its register, check, the payload offset, emit); a release
    3 cycles per message retired.

    Throughput
    ----------
    One packet per cycle within a message, one operation at a time: a message of one
    packet costs 2 cycles of the block (IDLE, SEG), so very short messages do not reach one
    packet per cycle.

    Raises
    ------
    ValueError
        If ``qps`` is not an int in 1 .. 65536, ``msgs`` is not a power of two in
        2 .. 256, or ``counter_width`` is not 0, 16 or 32.
    """

    def __init__(self, qps=64, msgs=16, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        if not isinstance(qps, int) or not 1 <= qps <= 1 << QP_INDEX_BITS:
            raise ValueError(f"qps = {qps!r} is outside 1 .. {1 << QP_INDEX_BITS}")
        if not isinstance(msgs, int) or msgs < 2 or msgs > 256 or msgs & (msgs - 1):
            raise ValueError(f"msgs = {msgs!r} is not a power of two in 2 .. 256")
        self.qps, self.msgs = qps, msgs
        self.slot_bits = msgs.bit_length() - 1
        super().__init__({
            "wr": In(meta_stream(WR)),
            "rtx": In(meta_stream(rtx_layout(32))),
            "release": In(meta_stream(release_layout(32))),
            "pkt": Out(meta_stream(SEG_PKT)),
            "done": Out(meta_stream(WR_DONE)),
            "s_axil": In(AxiLiteSignature(SEG_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        # Registers: the CSR block on s_axil; the PMTU from config.pmtu_log2, clamped.
        regs = self._registers(m)
        # Inputs through skid buffers (registered ready).
        ins = self._inputs(m)
        # Outputs from FIFOs; a packet is written only when the FIFO has room.
        outs = self._outputs(m)
        # Tables: the QP context (distributed RAM) and message entries (block RAM).
        tab = self._tables(m)
        # The counters' event strobes, one bit each, raised by the states below.
        events = Signal(data.StructLayout({n: 1 for n in COUNTERS}))
        # Operation registers: the work request being cut, the rtx request, the release.
        op = self._operation_registers(m, tab)
        # Reset sweep and opens: their registers and status.busy.
        sw = self._sweep_and_opens(m, regs.f)
        # The retransmit engine's registers: the packet's index and payload offset.
        rtx = self._rtx_registers()
        # One operation at a time, in order of priority (the FSM):
        with m.FSM():
            # SWEEP: open every QP at PSN 0 after reset.
            self._sweep_state(m, tab, sw)
            # IDLE: an open, else a release, else a retransmit request, else a work request.
            self._idle_state(m, regs, ins, tab, op, sw, events)
            # SEG: cut the work request into packets; its message entry with the last.
            self._seg_state(m, regs, outs, tab, op, events)
            # RTX_*: rebuild the packet a retransmit request names.
            self._rtx_states(m, regs, outs, tab, op, rtx, events)
            # REL_*: retire the messages a release acknowledges, with their completions.
            self._release_states(m, outs, tab, op, events)
        # Event counters.
        event_counters(m, regs.f, events, COUNTERS, regs.f["control"]["clear"],
                       width=self.counter_width)
        return m

    def _below_qps(self, qp):
        """``qp`` is below ``qps`` (a QP that exists)."""
        return Const(1, 1) if self.qps == 1 << QP_INDEX_BITS else qp < self.qps

    def _slot_addr(self, q, slot):
        """Message table address of QP ``q``'s ring position ``slot``."""
        sb = self.slot_bits
        return Cat(slot[:sb], q) if self.qps > 1 else Cat(slot[:sb], Const(0, 1))

    def _registers(self, m):
        """The CSR block on ``s_axil``, ``info``; the PMTU, ``config.pmtu_log2`` clamped to
        8 .. 14. Returns the fields, ``plog`` and ``pmtu``."""
        m.submodules.csr = csr = CsrBlock(SEG_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        f = csr.fields
        m.d.comb += [f["info"]["qps"].eq(self.qps), f["info"]["msgs"].eq(self.msgs)]
        plog = Signal(4)
        reg_plog = f["config"]["pmtu_log2"]
        m.d.comb += plog.eq(Mux(reg_plog < PMTU_LOG2_RANGE.start, PMTU_LOG2_RANGE.start,
                                Mux(reg_plog >= PMTU_LOG2_RANGE.stop, PMTU_LOG2_RANGE.stop - 1,
                                    reg_plog)))
        pmtu = Signal(16)
        m.d.comb += pmtu.eq(Const(1, 16) << plog)
        return SimpleNamespace(f=f, plog=plog, pmtu=pmtu)

    def _inputs(self, m):
        """``wr``, ``rtx`` and ``release`` through skid buffers (registered ready)."""
        m.submodules.wr_skid = wr_in = MetaSkidBuffer(WR)
        m.submodules.rtx_skid = rtx_in = MetaSkidBuffer(rtx_layout(32))
        m.submodules.rel_skid = rel_in = MetaSkidBuffer(release_layout(32))
        wiring.connect(m, wiring.flipped(self.wr), wr_in.i)
        wiring.connect(m, wiring.flipped(self.rtx), rtx_in.i)
        wiring.connect(m, wiring.flipped(self.release), rel_in.i)
        return SimpleNamespace(wr=wr_in.o, rtx=rtx_in.o, rel=rel_in.o)

    def _outputs(self, m):
        """``pkt`` and ``done`` from FIFOs; returns the FIFOs' write sides."""
        pkt_w = meta_stream(SEG_PKT).create()
        done_w = meta_stream(WR_DONE).create()
        stream_fifo(m, "pkt_fifo", pkt_w, wiring.flipped(self.pkt), 4)
        stream_fifo(m, "done_fifo", done_w, wiring.flipped(self.done), 4)
        return SimpleNamespace(pkt_w=pkt_w, done_w=done_w)

    def _tables(self, m):
        """The QP context, read without a clock (distributed RAM), the messages from block
        RAM (one cycle); ``qp``, the operation's QP, addresses the context, ``c`` is the
        context as read and updated."""
        qps, msgs = self.qps, self.msgs
        m.submodules.ctx = ctx = Memory(shape=_CTX, depth=max(qps, 2), init=[])
        ctx_r = ctx.read_port(domain="comb")
        ctx_w = ctx.write_port()
        m.submodules.msg = msg = Memory(shape=_MSG, depth=max(qps, 2) * msgs, init=[])
        msg_r = msg.read_port()
        msg_w = msg.write_port()

        qp = Signal(QP_INDEX_BITS)              # the operation's QP
        c = Signal(_CTX)                        # its context, as read and updated
        m.d.comb += [ctx_r.addr.eq(qp), ctx_w.addr.eq(qp), ctx_w.data.eq(c)]
        # Decisions read the context as read (``cr``), never ``c``, the value being
        # written: ``c`` is muxed by state, and a path through it would join every state's
        # arithmetic into one.
        cr = ctx_r.data
        used = (cr.head - cr.tail)[:9]           # messages in flight (9-bit positions)
        return SimpleNamespace(ctx_r=ctx_r, ctx_w=ctx_w, msg_r=msg_r, msg_w=msg_w, qp=qp, c=c,
                               cr=cr, used=used)

    def _operation_registers(self, m, tab):
        """The registers of the operation under way: the work request being cut and its
        packet, the retransmit request, the release, the message entry read."""
        # Segmentation registers.
        wr = Signal(WR)
        k = Signal(PSN)                          # packet index in the message
        off = Signal(32)                         # its payload offset
        va = Signal(64)                          # its RETH address
        n_last = Signal()                        # this packet is the message's last
        rtx_req = Signal(rtx_layout(32))
        rel = Signal(release_layout(32))
        m_e = Signal(_MSG)                       # the message entry read for rtx/release
        # The message entry, registered after the block RAM: the RAM's clock-to-output is
        # most of a cycle on ECP5, so nothing is computed on its raw output.
        ms = Signal(_MSG)
        m.d.sync += ms.eq(tab.msg_r.data)
        return SimpleNamespace(wr=wr, k=k, off=off, va=va, n_last=n_last, rtx_req=rtx_req,
                               rel=rel, m_e=m_e, ms=ms)

    def _sweep_and_opens(self, m, f):
        """Reset sweep and opens: ``sweep`` runs after reset, ``open_pend`` holds a
        ``qp_command.open`` until IDLE takes it; ``status.busy`` while either runs."""
        sweep = Signal(init=1)
        sweep_qp = Signal(QP_INDEX_BITS)
        open_req = f["qp_command"]["open"] & self._below_qps(f["qp_select"]["qp"])
        open_pend = Signal()
        with m.If(open_req):
            m.d.sync += open_pend.eq(1)
        m.d.comb += f["status"]["busy"].eq(sweep | open_pend)
        return SimpleNamespace(sweep=sweep, sweep_qp=sweep_qp, open_req=open_req,
                               open_pend=open_pend)

    def _rtx_registers(self):
        """The retransmit engine's registers: the packet's index in its message
        (``k``) and its payload offset (``off``)."""
        rtx_k = Signal(PSN)
        rtx_off = Signal(32)
        return SimpleNamespace(k=rtx_k, off=rtx_off)

    def _emit(self, pkt_w, qp, kind_rtx, psn, opcode, length, e_va, e_off, wr_id, rkey,
              dma_length, imm, rqmsn, msn, tag, avoid, ack_req):
        """The statements that put a packet of QP ``qp`` on ``pkt_w``'s payload."""
        return [
            pkt_w.payload.qp.eq(qp), pkt_w.payload.psn.eq(psn),
            pkt_w.payload.opcode.eq(opcode), pkt_w.payload.ack_req.eq(ack_req),
            pkt_w.payload.rtx.eq(kind_rtx), pkt_w.payload.va.eq(e_va),
            pkt_w.payload.rkey.eq(rkey), pkt_w.payload.dma_length.eq(dma_length),
            pkt_w.payload.length.eq(length), pkt_w.payload.imm.eq(imm),
            pkt_w.payload.rqmsn.eq(rqmsn), pkt_w.payload.msn.eq(msn),
            pkt_w.payload.tag.eq(tag), pkt_w.payload.wr_id.eq(wr_id),
            pkt_w.payload.offset.eq(e_off), pkt_w.payload.avoid.eq(avoid),
        ]

    @staticmethod
    def _opcode_of(first, last, with_imm):
        """The WRITE opcode of a packet, by its place in the message."""
        return Mux(first & last,
                   Mux(with_imm, int(Opcode.WRITE_ONLY_IMM), int(Opcode.WRITE_ONLY)),
                   Mux(first, int(Opcode.WRITE_FIRST),
                       Mux(last, Mux(with_imm, int(Opcode.WRITE_LAST_IMM),
                                     int(Opcode.WRITE_LAST)),
                           int(Opcode.WRITE_MIDDLE))))

    def _sweep_state(self, m, tab, sw):
        """SWEEP: after reset, every QP's context zeroed (opened at PSN 0), one a cycle."""
        with m.State("SWEEP"):
            m.d.comb += [tab.qp.eq(sw.sweep_qp), tab.ctx_w.en.eq(1), tab.c.eq(0)]
            m.d.sync += sw.sweep_qp.eq(sw.sweep_qp + 1)
            with m.If(sw.sweep_qp == max(self.qps, 2) - 1):
                m.d.sync += sw.sweep.eq(0)
                m.next = "IDLE"

    def _idle_state(self, m, regs, ins, tab, op, sw, events):
        """IDLE: an open, else a release, else a retransmit request, else a work request
        (taken when its QP has a message slot free: on to SEG)."""
        f, qp, c = regs.f, tab.qp, tab.c
        wr_in, rtx_in, rel_in = ins.wr, ins.rtx, ins.rel
        with m.State("IDLE"):
            with m.If(sw.open_pend):
                m.d.comb += [qp.eq(f["qp_select"]["qp"]), tab.ctx_w.en.eq(1),
                             c.psn.eq(f["qp_start"]["psn"])]
                m.d.sync += sw.open_pend.eq(sw.open_req)
            with m.Elif(rel_in.valid):
                m.d.comb += rel_in.ready.eq(1)
                m.d.sync += op.rel.eq(rel_in.payload)
                with m.If(self._below_qps(rel_in.payload.qp)):
                    m.next = "REL_READ"
                with m.Else():
                    m.d.comb += events.release_bad.eq(1)
            with m.Elif(rtx_in.valid):
                m.d.comb += rtx_in.ready.eq(1)
                m.d.sync += op.rtx_req.eq(rtx_in.payload)
                m.next = "RTX_READ"
            with m.Elif(wr_in.valid):
                m.d.comb += [qp.eq(wr_in.payload.qp), c.eq(tab.ctx_r.data)]
                with m.If(~self._below_qps(wr_in.payload.qp)):
                    # Refused whole: a QP that does not exist has no context.
                    m.d.comb += [wr_in.ready.eq(1), events.wr_bad.eq(1)]
                with m.Elif(tab.used != self.msgs):
                    m.d.comb += [wr_in.ready.eq(1), events.wrs.eq(1)]
                    m.d.sync += [op.wr.eq(wr_in.payload), op.k.eq(0), op.off.eq(0),
                                 op.va.eq(wr_in.payload.va),
                                 op.n_last.eq(wr_in.payload.length <= regs.pmtu)]
                    m.next = "SEG"

    def _seg_state(self, m, regs, outs, tab, op, events):
        """SEG: one packet of the work request a cycle; with the last, the message's entry
        and the QP's new context (next PSN, MSNs, ring head)."""
        sb, pmtu, pkt_w = self.slot_bits, regs.pmtu, outs.pkt_w
        qp, c, cr, ctx_r, msg_w, ctx_w = tab.qp, tab.c, tab.cr, tab.ctx_r, tab.msg_w, tab.ctx_w
        wr, k, off, va, n_last = op.wr, op.k, op.off, op.va, op.n_last
        with m.State("SEG"):
            m.d.comb += [qp.eq(wr.qp), c.eq(ctx_r.data)]
            remaining = wr.length - off
            length = Mux(n_last, remaining, pmtu)
            m.d.comb += self._emit(pkt_w, qp, 0, cr.psn + k,
                                   self._opcode_of(k == 0, n_last, wr.with_imm),
                                   length, va, off, wr.wr_id, wr.rkey, wr.length, wr.imm,
                                   cr.rqmsn, cr.msn,
                                   Cat(cr.head[:sb], Const(0, TAG_SLOT_BITS - sb),
                                       cr.head[sb:], Const(0, 24 - (9 - sb))),
                                   0, n_last)
            m.d.comb += pkt_w.valid.eq(1)
            with m.If(pkt_w.ready):
                m.d.comb += events.packets.eq(1)
                m.d.sync += [k.eq(k + 1), off.eq(off + pmtu), va.eq(va + pmtu),
                             n_last.eq(wr.length - off <= 2 * pmtu)]
                with m.If(n_last):
                    # The message's entry, written once its last PSN is known (nothing
                    # else runs while a message is cut, so nothing reads it before).
                    m.d.comb += [msg_w.en.eq(1), msg_w.addr.eq(self._slot_addr(qp, cr.head)),
                                 msg_w.data.wr_id.eq(wr.wr_id), msg_w.data.va.eq(wr.va),
                                 msg_w.data.rkey.eq(wr.rkey),
                                 msg_w.data.length.eq(wr.length),
                                 msg_w.data.imm.eq(wr.imm),
                                 msg_w.data.with_imm.eq(wr.with_imm),
                                 msg_w.data.psn.eq(cr.psn), msg_w.data.last.eq(cr.psn + k),
                                 msg_w.data.rqmsn.eq(cr.rqmsn), msg_w.data.msn.eq(cr.msn)]
                    m.d.comb += [ctx_w.en.eq(1), c.psn.eq(ctx_r.data.psn + k + 1),
                                 c.msn.eq(ctx_r.data.msn + 1),
                                 c.rqmsn.eq(ctx_r.data.rqmsn + wr.with_imm),
                                 c.head.eq(ctx_r.data.head + 1)]
                    m.next = "IDLE"

    def _rtx_states(self, m, regs, outs, tab, op, rtx, events):
        """RTX_READ .. RTX_EMIT: read the message the tag names, check the tag and PSN
        against it, work out the payload offset, emit the packet again."""
        sb, pmtu, pkt_w, qp, cr = self.slot_bits, regs.pmtu, outs.pkt_w, tab.qp, tab.cr
        rtx_req, ms, m_e, rtx_k, rtx_off = op.rtx_req, op.ms, op.m_e, rtx.k, rtx.off
        with m.State("RTX_READ"):
            m.d.comb += [qp.eq(rtx_req.qp),
                         tab.msg_r.addr.eq(self._slot_addr(rtx_req.qp, rtx_req.tag[:sb]))]
            m.next = "RTX_HOLD"
        with m.State("RTX_HOLD"):            # the entry into its register
            m.next = "RTX_CHECK"
        with m.State("RTX_CHECK"):
            m.d.comb += qp.eq(rtx_req.qp)
            tag_lap = rtx_req.tag[TAG_SLOT_BITS:TAG_SLOT_BITS + 9 - sb]
            slot = Cat(rtx_req.tag[:sb], tag_lap)     # the 9-bit ring position
            in_flight = ((slot - cr.tail)[:9] < tab.used) & self._below_qps(rtx_req.qp)
            kk = (rtx_req.psn - ms.psn)[:PSN]
            ok = in_flight & (kk <= (ms.last - ms.psn)[:PSN])
            m.d.sync += [m_e.eq(ms), rtx_k.eq(kk)]
            with m.If(ok):
                m.next = "RTX_SHIFT"
            with m.Else():
                m.d.comb += events.rtx_bad.eq(1)
                m.next = "IDLE"
        with m.State("RTX_SHIFT"):
            # The payload offset, a stage of its own: after the block RAM and the check,
            # a shift by the PMTU would be the block's longest path.
            m.d.sync += rtx_off.eq((rtx_k << regs.plog)[:32])
            m.next = "RTX_EMIT"
        with m.State("RTX_EMIT"):
            m.d.comb += qp.eq(rtx_req.qp)
            last = m_e.length - rtx_off <= pmtu
            length = Mux(last, m_e.length - rtx_off, pmtu)
            m.d.comb += self._emit(pkt_w, qp, 1, rtx_req.psn,
                                   self._opcode_of(rtx_k == 0, last, m_e.with_imm),
                                   length, m_e.va + rtx_off, rtx_off, m_e.wr_id, m_e.rkey,
                                   m_e.length, m_e.imm, m_e.rqmsn, m_e.msn, rtx_req.tag,
                                   rtx_req.ev, last)
            m.d.comb += pkt_w.valid.eq(1)
            with m.If(pkt_w.ready):
                m.d.comb += events.retransmissions.eq(1)
                m.next = "IDLE"

    def _release_states(self, m, outs, tab, op, events):
        """REL_READ .. REL_CHECK: read the QP's oldest message; while its last PSN is
        acknowledged, a ``done`` record and the ring tail one on, then the next."""
        qp, c, ctx_r, rel, ms, done_w = tab.qp, tab.c, tab.ctx_r, op.rel, op.ms, outs.done_w
        with m.State("REL_READ"):
            m.d.comb += [qp.eq(rel.qp), tab.msg_r.addr.eq(self._slot_addr(rel.qp, tab.cr.tail))]
            with m.If(ctx_r.data.head == ctx_r.data.tail):
                m.next = "IDLE"
            with m.Else():
                m.next = "REL_HOLD"
        with m.State("REL_HOLD"):            # the entry into its register
            m.next = "REL_CHECK"
        with m.State("REL_CHECK"):
            m.d.comb += [qp.eq(rel.qp), c.eq(ctx_r.data)]
            # The message is acknowledged when its last PSN is at or before ``last``.
            acked = (rel.last - ms.last)[:PSN] < (1 << (PSN - 1))
            with m.If(acked):
                m.d.comb += [done_w.valid.eq(1), done_w.payload.qp.eq(rel.qp),
                             done_w.payload.wr_id.eq(ms.wr_id)]
                with m.If(done_w.ready):
                    m.d.comb += [tab.ctx_w.en.eq(1), c.tail.eq(ctx_r.data.tail + 1),
                                 events.done.eq(1)]
                    m.next = "REL_READ"
                with m.Else():
                    m.next = "REL_READ"
            with m.Else():
                m.next = "IDLE"
