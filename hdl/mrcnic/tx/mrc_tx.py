"""The transmit half of the NIC: :class:`MrcTx` (``mrc-tx``).

The transmit half of :class:`~mrcnic.nic.MrcNic`, assembled from the transmit blocks: a
:class:`~mrcnic.tx.segmenter.TxSegmenter` cuts work requests into packets, a send gate asks
the :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker` for credit, the
:class:`~mrcnic.tx.path_selector.PathSelector` gives each packet an EV,
:class:`~mrcnic.tx.roce_tx.RoceTx` builds the frame with the payload the host returns for a
payload request, and :class:`~mrcnic.tx.srv6_encap.Srv6Encap` puts it on its EV's path; each
frame leaves whole on the port of its plane.

Operation, decisions and measured figures: docs/blocks/mrc-tx.md.
"""

from types import SimpleNamespace

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto

from mrcnic.base.records import (
    ACK_DESC, PAYLOAD_REQ, EV_FEEDBACK, EV_INDEX_BITS, PEER_STATUS, FeedbackKind, CWND_IN,
    RtxCause, RTT_SAMPLE, TICK_NS, TIME_BITS, TS_UNIT_NS, TX_DESC, sent_layout, SEG_PKT, WR,
    WR_DONE)
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters, ipv6_registers, ipv6_value)
from mrcnic.base.csr.bus import CsrBus
from mrcnic.tx.path_selector import EVENT, SELECTOR_REGS, PathSelector
from mrcnic.base.proto import EvMode, Opcode, SackMode
from mrcnic.tx.retransmit_tracker import RT_REGS, RetransmitTracker
from mrcnic.tx.roce_tx import TX_REGS, RoceTx
from mrcnic.tx.srv6_encap import ENCAP_DESC, ENCAP_REGS, Srv6Encap
from mrcnic.base.stream import AxiStreamSignature, MetaArbiter, frame_demux, meta_stream
from mrcnic.tx.segmenter import SEG_REGS, TxSegmenter

__all__ = ["MrcTx", "MRC_TX_REGS", "LOOP_PACKETS", "CREDIT_RULE",
           "LOSS_FEEDBACK", "STALE_PORT", "DESC_LOOKAHEAD",
           "TICK_CYCLES_DEFAULT", "TS_CYCLES_DEFAULT", "RTT_DEPTH"]

CREDIT_RULE = "one packet per QP between the credit check and its sent record"
# Decision: a packet lost silently (a SACK hole past the reorder guard: later packets on
# other paths arrived, it did not, and no trim said why) is the same evidence as a timeout
# (spec §4: "retransmit timeout with neither SACK nor trim -> ASSUMED_BAD"), only sooner:
# its EV is reported as TIMEOUT when the retransmission is asked for. Probes bring an EV
# that lost a packet to random loss back.
LOSS_FEEDBACK = "a SACK hole reports its EV as TIMEOUT"
# Decision: the selector decides a few packets ahead of the wire (its response FIFO, then
# the descriptors RoceTx holds). A decision whose port went down while it waited in the
# selector's response FIFO is not forked: the packet goes round again like a 'none'
# (counted, ``port_down``); and the fork feeds RoceTx with no FIFO between, so that
# after a port goes down at most DESC_LOOKAHEAD frames already forked to it still start
# (docs/blocks/mrc-tx.md measures the cycles).
STALE_PORT = "a decision for a port that went down is requested again"
DESC_LOOKAHEAD = 3             # RoceTx's descriptor skid buffer (2) and first stage (1)
LOOP_PACKETS = 4               # packets in the selector's request loop (see Operation, 2)
TICK_CYCLES_DEFAULT = 256      # cycles per timer tick (TICK_NS at a 4 ns clock)
TS_CYCLES_DEFAULT = TICK_CYCLES_DEFAULT * TS_UNIT_NS // TICK_NS   # cycles per timestamp unit
RTT_DEPTH = 4                  # RTT samples held for a slow reader; more are dropped
MAX_QPS = 1024                 # error and in-flight bits are flip-flops
PLANE_CHOICES = (1, 2, 4, 8)
BRANCH_DEPTH = 16              # each branch of the fork

COUNTERS = ["packets", "retransmissions", "no_path", "credit_wait", "dropped_error",
            "qp_errors", "probes", "probe_answers", "losses", "payload_requests", "port_down",
            "peer_ports", "announcements", "rtt_samples", "rtt_dropped"]

