"""RoCEv2/MRC receive parser and payload buffer: :class:`RoceRx` (``roce-rx``).

The receive parser of one plane, in :class:`~mrcnic.rx.mrc_rx.MrcRx` after the plane's
:class:`~mrcnic.rx.srv6_decap.Srv6Decap`: it checks each RoCEv2/MRC frame as it streams and
turns it into one record (a packet for the PSN tracker, a received SACK or NACK, an AETH
NAK, a port status update); a data packet's payload waits in a block-RAM buffer until its
verdict comes back, and is then placed or dropped. :class:`HeaderCheck` is its stage B.

Operation, decisions and measured figures: docs/blocks/roce-rx.md.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base import proto

from mrcnic.base.records import ACK_DESC, NAK, PLACE, RX_PKT, VERDICT_IN, PEER_STATUS, DECAP_META
from mrcnic.base.crc import CrcStream
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import (
    AETH, BTH, CC_STATE, ETH, IMMDT, IPV6, NETH, PETH, PORT_STATUS, RETH, SETH, TSETH, UDP,
    EvMode, Opcode)
from mrcnic.base.stream import (AxiStreamSignature, FrameCursor, MetaSkidBuffer, SkidBuffer,
                     check_data_width, const_lt, drive_axis, keep_count, meta_stream)

__all__ = ["RoceRx", "ROCE_RX_REGS",
           "RX_COUNTERS"]


# Frame positions after decapsulation.
IP_AT = ETH.size                        # 14
UDP_AT = IP_AT + IPV6.size              # 54
BTH_AT = UDP_AT + UDP.size              # 62
EXT_AT = BTH_AT + BTH.size              # 74: the headers after the BTH
HDR_BYTES = EXT_AT + SETH.size + CC_STATE.size      # 110: a SACK's, the longest read
KEPT = [*range(12, IP_AT + 8), *range(UDP_AT, HDR_BYTES)]   # bytes stage B reads
# Payload start: METH, then TSETH (ts bit), RETH, ImmDt (the _IMM opcodes).
PAYLOAD_AT = [EXT_AT + 4 + RETH.size + 4 * k for k in range(3)]  # 94, 98, 102
CONTROL_END = {Opcode.ACK: EXT_AT + AETH.size, Opcode.SACK: HDR_BYTES,
               Opcode.NACK: EXT_AT + NETH.size, Opcode.PROBE: EXT_AT + PETH.size,
               Opcode.EP_REQUEST: EXT_AT + PORT_STATUS.size}

# Record kinds (stage B -> stage D).
K_DATA, K_TRIM, K_PROBE, K_SACK, K_NACK, K_ACK, K_NAK, K_PEER = range(8)
# Drop causes found in stage B, by priority; the ICRC, too_long and no_room come after.
C_NONE, C_IN_BAD, C_NOT_ROCE, C_TRUNCATED, C_OPCODE, C_LENGTH = range(6)

FIFO_DEPTH = 16         # record FIFOs and the summary FIFO; > frames in flight at 2048 bits

RX_COUNTERS = ["frames", "data", "trimmed", "probes", "sacks", "nacks", "acks", "naks",
               "port_status", "placed", "verdict_drop", "in_bad", "not_roce", "truncated", "opcode",
               "length", "icrc", "too_long", "no_room", "verdict_tag"]

ROCE_RX_REGS = RegisterMap("roce_rx", [
    Register("udp_dport", [Field("port", 16, "rw", reset=proto.UDP_DPORT_DEFAULT,
                                 desc="RoCEv2 UDP destination port")]),
    Register("pmtu", [Field("bytes", 16, "rw", reset=4096,
                            desc="Longest payload accepted (values above pmtu_max act as "
                                 "pmtu_max)")]),
    Register("trim_dscp", [Field("dscp", 6, "rw", reset=proto.DSCP_TRIMMED,
                                 desc="Codepoint of a trimmed packet")]),
    Register("trim_lasthop_dscp", [Field("dscp", 6, "rw", reset=proto.DSCP_TRIMMED_LASTHOP,
                                         desc="Codepoint of a packet trimmed at its last "
                                              "hop")]),
    Register("status", [Field("held", 11, "ro",
                              desc="Held-queue entries in use or reserved by frames in flight"),
                        Field("buffer_words", 16, "ro", offset=16,
                              desc="Payload buffer words in use")]),
    Register("control", [Field("clear", 1, "w1p", desc="Zero every counter")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("frames", "Frames in"),
        ("data", "Data packets accepted (payload held, pkt record with slot)"),
        ("trimmed", "Trimmed packets (pkt record, trimmed = 1)"),
        ("probes", "Probes (pkt record)"),
        ("sacks", "SACKs (ack record)"),
        ("nacks", "NACKs (ack record)"),
        ("acks", "AETH ACKs with syndrome 0 (dropped)"),
        ("naks", "AETH ACKs with a non-zero syndrome (nak record)"),
        ("port_status", "Port status updates (peer record)"),
        ("placed", "Place verdicts (place record)"),
        ("verdict_drop", "Held payloads dropped by their verdict"),
        ("in_bad", "Frames with tuser[0] or meta.bad"),
        ("not_roce", "Not IPv6 / UDP to udp_dport"),
        ("truncated", "Frames shorter than their headers"),
        ("opcode", "Opcodes other than WRITE, ACK, SACK, NACK, probe, port status"),
        ("length", "Lengths that disagree with the frame"),
        ("icrc", "Bad ICRC"),
        ("too_long", "Payload longer than pmtu"),
        ("no_room", "Data packets dropped: payload buffer or held queue full"),
        ("verdict_tag", "Verdicts whose tag was not the head packet's (packet dropped)"),
    ]],
])


class RoceRx(wiring.Component):
    """RoCEv2/MRC receive parser and payload buffer of one plane: one record per frame, the
    payloads held until their verdicts.

    Each frame (as decapsulated, with its ``meta`` record) gives at most one record: a data
    packet, a probe or a trimmed packet (its DSCP one of the trim registers) a ``pkt``
    record; a SACK or NACK an ``ack`` record; an AETH NAK a ``nak`` record; a port status
    update a ``peer`` record. A frame that fails a check gives no record and is counted. A
    data packet's payload is held until its ``verdict`` places it (``place`` record and
    payload on ``m_axis``) or drops it. The checks and their order: docs/blocks/roce-rx.md.

    Parameters
    ----------
    data_width : int
        Bus width in bits (B = ``data_width`` / 8 bytes), one of 64, 128, 256, 512, 1024,
        2048. Default 512.
    buffer_bytes : int
        Payload buffer in bytes, a power of two, at least 2 x (``pmtu_max`` + 110) and at
        least 2 x (the words of a ``pmtu_max`` frame + 1) x B. Default 16384.
    pmtu_max : int
        Largest payload the ``pmtu`` register can allow, 256 .. 16384. Default 4096.
    max_held : int
        Data packets held at once (waiting for or under a verdict), a power of two
        4 .. 1024. Default 64.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames from :class:`~mrcnic.rx.srv6_decap.Srv6Decap`; ``tuser[0]`` marks a bad one.
    meta : stream of :data:`~mrcnic.base.records.DECAP_META`, in
        One record per frame, in order, taken with the frame's last beat.
    verdict : stream of :data:`~mrcnic.base.records.VERDICT_IN`, in
        One {``tag``, ``place``} per ``pkt`` record with ``slot`` = 1, in order.
    pkt : stream of :data:`~mrcnic.base.records.RX_PKT`, out
        Data packets, probes and trimmed packets: the
        :data:`~mrcnic.base.records.PKT_IN` fields, then the RETH (``va``, ``rkey``,
        ``dma_length``) and ``slot``. ``tag`` counts the ``slot`` = 1 records (16 bits,
        wrapping); it is 0 on the others.
    ack : stream of :data:`~mrcnic.base.records.ACK_DESC`, out
        The SACKs and NACKs received.
    nak : stream of :data:`~mrcnic.base.records.NAK`, out
        The AETH NAKs received: ``qp``, BTH ``psn``, ``syndrome``.
    peer : stream of :data:`~mrcnic.base.records.PEER_STATUS`, out
        The port status updates received (QP = the body's ``dst_id``, the port mask).
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit, always 0), out
        Placed payloads, each alone as one frame: payload byte 0 in byte 0 of the first
        beat, pad and ICRC removed.
    place : stream of :data:`~mrcnic.base.records.PLACE`, out
        One per place verdict; with ``length`` > 0 it belongs to the next ``m_axis`` frame.
    s_axil : AXI4-Lite, in
        Registers, :data:`ROCE_RX_REGS`.
    crc_latency, record_latency, place_latency : int
        Cycles of the ICRC pipeline (:class:`~mrcnic.base.crc.CrcStream`), from a frame's
        last input beat to its record, and from a verdict to its payload's first beat.

    ``s_axis``, ``m_axis``, ``meta`` and ``verdict`` have skid buffers (registered ready);
    the record outputs come from FIFOs.

    Latency
    -------
    :attr:`record_latency` = :attr:`crc_latency` + 4 cycles from a frame's last input beat
    to its record valid: 9 at 64 and 128 bits, 10 at 256 and 512, 11 at 1024 and 2048.
    :attr:`place_latency` = 3 cycles from a verdict to the first payload beat valid on
    ``m_axis``, the held packet at the head of the queue.

    Throughput
    ----------
    One input beat per cycle sustained, frames of any kind back to back, as long as the
    record outputs are read; one output beat per cycle while ``m_axis`` is ready, no idle
    cycle between payloads whose verdicts are there. A frame's last beat waits only when a
    record FIFO could overflow or its ``meta`` record has not come.

    Raises
    ------
    TypeError
        If ``data_width``, ``buffer_bytes``, ``pmtu_max`` or ``max_held`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048; ``pmtu_max`` is outside
        256 .. 16384; ``buffer_bytes`` is not a power of two or is smaller than the bound
        above; ``max_held`` is not a power of two in 4 .. 1024; or ``counter_width`` is not
        0, 16 or 32.
    """

    def __init__(self, data_width=512, buffer_bytes=16384, pmtu_max=4096, max_held=64,
                 counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        check_data_width(data_width, minimum=64, maximum=2048, power_of_two=True)
        B = data_width // 8
        for name, value in (("buffer_bytes", buffer_bytes), ("pmtu_max", pmtu_max),
                            ("max_held", max_held)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {value!r}")
        if not 256 <= pmtu_max <= 16384:
            raise ValueError(f"pmtu_max = {pmtu_max} is outside 256..16384")
        if buffer_bytes <= 0 or buffer_bytes & (buffer_bytes - 1):
            raise ValueError(f"buffer_bytes = {buffer_bytes} is not a power of two")
        # A frame writes its payload, pad and ICRC, realigned: at most this many words.
        frame_words = -(-(pmtu_max + 3 + proto.ICRC_LEN) // B) + 1
        need = max(2 * (pmtu_max + HDR_BYTES), 2 * (frame_words + 1) * B)
        if buffer_bytes < need:
            raise ValueError(f"buffer_bytes = {buffer_bytes} is less than 2 x (pmtu_max + "
                             f"headers) = {need} bytes at data_width {data_width}")
        if not 4 <= max_held <= 1024 or max_held & (max_held - 1):
            raise ValueError(f"max_held = {max_held} is not a power of two in 4..1024")
        self.data_width, self.B = data_width, B
        self.buffer_bytes, self.pmtu_max, self.max_held = buffer_bytes, pmtu_max, max_held
        self.words = buffer_bytes // B
        self.aw = ceil_log2(self.words)
        self.crc = CrcStream(data_width)
        self.crc_latency = self.crc.latency
        self.record_latency = self.crc_latency + 4
        self.place_latency = 3
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "meta": In(meta_stream(DECAP_META)),
            "verdict": In(meta_stream(VERDICT_IN)),
            "pkt": Out(meta_stream(RX_PKT)),
            "ack": Out(meta_stream(ACK_DESC)),
            "nak": Out(meta_stream(NAK)),
            "peer": Out(meta_stream(PEER_STATUS)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "place": Out(meta_stream(PLACE)),
            "s_axil": In(AxiLiteSignature(ROCE_RX_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        B, W, AW = self.B, self.data_width, self.aw
        PTR = AW + 1                      # buffer pointers carry a lap bit: full vs empty

        m.submodules.in_skid = in_skid = SkidBuffer(W)
        wiring.connect(m, wiring.flipped(self.s_axis), in_skid.s_axis)
        m.submodules.meta_skid = meta_skid = MetaSkidBuffer(DECAP_META)
        wiring.connect(m, wiring.flipped(self.meta), meta_skid.i)
        m.submodules.verdict_skid = verdict_skid = MetaSkidBuffer(VERDICT_IN)
        wiring.connect(m, wiring.flipped(self.verdict), verdict_skid.i)
        m.submodules.out_skid = out_skid = SkidBuffer(W)
        wiring.connect(m, out_skid.m_axis, wiring.flipped(self.m_axis))
        m.submodules.csr = csr = CsrBlock(ROCE_RX_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        regs = csr.fields
        s, mi, vi = in_skid.m_axis, meta_skid.o, verdict_skid.o

        summary = data.StructLayout({
            "cause": 3, "check_icrc": 1, "too_long": 1, "no_room": 1, "kind": 3,
            "res": 1, "wrote": 1, "start": PTR, "end": PTR,
            "body": data.UnionLayout({"pkt": RX_PKT, "ack": ACK_DESC, "nak": NAK,
                                      "peer": PEER_STATUS}),
        })
        lb = ceil_log2(B)
        # A held-queue entry carries its payload's word count, whether it is one word, and
        # the last word's last lane, worked out before the queue so that the reader, which
        # decides from the entry in the cycle it sees it, has no arithmetic on that path.
        held = data.StructLayout({"hole": 1, "wrote": 1, "start": PTR, "end": PTR,
                                  "words": 16, "one": 1, "tail": lb, "place": PLACE})

        # --- Parse: cursor, ICRC, sticky flags ----------------------------------------------
        accept = Signal()
        cap = FrameCursor(m, s, accept, header_bytes=HDR_BYTES)
        for pos in KEPT:
            cap.now(pos)
        room = Signal()                  # registered: record FIFOs have room (see credits)
        m.d.comb += [
            s.tready.eq(~s.tlast | (mi.valid & room)),
            accept.eq(s.tvalid & s.tready),
            mi.ready.eq(accept & s.tlast),
        ]
        last = accept & s.tlast

        m.submodules.icrc = crc = self.crc
        m.d.comb += [crc.en.eq(1), crc.valid.eq(accept), crc.data.eq(s.tdata),
                     crc.keep.eq(s.tkeep), crc.first.eq(cap.first), crc.last.eq(s.tlast)]

        bad_r = Signal()
        bad_now = Mux(cap.first, 0, bad_r) | s.tuser[0]
        with m.If(accept):
            m.d.sync += bad_r.eq(bad_now)

        # Stage B registers, loaded with the last beat.
        fin = Signal()
        fin_len = Signal(17)
        fin_bad = Signal()
        fin_meta = Signal(DECAP_META)
        m.d.sync += fin.eq(last)
        with m.If(last):
            m.d.sync += [fin_len.eq(cap.off + keep_count(s.tkeep)),
                         fin_bad.eq(bad_now | mi.payload.bad), fin_meta.eq(mi.payload)]

        # --- Payload writer -----------------------------------------------------------------
        mem = Memory(shape=W, depth=self.words, init=[])
        m.submodules.mem = mem
        wr = mem.write_port()
        rd = mem.read_port(domain="sync")

        wp = Signal(PTR)                 # next word to write
        rp = Signal(PTR)                 # words before this one are free
        full = (wp[:AW] == rp[:AW]) & (wp[AW] != rp[AW])

        op_now = cap.now(BTH_AT)
        is_write_now = (op_now >= Opcode.WRITE_FIRST) & (op_now <= Opcode.WRITE_ONLY_IMM)
        imm_now = (op_now == Opcode.WRITE_LAST_IMM) | (op_now == Opcode.WRITE_ONLY_IMM)
        ts_now = cap.now(BTH_AT + 8)[proto.BTH_TS_BIT]
        psel_now = Signal(2)
        m.d.comb += psel_now.eq(ts_now + imm_now)

        def per_p(fn, sel):
            out = Signal(name=f"per_p_{fn.__name__}")
            with m.Switch(sel):
                for k, p in enumerate(PAYLOAD_AT):
                    with m.Case(k):
                        m.d.comb += out.eq(fn(p))
            return out

        def beats_after_start(p):          # this beat completes a word: beat >= P // B + 1
            return ~const_lt(cap.beat, p // B + 1)

        def tail_word(p):                  # a last beat that holds payload-side bytes
            return ~const_lt(cap.beat, p // B) & s.tkeep[p % B]

        # Per-frame state of the frame streaming in, cleared by its last beat; its final
        # value goes to stage B with the last beat (fin_*), where the flush may change it.
        fr_res, fr_ovf, fr_wrote = Signal(), Signal(), Signal()
        fr_start = Signal(PTR)
        fin_res, fin_ovf, fin_wrote = Signal(), Signal(), Signal()
        fin_start = Signal(PTR)
        fl_req, fl_psel = Signal(), Signal(2)

        # Held-queue entries in use (queue and head register) plus those reserved by frames
        # not yet decided, kept as one counter so that the check before a write is a
        # compare, not an adder.
        slots = Signal(range(self.max_held + 1))
        slot_ok = slots < self.max_held
        head_pop = Signal()                           # an entry leaves the head (reader)

        wreq_n = accept & is_write_now & per_p(beats_after_start, psel_now) & ~fr_ovf
        wreq_f = fin & fl_req & ~fin_ovf
        wreq = wreq_n | wreq_f
        cur_res = Mux(wreq_f, fin_res, fr_res)
        do_write = Signal()
        m.d.comb += do_write.eq(wreq & ~full & (cur_res | slot_ok))
        ovf_set = wreq & ~do_write
        res_set = do_write & ~cur_res

        prev = Signal(W)
        with m.If(accept):
            m.d.sync += prev.eq(s.tdata)
        window = Cat(prev, Mux(wreq_f, 0, s.tdata))
        wdata = Signal(W)
        with m.Switch(Mux(wreq_f, fl_psel, psel_now)):
            for k, p in enumerate(PAYLOAD_AT):
                with m.Case(k):
                    m.d.comb += wdata.eq(window[8 * (p % B):8 * (p % B) + W])
        m.d.comb += [wr.addr.eq(wp[:AW]), wr.data.eq(wdata), wr.en.eq(do_write)]

        with m.If(last):
            m.d.sync += [
                fin_res.eq(fr_res | (wreq_n & res_set)),
                fin_ovf.eq(fr_ovf | (wreq_n & ovf_set)),
                fin_wrote.eq(fr_wrote | (wreq_n & do_write)),
                fin_start.eq(Mux(fr_wrote, fr_start, wp)),
                fl_req.eq(is_write_now & per_p(tail_word, psel_now)),
                fl_psel.eq(psel_now),
                fr_res.eq(0), fr_ovf.eq(0), fr_wrote.eq(0),
            ]
        with m.Elif(accept):
            with m.If(res_set & wreq_n):
                m.d.sync += fr_res.eq(1)
            with m.If(ovf_set & wreq_n):
                m.d.sync += fr_ovf.eq(1)
            with m.If(do_write & wreq_n & ~fr_wrote):
                m.d.sync += [fr_wrote.eq(1), fr_start.eq(wp)]

        # --- Stage B: checks and record from the kept header bytes --------------------------
        m.submodules.check = chk = HeaderCheck(self.pmtu_max)
        pmtu = Signal(16)                # the register, at most pmtu_max; changes rarely
        m.d.sync += pmtu.eq(Mux(regs["pmtu"]["bytes"] > self.pmtu_max, self.pmtu_max,
                                regs["pmtu"]["bytes"]))
        m.d.comb += [
            chk.bus.eq(Cat(*(cap.regs[i] if i in cap.regs else Const(0, 8)
                             for i in range(HDR_BYTES)))),
            chk.n.eq(fin_len), chk.bad.eq(fin_bad), chk.meta.eq(fin_meta),
            chk.udp_dport.eq(regs["udp_dport"]["port"]), chk.pmtu.eq(pmtu),
            chk.trim_dscp.eq(regs["trim_dscp"]["dscp"]),
            chk.trim_lasthop_dscp.eq(regs["trim_lasthop_dscp"]["dscp"]),
        ]
        kind = chk.kind
        # The flush write happens in this cycle; a data frame that wrote nothing reserves its
        # held-queue entry now.
        b_res = fin_res | (wreq_f & res_set)
        b_ovf = fin_ovf | (wreq_f & ovf_set)
        b_wrote = fin_wrote | (wreq_f & do_write)
        late_res = fin & chk.data_frame & ~b_res & ~b_ovf
        late_ok = late_res & slot_ok

        sm = Signal(summary)
        m.d.comb += [
            sm.cause.eq(chk.cause), sm.check_icrc.eq(chk.check_icrc),
            sm.too_long.eq(chk.too_long),
            sm.no_room.eq((kind == K_DATA) & (b_ovf | (late_res & ~slot_ok))),
            sm.kind.eq(kind), sm.res.eq(b_res | late_ok), sm.wrote.eq(b_wrote),
            sm.start.eq(Mux(fin_wrote, fin_start, wp)), sm.end.eq(wp + (wreq_f & do_write)),
            sm.body.eq(chk.body),
        ]

        m.submodules.summary = sfifo = SyncFIFO(width=summary.size, depth=FIFO_DEPTH)
        m.d.comb += [sfifo.w_en.eq(fin), sfifo.w_data.eq(sm)]

        # --- Stage D: the ICRC verdict, records out ----------------------------------------
        # The ICRC verdict and the summary are registered first: both come at the end of
        # deep logic (the CRC's 32-bit compare, the summary's distributed RAM).
        hd = Signal(summary)
        done, icrc_ok = Signal(), Signal()
        m.d.comb += sfifo.r_en.eq(crc.done)
        m.d.sync += done.eq(crc.done)
        with m.If(crc.done):
            m.d.sync += [hd.eq(sfifo.r_data), icrc_ok.eq(crc.residue_ok)]
        icrc_bad = hd.check_icrc & ~icrc_ok
        late_cause = Signal(3)           # 1 icrc, 2 too_long, 3 no_room
        m.d.comb += late_cause.eq(Mux(icrc_bad, 1, Mux(hd.too_long, 2,
                                                       Mux(hd.no_room, 3, 0))))
        take = done & (hd.cause == C_NONE) & (late_cause == 0)
        hold = take & (hd.kind == K_DATA)

        m.submodules.pkt_fifo = pkt_fifo = SyncFIFOBuffered(width=RX_PKT.size,
                                                            depth=FIFO_DEPTH)
        m.submodules.ack_fifo = ack_fifo = SyncFIFOBuffered(width=ACK_DESC.size,
                                                            depth=FIFO_DEPTH)
        m.submodules.nak_fifo = nak_fifo = SyncFIFOBuffered(width=NAK.size, depth=FIFO_DEPTH)
        m.submodules.peer_fifo = peer_fifo = SyncFIFOBuffered(width=PEER_STATUS.size,
                                                              depth=FIFO_DEPTH)
        tag = Signal(16)
        rec = Signal(RX_PKT)
        m.d.comb += [rec.eq(hd.body.pkt), rec.slot.eq(hd.kind == K_DATA),
                     rec.tag.eq(Mux(hd.kind == K_DATA, tag, 0))]
        m.d.comb += [
            pkt_fifo.w_data.eq(rec),
            pkt_fifo.w_en.eq(take & ((hd.kind == K_DATA) | (hd.kind == K_TRIM) |
                                     (hd.kind == K_PROBE))),
            ack_fifo.w_data.eq(hd.body.ack),
            ack_fifo.w_en.eq(take & ((hd.kind == K_SACK) | (hd.kind == K_NACK))),
            nak_fifo.w_data.eq(hd.body.nak),
            nak_fifo.w_en.eq(take & (hd.kind == K_NAK)),
            peer_fifo.w_data.eq(hd.body.peer),
            peer_fifo.w_en.eq(take & (hd.kind == K_PEER)),
        ]
        for fifo, port in ((pkt_fifo, self.pkt), (ack_fifo, self.ack), (nak_fifo, self.nak),
                           (peer_fifo, self.peer)):
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]
        with m.If(hold):
            m.d.sync += tag.eq(tag + 1)

        # Credits: frames past their last beat whose record is not yet in a FIFO, plus the
        # FIFO's level, never exceed its depth. Registered from last cycle's counts, with one
        # frame of margin (at most one last beat a cycle).
        inflight = Signal(range(FIFO_DEPTH + 1))
        m.d.sync += inflight.eq(inflight + last - done)
        m.d.sync += room.eq((inflight + 2 <= FIFO_DEPTH) &
                            (inflight + pkt_fifo.level + 2 <= FIFO_DEPTH) &
                            (inflight + ack_fifo.level + 2 <= FIFO_DEPTH) &
                            (inflight + nak_fifo.level + 2 <= FIFO_DEPTH) &
                            (inflight + peer_fifo.level + 2 <= FIFO_DEPTH))

        # Buffer commit: keep (held entry), roll back, or leave a hole the reader skips.
        m.submodules.held = queue = SyncFIFOBuffered(width=held.size, depth=self.max_held)
        rollback = done & ~hold & hd.wrote & (wp == hd.end) & ~do_write
        hole = done & ~hold & hd.wrote & ~rollback
        entry = Signal(held)
        m.d.comb += [
            entry.hole.eq(~hold), entry.wrote.eq(hd.wrote), entry.start.eq(hd.start),
            entry.end.eq(hd.end),
            entry.place.qp.eq(hd.body.pkt.qp), entry.place.psn.eq(hd.body.pkt.psn),
            entry.place.va.eq(hd.body.pkt.va), entry.place.length.eq(hd.body.pkt.length),
            entry.place.tag.eq(tag),
            entry.words.eq((hd.body.pkt.length + B - 1) >> lb),
            entry.one.eq((hd.body.pkt.length != 0) & (hd.body.pkt.length <= B)),
            entry.tail.eq((hd.body.pkt.length - 1)[:lb]),
            queue.w_data.eq(entry), queue.w_en.eq(hold | hole),
        ]
        with m.If(rollback):
            m.d.sync += wp.eq(hd.start)
        with m.Elif(do_write):
            m.d.sync += wp.eq(wp + 1)
        # A reserved frame keeps its slot when it leaves an entry; the slot is freed when the
        # entry leaves the head (below) or when the frame leaves none.
        m.d.sync += slots.eq(slots + (res_set | late_ok) - (done & hd.res & ~(hold | hole))
                             - head_pop)

        # --- Reader: verdicts, place records, payload out ----------------------------------
        m.submodules.place_fifo = place_fifo = SyncFIFOBuffered(width=PLACE.size, depth=4)
        m.d.comb += [self.place.payload.eq(place_fifo.r_data),
                     self.place.valid.eq(place_fifo.r_rdy), place_fifo.r_en.eq(self.place.ready)]
        # The head entry comes from a register (block RAM has a slow clock-to-output).
        m.submodules.head_skid = head_skid = MetaSkidBuffer(held)
        m.d.comb += [head_skid.i.payload.eq(queue.r_data), head_skid.i.valid.eq(queue.r_rdy),
                     queue.r_en.eq(head_skid.i.ready)]
        head = head_skid.o.payload
        hv = head_skid.o.valid
        reading = Signal()
        raddr = Signal(AW)
        rleft = Signal(16)
        r_last = Signal()                # the next read is the payload's last word
        r_end = Signal(PTR)
        r_keep = Signal(B)
        o_valid, o_last = Signal(), Signal()
        o_keep = Signal(B)
        out_free = ~o_valid | out_skid.s_axis.tready

        # Lane l of the last word is kept when l <= (length - 1) mod B (lane 0 always).
        head_keep = Cat(Const(1, 1), *(Const(l, lb) <= head.tail for l in range(1, B)))

        vmatch = vi.payload.tag == head.place.tag
        place_it = vmatch & vi.payload.place
        pop_hole = ~reading & hv & head.hole
        v_take = ~reading & hv & ~head.hole & vi.valid & \
            (~place_it | (place_fifo.w_rdy & out_free))
        start_read = v_take & place_it & (head.words != 0)
        issue = (reading | start_read) & out_free
        left = Mux(reading, rleft, head.words)
        last_word = Mux(reading, r_last, head.one)
        addr = Mux(reading, raddr, head.start[:AW])
        m.d.comb += [rd.addr.eq(addr), rd.en.eq(out_free)]
        with m.If(issue):
            m.d.sync += [raddr.eq(addr + 1), rleft.eq(left - 1), r_last.eq(left == 2),
                         o_last.eq(last_word),
                         o_keep.eq(Mux(last_word, Mux(reading, r_keep, head_keep),
                                       (1 << B) - 1))]
        with m.If(out_free):
            m.d.sync += o_valid.eq(issue)
        with m.If(start_read):
            m.d.sync += [reading.eq(~head.one), r_end.eq(head.end), r_keep.eq(head_keep)]
        with m.Elif(reading & issue & last_word):
            m.d.sync += reading.eq(0)
        with m.If(pop_hole | (v_take & ~start_read & head.wrote) | (start_read & head.one)):
            m.d.sync += rp.eq(head.end)
        with m.Elif(reading & issue & last_word):
            m.d.sync += rp.eq(r_end)
        m.d.comb += head_pop.eq(pop_hole | v_take)
        m.d.comb += [head_skid.o.ready.eq(pop_hole | v_take), vi.ready.eq(v_take),
                     place_fifo.w_en.eq(v_take & place_it),
                     place_fifo.w_data.eq(head.place)]
        drive_axis(m, out_skid.s_axis, valid=o_valid, data=rd.data, keep=o_keep,
                   last=o_last, user=0)

        # --- Counters, status ----------------------------------------------------------------
        ev = Signal(data.StructLayout({name: 1 for name in RX_COUNTERS}))
        k = hd.kind
        m.d.comb += [
            ev.frames.eq(done), ev.data.eq(hold),
            ev.trimmed.eq(take & (k == K_TRIM)), ev.probes.eq(take & (k == K_PROBE)),
            ev.sacks.eq(take & (k == K_SACK)), ev.nacks.eq(take & (k == K_NACK)),
            ev.acks.eq(take & (k == K_ACK)), ev.naks.eq(take & (k == K_NAK)),
            ev.port_status.eq(take & (k == K_PEER)),
            ev.placed.eq(v_take & place_it), ev.verdict_drop.eq(v_take & vmatch & ~place_it),
            ev.verdict_tag.eq(v_take & ~vmatch),
            ev.in_bad.eq(done & (hd.cause == C_IN_BAD)),
            ev.not_roce.eq(done & (hd.cause == C_NOT_ROCE)),
            ev.truncated.eq(done & (hd.cause == C_TRUNCATED)),
            ev.opcode.eq(done & (hd.cause == C_OPCODE)),
            ev.length.eq(done & (hd.cause == C_LENGTH)),
            ev.icrc.eq(done & (hd.cause == C_NONE) & (late_cause == 1)),
            ev.too_long.eq(done & (hd.cause == C_NONE) & (late_cause == 2)),
            ev.no_room.eq(done & (hd.cause == C_NONE) & (late_cause == 3)),
        ]
        event_counters(m, regs, ev, RX_COUNTERS, regs["control"]["clear"], width=self.counter_width)
        m.d.comb += [regs["status"]["held"].eq(slots),
                     regs["status"]["buffer_words"].eq((wp - rp)[:PTR])]
        cap.capture()
        return m



class HeaderCheck(wiring.Component):
    """Stage B of :class:`RoceRx`: every check but the ICRC, and the frame's record, from its
    header bytes, its length, its sticky bad flag and its ``DECAP_META``. Combinational.

    The checks are those of :class:`RoceRx` in its order (``in_bad``, ``not_roce``,
    ``truncated``, ``opcode``, ``length``; ``too_long`` apart, since the ICRC comes before
    it). The lengths a frame may have are subtracted from ``n`` in parallel and then
    selected by the opcode, so that no subtraction waits for the opcode's decoding.

    Parameters
    ----------
    pmtu_max : int
        :class:`RoceRx`'s ``pmtu_max``, which checks it; ``pmtu`` comes in already limited
        to it.

    Attributes
    ----------
    bus : Signal(880), in
        Header bytes 0 .. 109 of the frame, byte i at bits 8i .. 8i + 7 (those the
        :class:`~mrcnic.base.stream.FrameCursor` keeps; the others 0).
    n : Signal(17), in
        The frame's length in bytes.
    bad : Signal(1), in
        ``tuser[0]`` on some beat of the frame, or ``meta.bad``.
    meta : Signal(:data:`~mrcnic.base.records.DECAP_META`), in
        The frame's record from :class:`~mrcnic.rx.srv6_decap.Srv6Decap`.
    udp_dport, pmtu : Signal(16), in
        The registers of those names (``pmtu`` at most ``pmtu_max``).
    trim_dscp, trim_lasthop_dscp : Signal(6), in
        The trimmed codepoints, the registers of those names.
    cause : Signal(3), out
        The first failing check: 0 none, 1 ``in_bad``, 2 ``not_roce``, 3 ``truncated``, 4
        ``opcode``, 5 ``length``.
    check_icrc : Signal(1), out
        The ICRC is to be checked (the frame is not trimmed).
    too_long : Signal(1), out
        A WRITE, not trimmed, whose payload is longer than ``pmtu``.
    kind : Signal(3), out
        The record's kind: data, trimmed, probe, SACK, NACK, AETH ACK, AETH NAK, port
        status (0 .. 7).
    data_frame : Signal(1), out
        A WRITE at least as long as Ethernet to BTH.
    body : Signal(union of ``pkt``, ``ack``, ``nak``, ``peer``), out
        The record, as :data:`~mrcnic.base.records.RX_PKT`,
        :data:`~mrcnic.base.records.ACK_DESC`, :data:`~mrcnic.base.records.NAK` or
        :data:`~mrcnic.base.records.PEER_STATUS` by ``kind``.

    Latency
    -------
    None: combinational (:class:`RoceRx` registers its outputs).

    Throughput
    ----------
    One frame per cycle.
    """

    def __init__(self, pmtu_max):
        self.pmtu_max = pmtu_max         # ``pmtu`` comes in already limited to it
        super().__init__({
            "bus": In(8 * HDR_BYTES), "n": In(17), "bad": In(1), "meta": In(DECAP_META),
            "udp_dport": In(16), "pmtu": In(16), "trim_dscp": In(6),
            "trim_lasthop_dscp": In(6),
            "cause": Out(3), "check_icrc": Out(1), "too_long": Out(1), "kind": Out(3),
            "data_frame": Out(1),
            "body": Out(data.UnionLayout({"pkt": RX_PKT, "ack": ACK_DESC, "nak": NAK,
                                      "peer": PEER_STATUS})),
        })

    def elaborate(self, platform):
        m = Module()
        bus, n = self.bus, self.n

        def get(h, name, at):
            return h.get(bus, name, at)

        meta = self.meta
        passed = meta.mode == EvMode.PASS
        dscp = Mux(passed, get(IPV6, "dscp", IP_AT), meta.dscp)
        ecn = Mux(passed, get(IPV6, "ecn", IP_AT), meta.ecn)
        lasthop = dscp == self.trim_lasthop_dscp
        trimmed = Signal()
        m.d.comb += trimmed.eq((dscp == self.trim_dscp) | lasthop)

        op = get(BTH, "opcode", BTH_AT)
        ts = get(BTH, "ts", BTH_AT)
        is_write = (op >= Opcode.WRITE_FIRST) & (op <= Opcode.WRITE_ONLY_IMM)
        has_imm = (op == Opcode.WRITE_LAST_IMM) | (op == Opcode.WRITE_ONLY_IMM)
        known = is_write | Cat(*(op == c for c in CONTROL_END)).any()
        # n minus each header length the frame may have (+ ICRC, + pad for the payload),
        # worked out in parallel from the registered length and then selected by the opcode,
        # so that no subtraction waits for the opcode's decoding.
        icrc = proto.ICRC_LEN
        constants = {UDP_AT, EXT_AT + 4 + RETH.size, EXT_AT + 8 + RETH.size,
                     *(p + icrc + q for p in PAYLOAD_AT for q in range(4)),
                     *(end + icrc for end in CONTROL_END.values())}
        minus = {c: Signal(signed(19), name=f"n_minus_{c}") for c in sorted(constants)}
        m.d.comb += [minus[c].eq(n - c) for c in minus]
        n_minus = minus.__getitem__

        psel = Signal(2)                 # payload at PAYLOAD_AT[psel]
        m.d.comb += psel.eq(ts + has_imm)
        pad = get(BTH, "pad", BTH_AT)
        rest = Signal(signed(19))        # bytes between the headers and the ICRC
        payload = Signal(signed(19))     # rest without the pad (writes)
        reth_left = Signal(signed(19))   # bytes after a trimmed frame's RETH
        with m.Switch(psel):
            for k, p in enumerate(PAYLOAD_AT):
                with m.Case(k):
                    m.d.comb += rest.eq(n_minus(p + icrc))
                    with m.Switch(pad):
                        for q in range(4):
                            with m.Case(q):
                                m.d.comb += payload.eq(n_minus(p + icrc + q))
        for c, end in CONTROL_END.items():
            with m.If(op == c):
                m.d.comb += rest.eq(n_minus(end + icrc))
        m.d.comb += reth_left.eq(Mux(ts, n_minus(EXT_AT + 8 + RETH.size),
                                     n_minus(EXT_AT + 4 + RETH.size)))

        not_roce = (((n >= 14) & (get(ETH, "ethertype", 0) != proto.ETHERTYPE_IPV6)) |
                    ((n >= 15) & (get(IPV6, "version", IP_AT) != proto.IPV6_VERSION)) |
                    ((n >= 21) & (get(IPV6, "next_header", IP_AT) != proto.IPPROTO_UDP)) |
                    ((n >= 58) & (get(UDP, "dst_port", UDP_AT) != self.udp_dport)))
        short = n < EXT_AT
        truncated = short | Mux(trimmed, is_write & reth_left[-1], known & rest[-1])
        ep_bad = (op == Opcode.EP_REQUEST) & (
            (get(BTH, "dest_qp", BTH_AT) != proto.ENDPOINT_QP) |
            (get(PORT_STATUS, "type", EXT_AT) != proto.EP_PORT_STATUS))
        opcode_bad = ~short & Mux(trimmed, ~is_write, ~known | ep_bad)
        plen = get(IPV6, "payload_length", IP_AT)
        length_bad = ((plen != n_minus(UDP_AT)) | (get(UDP, "length", UDP_AT) != plen) |
                      Mux(is_write, (rest[:2] != 0) | payload[-1], (rest != 0) | (pad != 0)))
        too_long = is_write & ~trimmed & (payload > self.pmtu)
        cause = Mux(self.bad, C_IN_BAD, Mux(not_roce, C_NOT_ROCE, Mux(
            truncated, C_TRUNCATED, Mux(opcode_bad, C_OPCODE, Mux(
                ~trimmed & length_bad, C_LENGTH, C_NONE)))))

        syndrome = get(AETH, "syndrome", EXT_AT)
        kind = Signal(3)
        with m.If(trimmed):
            m.d.comb += kind.eq(K_TRIM)
        with m.Elif(op == Opcode.PROBE):
            m.d.comb += kind.eq(K_PROBE)
        with m.Elif(op == Opcode.SACK):
            m.d.comb += kind.eq(K_SACK)
        with m.Elif(op == Opcode.NACK):
            m.d.comb += kind.eq(K_NACK)
        with m.Elif(op == Opcode.ACK):
            m.d.comb += kind.eq(Mux(syndrome == 0, K_ACK, K_NAK))
        with m.Elif(op == Opcode.EP_REQUEST):
            m.d.comb += kind.eq(K_PEER)
        with m.Else():
            m.d.comb += kind.eq(K_DATA)

        body = self.body
        pk = body.pkt
        with m.If((kind == K_SACK) | (kind == K_NACK)):
            a = body.ack
            m.d.comb += a.qp.eq(get(BTH, "dest_qp", BTH_AT)[:16])
            with m.If(kind == K_SACK):
                m.d.comb += [
                    a.cack.eq(get(SETH, "cack_psn", EXT_AT)),
                    a.ack_psn_offset.eq(get(SETH, "ack_psn_offset", EXT_AT)),
                    a.sack_offset.eq(get(SETH, "sack_offset", EXT_AT)),
                    a.bitmap.eq(get(SETH, "bitmap", EXT_AT)),
                    a.m.eq(get(SETH, "m", EXT_AT)), a.pr.eq(get(SETH, "pr", EXT_AT)),
                    a.mpr.eq(get(SETH, "mpr", EXT_AT)),
                    a.ooo_count.eq(get(CC_STATE, "ooo_count", EXT_AT + SETH.size)),
                    a.rcvd_bytes.eq(get(CC_STATE, "rcvd_bytes", EXT_AT + SETH.size)),
                    a.entropy.eq(get(SETH, "entropy", EXT_AT)),
                    a.timestamp.eq(get(CC_STATE, "timestamp", EXT_AT + SETH.size)),
                ]
            with m.Else():
                m.d.comb += [
                    a.nack.eq(1), a.reason.eq(get(NETH, "reason", EXT_AT)),
                    a.psn.eq(get(NETH, "nack_psn", EXT_AT)),
                    a.entropy.eq(get(NETH, "entropy", EXT_AT)),
                    a.timestamp.eq(get(NETH, "timestamp", EXT_AT)),
                ]
        with m.Elif(kind == K_PEER):
            m.d.comb += [body.peer.qp.eq(get(PORT_STATUS, "dst_id", EXT_AT)),
                         body.peer.ports.eq(get(PORT_STATUS, "ports", EXT_AT))]
        with m.Elif(kind == K_NAK):
            m.d.comb += [body.nak.qp.eq(get(BTH, "dest_qp", BTH_AT)[:16]),
                         body.nak.psn.eq(get(BTH, "psn", BTH_AT)),
                         body.nak.syndrome.eq(syndrome)]
        with m.Else():
            m.d.comb += [
                pk.qp.eq(get(BTH, "dest_qp", BTH_AT)[:16]), pk.psn.eq(get(BTH, "psn", BTH_AT)),
                pk.opcode.eq(op), pk.ack_req.eq(get(BTH, "ack_req", BTH_AT)),
                pk.rtx.eq(get(BTH, "rtx", BTH_AT)), pk.ce.eq(ecn == proto.ECN_CE),
                pk.trimmed.eq(trimmed), pk.lasthop.eq(trimmed & lasthop),
                pk.entropy.eq(proto_stev(get(UDP, "src_port", UDP_AT),
                                         get(IPV6, "flow_label", IP_AT))),
            ]
            with m.If(kind == K_PROBE):
                m.d.comb += pk.timestamp.eq(get(PETH, "timestamp", EXT_AT))
            with m.Else():
                m.d.comb += [
                    pk.timestamp.eq(Mux(ts, get(TSETH, "timestamp", EXT_AT + 4), 0)),
                    pk.va.eq(Mux(ts, get(RETH, "va", EXT_AT + 8), get(RETH, "va", EXT_AT + 4))),
                    pk.rkey.eq(Mux(ts, get(RETH, "rkey", EXT_AT + 8),
                                   get(RETH, "rkey", EXT_AT + 4))),
                    pk.dma_length.eq(Mux(ts, get(RETH, "dma_length", EXT_AT + 8),
                                         get(RETH, "dma_length", EXT_AT + 4))),
                ]
                with m.If(kind == K_DATA):
                    m.d.comb += [pk.length.eq(payload[:16]), pk.slot.eq(1)]
                    with m.If(has_imm):
                        m.d.comb += pk.imm.eq(Mux(ts, get(IMMDT, "imm", EXT_AT + 24),
                                                  get(IMMDT, "imm", EXT_AT + 20)))

        m.d.comb += [self.cause.eq(cause), self.check_icrc.eq(~trimmed),
                     self.too_long.eq(too_long), self.kind.eq(kind),
                     self.data_frame.eq(is_write & ~short)]
        return m


def proto_stev(udp_src_port, flow_label):
    """Gateware :func:`mrcnic.base.proto.stev_join`: EV[15:0] from the port, EV[31:16] from the
    flow label's low bits."""
    return Cat(udp_src_port[:proto.STEV_PORT_BITS], flow_label[:proto.STEV_FLOW_BITS])


