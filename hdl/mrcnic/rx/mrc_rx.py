"""The receive half of the NIC: :class:`MrcRx` (``mrc-rx``).

The receive half of :class:`~mrcnic.nic.MrcNic`, assembled from the blocks: per plane a
:class:`~mrcnic.rx.srv6_decap.Srv6Decap` and a :class:`~mrcnic.rx.roce_rx.RoceRx`; one
:class:`~mrcnic.rx.memory_protect.MemoryProtect` and one
:class:`~mrcnic.rx.psn_tracker.PsnTracker` for all planes behind a round-robin merge of their
records; one :class:`~mrcnic.rx.ack_generator.AckGenerator` whose frames leave on the planes;
every register behind one AXI4-Lite port.

Operation, decisions and verification: docs/blocks/mrc-rx.md.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mrcnic.base.records import (
    ACK_DESC, COMPLETION, EV_PROBE, PKT_IN, Verdict, NAK, PEER_STATUS, PLACE, RX_PKT)
from mrcnic.rx.ack_generator import ACK_REGS, AckGenerator
from mrcnic.base.csr import AxiLiteSignature, check_counter_width
from mrcnic.base.csr.bus import CsrBus
from mrcnic.rx.memory_protect import MP_REGS, MemoryProtect
from mrcnic.rx.psn_tracker import TRACKER_REGS, WINDOW_CHUNKS, PsnTracker
from mrcnic.rx.roce_rx import ROCE_RX_REGS, RoceRx
from mrcnic.rx.srv6_decap import DECAP_REGS, Srv6Decap
from mrcnic.base.stream import AxiStreamSignature, MetaArbiter, MetaSkidBuffer, meta_stream

__all__ = ["MrcRx", "TAG_PLANE", "TAG_SLOT"]

TAG_PLANE = slice(12, 15)       # the record's plane in the tracker's tag
TAG_SLOT = 15                   # ... and whether RoceRx holds a payload for it
MAX_PLANES = 8
MAX_QPS = 1 << 15               # a denied record goes to the tracker as QP index MAX_QPS


class MrcRx(wiring.Component):
    """The receive half of the NIC: frames from the planes in, payloads placed, SACKs,
    NACKs and AETH NAKs out on the planes.

    Frames from plane p (``s{p}_axis``) are decapsulated and parsed on their plane; a data
    packet's payload waits in that plane's RoceRx buffer. The planes' packet records meet
    in a round-robin :class:`~mrcnic.base.stream.MetaArbiter`, pass the memory check and go
    to the PSN tracker, their plane and whether a payload waits riding in the tracker's
    ``tag`` (:data:`TAG_PLANE`, :data:`TAG_SLOT`). A denied record still goes to the
    tracker, as an out-of-range QP index, so that its verdict (NO_QP) keeps its place. A
    verdict for a waiting payload goes back to its plane: PLACE places it (``pl{p}_axis``
    with ``place{p}``), any other verdict drops it. The tracker's SACKs and NACKs leave on
    the plane of the EV they answer (the low 8 bits of the echoed entropy mod ``planes``),
    the AETH NAKs for the memory check's access errors on plane ``qp`` mod ``planes``, both
    on ``a{p}_axis``; each access error is also copied to ``access_nak``. The peer's SACKs
    and NACKs, AETH NAKs and port status updates of all planes are merged onto ``ack``,
    ``nak`` and ``peer``; completions leave on ``cpl``.

    Parameters
    ----------
    planes : int
        Planes, 1 .. 8. Default 2.
    data_width : int
        Bus width in bits of every AXI-Stream port, one of 64, 128, 256, 512, 1024, 2048
        (as :class:`~mrcnic.rx.srv6_decap.Srv6Decap`, :class:`~mrcnic.rx.roce_rx.RoceRx` and
        :class:`~mrcnic.rx.ack_generator.AckGenerator` take it). Default 64.
    qps : int
        QPs, 1 .. 1024 (:class:`~mrcnic.rx.memory_protect.MemoryProtect`'s limit). Default 8.
    mpr_max : int
        The PSN tracker's largest receive window in 128-PSN units, a power of two 1 .. 64.
        Default 8.
    buffer_bytes : int
        Each plane's RoceRx payload buffer, a power of two at least as RoceRx requires for
        ``pmtu_max`` and ``data_width``. Default 16384.
    regions : int
        Memory regions of the memory-protection table, 1 .. 256. Default 16.
    window_chunks : int
        The PSN tracker's window chunks, 3 or 2. Default 3.
    max_wimm_dest : int
        WRITE-with-immediate completions the PSN tracker holds at once, 1 .. 32. Default 8.
    counter_width : int
        Width of every block's event counters: 32, 16 or 0 (none; they read 0). Default 32.
    pmtu_max : int
        RoceRx's longest payload, 256 .. 16384 (a jumbo PMTU such as 8192 needs it raised,
        and ``buffer_bytes`` with it). Default 4096.

    Attributes
    ----------
    s{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames from plane p; ``tuser[0]`` marks a bad one.
    a{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Control frames to plane p: SACK, NACK, AETH NAK.
    pl{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Payloads placed from plane p, one frame each.
    place{p} : stream of :data:`~mrcnic.base.records.PLACE`, out
        One record per place verdict of plane p; one with ``length`` > 0 belongs to the
        next frame on ``pl{p}_axis``.
    ack : stream of :data:`~mrcnic.base.records.ACK_DESC`, out
        The peer's SACKs and NACKs, all planes merged (the retransmit tracker's input).
    nak : stream of :data:`~mrcnic.base.records.NAK`, out
        The peer's AETH NAKs, all planes merged.
    peer : stream of :data:`~mrcnic.base.records.PEER_STATUS`, out
        The peer's port status updates, all planes merged (for the path selector).
    access_nak : stream of :data:`~mrcnic.base.records.NAK`, out
        A copy of each access-error record sent as an AETH NAK (the QP is in error). Must
        be read: a record moves only when both the generator and this port take it (tie
        ``access_nak.ready`` high if unused); it passes a register slice.
    cpl : stream of :data:`~mrcnic.base.records.COMPLETION`, out
        WRITE-with-immediate completions.
    s_axil : AXI4-Lite, in
        The register bus, :attr:`bus`.
    bus : :class:`~mrcnic.base.csr.bus.CsrBus`
        Its directory lists, in order, the ``srv6-decap`` of each plane, the ``roce-rx`` of
        each plane, the ``memory-protect``, the ``psn-tracker`` and the ``ack-generator``.

    Latency
    -------
    Not measured for the whole: each path is the sum of its blocks' latencies (see theirs)
    and of the merges between them.

    Throughput
    ----------
    Each plane takes one input beat a cycle; the packet records of all planes share the
    memory check and the PSN tracker, one record a cycle, and the control frames of all
    planes share the ACK generator.

    Raises
    ------
    ValueError
        If ``planes`` is not an int in 1 .. 8; ``qps`` is not an int in 1 .. 32768;
        ``window_chunks`` is not 2 or 3; ``max_wimm_dest`` is not an int in 1 .. 32;
        ``counter_width`` is not 0, 16 or 32; or ``data_width`` is not a whole number of
        bytes in 8 .. 4096. The blocks refuse the other parameters, and ``qps`` above 1024
        or a ``data_width`` they cannot take, with their own ValueError or TypeError when
        the design is elaborated.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, planes=2, data_width=64, qps=8, mpr_max=8, buffer_bytes=16384,
                 regions=16, window_chunks=3, max_wimm_dest=8, counter_width=32,
                 pmtu_max=4096):
        if not isinstance(planes, int) or not 1 <= planes <= MAX_PLANES:
            raise ValueError(f"planes = {planes!r} is outside 1 .. {MAX_PLANES}")
        if not isinstance(qps, int) or not 1 <= qps <= MAX_QPS:
            raise ValueError(f"qps = {qps!r} is outside 1 .. {MAX_QPS} (a denied record "
                             f"goes to the PSN tracker as QP index {MAX_QPS})")
        self.planes, self.data_width, self.qps = planes, data_width, qps
        self.mpr_max, self.buffer_bytes, self.regions = mpr_max, buffer_bytes, regions
        if window_chunks not in WINDOW_CHUNKS:
            raise ValueError(f"window_chunks = {window_chunks!r} is not one of {WINDOW_CHUNKS}")
        if not isinstance(max_wimm_dest, int) or not 1 <= max_wimm_dest <= 32:
            raise ValueError(f"max_wimm_dest = {max_wimm_dest!r} is outside 1 .. 32")
        self.window_chunks, self.max_wimm_dest = window_chunks, max_wimm_dest
        self.pmtu_max = pmtu_max
        self.counter_width = check_counter_width(counter_width)
        blocks = ([("srv6-decap", DECAP_REGS.addr_width)] * planes
                  + [("roce-rx", ROCE_RX_REGS.addr_width)] * planes
                  + [("memory-protect", MP_REGS.addr_width),
                     ("psn-tracker", TRACKER_REGS.addr_width),
                     ("ack-generator", ACK_REGS.addr_width)])
        self.bus = CsrBus(blocks)
        axis = AxiStreamSignature(data_width)
        members = {"s_axil": In(AxiLiteSignature(self.bus.addr_width))}
        for p in range(planes):
            members[f"s{p}_axis"] = In(axis)
            members[f"a{p}_axis"] = Out(axis)
            members[f"pl{p}_axis"] = Out(axis)
            members[f"place{p}"] = Out(meta_stream(PLACE))
        members["ack"] = Out(meta_stream(ACK_DESC))
        members["nak"] = Out(meta_stream(NAK))
        members["peer"] = Out(meta_stream(PEER_STATUS))
        members["access_nak"] = Out(meta_stream(NAK))
        members["cpl"] = Out(meta_stream(COMPLETION))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        P, W = self.planes, self.data_width
        m.submodules.bus = bus = self.bus
        wiring.connect(m, wiring.flipped(self.s_axil), bus.s_axil)

        decaps, rxs = [], []
        for p in range(P):
            d = Srv6Decap(W, counter_width=self.counter_width)
            r = RoceRx(W, buffer_bytes=self.buffer_bytes, pmtu_max=self.pmtu_max,
                       counter_width=self.counter_width)
            m.submodules[f"decap{p}"] = d
            m.submodules[f"rx{p}"] = r
            wiring.connect(m, wiring.flipped(getattr(self, f"s{p}_axis")), d.s_axis)
            wiring.connect(m, d.m_axis, r.s_axis)
            wiring.connect(m, d.meta, r.meta)
            wiring.connect(m, r.m_axis, wiring.flipped(getattr(self, f"pl{p}_axis")))
            wiring.connect(m, r.place, wiring.flipped(getattr(self, f"place{p}")))
            wiring.connect(m, bus.m_axil[p], d.s_axil)
            wiring.connect(m, bus.m_axil[P + p], r.s_axil)
            decaps.append(d)
            rxs.append(r)
        cw = self.counter_width
        m.submodules.protect = mp = MemoryProtect(self.regions, self.qps, counter_width=cw)
        m.submodules.tracker = trk = PsnTracker(self.qps, self.mpr_max, self.max_wimm_dest,
                                                window_chunks=self.window_chunks,
                                                counter_width=cw)
        m.submodules.ackgen = gen = AckGenerator(W, self.qps, counter_width=cw)
        wiring.connect(m, bus.m_axil[2 * P], mp.s_axil)
        wiring.connect(m, bus.m_axil[2 * P + 1], trk.s_axil)
        wiring.connect(m, bus.m_axil[2 * P + 2], gen.s_axil)

        def merged(name, layout):
            """The planes' ``name`` streams as one stream with ``src``."""
            if P == 1:
                return getattr(rxs[0], name), None
            arb = MetaArbiter(layout, P)
            m.submodules[f"{name}_arb"] = arb
            for p in range(P):
                wiring.connect(m, getattr(rxs[p], name), arb.i[p])
            return arb.o, arb.o.payload.src

        # --- Packet records: memory protection, then the tracker, the plane and slot in its
        # tag. The plane goes into the record's tag before the check (the check passes the
        # records through in order, tag untouched).
        pkt, src = merged("pkt", RX_PKT)
        plane = Signal(3)
        m.d.comb += plane.eq(src if src is not None else 0)
        for name, _ in RX_PKT:
            if name != "tag":
                m.d.comb += getattr(mp.pkt.payload, name).eq(getattr(pkt.payload, name))
        m.d.comb += [mp.pkt.payload.tag.eq(Cat(pkt.payload.tag[:TAG_PLANE.start], plane,
                                               pkt.payload.slot)),
                     mp.pkt.valid.eq(pkt.valid), pkt.ready.eq(mp.pkt.ready)]
        # Decision: a denied record still goes to the tracker, as QP index MAX_QPS (out of
        # range), so that its verdict (NO_QP: its payload dropped) keeps its place among its
        # plane's verdicts and no QP's state changes (the tracker counts it as no_qp).
        o = mp.out
        for name, _ in PKT_IN:
            if name != "qp":
                m.d.comb += getattr(trk.pkt.payload, name).eq(getattr(o.payload, name))
        m.d.comb += [trk.pkt.payload.qp.eq(Mux(o.payload.deny, MAX_QPS, o.payload.qp)),
                     trk.pkt.valid.eq(o.valid), o.ready.eq(trk.pkt.ready)]

        # --- Verdicts back to their planes, in each plane's order ----------------------------
        v = trk.verdict
        v_plane = v.payload.tag[TAG_PLANE]
        v_slot = v.payload.tag[TAG_SLOT]
        counts = [Signal(16, name=f"verdicts{p}") for p in range(P)]
        ready = Signal()
        m.d.comb += ready.eq(1)                     # a verdict with no payload is dropped
        for p in range(P):
            port = rxs[p].verdict
            mine = v.valid & v_slot & (v_plane == p)
            m.d.comb += [port.valid.eq(mine), port.payload.tag.eq(counts[p]),
                         port.payload.place.eq(v.payload.verdict == Verdict.PLACE)]
            with m.If(mine):
                m.d.comb += ready.eq(port.ready)
                with m.If(port.ready):
                    m.d.sync += counts[p].eq(counts[p] + 1)
        m.d.comb += v.ready.eq(ready)

        self._control_frames(m, gen, trk, mp, merged)

        # --- Received SACK/NACKs and NAKs, completions ---------------------------------------
        for name, layout in (("ack", ACK_DESC), ("nak", NAK), ("peer", PEER_STATUS)):
            stream, _ = merged(name, layout)
            out = getattr(self, name)
            for field, _ in layout:
                m.d.comb += getattr(out.payload, field).eq(getattr(stream.payload, field))
            m.d.comb += [out.valid.eq(stream.valid), stream.ready.eq(out.ready)]
        wiring.connect(m, trk.cpl, wiring.flipped(self.cpl))
        return m

    def _control_frames(self, m, gen, trk, mp, merged):
        """Control frames: SACK/NACK and EV answers on the plane of the EV they answer, AETH
        NAKs on plane qp mod planes. The generator takes at most one record a cycle, from
        desc, nak or probe (a higher input's valid holds a lower one's ready low), and
        sends the frames in the order it took the records; so the plane FIFO, written at
        whichever handshake happens, holds the planes in frame order. Every input waits
        while the FIFO is full."""
        P = self.planes
        plane_fifo = SyncFIFOBuffered(width=3, depth=16)
        m.submodules.ack_planes = plane_fifo
        room = plane_fifo.w_rdy

        def ev_plane_of(entropy):
            return entropy[:8] % P if P > 1 else 0
        a = trk.ack
        ev_plane = Signal(3)
        m.d.comb += ev_plane.eq(ev_plane_of(a.payload.entropy))
        desc_go = a.valid & gen.desc.ready & room
        m.d.comb += [gen.desc.payload.eq(a.payload), gen.desc.valid.eq(a.valid & room),
                     a.ready.eq(gen.desc.ready & room)]
        # The peer's EV probe requests of every plane, answered on the plane of their EV.
        evp, _ = merged("ev_probe", EV_PROBE)
        probe_plane = Signal(3)
        m.d.comb += probe_plane.eq(ev_plane_of(evp.payload.entropy))
        probe_go = evp.valid & gen.probe.ready & room
        m.d.comb += [*(getattr(gen.probe.payload, f).eq(getattr(evp.payload, f))
                       for f, _ in EV_PROBE),
                     gen.probe.valid.eq(evp.valid & room), evp.ready.eq(gen.probe.ready & room)]
        # The access-error records, forked: a record moves when the generator, the
        # access_nak slice and the plane FIFO all take it.
        m.submodules.access_nak_slice = copy = MetaSkidBuffer(NAK)
        wiring.connect(m, copy.o, wiring.flipped(self.access_nak))
        nk = mp.nak
        nak_plane = Signal(3)
        m.d.comb += nak_plane.eq(nk.payload.qp % P if P > 1 else 0)
        nak_go = nk.valid & gen.nak.ready & copy.i.ready & room
        m.d.comb += [gen.nak.payload.eq(nk.payload), copy.i.payload.eq(nk.payload),
                     gen.nak.valid.eq(nk.valid & copy.i.ready & room),
                     copy.i.valid.eq(nk.valid & gen.nak.ready & room),
                     nk.ready.eq(gen.nak.ready & copy.i.ready & room),
                     plane_fifo.w_data.eq(Mux(nak_go, nak_plane,
                                              Mux(probe_go, probe_plane, ev_plane))),
                     plane_fifo.w_en.eq(desc_go | nak_go | probe_go)]
        g = gen.m_axis
        out_plane = plane_fifo.r_data
        ready_out = Signal()
        for p in range(P):
            port = getattr(self, f"a{p}_axis")
            sel = plane_fifo.r_rdy & (out_plane == p)
            m.d.comb += [port.tdata.eq(g.tdata), port.tkeep.eq(g.tkeep),
                         port.tlast.eq(g.tlast), port.tuser.eq(g.tuser),
                         port.tvalid.eq(g.tvalid & sel)]
            with m.If(sel):
                m.d.comb += ready_out.eq(port.tready)
        m.d.comb += [g.tready.eq(ready_out & plane_fifo.r_rdy),
                     plane_fifo.r_en.eq(g.tvalid & g.tready & g.tlast)]