MRC_TX_REGS = RegisterMap("mrc_tx", [
    Register("info", [Field("planes", 4, "ro", desc="Planes (parameter)"),
                      Field("qps", 11, "ro", offset=16, desc="QPs (parameter)")]),
    Register("config", [
        Field("mode", 3, "rw", reset=EvMode.SRV6, desc="Encapsulation: EvMode 3 SRV6 or 4 "
                                                       "SRV6_SRH (1 STEV, 2 UDP, 0 PASS)"),
        Field("hop_limit", 8, "rw", offset=8, reset=64, desc="Outer IPv6 hop limit"),
    ]),
    *ipv6_registers("outer_src", "Outer source (this NIC's SRv6 address)"),
    Register("tick", [Field("cycles", 16, "rw", reset=TICK_CYCLES_DEFAULT,
                            desc="Clock cycles per 1.024 us tick of the time base (0 or 1: "
                                 "every cycle)")]),
    Register("now", [Field("ticks", 32, "ro", desc="The time base")]),
    Register("timestamp", [
        Field("tseth", 1, "rw", desc="1: every data packet carries a TSETH with the "
                                     "timestamp, and every SACK or NACK echoing one gives an "
                                     "RTT sample (probes always carry one in their PETH)"),
        Field("cycles", 15, "rw", offset=16, reset=TS_CYCLES_DEFAULT,
              desc="Clock cycles per 128 ns unit of the timestamps (0 or 1: every cycle)"),
    ]),
    Register("qp_select", [Field("qp", 16, "rw", desc="QP qp_command and qp_status act on")]),
    Register("qp_command", [Field("clear_error", 1, "w1p",
                                  desc="Let QP qp_select's packets through again (open it "
                                       "in the segmenter and the tracker too)")]),
    Register("qp_status", [Field("error", 1, "ro", desc="QP qp_select is in error: its "
                                                        "packets are dropped")]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("packets", "New packets forked to RoceTx"),
        ("retransmissions", "Retransmitted packets forked to RoceTx"),
        ("no_path", "Selector responses 'none': the packet requested again"),
        ("credit_wait", "Credit checks a new packet failed"),
        ("dropped_error", "Packets dropped at the gate: their QP in error"),
        ("qp_errors", "QP error records from the tracker"),
        ("probes", "Probe frames sent (the selector's probe records)"),
        ("probe_answers", "SACKs with pr = 1 given to the selector as probe feedback"),
        ("losses", "SACK holes reported to the selector as TIMEOUT (LOSS_FEEDBACK)"),
        ("payload_requests", "Payload requests (preq)"),
        ("port_down", "Selector decisions for a port that went down since: the packet "
                      "requested again (STALE_PORT)"),
        ("peer_ports", "Port status updates from peers given to the selector (PEER_PORTS)"),
        ("announcements", "Port status updates sent (the selector's announce records)"),
        ("rtt_samples", "RTT samples given on rtt"),
        ("rtt_dropped", "RTT samples dropped: rtt's FIFO full"),
    ]],
])


