"""SRv6 decapsulation on receive: :class:`Srv6Decap` (``srv6-decap``).

The first block of each plane in :class:`~mrcnic.rx.mrc_rx.MrcRx`, before
:class:`~mrcnic.rx.roce_rx.RoceRx`: it removes the outer IPv6 header (and SRH) of an SRv6
frame and reports what the frame's first IPv6 header carried, encapsulated or not. Two
stages, each a component of this file: :class:`OuterParse` (reads and checks the outer
headers) and :class:`HeaderRemove` (removes them).

Operation, decisions and measured figures: docs/blocks/srv6.md.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto

from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import ETH, IPV6, EvMode
from mrcnic.base.stream import (
    AxiStreamSignature, FrameCursor, check_data_width, const_lt, drive_axis, keep_count,
    length_countdown, meta_stream, register_stages, skid_chain, stream_fifo)
from mrcnic.base.records import DECAP_META

__all__ = ["DECAP_REGS", "Srv6Decap", "OuterParse", "HeaderRemove"]


DECAP_COUNTERS = ["frames", "stripped", "in_bad", "version", "length", "srh", "inner",
                  "truncated", "too_long"]
MAX_FRAME_DEFAULT = 9216 + proto.OUTER_SRH_LEN      # a jumbo inner frame, encapsulated

DECAP_REGS = RegisterMap("srv6_decap", [
    Register("config", [Field("srh_any_left", 1, "rw",
                              desc="Accept an SRH with segments left 1 (a link with no SRv6 "
                                   "switch, such as NIC to NIC); 0: only 0")]),
    Register("max_frame", [Field("bytes", 16, "rw", reset=MAX_FRAME_DEFAULT,
                                 desc="Frames longer than this on the wire are bad")]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("frames", "Frames in"),
        ("stripped", "Frames whose outer header (and SRH) was removed"),
        ("in_bad", "Frames that arrived with tuser[0] set"),
        ("version", "IPv6 frames with an outer version other than 6"),
        ("length", "Stripped frames whose length disagrees with the outer payload length"),
        ("srh", "Frames with an SRH other than MRC's one-segment, exhausted form"),
        ("inner", "Stripped frames whose inner header is not IPv6"),
        ("truncated", "Stripped frames that end inside the inner IPv6 header"),
        ("too_long", "Frames longer than max_frame"),
    ]],
])

REMOVE_CHOICES = (0, proto.OUTER_IPV6_LEN, proto.OUTER_SRH_LEN)     # index: HeaderRemove "h"

IP = ETH.size
POS_ETHERTYPE = ETH.offset("ethertype")[0]
POS_PLEN = IP + IPV6.offset("payload_length")[0]
POS_NH = IP + IPV6.offset("next_header")[0]
POS_HOP = IP + IPV6.offset("hop_limit")[0]
POS_DST = IP + IPV6.offset("dst")[0]
POS_SRH = IP + IPV6.size


class OuterParse(wiring.Component):
    """Stage 1 of :class:`Srv6Decap`: reads and checks the outer headers as the frame passes.

    The frame goes through a stall-all pipeline of :attr:`depth` registers, so that what to
    remove is known before its first beat leaves. ``rec`` (``h``: index into
    :data:`REMOVE_CHOICES`) is written once per frame at the beat that carries the outer
    Next Header (or at the last beat if the frame ends before it); ``meta`` at the frame's
    last beat. On ``m_axis`` the frame is unchanged but for ``tuser[0]`` on its last beat,
    which carries the verdict of the checks.

    Parameters
    ----------
    data_width : int
        Bus width in bits, one of 64, 128, 256, 512, 1024, 2048.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames; ``tuser[0]`` marks a bad one.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The same frames, ``tuser[0]`` on the last beat set when the frame is bad.
    rec : stream of {``h``: 2 bits}, out
        What to remove from each frame: 0, 40 or 64 bytes after the Ethernet header.
    meta : stream of :data:`~mrcnic.base.records.DECAP_META`, out
        One record per frame, written at its last beat.
    stats : Signal(one bit per counter of ``DECAP_COUNTERS``), out
        One-cycle pulses at each frame's last beat, for the event counters: ``frames``,
        ``stripped`` and each cause.
    srh_any_left : Signal(1), in
        The ``config.srh_any_left`` register.
    max_frame : Signal(16), in
        The ``max_frame`` register.
    depth : int
        Pipeline registers: ``20 // B + 3`` on a B-byte bus.

    Latency
    -------
    :attr:`depth` cycles from ``s_axis`` to ``m_axis``; ``rec`` and ``meta`` are valid in
    the cycle their beat is taken.

    Throughput
    ----------
    One beat per cycle. The input waits while ``m_axis`` holds a beat not taken, or while
    ``rec`` or ``meta`` has no room for the record of the beat at the input.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048.
    """

    def __init__(self, data_width):
        self.data_width = check_data_width(data_width, minimum=64, maximum=2048,
                                           power_of_two=True)
        self.depth = POS_NH // (data_width // 8) + 3
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "rec": Out(meta_stream({"h": 2})),
            "meta": Out(meta_stream(DECAP_META)),
            "stats": Out(data.StructLayout({n: 1 for n in DECAP_COUNTERS})),
            "srh_any_left": In(1), "max_frame": In(16),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        s = self.s_axis
        # Position in the frame, and header bytes up to the end of the inner IPv6 header
        # behind an SRH, each from the beat carrying it.
        accept = Signal()
        cap = FrameCursor(m, s, accept, header_bytes=IP + proto.OUTER_SRH_LEN + IPV6.size)
        beat, off, first = cap.beat, cap.off, cap.first
        now, field = cap.now, cap.field
        last_valid = Signal()
        en = ~last_valid | self.m_axis.tready

        def at_or_after(pos):
            return ~const_lt(beat, pos // B)

        # True on a last beat that ends before byte `nbytes` of the frame.
        def ends_before(nbytes):
            lb, ll = (nbytes - 1) // B, (nbytes - 1) % B
            return const_lt(beat, lb) | ((beat == lb) & ~s.tkeep[ll])

        # Decided at the outer Next Header: what to remove.
        is_ipv6 = field(POS_ETHERTYPE, 2) == proto.ETHERTYPE_IPV6
        version_ok = now(IP)[4:] == proto.IPV6_VERSION
        nh = now(POS_NH)
        h = Signal(2)
        with m.If(is_ipv6 & version_ok & (nh == proto.IPPROTO_IPV6)):
            m.d.comb += h.eq(1)
        with m.Elif(is_ipv6 & version_ok & (nh == proto.IPPROTO_ROUTING)):
            m.d.comb += h.eq(2)
        rec_beat = POS_NH // B
        short = s.tlast & const_lt(beat, rec_beat)
        push_rec = (beat == rec_beat) | short

        # Per-frame verdicts, sticky; the value on the last beat is the frame's.
        h_r = Signal(2)
        h_now = Mux(beat == rec_beat, Mux(short, 0, h), Mux(const_lt(beat, rec_beat), 0, h_r))
        room_r = Signal(range(-2 ** 17, 2 ** 17))
        room_left = Mux(first, self.max_frame, room_r)
        with m.If(accept):
            m.d.sync += room_r.eq(Mux(room_left < 0, room_left, room_left - B))
        sticky = {n: Signal(name=f"{n}_r")
                  for n in ("version", "srh", "inner", "in_bad", "too_long")}
        now_flags = {
            "version": cap.here(IP) & is_ipv6 & ~version_ok,
            "in_bad": s.tuser[0],
            # Against the bytes the limit leaves for this beat (a register counted down by
            # the bus width), so no adder sits on the path; sticky, so that a frame far
            # longer than the counters still counts.
            "too_long": keep_count(s.tkeep) > room_left,
        }
        srh_ok = ((now(POS_SRH) == proto.IPPROTO_IPV6) & (now(POS_SRH + 1) == 2) &
                  (now(POS_SRH + 2) == proto.SRH_ROUTING_TYPE) &
                  ((now(POS_SRH + 3) == 0) | (self.srh_any_left & (now(POS_SRH + 3) == 1))) &
                  (now(POS_SRH + 4) == 0))
        now_flags["srh"] = cap.here(POS_SRH + 4) & (h_now == 2) & ~srh_ok
        inner_ip = {1: IP + proto.OUTER_IPV6_LEN, 2: IP + proto.OUTER_SRH_LEN}
        now_flags["inner"] = ((cap.here(inner_ip[1]) & (h_now == 1) &
                               (now(inner_ip[1])[4:] != proto.IPV6_VERSION)) |
                              (cap.here(inner_ip[2]) & (h_now == 2) &
                               (now(inner_ip[2])[4:] != proto.IPV6_VERSION)))
        flags = {n: Mux(first, 0, sticky[n]) | now_flags[n] for n in sticky}

        # Length: the frame ends where the outer payload length says.
        # rem: bytes left by the outer header from this beat on; a register where it is used
        # (the last beat of a frame that holds the inner IPv6 header; shorter ones are
        # truncated, and then `length` is not reported).
        rem, rem_ok = length_countdown(
            m, cap, pos=POS_PLEN, bias=IP + IPV6.size,
            first_use_beat=(IP + proto.OUTER_IPV6_LEN + IPV6.size - 1) // B)
        exp_keep = Cat(*(rem > j for j in range(B)))
        length_bad = ~rem_ok | (rem < 1) | (rem > B) | (s.tkeep != exp_keep)
        truncated = ((h_now == 1) & ends_before(inner_ip[1] + IPV6.size)) | \
                    ((h_now == 2) & ends_before(inner_ip[2] + IPV6.size))
        stripped = h_now != 0
        verdict = {
            "in_bad": flags["in_bad"],
            "too_long": flags["too_long"],
            "version": flags["version"],
            "srh": stripped & flags["srh"],
            "inner": stripped & flags["inner"] & ~truncated,
            "truncated": stripped & truncated,
            "length": stripped & length_bad & ~truncated,
        }
        bad = Cat(*verdict.values()).any()

        # Records out; the input waits for room in both.
        # The first IPv6 header's fields (the outer one when encapsulated) for any IPv6 frame
        # long enough to hold it, zero otherwise: the receive side reads ECN from here.
        meta = self.meta.payload
        hdr_ok = is_ipv6 & ~ends_before(IP + IPV6.size)
        m.d.comb += [
            self.rec.payload.h.eq(Mux(short, 0, h)),
            meta.mode.eq(Mux(h_now == 2, EvMode.SRV6_SRH,
                             Mux(h_now == 1, EvMode.SRV6, EvMode.PASS))),
            meta.srh.eq(h_now == 2),
            meta.bad.eq(bad),
        ]
        with m.If(hdr_ok):
            m.d.comb += [
                meta.dscp.eq(now(IP)[0:4] << 2 | now(IP + 1)[6:8]),
                meta.ecn.eq(now(IP + 1)[4:6]),
                meta.flow_label.eq(Cat(now(IP + 3), now(IP + 2), now(IP + 1)[0:4])),
                meta.hop_limit.eq(now(POS_HOP)),
                meta.residue.eq(field(POS_DST, 16)),
            ]
        room = (~push_rec | self.rec.ready) & (~s.tlast | self.meta.ready)
        m.d.comb += accept.eq(s.tvalid & en & room)
        m.d.comb += [
            s.tready.eq(en & room),
            self.rec.valid.eq(s.tvalid & en & push_rec & (~s.tlast | self.meta.ready)),
            self.meta.valid.eq(s.tvalid & en & s.tlast & (~push_rec | self.rec.ready)),
        ]
        with m.If(accept):
            m.d.sync += h_r.eq(h_now)
            m.d.sync += [sticky[n].eq(flags[n]) for n in sticky]

        # The frame itself goes through the pipeline; tuser[0] of its last beat = verdict.
        stage = register_stages(m, en, {"valid": accept, "data": s.tdata, "keep": s.tkeep,
                                         "last": s.tlast, "user": s.tlast & bad},
                                self.depth, "p")[-1]
        m.d.comb += last_valid.eq(stage["valid"])
        drive_axis(m, self.m_axis, **stage)
        counted = accept & s.tlast
        m.d.comb += [self.stats.frames.eq(counted), self.stats.stripped.eq(counted & stripped)]
        m.d.comb += [getattr(self.stats, n).eq(counted & v) for n, v in verdict.items()]
        cap.capture()
        return m


class HeaderRemove(wiring.Component):
    """Stage 2 of :class:`Srv6Decap`: removes 0, 40 or 64 bytes after the Ethernet header.

    With H = q*B + s, output beat j is lanes ``s..B-1`` of input beat j + q followed by lanes
    ``0..s-1`` of input beat j + q + 1, with the Ethernet header in front. The input sits in a
    two-entry window so that both beats are visible: each cycle that the output can move, the
    block consumes one input beat (two when the frame's last beat fits entirely into the
    current output beat) and makes at most one output beat. ``rec`` gives H per frame. A
    frame that ends inside the removed bytes leaves as its Ethernet header alone. Output
    registered.

    Parameters
    ----------
    data_width : int
        Bus width in bits, one of 64, 128, 256, 512, 1024, 2048.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames, from :class:`OuterParse`.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The frames with H bytes removed after the Ethernet header; ``tuser[0]`` of the last
        input beat goes to the last output beat.
    rec : stream of {``h``: 2 bits}, in
        One per frame, taken at its first beat: H = :data:`REMOVE_CHOICES` [``h``].

    Latency
    -------
    3 + q cycles from a frame's first input beat to its first output beat (2 + q for a
    one-beat frame), q = H // B the input beats removed whole.

    Throughput
    ----------
    One input beat per cycle sustained, frames back to back, with no extra cycle at the end
    of a frame: a frame of L bytes leaves in ceil((L - H) / B) beats.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048.
    """

    def __init__(self, data_width):
        self.data_width = check_data_width(data_width, minimum=64, maximum=2048,
                                           power_of_two=True)
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "rec": In(meta_stream({"h": 2})),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        s = self.s_axis
        q = {h: n // B for h, n in enumerate(REMOVE_CHOICES)}
        sh = {h: n % B for h, n in enumerate(REMOVE_CHOICES)}

        # Two-entry window: w[0] is the oldest beat. Filled from s_axis behind the pops.
        wv = [Signal(name=f"w{i}_valid") for i in range(2)]
        wd = [Signal(8 * B, name=f"w{i}_data") for i in range(2)]
        wk = [Signal(B, name=f"w{i}_keep") for i in range(2)]
        wl = [Signal(name=f"w{i}_last") for i in range(2)]
        wu = [Signal(name=f"w{i}_user") for i in range(2)]

        c = Signal(16)                  # input beats consumed in this frame (saturating)
        h_r = Signal(2)
        eth = Signal(8 * IP)
        o_valid, o_data, o_keep, o_last, o_user = (Signal(), Signal(8 * B), Signal(B),
                                                   Signal(), Signal())
        first = c == 0
        cur_h = Mux(first, self.rec.payload.h, h_r)

        # Per h: whether the oldest beat is still inside the removed bytes, and the lanes.
        removing = Signal()
        out_data, out_keep = Signal(8 * B), Signal(B)
        fits = Signal()                 # w1 is the last beat and ends within this output
        with m.Switch(cur_h):
            for h in range(len(REMOVE_CHOICES)):
                with m.Case(h):
                    n = sh[h]
                    m.d.comb += removing.eq(const_lt(c, q[h]))
                    for l in range(B):
                        src = l + n
                        if src < B:
                            m.d.comb += [out_data.word_select(l, 8).eq(wd[0].word_select(src, 8)),
                                         out_keep[l].eq(wk[0][src])]
                        else:
                            use = wv[1] & ~wl[0]
                            m.d.comb += [
                                out_data.word_select(l, 8).eq(wd[1].word_select(src - B, 8)),
                                out_keep[l].eq(use & wk[1][src - B]),
                            ]
                    m.d.comb += fits.eq(wl[1] & (~wk[1][n] if n else 0))

        # The Ethernet header goes in front of output beats 0 (and 1 when B = 8).
        j = Signal(range(4))
        eth_now = Signal(8 * IP)
        for e in range(IP):
            m.d.comb += eth_now.word_select(e, 8).eq(
                Mux(c == e // B, wd[0].word_select(e % B, 8), eth.word_select(e, 8)))
        final_data, final_keep = Signal(8 * B), Signal(B)
        m.d.comb += [final_data.eq(out_data), final_keep.eq(out_keep)]
        for e in range(IP):
            jj, l = divmod(e, B)
            with m.If((j == jj) & (cur_h != 0)):
                m.d.comb += [final_data.word_select(l, 8).eq(eth_now.word_select(e, 8)),
                             final_keep[l].eq(1)]

        out_free = ~o_valid | self.m_axis.tready
        have_rec = ~first | self.rec.valid
        # Producing needs the next beat too, unless this one is the frame's last.
        can_go = out_free & wv[0] & have_rec & (removing | wl[0] | wv[1])
        produce = can_go & ~removing
        pop2 = produce & ~wl[0] & fits
        # A frame that ends inside the removed bytes leaves as its Ethernet header alone
        # (two beats when B = 8: its last input beat stays until the second one).
        eth_only = can_go & removing & wl[0]
        eth_beats = -(-IP // B)
        eth_done = eth_only & (j == eth_beats - 1)
        pop1 = can_go & ~pop2 & ~(eth_only & ~eth_done)
        frame_end = produce & (wl[0] | pop2)

        with m.If(produce):
            m.d.sync += [o_valid.eq(1), o_data.eq(final_data), o_keep.eq(final_keep),
                         o_last.eq(frame_end),
                         o_user.eq(Mux(pop2, wu[1], wu[0]) & frame_end)]
            m.d.sync += j.eq(Mux(j == 3, j, j + 1))
        with m.Elif(self.m_axis.tready):
            m.d.sync += o_valid.eq(0)
        with m.If(can_go):
            with m.If(first):
                m.d.sync += h_r.eq(self.rec.payload.h)
            m.d.sync += eth.eq(eth_now)
            with m.If(frame_end | eth_done):
                m.d.sync += [c.eq(0), j.eq(0)]
            with m.Elif(~eth_only):
                m.d.sync += c.eq(Mux(c == 0xFFFF, c, c + 1))
        m.d.comb += self.rec.ready.eq(can_go & first)

        with m.If(eth_only):
            eth_pad = Cat(eth_now, Const(0, 8 * B * eth_beats - 8 * IP))
            with m.Switch(j):
                for jj in range(eth_beats):
                    with m.Case(jj):
                        n = min(B, IP - jj * B)
                        m.d.sync += [o_data.eq(eth_pad.word_select(jj, 8 * B)),
                                     o_keep.eq((1 << n) - 1)]
            m.d.sync += [o_valid.eq(1), o_last.eq(eth_done), o_user.eq(wu[0] & eth_done),
                         j.eq(Mux(eth_done, 0, j + 1))]

        # Window refill: shift out what was consumed, take a new beat into the first hole.
        pops = Mux(pop2, 2, Mux(pop1, 1, 0))
        after = [Signal(name=f"after{i}_valid") for i in range(2)]
        # Entry 1 moves to 0 on a single pop.
        m.d.comb += [
            after[0].eq(Mux(pops == 0, wv[0], Mux(pops == 1, wv[1], 0))),
            after[1].eq(Mux(pops == 0, wv[1], 0)),
        ]
        m.d.comb += s.tready.eq(~after[1])
        take = s.tvalid & ~after[1]
        with m.If(pops == 1):
            m.d.sync += [wd[0].eq(wd[1]), wk[0].eq(wk[1]), wl[0].eq(wl[1]), wu[0].eq(wu[1])]
        # The new beat lands in the first free entry after the pops.
        with m.If(take & ~after[0]):
            m.d.sync += [wd[0].eq(s.tdata), wk[0].eq(s.tkeep), wl[0].eq(s.tlast),
                         wu[0].eq(s.tuser[0])]
        with m.If(take & after[0]):
            m.d.sync += [wd[1].eq(s.tdata), wk[1].eq(s.tkeep), wl[1].eq(s.tlast),
                         wu[1].eq(s.tuser[0])]
        m.d.sync += [wv[0].eq(after[0] | take), wv[1].eq(after[0] & after[1] | (after[0] & take))]

        drive_axis(m, self.m_axis, valid=o_valid, data=o_data, keep=o_keep, last=o_last,
                   user=o_user)
        return m


class Srv6Decap(wiring.Component):
    """SRv6 decapsulation: removes a frame's outer IPv6 header (and SRH) and reports what
    the frame's first IPv6 header carried.

    A frame of Ethernet type IPv6, outer version 6 and outer Next Header 41 (IPv6-in-IPv6)
    or 43 (Routing: MRC's one-segment SRH) loses the 40 bytes of its outer header, or the 64
    of outer header and SRH, after its Ethernet header; any other frame leaves unchanged.
    Checks: ``version`` (Ethernet type IPv6, outer version not 6: passed, not stripped);
    on a stripped frame ``length`` (not 54 + the outer payload length), ``srh`` (not
    routing type 4, header length 2, segments left 0, or 1 with the ``srh_any_left``
    register, last entry 0, Next Header 41), ``inner`` (inner version not 6) and
    ``truncated`` (ends inside the inner IPv6 header); on any frame ``too_long`` (longer
    than the ``max_frame`` register) and ``in_bad`` (``tuser[0]`` on input). A bad frame
    still leaves, with ``tuser[0]`` on its last beat and ``meta.bad`` set, and is counted
    by cause; the next frame is unaffected.

    Parameters
    ----------
    data_width : int
        Bus width in bits, one of 64, 128, 256, 512, 1024, 2048. Default 512.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames from the network; ``tuser[0]`` marks a bad one.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The frames, decapsulated; ``tuser[0]`` on the last beat of a bad one.
    meta : stream of :data:`~mrcnic.base.records.DECAP_META`, out
        One record per frame, in order, no later than the frame's last beat: ``mode``
        (PASS, SRV6, SRV6_SRH), the first IPv6 header's ``dscp``, ``ecn``, ``flow_label``,
        ``hop_limit`` and destination (``residue``, the uSID residue, spec §2.4), ``srh``,
        ``bad``. A frame's last beat waits for room for its record.
    s_axil : AXI4-Lite, in
        Registers, :data:`DECAP_REGS`.
    latency : int
        Cycles from a frame's first input beat to its first output beat in PASS mode.

    Latency
    -------
    ``20 // B + 9 + q`` cycles from a frame's first input beat to its first output beat on a
    B-byte bus, for a frame of more than one beat, where q = H // B beats are removed whole
    (11, 16, 19 for PASS, SRV6, SRV6_SRH at 64 bits; 9, 9, 10 at 512 bits); one less for a
    one-beat frame. :attr:`latency` is the PASS figure.

    Throughput
    ----------
    One input beat per cycle sustained, frames back to back; a frame of L bytes leaves in
    ceil((L - H) / B) beats.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, or ``counter_width`` is not
        0, 16 or 32.
    """

    def __init__(self, data_width=512, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        self.data_width = data_width
        self.parse = OuterParse(data_width)
        self.latency = self.parse.depth + 6
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "meta": Out(meta_stream(DECAP_META)),
            "s_axil": In(AxiLiteSignature(DECAP_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.parse = parse = self.parse
        m.submodules.remove = rm = HeaderRemove(self.data_width)
        skid_chain(m, self.s_axis, [parse, rm], self.m_axis)
        m.submodules.csr = csr = CsrBlock(DECAP_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        # Records of the frames inside the parse pipeline: at most one per stage, plus slack.
        stream_fifo(m, "rec_fifo", parse.rec, rm.rec, parse.depth + 4)
        stream_fifo(m, "meta_fifo", parse.meta, self.meta, parse.depth + 4)
        f = csr.fields
        m.d.comb += [parse.srh_any_left.eq(f["config"]["srh_any_left"]),
                     parse.max_frame.eq(f["max_frame"]["bytes"])]
        event_counters(m, f, parse.stats, DECAP_COUNTERS, f["control"]["clear"],
                       width=self.counter_width)
        return m


