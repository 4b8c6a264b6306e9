"""SRv6 and entropy encapsulation on transmit: :class:`Srv6Encap` (``srv6-encap``).

The last stage of :class:`~mrcnic.tx.mrc_tx.MrcTx` before the plane's port: each frame from
:class:`~mrcnic.tx.roce_tx.RoceTx` gets its path, the 32-bit entropy value in the inner flow
label and UDP source port (STEV, UDP modes), or an outer IPv6 header whose destination is the
SRv6 uSID path, with a one-segment SRH for 256-bit EVs (SRv6 modes, spec §2.1-2.4). Two
stages, each a component of this file: :class:`EntropyRewrite` (in-place rewrite, ICRC patch,
checks) and :class:`HeaderInsert` (the outer headers).

Operation, decisions and measured figures: docs/blocks/srv6.md.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base import crc, proto


from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import ETH, IPV6, SRH, UDP, EvMode
from mrcnic.base.stream import (AxiStreamSignature, FrameCursor, MetaSkidBuffer,
                     check_data_width, const_lt as _lt, keep_count, length_countdown,
                     drive_axis, meta_stream, register_stages, skid_chain, stream_fifo)


__all__ = ["ENCAP_DESC", "ENCAP_REGS", "INSERT_LEN", "MIN_ROCE_FRAME", "Srv6Encap",
           "EntropyRewrite", "HeaderInsert"]


ENCAP_DESC = data.StructLayout({
    "mode":      3,        # proto.EvMode
    "ev":        256,      # expanded EV, first field most significant (mrcnic.model.ev)
    "entropy":   32,       # SRv6 modes: the EV's index, echoed by the peer in SACK/NACK
    "outer_src": 128,
    "dscp":      6,
    "ecn":       2,
    "hop_limit": 8,
})

ENCAP_COUNTERS = ["frames", "bytes", "in_bad", "not_roce", "truncated", "length", "too_long",
                  "desc_wait"]

ENCAP_REGS = RegisterMap("srv6_encap", [
    Register("config", [
        Field("udp_dport", 16, "rw", reset=proto.UDP_DPORT_DEFAULT,
              desc="MRC UDP destination port a frame must carry (non-PASS modes)"),
        Field("stev_swap", 1, "rw",
              desc="0: EV[15:0] to the UDP source port, EV[31:16] to the flow label; "
                   "1: the other way round"),
    ], desc="Configuration"),
    Register("max_frame", [Field("bytes", 16, "rw", reset=9216,
                                 desc="Frames whose IPv6 payload length says more are bad")]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("frames", "Frames in"),
        ("bytes", "Bytes in (all frames, wrapping)"),
        ("in_bad", "Frames that arrived with tuser[0] set"),
        ("not_roce", "Non-PASS frames that are not Ethernet/IPv6/UDP to udp_dport"),
        ("truncated", "Non-PASS frames shorter than 78 bytes"),
        ("length", "Non-PASS frames whose length disagrees with the IPv6 payload length"),
        ("too_long", "Non-PASS frames longer than max_frame by their IPv6 payload length"),
        ("desc_wait", "Cycles a frame waited for its descriptor"),
    ]],
])

# Bytes inserted per mode (spec §2.1): the outer IPv6 header, and the SRH after it.
INSERT_LEN = {EvMode.PASS: 0, EvMode.STEV: 0, EvMode.UDP: 0,
              EvMode.SRV6: proto.OUTER_IPV6_LEN, EvMode.SRV6_SRH: proto.OUTER_SRH_LEN}
INSERT_CHOICES = (0, proto.OUTER_IPV6_LEN, proto.OUTER_SRH_LEN)   # index = HeaderInsert "h"
MIN_ROCE_FRAME = ETH.size + IPV6.size + UDP.size + proto.BTH.size + proto.ICRC_LEN   # 78

# Byte positions in the (inner) frame.
POS_ETHERTYPE = ETH.offset("ethertype")[0]                      # 12
POS_IP = ETH.size                                               # 14
POS_VERSION = POS_IP + IPV6.offset("version")[0]                # 14
POS_PLEN = POS_IP + IPV6.offset("payload_length")[0]            # 18
POS_NH = POS_IP + IPV6.offset("next_header")[0]                 # 20
POS_UDP = POS_IP + IPV6.size                                    # 54
POS_SPORT = POS_UDP + UDP.offset("src_port")[0]                 # 54
POS_DPORT = POS_UDP + UDP.offset("dst_port")[0]                 # 56


def _prefix_layout():
    return data.StructLayout({"h": 2, "prefix": 8 * (POS_IP + proto.OUTER_SRH_LEN)})


class EntropyRewrite(wiring.Component):
    """Stage 1 of :class:`Srv6Encap`: in-place rewrite, ICRC patch, checks.

    Each frame takes one ``desc`` record with its first beat. By the record's ``mode`` the
    inner flow label and UDP source port are rewritten in place (STEV, SRV6, SRV6_SRH: the
    entropy E in both; UDP: the port only; PASS: nothing) and the ICRC is patched in flight
    (the CRC of old XOR new port, advanced over the bytes after it one beat per cycle, then
    by the part of a beat left in ``ceil(log2(B)/2)`` stages), so that an ICRC wrong on
    input stays exactly as wrong. The inner headers are parsed and checked (not RoCEv2,
    truncated, length, too long: the frame leaves marked with ``tuser[0]``). The bytes
    :class:`HeaderInsert` puts in go to ``ins``, one record per frame.

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 2048.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames: Ethernet, IPv6, UDP, BTH, ..., ICRC; no FCS.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The same frames rewritten; ``tuser[0]`` on the last beat of a bad one.
    desc : stream of :data:`ENCAP_DESC`, in
        One descriptor per frame, taken with its first beat.
    ins : stream of ``h`` (2 bits, index into :data:`INSERT_CHOICES`) and ``prefix`` (the
        output's first 78 bytes), out
        Per frame, what :class:`HeaderInsert` puts in: written when the frame's IPv6
        payload length has been seen; the FIFO it feeds must have room, or the input waits.
    udp_dport, stev_swap, max_frame_reg : Signal(16), Signal(1), Signal(16), in
        The register values: the MRC UDP destination port a frame must carry; swap the
        halves of E; the largest IPv6 payload length taken as good.
    stats : Signal, out
        One bit per counted event of ``ENCAP_COUNTERS``, pulsed once per event, and
        ``bytes`` (16 bits), the bytes of each beat, counted once per beat.
    depth : int
        Pipeline registers, ``ceil(log2(B)/2)`` + 2.

    Latency
    -------
    :attr:`depth` register stages, a stall-all pipeline: every stage moves when the last
    one is empty or ``m_axis`` takes it.

    Throughput
    ----------
    One beat per cycle; a frame waits only for its descriptor.

    Raises
    ------
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, data_width):
        self.data_width = check_data_width(data_width, minimum=64, maximum=2048,
                                           power_of_two=True)
        B = data_width // 8
        self.k_bits = max(1, (B - 1).bit_length())      # the ICRC's lane in its beat
        self.crc_latency = (self.k_bits + 1) // 2
        # Registers: the launch of the ICRC advance, the advance, the output.
        self.depth = self.crc_latency + 2
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "desc": In(meta_stream(ENCAP_DESC)),
            "ins": Out(meta_stream(_prefix_layout())),
            "udp_dport": In(16), "stev_swap": In(1), "max_frame_reg": In(16),
            "stats": Out(data.StructLayout({n: 1 for n in ENCAP_COUNTERS if n != "bytes"}
                                           | {"bytes": 16})),
        })

    def elaborate(self, platform):
        m = Module()
        # Stage 0: the frame cursor and the per-frame values from the descriptor.
        fr = self._stage0_frame(m)
        # Stage 0: E by the mode, and the in-place rewrite of flow label and UDP source port.
        rw = self._stage0_rewrite(m, fr)
        # Stage 0: the per-frame checks (not RoCEv2, bad on input, truncated, too long).
        chk = self._stage0_checks(m, fr, rw)
        # Stage 0: the record HeaderInsert needs, pushed once the payload length is known.
        push = self._stage0_insert_record(m, fr, rw)
        # Stage 0: the handshakes of input, descriptor and record; the per-frame registers.
        self._stage0_handshake(m, fr, chk, push)
        # ICRC patch launch: the port's change, advanced a beat at a time, into the shift.
        icrc = self._icrc_launch(m, fr, rw)
        # Stages 1 .. depth: the pipeline registers, the last aligned with the shift's output.
        stages = self._stages_pipeline(m, fr, rw, chk, icrc)
        # ICRC patch: the correction on the lanes where the ICRC falls; the expected keep.
        pt = self._icrc_patch(m, fr, stages, icrc.shift)
        # The output register: the patch applied, the frame marked bad on its last beat.
        out = self._stage_out(m, fr, stages[-1], pt)
        # The counted events: frames, bytes, and each check failed.
        self._stats(m, out)
        # The frame cursor's counters and byte copies, on accepted beats (outside any If).
        fr.cap.capture()
        return m

    def _stage0_frame(self, m):
        """Stage 0's position in the frame, its stall, and the descriptor's values."""
        s, d = self.s_axis, self.desc.payload
        # Position in the frame, and the inner header bytes, each from the beat carrying it.
        accept = Signal()
        cap = FrameCursor(m, s, accept, header_bytes=MIN_ROCE_FRAME)
        last_valid = Signal()             # the last pipeline stage holds a beat
        en = ~last_valid | self.m_axis.tready

        # Per-frame values: from the descriptor on the first beat, then held.
        first = cap.first
        mode_r = Signal(3)
        ev_r = Signal(256)
        ent_r = Signal(32)
        hdr_r = Signal(128 + 6 + 2 + 8)   # outer_src, dscp, ecn, hop_limit
        mode = Mux(first, d.mode, mode_r)
        ev = Mux(first, d.ev, ev_r)
        ent = Mux(first, d.entropy, ent_r)
        outer = Mux(first, Cat(d.outer_src, d.dscp, d.ecn, d.hop_limit), hdr_r)
        return SimpleNamespace(
            accept=accept, cap=cap, beat=cap.beat, first=first, last_valid=last_valid, en=en,
            mode_r=mode_r, ev_r=ev_r, ent_r=ent_r, hdr_r=hdr_r, mode=mode, ev=ev, ent=ent,
            outer=outer)

    def _stage0_rewrite(self, m, fr):
        """E by the mode; the flow label and UDP source port rewritten in the beat."""
        B = self.data_width // 8
        s, cap, mode, ev = self.s_axis, fr.cap, fr.mode, fr.ev
        srv6 = (mode == EvMode.SRV6) | (mode == EvMode.SRV6_SRH)
        e32 = Signal(32)
        with m.Switch(mode):
            with m.Case(EvMode.STEV):
                m.d.comb += e32.eq(ev[224:256])
            with m.Case(EvMode.UDP):
                m.d.comb += e32.eq(Cat(ev[240:256], Const(0, 16)))
            with m.Default():
                m.d.comb += e32.eq(fr.ent)
        lo, hi = e32[:proto.STEV_PORT_BITS], e32[proto.STEV_PORT_BITS:]
        new_port = Mux(self.stev_swap & (mode != EvMode.UDP), hi, lo)
        new_flow = Mux(self.stev_swap, lo, hi)
        rewrite_flow = (mode == EvMode.STEV) | srv6
        rewrite_port = mode != EvMode.PASS

        plen = cap.field(POS_PLEN, 2)
        old_port = cap.field(POS_SPORT, 2)

        # In-place rewrites (flow label bits 19:16 zeroed, 15:0 written; UDP source port).
        out_data = Signal(8 * B)
        m.d.comb += out_data.eq(s.tdata)
        fl_hi_pos = POS_VERSION + 1          # byte 15: traffic class low nibble, flow[19:16]
        writes = [(fl_hi_pos, rewrite_flow, Cat(Const(0, 4), cap.lane(fl_hi_pos)[4:])),
                  (fl_hi_pos + 1, rewrite_flow, new_flow[8:16]),
                  (fl_hi_pos + 2, rewrite_flow, new_flow[0:8]),
                  (POS_SPORT, rewrite_port, new_port[8:16]),
                  (POS_SPORT + 1, rewrite_port, new_port[0:8])]
        for pos, cond, value in writes:
            with m.If(cond & (fr.beat == pos // B)):
                m.d.comb += out_data.word_select(pos % B, 8).eq(value)
        return SimpleNamespace(new_port=new_port, new_flow=new_flow, rewrite_port=rewrite_port,
                               plen=plen, old_port=old_port, out_data=out_data)

    def _stage0_checks(self, m, fr, rw):
        """The per-frame checks, sticky over the frame."""
        B = self.data_width // 8
        s, cap, first, beat = self.s_axis, fr.cap, fr.first, fr.beat
        now, field_now = cap.now, cap.field
        # Per-frame checks, sticky over the frame; a beat carries the value so far.
        ethertype = field_now(POS_ETHERTYPE, 2)
        not_roce_now = Signal()
        nr_r = Signal()
        # Each check is made on the beat that carries its field's last byte, if it does.
        here = cap.here
        m.d.comb += not_roce_now.eq(
            (here(POS_ETHERTYPE + 1) & (ethertype != proto.ETHERTYPE_IPV6)) |
            (here(POS_VERSION) & (now(POS_VERSION)[4:] != proto.IPV6_VERSION)) |
            (here(POS_NH) & (now(POS_NH) != proto.IPPROTO_UDP)) |
            (here(POS_DPORT + 1) & (field_now(POS_DPORT, 2) != self.udp_dport)))
        not_roce = Mux(first, 0, nr_r) | not_roce_now
        bad_in_r = Signal()
        bad_in = Mux(first, 0, bad_in_r) | s.tuser[0]
        frame_len = POS_IP + IPV6.size + rw.plen      # by the header
        # Ended before the smallest RoCEv2 frame: the last beat ends below byte 78.
        min_beat, min_lane = (MIN_ROCE_FRAME - 1) // B, (MIN_ROCE_FRAME - 1) % B
        truncated = s.tlast & (_lt(beat, min_beat) | ((beat == min_beat) & ~s.tkeep[min_lane]))
        too_long = ~_lt(beat, POS_PLEN // B) & (frame_len > self.max_frame_reg)
        return SimpleNamespace(not_roce=not_roce, nr_r=nr_r, bad_in=bad_in, bad_in_r=bad_in_r,
                               truncated=truncated, too_long=too_long)

    def _stage0_insert_record(self, m, fr, rw):
        """The ``ins`` record: ``h`` and the prefix; returns when it is pushed."""
        B = self.data_width // 8
        s, now, mode, beat = self.s_axis, fr.cap.now, fr.mode, fr.beat
        outer = fr.outer
        outer_src, dscp, ecn, hop_limit = outer[:128], outer[128:134], outer[134:136], \
            outer[136:144]
        # The record HeaderInsert needs, written once the payload length is known.
        ins_beat = (POS_PLEN + 1) // B
        h = Signal(2)
        with m.Switch(mode):
            for mv, hlen in INSERT_LEN.items():
                with m.Case(mv):
                    m.d.comb += h.eq(INSERT_CHOICES.index(hlen))
        short = s.tlast & _lt(beat, ins_beat)          # ended before its payload length
        eth_bytes = Cat(*(now(i) for i in range(POS_IP)))
        srh_on = mode == EvMode.SRV6_SRH
        outer_hdr = IPV6.assemble({
            "version": proto.IPV6_VERSION, "dscp": dscp, "ecn": ecn,
            "flow_label": rw.new_flow,
            "payload_length": (rw.plen + Mux(srh_on, proto.OUTER_SRH_LEN,
                                             proto.OUTER_IPV6_LEN))[:16],
            "next_header": Mux(srh_on, proto.IPPROTO_ROUTING, proto.IPPROTO_IPV6),
            "hop_limit": hop_limit, "src": outer_src, "dst": fr.ev[128:256],
        })
        srh_hdr = SRH.assemble({
            "next_header": proto.IPPROTO_IPV6, "hdr_ext_len": 2,
            "routing_type": proto.SRH_ROUTING_TYPE, "segments_left": 1, "last_entry": 0,
            "segment": fr.ev[0:128],
        })
        push = s.tvalid & ((beat == ins_beat) | short)
        m.d.comb += [
            self.ins.payload.h.eq(Mux(short, 0, h)),
            self.ins.payload.prefix.eq(Cat(eth_bytes, outer_hdr, srh_hdr)),
        ]
        return push

    def _stage0_handshake(self, m, fr, chk, push):
        """Stage 0's handshakes, and the per-frame registers loaded on accepted beats."""
        s, d, first, en, accept = self.s_axis, self.desc.payload, fr.first, fr.en, fr.accept
        desc_ok = ~first | self.desc.valid
        # Beats wait while the insert FIFO is full, whether or not they write to it: the
        # FIFO outlasts the frames in flight, and the handshakes stay shallow.
        m.d.comb += [
            accept.eq(s.tvalid & en & desc_ok & self.ins.ready),
            s.tready.eq(en & desc_ok & self.ins.ready),
            self.desc.ready.eq(en & first & s.tvalid & self.ins.ready),
            self.ins.valid.eq(push & en & desc_ok),
        ]
        m.d.comb += self.stats.desc_wait.eq(s.tvalid & first & ~self.desc.valid)

        with m.If(accept):
            with m.If(first):
                m.d.sync += [fr.mode_r.eq(d.mode), fr.ev_r.eq(d.ev), fr.ent_r.eq(d.entropy),
                             fr.hdr_r.eq(fr.outer)]
            m.d.sync += [chk.nr_r.eq(chk.not_roce), chk.bad_in_r.eq(chk.bad_in)]

    def _icrc_launch(self, m, fr, rw):
        """ICRC patch launch: the port's change, advanced a beat at a time, into the shift."""
        B = self.data_width // 8
        cap, beat, en, accept = fr.cap, fr.beat, fr.en, fr.accept
        # ICRC patch: launched on the beat that carries the UDP source port.
        # ICRC patch. The change of the port bytes moves the CRC register by S.delta right
        # after the port; the patch is that state advanced over the zero bytes up to the
        # ICRC. The advance is done a beat at a time while the frame streams (state `e`, at
        # the start of each beat after the port's: one fixed 32x32 XOR map per beat), and the
        # last part, less than a beat, in CrcShiftPipeline, tagged on the beat where the ICRC
        # starts. So the pipeline is only log2(B)/2 stages deep, whatever the frame length.
        port_beat = (POS_SPORT + 1) // B
        n_p = POS_SPORT + 2 - port_beat * B       # port beat bytes up to the port's end
        delta = Mux(rw.rewrite_port, rw.old_port ^ rw.new_port, 0)
        m_s = crc.field_matrix(2)
        m_next = crc.mat_mul(crc.zero_bytes_matrix(B - n_p), m_s)
        e = Signal(32)
        with m.If(accept):
            with m.If(beat == port_beat):
                m.d.sync += e.eq(crc.gf2_apply(m_next, delta))
            with m.Else():
                m.d.sync += e.eq(crc.gf2_apply(crc.zero_bytes_matrix(B), e))
        # rel = ICRC start - this beat's offset (a register where the ICRC can be).
        first_icrc_beat = (MIN_ROCE_FRAME - proto.ICRC_LEN) // B
        rel, rel_ok = length_countdown(m, cap, pos=POS_PLEN,
                                       bias=POS_IP + IPV6.size - proto.ICRC_LEN,
                                       first_use_beat=first_icrc_beat)
        at_port = beat == port_beat
        icrc_here = rel_ok & (rel >= 0) & (rel < B) & ~_lt(beat, port_beat)
        launch_v, launch_k, launch_tag = Signal(32), Signal(self.k_bits), Signal()
        with m.If(en):
            m.d.sync += [
                launch_v.eq(Mux(at_port, crc.gf2_apply(m_s, delta), e)),
                launch_k.eq(Mux(at_port, rel - n_p, rel)[:self.k_bits]),
                launch_tag.eq(accept & icrc_here),
            ]
        m.submodules.shift = shift = crc.CrcShiftPipeline(self.k_bits)
        m.d.comb += [shift.en.eq(en), shift.v.eq(launch_v), shift.k.eq(launch_k),
                     shift.tag.eq(launch_tag)]
        return SimpleNamespace(shift=shift, rel=rel, rel_ok=rel_ok)

    def _stages_pipeline(self, m, fr, rw, chk, icrc):
        """Stages 1 .. depth; returns the list of stages, stage 0 first."""
        s = self.s_axis
        # --- stages 1 .. depth: the pipeline ---------------------------------------------
        # rem: bytes of the frame (by its header) from this beat's first byte on.
        rem0 = Signal(range(-2 ** 17, 2 ** 17))
        m.d.comb += rem0.eq(icrc.rel + proto.ICRC_LEN)
        stage0 = {
            "valid": fr.accept, "data": rw.out_data, "keep": s.tkeep, "last": s.tlast,
            "bad_in": chk.bad_in, "pass_": fr.mode == EvMode.PASS, "not_roce": chk.not_roce,
            "truncated": chk.truncated, "too_long": chk.too_long, "rem": rem0,
            "rem_ok": icrc.rel_ok,
        }
        stages = register_stages(m, fr.en, stage0, self.depth - 1, "s")
        return stages

    def _icrc_patch(self, m, fr, stages, shift):
        """ICRC patch: the correction on the ICRC's lanes of `pen`; the keep expected."""
        B = self.data_width // 8
        en = fr.en
        # Computed on the way into `pen`, from `rem` of the stage before it, so that the
        # patch itself is shallow: where the ICRC's 4 bytes fall in this beat (one-hot over
        # lanes -3 .. B-1 of its first byte), and the keep the header's length implies.
        before = stages[-2]
        onehot, exp_last, exp_keep = Signal(B + 3), Signal(), Signal(B)
        with m.If(en):
            m.d.sync += [onehot[r + 3].eq(before["rem_ok"] &
                                          (before["rem"] == r + proto.ICRC_LEN))
                         for r in range(-3, B)]
            m.d.sync += exp_last.eq(before["rem_ok"] & (before["rem"] > 0) &
                                    (before["rem"] <= B))
            m.d.sync += [exp_keep[j].eq(before["rem"] > j) for j in range(B)]

        corr_hold = Signal(32)
        corr = Mux(shift.out_tag, shift.out, corr_hold)
        with m.If(en & shift.out_tag):
            m.d.sync += corr_hold.eq(shift.out)
        patch = Signal(8 * B)
        for j in range(B):
            # Lane j holds ICRC byte i when the ICRC starts at lane j - i.
            terms = [Mux(onehot[j - i + 3], corr.word_select(i, 8), 0) for i in range(4)]
            m.d.comb += patch.word_select(j, 8).eq(terms[0] | terms[1] | terms[2] | terms[3])
        return SimpleNamespace(patch=patch, exp_last=exp_last, exp_keep=exp_keep)

    def _stage_out(self, m, fr, pen, pt):
        """The output register and ``m_axis``; the length check."""
        B = self.data_width // 8
        en = fr.en
        # The output register: the pipeline's last stage, with the patch applied on the way.
        patched = pen["data"] ^ Mux(pen["pass_"], 0, pt.patch)
        fin = register_stages(m, en, {**pen, "data": patched}, 1, "out")[-1]
        length_bad = Signal()
        nbytes = Signal(range(B + 1))
        with m.If(en):
            m.d.sync += length_bad.eq(pen["last"] & ~(pt.exp_last & (pen["keep"] == pt.exp_keep)))
            m.d.sync += nbytes.eq(keep_count(pen["keep"]))

        errors = fin["not_roce"] | fin["truncated"] | fin["too_long"] | length_bad
        bad = fin["bad_in"] | (~fin["pass_"] & errors)
        m.d.comb += fr.last_valid.eq(fin["valid"])
        drive_axis(m, self.m_axis, valid=fin["valid"], data=fin["data"], keep=fin["keep"],
                   last=fin["last"], user=fin["last"] & bad)
        return SimpleNamespace(fin=fin, length_bad=length_bad, nbytes=nbytes)

    def _stats(self, m, out):
        """``stats``: the events of the beats and frames ``m_axis`` takes."""
        fin, length_bad = out.fin, out.length_bad
        moved = fin["valid"] & self.m_axis.tready
        counted = moved & fin["last"]
        nonpass = counted & ~fin["pass_"]
        m.d.comb += [
            self.stats.frames.eq(counted),
            self.stats.bytes.eq(Mux(moved, out.nbytes, 0)),
            self.stats.in_bad.eq(counted & fin["bad_in"]),
            self.stats.not_roce.eq(nonpass & fin["not_roce"]),
            self.stats.truncated.eq(nonpass & fin["truncated"]),
            self.stats.too_long.eq(nonpass & fin["too_long"] & ~fin["truncated"]),
            self.stats.length.eq(nonpass & length_bad & ~fin["truncated"]),
        ]


class HeaderInsert(wiring.Component):
    """Stage 2 of :class:`Srv6Encap`: puts 0, 40 or 64 bytes after the Ethernet header.

    Each frame takes one ``ins`` record: ``h`` (index into :data:`INSERT_CHOICES`) and
    ``prefix``, the output's first ``14 + H`` bytes (Ethernet header, outer IPv6, SRH). The
    output is the input shifted by H bytes with those first bytes overwritten. With
    H = q*B + s on a B-byte bus, output beat j takes lanes ``l >= s`` from input beat j - q
    (the beat it consumes) and lanes ``l < s`` from the beat before (kept in a register); the
    prefix lanes of the first beats come from a shift register. The possible ``s`` are few (at
    most 3 per width), so each output lane is a small mux. A frame starts only once its
    first data beat is there too, so that frames leave without holes.

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 2048.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames from :class:`EntropyRewrite`.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The frames with H bytes inserted after the Ethernet header; registered.
    ins : stream of ``h`` (2 bits, index into :data:`INSERT_CHOICES`) and ``prefix`` (the
        output's first 78 bytes), in
        One record per frame.

    Latency
    -------
    1 cycle (the output register).

    Throughput
    ----------
    One output beat per cycle, the first beat of a frame right after the last of the one
    before: a frame of L bytes takes ceil((L + H) / B) beats.

    Raises
    ------
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, data_width):
        self.data_width = check_data_width(data_width, minimum=64, maximum=2048,
                                           power_of_two=True)
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "ins": In(meta_stream(_prefix_layout())),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.data_width // 8
        s, ins = self.s_axis, self.ins
        plan = self._insert_plan(B)
        jmax = plan.jmax

        j = Signal(range(jmax + 1))
        flush = Signal()            # the input's last beat spilled: one more output beat
        h_r = Signal(2)
        pwidth = max(len(ins.payload.prefix), 8 * B)
        pfx_r = Signal(pwidth)
        prev_data, prev_keep, prev_user = Signal(8 * B), Signal(B), Signal()
        o_valid, o_data, o_keep, o_last, o_user = (Signal(), Signal(8 * B), Signal(B),
                                                   Signal(), Signal())

        first = (j == 0) & ~flush
        cur_h = Mux(first, ins.payload.h, h_r)
        cur_p = Signal(pwidth)
        m.d.comb += cur_p.eq(Mux(first, ins.payload.prefix, pfx_r))

        # The lanes of output beat j: prefix lanes, input lanes shifted by s, spill.
        sl = self._shifted_lanes(m, plan, cur_h, j, flush, prev_data, prev_keep)
        need_cur, pmask, spill = sl.need_cur, sl.pmask, sl.spill
        s_data, s_keep = sl.s_data, sl.s_keep

        out_free = ~o_valid | self.m_axis.tready
        # A frame starts only once its first beat is here too, so that its prefix does not
        # run ahead of its data: MACs downstream want frames without holes.
        emit = out_free & (~first | (ins.valid & s.tvalid)) & (~need_cur | s.tvalid)
        last = flush | (need_cur & s.tlast & ~spill)
        data_out, keep_out = Signal(8 * B), Signal(B)
        for l in range(B):
            m.d.comb += [
                data_out.word_select(l, 8).eq(Mux(pmask[l], cur_p.word_select(l, 8),
                                                  s_data.word_select(l, 8))),
                keep_out[l].eq(pmask[l] | s_keep[l]),
            ]
        m.d.comb += [
            s.tready.eq(emit & need_cur),
            ins.ready.eq(emit & first),
        ]
        drive_axis(m, self.m_axis, valid=o_valid, data=o_data, keep=o_keep, last=o_last,
                   user=o_user)
        with m.If(emit):
            m.d.sync += [
                o_valid.eq(1), o_data.eq(data_out), o_keep.eq(keep_out), o_last.eq(last),
                o_user.eq(Mux(flush, prev_user, need_cur & s.tlast & s.tuser[0] & ~spill)),
                pfx_r.eq(cur_p >> (8 * B)),
                h_r.eq(cur_h),
            ]
            with m.If(need_cur):
                m.d.sync += [prev_data.eq(s.tdata), prev_keep.eq(s.tkeep),
                             prev_user.eq(s.tuser[0])]
            with m.If(last):
                m.d.sync += [j.eq(0), flush.eq(0)]
            with m.Else():
                m.d.sync += j.eq(Mux(j == jmax, j, j + 1))
                with m.If(need_cur & s.tlast & spill):
                    m.d.sync += flush.eq(1)
        with m.Elif(self.m_axis.tready):
            m.d.sync += o_valid.eq(0)
        return m

    @staticmethod
    def _insert_plan(B):
        """Per ``h``: prefix bytes ``plen``, H = ``q``*B + ``sh``; ``jmax``, the last beat
        index the frame counter tells apart."""
        plen = {h: (POS_IP + n if n else 0) for h, n in enumerate(INSERT_CHOICES)}
        q = {h: n // B for h, n in enumerate(INSERT_CHOICES)}
        sh = {h: n % B for h, n in enumerate(INSERT_CHOICES)}
        jmax = max(max(q.values()), max(-(-p // B) for p in plen.values())) + 1
        return SimpleNamespace(plen=plen, q=q, sh=sh, jmax=jmax)

    def _shifted_lanes(self, m, plan, cur_h, j, flush, prev_data, prev_keep):
        """Output beat j by the frame's ``h``: its prefix lanes, the lanes ``l >= s`` of the
        beat consumed and ``l < s`` of the beat before, and whether the last beat spills."""
        B = self.data_width // 8
        s = self.s_axis
        plen, q, sh, jmax = plan.plen, plan.q, plan.sh, plan.jmax
        need_cur = Signal()
        pmask = Signal(B)
        spill = Signal()
        s_data, s_keep = Signal(8 * B), Signal(B)
        with m.Switch(cur_h):
            for h in range(len(INSERT_CHOICES)):
                with m.Case(h):
                    m.d.comb += need_cur.eq(~flush & ~_lt(j, q[h]))
                    # Prefix lanes of beat j, a constant per (h, j).
                    with m.Switch(j):
                        for jj in range(jmax + 1):
                            with m.Case(jj):
                                lanes = max(0, min(B, plen[h] - jj * B))
                                m.d.comb += pmask.eq((1 << lanes) - 1)
                    n = sh[h]
                    for l in range(B):
                        if l >= n:      # from the beat being consumed
                            m.d.comb += [
                                s_data.word_select(l, 8).eq(s.tdata.word_select(l - n, 8)),
                                s_keep[l].eq(~flush & s.tkeep[l - n]),
                            ]
                        else:           # from the beat before
                            m.d.comb += [
                                s_data.word_select(l, 8).eq(
                                    prev_data.word_select(l - n + B, 8)),
                                s_keep[l].eq(prev_keep[l - n + B]),
                            ]
                    m.d.comb += spill.eq(s.tkeep[B - n] if n else 0)
        return SimpleNamespace(need_cur=need_cur, pmask=pmask, spill=spill, s_data=s_data,
                               s_keep=s_keep)


class Srv6Encap(wiring.Component):
    """SRv6, STEV and UDP entropy encapsulation: each frame is put on its EV's path.

    Each frame on ``s_axis`` (Ethernet, inner IPv6, UDP, BTH, ..., ICRC; no FCS) takes one
    ``desc`` record and leaves on ``m_axis``, by the record's ``mode``
    (:class:`~mrcnic.base.proto.EvMode`, spec §2.3):

    ============ =========================================================================
    mode         what happens to the frame
    ============ =========================================================================
    PASS         nothing
    STEV         inner flow label = {0, E[31:16]}, UDP source port = E[15:0], E = ev[255:224]
    UDP          UDP source port = ev[255:240]
    SRV6         as STEV with E = ``entropy`` (the EV's index), then an outer IPv6 header is
                 inserted after Ethernet: destination ev[255:128], source ``outer_src``,
                 traffic class ``dscp``/``ecn``, flow label {0, E[31:16]}, hop limit
                 ``hop_limit``, next header 41, payload length = inner one + 40
    SRV6_SRH     as SRV6, with next header 43 and a one-segment SRH (segment ev[127:0],
                 segments left 1, next header 41); payload length = inner one + 64
    ============ =========================================================================

    The register ``config.stev_swap`` swaps the halves of E. The ICRC, which covers the UDP
    source port, is patched in flight; an ICRC wrong on input stays exactly as wrong. In
    the non-PASS modes a frame that is not RoCEv2 (Ethernet, IPv6, UDP to
    ``config.udp_dport``), shorter than 78 bytes, whose length disagrees with its IPv6
    payload length, or longer than ``max_frame``, and in every mode a frame that arrives with
    ``tuser[0]``, leaves marked with ``tuser[0]`` on its last beat and is counted; the next
    frame is unaffected.

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
        Frames; ``tuser[0]`` marks a bad one.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Frames on their path; ``tuser[0]`` on the last beat of a bad one.
    desc : stream of :data:`ENCAP_DESC`, in
        One descriptor per frame, taken with its first beat: ``mode``, ``ev`` (the expanded
        EV, first field most significant), ``entropy``, ``outer_src``, ``dscp``, ``ecn``,
        ``hop_limit``.
    s_axil : AXI4-Lite, in
        Registers, :data:`ENCAP_REGS`.
    latency : int
        Cycles from a frame's first input beat to its first output beat.

    Latency
    -------
    :attr:`latency` = ``ceil(log2(B)/2)`` + 6 cycles from ``s_axis`` to ``m_axis`` on a
    B-byte bus, in every mode: 8 at 64 bits, 9 at 512, 10 at 2048.

    Throughput
    ----------
    One output beat per cycle with no idle cycle between frames: a frame of L bytes with
    H inserted takes ceil((L + H) / B) beats. A frame waits for its descriptor (the
    ``desc_wait`` counter counts those cycles); nothing else stalls.

    Raises
    ------
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, or ``counter_width`` is not
        0, 16 or 32.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, data_width=512, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        self.data_width = data_width
        self.rewrite = EntropyRewrite(data_width)      # checks the parameters
        self.latency = self.rewrite.depth + 4
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "desc": In(meta_stream(ENCAP_DESC)),
            "s_axil": In(AxiLiteSignature(ENCAP_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rewrite = rw = self.rewrite
        m.submodules.insert = ins = HeaderInsert(self.data_width)
        skid_chain(m, self.s_axis, [rw, ins], self.m_axis)
        m.submodules.desc_skid = desc_skid = MetaSkidBuffer(ENCAP_DESC)
        wiring.connect(m, wiring.flipped(self.desc), desc_skid.i)
        wiring.connect(m, desc_skid.o, rw.desc)
        m.submodules.csr = csr = CsrBlock(ENCAP_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        # Records for frames inside the rewrite pipeline: at most one per stage, plus slack.
        stream_fifo(m, "ins_fifo", rw.ins, ins.ins, rw.depth + 4)

        f = csr.fields
        m.d.comb += [
            rw.udp_dport.eq(f["config"]["udp_dport"]),
            rw.stev_swap.eq(f["config"]["stev_swap"]),
            rw.max_frame_reg.eq(f["max_frame"]["bytes"]),
        ]
        event_counters(m, f, rw.stats, ENCAP_COUNTERS, f["control"]["clear"],
                       width=self.counter_width)
        return m