class MrcTx(wiring.Component):
    """The transmit half of the NIC: work requests in, frames on every plane out.

    Work requests are cut into packets by a :class:`~mrcnic.tx.segmenter.TxSegmenter`.
    Each packet then passes: the send gate (a new packet goes only when the
    :class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker` gives its QP credit, at most
    one per QP between the credit check and its ``sent`` record, :data:`CREDIT_RULE`; a
    packet of a QP in error is dropped); a request to the
    :class:`~mrcnic.tx.path_selector.PathSelector` (a response without a usable EV, or for
    a port gone down since, :data:`STALE_PORT`, sends the packet round again, at most
    :data:`LOOP_PACKETS` in the loop); the fork, in one cycle, to the
    :class:`~mrcnic.tx.roce_tx.RoceTx` descriptor, the payload request ``preq``, the
    :class:`~mrcnic.tx.srv6_encap.Srv6Encap` descriptor, the plane FIFO and the tracker's
    ``sent`` record; then RoceTx builds the frame with the payload from ``s_axis``,
    Srv6Encap puts it on its EV's path and it leaves whole on ``m{p}_axis``, p its EV's
    plane. The tracker's retransmit requests and releases go back to the segmenter; its
    feedback, the SACK holes it requests (as TIMEOUT, :data:`LOSS_FEEDBACK`), the peer's
    probe answers and the peer's port status updates go to the selector. The selector's
    probes and port status announcements go out as frames ahead of the next data packet.

    Parameters
    ----------
    planes : int
        Planes (ports), one of 1, 2, 4, 8. Default 4.
    data_width : int
        Bus width in bits, a power of two 64 .. 2048 (RoceTx's and Srv6Encap's check).
        Default 64.
    qps : int
        Queue pairs, 1 .. 1024. Default 8.
    msgs : int
        Messages in flight per QP, a power of two 2 .. 256 (the segmenter's). Default 16.
    ev_count : int
        EVs per profile, a power of two 2 .. 256, at least ``planes`` (the selector's).
        Default 32.
    profiles : int
        EV profiles, 1 .. 16 (the selector's). Default 2.
    ev_bits : int
        Bits of the expanded EV: 128 (SRv6) or 256 (SRv6 + SRH). Default 128.
    outstanding : int
        PSNs outstanding per QP, a power of two 128 .. 16384 (the tracker's). Default 1024.
    pending : int
        Entries of the retransmit tracker's pending table, 1 .. 64. Default 16.
    counter_width : int
        Width of every block's event counters: 32, 16 or 0 (no counters; they read 0).
        Default 32.

    Attributes
    ----------
    wr : stream of :data:`~mrcnic.base.records.WR`, in
        Work requests.
    done : stream of :data:`~mrcnic.base.records.WR_DONE`, out
        Send completions, as messages are acknowledged.
    preq : stream of :data:`~mrcnic.base.records.PAYLOAD_REQ`, out
        Payload requests (``qp``, ``wr_id``, ``offset``, ``length``), one per packet with a
        payload.
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Payloads: one frame per payload request, in request order.
    m{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Frames of plane p, one port per plane.
    ack : stream of :data:`~mrcnic.base.records.ACK_DESC`, in
        The peer's SACKs and NACKs (the receive half's ``ack``).
    peer : stream of :data:`~mrcnic.base.records.PEER_STATUS`, in
        The peer's port status updates (the receive half's ``peer``).
    cwnd : stream of :data:`~mrcnic.base.records.CWND_IN`, in
        Congestion window per QP, to the tracker; unlimited if never written.
    port_up : Signal(planes), in
        Per plane: the port's link is up.
    credit : Signal(planes), in
        Per plane: the port can take another frame.
    event : stream of :data:`~mrcnic.tx.path_selector.EVENT`, out
        The selector's EV state changes.
    rtt : stream of :data:`~mrcnic.base.records.RTT_SAMPLE`, out
        A round-trip time sample per probe answer and, with ``timestamp.tseth``, per SACK
        or NACK: :data:`RTT_DEPTH` samples are held, the next ones dropped and counted
        (``rtt_dropped``); the ack path never waits for it.
    s_axil : AXI4-Lite, in
        Registers: a :class:`~mrcnic.base.csr.bus.CsrBus` over this block's own
        (:data:`MRC_TX_REGS`), the segmenter's, the path selector's, the retransmit
        tracker's, RoceTx's and Srv6Encap's; the directory names them.

    Latency
    -------
    Not stated end to end: a packet passes the segmenter, the send gate (a new packet: ask
    in one cycle, decide in the next), the selector
    (:attr:`~mrcnic.tx.path_selector.PathSelector.latency`), the fork, then RoceTx and
    Srv6Encap (their ``latency`` attributes). After a port goes down, at most
    :data:`DESC_LOOKAHEAD` frames already forked to it still start, besides the frame
    under way.

    Throughput
    ----------
    One beat a cycle out of RoceTx and Srv6Encap, all planes together; at most one new
    packet every two cycles through the gate, and :data:`LOOP_PACKETS` packets per
    selector round trip.

    Raises
    ------
    ValueError
        If ``planes`` is not one of 1, 2, 4, 8; ``qps`` is not an int in 1 .. 1024;
        ``ev_bits`` is not 128 or 256; or a block refuses its parameter (``data_width``,
        ``msgs``, ``ev_count``, ``profiles``, ``outstanding``, ``pending``,
        ``counter_width``: the ranges above).
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, planes=4, data_width=64, qps=8, msgs=16, ev_count=32, profiles=2,
                 ev_bits=128, outstanding=1024, pending=16, counter_width=32):
        if planes not in PLANE_CHOICES:
            raise ValueError(f"planes = {planes!r} is not one of {PLANE_CHOICES}")
        if not isinstance(qps, int) or not 1 <= qps <= MAX_QPS:
            raise ValueError(f"qps = {qps!r} is outside 1 .. {MAX_QPS}")
        if ev_bits not in (128, 256):
            raise ValueError(f"ev_bits = {ev_bits!r}: SRv6 needs 128 (address) or 256 "
                             f"(address and SRH segment)")
        self.planes, self.data_width, self.qps, self.msgs = planes, data_width, qps, msgs
        self.ev_count, self.profiles, self.ev_bits = ev_count, profiles, ev_bits
        self.outstanding = outstanding
        self.counter_width = cw = check_counter_width(counter_width)
        # The blocks are made here so that a bad parameter fails at construction.
        self.seg = TxSegmenter(qps, msgs, counter_width=cw)
        self.sel = PathSelector(qps, ev_count, planes, profiles, ev_bits, counter_width=cw)
        self.trk = RetransmitTracker(qps, outstanding, 32, pending, counter_width=cw)
        self.tx = RoceTx(data_width, qps, counter_width=cw)
        self.encap = Srv6Encap(data_width, counter_width=cw)
        self.bus = CsrBus([("mrc-tx", MRC_TX_REGS.addr_width),
                           ("tx-segmenter", SEG_REGS.addr_width),
                           ("path-selector", SELECTOR_REGS.addr_width),
                           ("retransmit-tracker", RT_REGS.addr_width),
                           ("roce-tx", TX_REGS.addr_width),
                           ("srv6-encap", ENCAP_REGS.addr_width)])
        axis = AxiStreamSignature(data_width)
        members = {
            "wr": In(meta_stream(WR)), "done": Out(meta_stream(WR_DONE)),
            "preq": Out(meta_stream(PAYLOAD_REQ)), "s_axis": In(axis),
            "ack": In(meta_stream(ACK_DESC)), "peer": In(meta_stream(PEER_STATUS)),
            "cwnd": In(meta_stream(CWND_IN)),
            "port_up": In(planes), "credit": In(planes),
            "event": Out(meta_stream(EVENT)), "rtt": Out(meta_stream(RTT_SAMPLE)),
            "s_axil": In(AxiLiteSignature(self.bus.addr_width)),
        }
        for p in range(planes):
            members[f"m{p}_axis"] = Out(axis)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # The blocks, and the CSR bus over this block's registers and every block's.
        f = self._blocks(m)
        # The counters' event strobes, one bit each, raised by the parts below.
        events = Signal(data.StructLayout({name: 1 for name in COUNTERS}))
        # Time base: `now`, ticks of tick.cycles cycles, to the tracker and the register;
        # the 128 ns timestamps of probes and data packets.
        now = self._time_base(m, f)
        ts_now = self._timestamps(m, f)
        # Around the blocks: work requests, completions, releases, cwnd, EV events, ports.
        self._around_blocks(m)
        # Path feedback to the selector: the tracker's, losses, probe answers, peers' ports.
        self._path_feedback(m, events)
        # RTT samples from the timestamps SACKs and NACKs echo.
        self._rtt_samples(m, f, events, ts_now)
        # QPs in error: set by the tracker, cleared by qp_command.clear_error.
        error = self._qp_errors(m, f, events)
        # 1. The send gate: credit for a new packet, drop for a QP in error.
        gate = self._send_gate(m, error, events)
        # 2. The selector's request loop: one request per packet, 'none' goes round again.
        loop = self._request_loop(m, gate, events)
        # 3. The fork: the branches, each with a FIFO but RoceTx's descriptor.
        br = self._fork_branches(m)
        # 3. The fork: a probe first; a packet with its EV when every branch has room.
        dec = self._fork_go(m, gate, loop, br)
        # 3. The fork: the records into every branch it takes, the counters.
        self._fork_records(m, f, now, ts_now, events, loop, br, dec)
        # 3. The fork: the branch FIFOs out to Srv6Encap, the tracker's sent and preq.
        self._fork_drains(m, gate, br)
        # 4. Frames: RoceTx, Srv6Encap, the plane's port.
        self._frames(m, br.plane_fifo)
        # Event counters.
        event_counters(m, f, events, COUNTERS, f["control"]["clear"], width=self.counter_width)
        return m

    def _blocks(self, m):
        """The blocks as submodules; the CSR bus on ``s_axil`` to this block's registers
        and each block's, in the directory's order; ``info``. Returns the fields."""
        m.submodules.bus = bus = self.bus
        wiring.connect(m, wiring.flipped(self.s_axil), bus.s_axil)
        m.submodules.csr = csr = CsrBlock(MRC_TX_REGS)
        m.submodules.seg = seg = self.seg
        m.submodules.sel = sel = self.sel
        m.submodules.trk = trk = self.trk
        m.submodules.tx = tx = self.tx
        m.submodules.encap = encap = self.encap
        for k, block in enumerate((csr, seg, sel, trk, tx, encap)):
            wiring.connect(m, bus.m_axil[k], block.s_axil)
        f = csr.fields
        m.d.comb += [f["info"]["planes"].eq(self.planes), f["info"]["qps"].eq(self.qps)]
        return f

    def _time_base(self, m, f):
        """``now``: one tick every ``tick.cycles`` cycles; to the tracker and ``now``."""
        now = Signal(TIME_BITS)
        div = Signal(16)
        with m.If(div + 1 >= f["tick"]["cycles"]):
            m.d.sync += [div.eq(0), now.eq(now + 1)]
        with m.Else():
            m.d.sync += div.eq(div + 1)
        m.d.comb += [self.trk.now.eq(now), f["now"]["ticks"].eq(now)]
        return now

    def _timestamps(self, m, f):
        """``ts_now``: the 16-bit timestamp that probes and data packets carry, one unit
        (:data:`~mrcnic.base.records.TS_UNIT_NS`) every ``timestamp.cycles`` cycles."""
        ts_now = Signal(16)
        div = Signal(15)
        with m.If(div + 1 >= f["timestamp"]["cycles"]):
            m.d.sync += [div.eq(0), ts_now.eq(ts_now + 1)]
        with m.Else():
            m.d.sync += div.eq(div + 1)
        return ts_now

    def _rtt_samples(self, m, f, events, ts_now):
        """``rtt``: a sample for each SACK or NACK taken that echoes a timestamp of ours (a
        probe's answer always; any, with ``timestamp.tseth``), through a FIFO that drops
        when full."""
        m.submodules.rtt_fifo = fifo = SyncFIFO(width=RTT_SAMPLE.size, depth=RTT_DEPTH)
        a = self.ack.payload
        want = (self.ack.valid & self.ack.ready &
                ((a.pr & ~a.nack) | f["timestamp"]["tseth"]))
        sample = Signal(RTT_SAMPLE)
        m.d.comb += [sample.qp.eq(a.qp), sample.entropy.eq(a.entropy),
                     sample.probe.eq(a.pr & ~a.nack), sample.nack.eq(a.nack),
                     sample.rtt.eq(ts_now - a.timestamp),
                     fifo.w_data.eq(sample), fifo.w_en.eq(want),
                     events.rtt_samples.eq(want & fifo.w_rdy),
                     events.rtt_dropped.eq(want & ~fifo.w_rdy),
                     self.rtt.payload.eq(fifo.r_data), self.rtt.valid.eq(fifo.r_rdy),
                     fifo.r_en.eq(self.rtt.ready)]

    def _around_blocks(self, m):
        """The connections that pass around the blocks: ``wr`` and ``done`` of the
        segmenter, the tracker's releases, ``cwnd``, ``event``, the ports' state."""
        seg, sel, trk = self.seg, self.sel, self.trk
        wiring.connect(m, wiring.flipped(self.wr), seg.wr)
        wiring.connect(m, seg.done, wiring.flipped(self.done))
        wiring.connect(m, trk.release, seg.release)
        wiring.connect(m, wiring.flipped(self.cwnd), trk.cwnd)
        wiring.connect(m, sel.event, wiring.flipped(self.event))
        m.d.comb += [sel.port_up.eq(self.port_up), sel.credit.eq(self.credit)]

    def _fork_stream(self, m, src, dst, side, want, record):
        """``src`` to ``dst``; those records for which ``want`` also leave ``record`` on
        ``side`` (a record waits until both can take it)."""
        room = side.ready | ~want
        m.d.comb += [dst.payload.eq(src.payload), dst.valid.eq(src.valid & room),
                     src.ready.eq(dst.ready & room), side.valid.eq(src.valid & want &
                                                                   dst.ready)]
        for name, value in record.items():
            m.d.comb += getattr(side.payload, name).eq(value)

    def _path_feedback(self, m, events):
        """Path feedback, merged round robin into the selector's ``fb``: the tracker's,
        SACK holes as TIMEOUT (LOSS_FEEDBACK), probe answers, peers' port status."""
        sel, trk, seg = self.sel, self.trk, self.seg
        fb = MetaArbiter(EV_FEEDBACK, 4)
        m.submodules.fb_merge = fb
        wiring.connect(m, trk.feedback, fb.i[0])
        for name, _ in EV_FEEDBACK:
            m.d.comb += getattr(sel.fb.payload, name).eq(getattr(fb.o.payload, name))
        m.d.comb += [sel.fb.valid.eq(fb.o.valid), fb.o.ready.eq(sel.fb.ready)]

        # LOSS_FEEDBACK: a retransmission asked for a SACK hole reports its EV as TIMEOUT.
        rq = trk.rtx.payload
        self._fork_stream(m, trk.rtx, seg.rtx, fb.i[1], rq.cause == RtxCause.HOLE,
                          {"qp": rq.qp, "ev": rq.ev, "kind": FeedbackKind.TIMEOUT,
                           "entropy": 0})
        # A SACK answering a probe (pr = 1) is the probe's feedback, by its M (3 as NONE).
        a = self.ack.payload
        m.d.comb += events.probe_answers.eq(fb.i[2].valid & fb.i[2].ready)
        self._fork_stream(m, self.ack, trk.ack, fb.i[2], ~a.nack & a.pr,
                          {"qp": a.qp, "ev": a.entropy[:EV_INDEX_BITS], "entropy": a.entropy,
                           "kind": Mux(a.m == SackMode.SKIP_ONCE, FeedbackKind.PROBE_SKIP,
                                       Mux(a.m == SackMode.ALWAYS_SKIP, FeedbackKind.PROBE_BAD,
                                           FeedbackKind.PROBE_GOOD))})
        m.d.comb += events.losses.eq(fb.i[1].valid & fb.i[1].ready)
        # A peer's port status update is PEER_PORTS feedback for the QP it names.
        pr_in = self.peer
        m.d.comb += [fb.i[3].valid.eq(pr_in.valid), pr_in.ready.eq(fb.i[3].ready),
                     fb.i[3].payload.qp.eq(pr_in.payload.qp), fb.i[3].payload.ev.eq(0),
                     fb.i[3].payload.kind.eq(FeedbackKind.PEER_PORTS),
                     fb.i[3].payload.entropy.eq(pr_in.payload.ports),
                     events.peer_ports.eq(pr_in.valid & pr_in.ready)]

    def _qp_errors(self, m, f, events):
        """QPs in error (flip-flops): set by the tracker's ``qp_error``, cleared by
        ``qp_command.clear_error``, read in ``qp_status``. Returns the bits."""
        Q, trk = self.qps, self.trk
        error = Signal(Q)
        qsel = f["qp_select"]["qp"]
        m.d.comb += [trk.qp_error.ready.eq(1), events.qp_errors.eq(trk.qp_error.valid),
                     f["qp_status"]["error"].eq(Mux(qsel < Q, error.bit_select(qsel, 1), 0))]
        with m.If(f["qp_command"]["clear_error"] & (qsel < Q)):
            m.d.sync += error.bit_select(qsel, 1).eq(0)
        bad = trk.qp_error.payload.qp
        with m.If(trk.qp_error.valid & (bad < Q)):           # the tracker's own QP range
            m.d.sync += error.bit_select(bad, 1).eq(1)
        return error

    def _send_gate(self, m, error, events):
        """1. The send gate: the segmenter's next packet passes (a new one with its QP's
        credit, CREDIT_RULE; a retransmission as it is) or is dropped (its QP in error)."""
        Q, seg, trk = self.qps, self.seg, self.trk
        head = seg.pkt.payload
        in_flight = Signal(Q)             # a new packet of the QP is between gate and `sent`
        deciding = Signal()               # the credit asked last cycle is about `head`
        loop_count = Signal(range(LOOP_PACKETS + 1))      # packets in the request loop
        retry = Signal(SEG_PKT)
        retry_valid = Signal()
        q_err = error.bit_select(head.qp, 1) & (head.qp < Q)
        q_busy = in_flight.bit_select(head.qp, 1)
        m.d.comb += trk.credit_qp.eq(head.qp)
        loop_room = loop_count + retry_valid < LOOP_PACKETS
        gate_pass = Signal()
        gate_drop = Signal()
        with m.If(seg.pkt.valid):
            with m.If(q_err):
                m.d.comb += gate_drop.eq(1)
            with m.Elif(head.rtx):
                m.d.comb += gate_pass.eq(loop_room & ~retry_valid)
            with m.Elif(deciding):
                m.d.comb += [gate_pass.eq(trk.credit_ready & loop_room & ~retry_valid),
                             events.credit_wait.eq(~trk.credit_ready)]
        # ASK in one cycle (the QP has nothing in flight), DECIDE in the next.
        m.d.sync += deciding.eq(seg.pkt.valid & ~q_err & ~head.rtx & ~q_busy & ~deciding)
        m.d.comb += events.dropped_error.eq(gate_drop)
        return SimpleNamespace(head=head, in_flight=in_flight, loop_count=loop_count,
                               retry=retry, retry_valid=retry_valid, gate_pass=gate_pass,
                               gate_drop=gate_drop)

    def _request_loop(self, m, gate, events):
        """2. The selector's request loop: a request for the packet sent round again, else
        the gate's; the packet waits in a FIFO for the response. A response 'none', or for
        a port gone down (STALE_PORT), sends it round again."""
        sel, seg, head = self.sel, self.seg, gate.head
        retry, retry_valid, gate_pass = gate.retry, gate.retry_valid, gate.gate_pass
        req = sel.req
        from_retry = retry_valid
        src = Mux(from_retry, retry, head)
        src_view = data.View(SEG_PKT, src)
        m.d.comb += [req.payload.qp.eq(src_view.qp), req.payload.psn.eq(src_view.psn),
                     req.payload.rtx.eq(src_view.rtx), req.payload.avoid.eq(src_view.avoid),
                     req.valid.eq(from_retry | gate_pass)]
        requested = req.valid & req.ready
        m.d.comb += seg.pkt.ready.eq(gate.gate_drop | (gate_pass & req.ready))
        with m.If(gate_pass & req.ready & ~head.rtx):
            m.d.sync += gate.in_flight.bit_select(head.qp, 1).eq(1)
        waiting = SyncFIFOBuffered(width=SEG_PKT.size, depth=LOOP_PACKETS)
        m.submodules.waiting = waiting
        m.d.comb += [waiting.w_data.eq(src), waiting.w_en.eq(requested)]
        pkt = data.View(SEG_PKT, waiting.r_data)
        rsp = sel.rsp
        r = rsp.payload
        # STALE_PORT: a decision for a port that is down now goes round again as a 'none'.
        stale = ~r.none & ~self.port_up.bit_select(r.plane, 1)
        none = rsp.valid & (r.none | stale)
        round_again = none & ~retry_valid
        with m.If(requested & from_retry):
            m.d.sync += retry_valid.eq(0)
        with m.If(round_again):
            m.d.sync += [retry.eq(waiting.r_data), retry_valid.eq(1)]
        m.d.comb += [events.no_path.eq(round_again & r.none),
                     events.port_down.eq(round_again & stale)]
        return SimpleNamespace(waiting=waiting, pkt=pkt, rsp=rsp, r=r, none=none,
                               round_again=round_again)

    def _fork_branches(self, m):
        """3. The fork's branches: ``ins``, each branch's record, by name; a FIFO for each
        but RoceTx's descriptor (DESC_LOOKAHEAD); the plane FIFO."""
        branches = {
            "preq": (PAYLOAD_REQ, BRANCH_DEPTH),
            "encap": (ENCAP_DESC, BRANCH_DEPTH), "sent": (sent_layout(32), 4),
        }
        ins = {name: Signal(layout, name=f"{name}_in") for name, (layout, _) in branches.items()}
        # DESC_LOOKAHEAD: no FIFO before RoceTx. Its descriptor skid buffer (two) and first
        # stage (one) are all the frames decided ahead of the one it sends; its ready is a
        # register, so the fork offers a descriptor in the cycle it is taken, like a FIFO's
        # w_rdy.
        ins["desc"] = self.tx.desc.payload
        desc_room = self.tx.desc.ready
        fifos = {}
        for name, (layout, depth) in branches.items():
            fifo = SyncFIFOBuffered(width=layout.size, depth=depth)
            m.submodules[f"{name}_fifo"] = fifo
            fifos[name] = fifo
            m.d.comb += fifo.w_data.eq(ins[name])
        plane_fifo = SyncFIFOBuffered(width=3, depth=2 * BRANCH_DEPTH)
        m.submodules.plane_fifo = plane_fifo
        return SimpleNamespace(ins=ins, desc_room=desc_room, fifos=fifos, plane_fifo=plane_fifo)

    def _fork_go(self, m, gate, loop, br):
        """3. The fork's decision: a probe of the selector goes first; a packet with its EV
        goes when every branch it takes has room. Takes the response (or sends it round
        again)."""
        fifos, plane_fifo, pkt = br.fifos, br.plane_fifo, loop.pkt
        # A probe (the selector's, one per probe interval at most) goes first: under a
        # steady stream of data it would otherwise never leave. It takes the frame branches
        # only: no payload, no PSN, no sent record (spec §2.2: never retransmitted).
        pr = self.sel.probe
        probe_room = br.desc_room & fifos["encap"].w_rdy & plane_fifo.w_rdy
        go_probe = pr.valid & probe_room
        m.d.comb += pr.ready.eq(probe_room)
        has_payload = pkt.length != 0
        room = (br.desc_room & fifos["encap"].w_rdy & fifos["sent"].w_rdy
                & plane_fifo.w_rdy & (fifos["preq"].w_rdy | ~has_payload))
        go = loop.rsp.valid & ~loop.none & room & ~pr.valid
        m.d.comb += [loop.rsp.ready.eq(go | loop.round_again),
                     loop.waiting.r_en.eq(loop.rsp.ready), gate.loop_count.eq(loop.waiting.level)]
        return SimpleNamespace(pr=pr, go_probe=go_probe, has_payload=has_payload, go=go)

    def _fork_records(self, m, f, now, ts_now, events, loop, br, dec):
        """3. The fork's records: the RoceTx and Srv6Encap descriptors and the plane (of the
        probe or the packet), the tracker's ``sent`` record, the payload request; the
        write enables and the counters."""
        fifos, plane_fifo, pkt, r = br.fifos, br.plane_fifo, loop.pkt, loop.r
        pr, go_probe, has_payload, go = dec.pr, dec.go_probe, dec.has_payload, dec.go
        d, e, s, q = br.ins["desc"], br.ins["encap"], br.ins["sent"], br.ins["preq"]
        probe_id = Signal(16)
        with m.If(go_probe & ~pr.payload.announce):
            m.d.sync += probe_id.eq(probe_id + 1)
        expanded = Mux(pr.valid, pr.payload.expanded, r.expanded)
        with m.If(pr.valid):
            # A port status record of the selector (announce) is a port status update,
            # the port mask in the descriptor's imm; otherwise a probe.
            m.d.comb += [d.qp.eq(pr.payload.qp),
                         d.opcode.eq(Mux(pr.payload.announce, Opcode.EP_REQUEST, Opcode.PROBE)),
                         d.imm.eq(pr.payload.ports),
                         d.msn.eq(probe_id), d.entropy.eq(pr.payload.entropy),
                         d.timestamp.eq(ts_now),
                         e.entropy.eq(pr.payload.entropy), e.dscp.eq(proto.DSCP_DATA),
                         plane_fifo.w_data.eq(pr.payload.plane)]
        with m.Else():
            for name, _ in TX_DESC:
                if name not in ("entropy", "ts", "timestamp"):
                    m.d.comb += getattr(d, name).eq(getattr(pkt, name))
            m.d.comb += [d.entropy.eq(r.entropy), e.entropy.eq(r.entropy),
                         d.ts.eq(f["timestamp"]["tseth"]), d.timestamp.eq(ts_now),
                         e.dscp.eq(Mux(pkt.rtx, proto.DSCP_RTX, proto.DSCP_DATA)),
                         plane_fifo.w_data.eq(r.plane)]
        frame = go | go_probe
        m.d.comb += [
            e.mode.eq(f["config"]["mode"]), e.ev.eq(expanded << (256 - self.ev_bits)),
            e.outer_src.eq(ipv6_value(f, "outer_src")),
            e.ecn.eq(proto.ECN_ECT0), e.hop_limit.eq(f["config"]["hop_limit"]),
            s.qp.eq(pkt.qp), s.psn.eq(pkt.psn), s.ev.eq(r.ev), s.time.eq(now),
            s.tag.eq(pkt.tag), s.rtx.eq(pkt.rtx),
            q.qp.eq(pkt.qp), q.wr_id.eq(pkt.wr_id), q.offset.eq(pkt.offset),
            q.length.eq(pkt.length),
            self.tx.desc.valid.eq(frame), fifos["encap"].w_en.eq(frame),
            fifos["sent"].w_en.eq(go), fifos["preq"].w_en.eq(go & has_payload),
            plane_fifo.w_en.eq(frame),
            events.packets.eq(go & ~pkt.rtx), events.retransmissions.eq(go & pkt.rtx),
            events.payload_requests.eq(go & has_payload),
            events.probes.eq(go_probe & ~pr.payload.announce),
            events.announcements.eq(go_probe & pr.payload.announce),
        ]

    def _drain(self, m, fifo, port):
        """``fifo`` out on the stream ``port``."""
        m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                     fifo.r_en.eq(port.ready)]

    def _fork_drains(self, m, gate, br):
        """3. The fork's FIFOs out: to Srv6Encap's descriptor, the tracker's ``sent`` (which
        ends a new packet's time in flight, CREDIT_RULE) and ``preq``."""
        self._drain(m, br.fifos["encap"], self.encap.desc)
        self._drain(m, br.fifos["sent"], self.trk.sent)
        self._drain(m, br.fifos["preq"], self.preq)
        sent = self.trk.sent
        with m.If(sent.valid & sent.ready & ~sent.payload.rtx):
            m.d.sync += gate.in_flight.bit_select(sent.payload.qp, 1).eq(0)

    def _frames(self, m, plane_fifo):
        """4. Frames: the payload into RoceTx, RoceTx into Srv6Encap, each frame whole out
        on the port of its plane (the plane FIFO's)."""
        tx, encap = self.tx, self.encap
        wiring.connect(m, wiring.flipped(self.s_axis), tx.s_axis)
        wiring.connect(m, tx.m_axis, encap.s_axis)
        outs = [getattr(self, f"m{p}_axis") for p in range(self.planes)]
        done = frame_demux(m, encap.m_axis, plane_fifo.r_data, plane_fifo.r_rdy, outs)
        m.d.comb += plane_fifo.r_en.eq(done)
