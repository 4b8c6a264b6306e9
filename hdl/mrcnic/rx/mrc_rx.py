"""The receive half of the NIC: :class:`MrcRx` (``mrc-rx``).

Operation
    Per plane p, frames from the network on ``s{p}_axis`` pass :class:`~mrcnic.rx.srv6_decap.
    Srv6Decap` and :class:`~mrcnic.rx.roce_rx.RoceRx`. The planes' packet records meet in a
    :class:`~mrcnic.base.stream.MetaArbiter` (round robin) and go to one
    :class:`~mrcnic.rx.psn_tracker.PsnTracker`; the record's plane and whether it holds a
    payload ride in the tracker's 16-bit ``tag`` (:data:`TAG_PLANE`, :data:`TAG_SLOT`: the
    plane in bits 14:12, the slot in bit 15; RoceRx's own tag is the plane's count of slot
    records, which the verdict router keeps as well). Each verdict of a slot record goes
    back to its plane: PLACE places the payload (``pl{p}_axis`` with ``place{p}``), any
    other verdict drops it.

    The merged records pass :class:`~mrcnic.rx.memory_protect.MemoryProtect` before the
    tracker. Its access-error records (``nak``: qp, PSN, syndrome 0x62) are forked: each
    one goes both to the generator's ``nak`` input and out on ``access_nak`` (through a
    register slice, so that ``access_nak.ready`` reaches only registers); a record moves
    when both sides take it, so ``access_nak`` must be read (tie its ready high if unused).

    The tracker's SACK/NACK descriptors and the access-error records become frames in one
    :class:`~mrcnic.rx.ack_generator.AckGenerator` (SACK, NACK, and AETH NAK 0xD1 with
    syndrome 0x62). **Decision:** a SACK or NACK leaves on the plane of the EV it answers
    (the EV index, the low 8 bits of the echoed entropy, mod ``planes``: the path
    selector's plane of that EV); an AETH NAK answers no EV and leaves on plane ``qp`` mod
    ``planes``; both on ``a{p}_axis``. The tracker writes no descriptor, and the memory
    check no NAK, for a QP out of range, so the generator makes one frame per record. It
    takes at most one record a cycle (a NAK first when both wait) and sends the frames in
    the order it took them, so the planes of its frames are kept in one FIFO beside it,
    written at either handshake.

    The SACKs and NACKs received from the peer (``ack``: ACK_DESC, for the retransmit
    tracker), AETH NAKs (``nak``) and port status updates (``peer``:
    :data:`~mrcnic.base.records.PEER_STATUS`, for the path selector) of all planes are merged
    the same way; WRITE-with-immediate completions leave on ``cpl``.

    Registers: one AXI4-Lite port, ``s_axil``, a :class:`~mrcnic.base.csr.bus.CsrBus` over the
    blocks in this order: Srv6Decap and RoceRx of each plane, then the PSN tracker and the
    ACK generator (the directory names them).

Parameters
    ``planes`` 1 .. 8 (default 2); ``data_width`` (default 64); ``qps`` (default 8);
    ``mpr_max`` (default 8); ``buffer_bytes`` per plane (default 16384); ``regions`` of
    the memory-protection table (default 16); ``window_chunks`` of the PSN tracker (3 or 2,
    default 3); ``max_wimm_dest``, the PSN tracker's held completions (default 8);
    ``counter_width`` of every block's counters, 32, 16 or 0 (none; default 32);
    ``pmtu_max``, RoceRx's longest payload (default 4096; a jumbo PMTU such as 8192 needs
    it raised, with ``buffer_bytes`` per RoceRx's rule).

Latency, throughput
    Each plane takes one beat a cycle; the records of all planes share the tracker, one a
    cycle. Measured end to end in ``sim/rx/test_mrc_rx.py``.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mrcnic.base.records import (
    ACK_DESC, COMPLETION, PKT_IN, Verdict, NAK, PEER_STATUS, PLACE, RX_PKT)
from mrcnic.rx.ack_generator import ACK_REGS, AckGenerator
from mrcnic.base.csr.regs import AxiLiteSignature, check_counter_width
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

        # --- Control frames: SACK/NACK on the plane of the EV they answer, AETH NAKs on
        # plane qp mod planes. The generator takes at most one record a cycle, from desc or
        # nak (nak.valid holds desc.ready low), and sends the frames in the order it took
        # the records; so the plane FIFO, written at whichever handshake happens, holds the
        # planes in frame order. Both inputs wait while the FIFO is full.
        plane_fifo = SyncFIFOBuffered(width=3, depth=16)
        m.submodules.ack_planes = plane_fifo
        room = plane_fifo.w_rdy
        a = trk.ack
        ev_plane = Signal(3)
        m.d.comb += ev_plane.eq(a.payload.entropy[:8] % P if P > 1 else 0)
        desc_go = a.valid & gen.desc.ready & room
        m.d.comb += [gen.desc.payload.eq(a.payload), gen.desc.valid.eq(a.valid & room),
                     a.ready.eq(gen.desc.ready & room)]
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
                     plane_fifo.w_data.eq(Mux(nak_go, nak_plane, ev_plane)),
                     plane_fifo.w_en.eq(desc_go | nak_go)]
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

        # --- Received SACK/NACKs and NAKs, completions ---------------------------------------
        for name, layout in (("ack", ACK_DESC), ("nak", NAK), ("peer", PEER_STATUS)):
            stream, _ = merged(name, layout)
            out = getattr(self, name)
            for field, _ in layout:
                m.d.comb += getattr(out.payload, field).eq(getattr(stream.payload, field))
            m.d.comb += [out.valid.eq(stream.valid), stream.ready.eq(out.ready)]
        wiring.connect(m, trk.cpl, wiring.flipped(self.cpl))
        return m


