"""RoCEv2/MRC receive parser and payload buffer: :class:`RoceRx` (``roce-rx``).

The receive parser of one plane, in :class:`~mrcnic.rx.mrc_rx.MrcRx` after the plane's
:class:`~mrcnic.rx.srv6_decap.Srv6Decap`: it checks each RoCEv2/MRC frame as it streams and
turns it into one record (a packet for the PSN tracker, a received SACK or NACK, an AETH
NAK, a port status update); a data packet's payload waits in a block-RAM buffer until its
verdict comes back, and is then placed or dropped. Its stage B,
:class:`~mrcnic.rx.roce_rx.header_check.HeaderCheck`, is in :mod:`.header_check`.

Operation, decisions and measured figures: docs/blocks/roce-rx.md.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base import proto

from mrcnic.base.records import (
    ACK_DESC, EV_PROBE, NAK, PLACE, RX_PKT, VERDICT_IN, PEER_STATUS, DECAP_META)
from mrcnic.base.crc import CrcStream
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import Opcode
from mrcnic.base.stream import (AxiStreamSignature, FrameCursor, MetaSkidBuffer, SkidBuffer,
                     check_data_width, const_lt, drive_axis, keep_count, meta_stream)
from mrcnic.rx.roce_rx.header_check import (
    BTH_AT, C_IN_BAD, C_LENGTH, C_NONE, C_NOT_ROCE, C_OPCODE, C_TRUNCATED, HDR_BYTES,
    BODY, K_ACK, K_DATA, K_EV_PROBE, K_NACK, K_NAK, K_PEER, K_PROBE, K_SACK, K_TRIM, KEPT,
    KIND_BITS, PAYLOAD_AT, HeaderCheck)

__all__ = ["RoceRx", "ROCE_RX_REGS",
           "RX_COUNTERS"]


FIFO_DEPTH = 16         # record FIFOs and the summary FIFO; > frames in flight at 2048 bits

RX_COUNTERS = ["frames", "data", "trimmed", "probes", "sacks", "nacks", "acks", "naks",
               "port_status", "ev_probes", "placed", "verdict_drop", "in_bad", "not_roce",
               "truncated", "opcode", "length", "icrc", "too_long", "no_room", "verdict_tag"]

ROCE_RX_REGS = RegisterMap("roce_rx", [
    Register("udp_dport", [Field("port", 16, "rw", reset=proto.UDP_DPORT_DEFAULT,
                                 desc="MRC UDP destination port")]),
    Register("pmtu", [Field("bytes", 16, "rw", reset=4096,
                            desc="Longest payload accepted (values above pmtu_max act as "
                                 "pmtu_max)")]),
    Register("trim_dscp", [Field("dscp", 6, "rw", reset=proto.DSCP_TRIMMED,
                                 desc="Codepoint of a trimmed packet")]),
    Register("trim_lasthop_dscp", [Field("dscp", 6, "rw", reset=proto.DSCP_TRIMMED_LASTHOP,
                                         desc="Codepoint of a packet trimmed at its last "
                                              "hop")]),
    Register("stev_swap", [Field("swap", 1, "rw",
                                 desc="1: a data packet's EV is EV[31:16] from its UDP source "
                                      "port, EV[15:0] from its flow label (a peer that splits "
                                      "the STEV so, as the inserter's config.stev_swap); 0: "
                                      "the other way round")]),
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
        ("ev_probes", "EV probe requests (ev_probe record)"),
        ("placed", "Place verdicts (place record)"),
        ("verdict_drop", "Held payloads dropped by their verdict"),
        ("in_bad", "Frames with tuser[0] or meta.bad"),
        ("not_roce", "Not IPv6 / UDP to udp_dport"),
        ("truncated", "Frames shorter than their headers"),
        ("opcode", "Opcodes other than WRITE, ACK, SACK, NACK, probe, port status, EV "
                   "probe"),
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
    update a ``peer`` record; an EV probe request an ``ev_probe`` record. A frame that fails
    a check gives no record and is counted. A data packet's payload is held until its ``verdict`` places it (``place`` record and
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
    ev_probe : stream of :data:`~mrcnic.base.records.EV_PROBE`, out
        The EV probe requests received, to answer: ``qp`` the ERTH's ``dst_id``,
        ``peer_id`` its ``src_id``, the BTH ``psn``, ``entropy`` the frame's STEV (as a
        data packet's, with ``stev_swap``), the ERTH's ``timestamp``.
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
            "ev_probe": Out(meta_stream(EV_PROBE)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "place": Out(meta_stream(PLACE)),
            "s_axil": In(AxiLiteSignature(ROCE_RX_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        # Skid buffers on s_axis, meta, verdict and m_axis; the register block.
        io = self._ports(m)
        # Stage A: frame cursor, ICRC pipeline, sticky bad flag, stage B's input registers.
        a = self._stage_a_parse(m, io)
        # Payload buffer: the block RAM, its write and free pointers.
        buf = self._payload_buffer(m)
        # Payload writer: the payload, realigned, into the buffer as the frame streams.
        w = self._payload_writer(m, a, buf)
        # The writer's per-frame state, handed to stage B with the last beat.
        self._writer_frame_state(m, a, buf, w)
        # Stage B: HeaderCheck's checks and record, the summary FIFO.
        b = self._stage_b_check(m, io, a, buf, w)
        # Stage D: the ICRC verdict, the drop decision, the record FIFOs and outputs.
        d = self._stage_d_records(m, a, b)
        # Credits: a last beat is taken only when every record FIFO has room for it.
        self._credits(m, a, d)
        # Buffer commit: keep (held entry), roll back or leave a hole; slots in use.
        c = self._buffer_commit(m, buf, w, b, d)
        # Release engine: verdicts, place records, payloads out on m_axis.
        r = self._release_engine(m, io, buf, w, c)
        # Event counters and the status register.
        self._counters(m, io, buf, w, d, r)
        a.cap.capture()
        return m

    def _ports(self, m):
        """The skid buffers on the four streams and the register block."""
        W = self.data_width
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
        return SimpleNamespace(regs=csr.fields, s=in_skid.m_axis, mi=meta_skid.o,
                               vi=verdict_skid.o, out=out_skid.s_axis)

    def _stage_a_parse(self, m, io):
        """Stage A: the cursor keeping the header bytes, the input handshakes, the ICRC
        pipeline, the sticky bad flag, and stage B's registers loaded with the last beat."""
        s, mi = io.s, io.mi
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
        return SimpleNamespace(s=s, cap=cap, accept=accept, room=room, last=last, crc=crc,
                               fin=fin, fin_len=fin_len, fin_bad=fin_bad, fin_meta=fin_meta)

    def _payload_buffer(self, m):
        """The payload buffer: block RAM of ``words`` words of B bytes, the write pointer
        ``wp`` and the free pointer ``rp``."""
        AW = self.aw
        PTR = AW + 1                      # buffer pointers carry a lap bit: full vs empty
        mem = Memory(shape=self.data_width, depth=self.words, init=[])
        m.submodules.mem = mem
        wr = mem.write_port()
        rd = mem.read_port(domain="sync")

        wp = Signal(PTR)                 # next word to write
        rp = Signal(PTR)                 # words before this one are free
        full = (wp[:AW] == rp[:AW]) & (wp[AW] != rp[AW])
        return SimpleNamespace(wr=wr, rd=rd, wp=wp, rp=rp, full=full)

    def _per_p(self, m, fn, sel):
        """``fn(p)`` for the payload start ``p`` = ``PAYLOAD_AT[sel]``, as a 1-bit signal."""
        out = Signal(name=f"per_p_{fn.__name__}")
        with m.Switch(sel):
            for k, p in enumerate(PAYLOAD_AT):
                with m.Case(k):
                    m.d.comb += out.eq(fn(p))
        return out

    def _payload_writer(self, m, a, buf):
        """The payload writer: each word of payload, realigned from the previous beat and
        this one, goes into the buffer as the frame streams, and the tail's word in the
        cycle after the last beat (the flush); a frame that finds no room stops writing."""
        B, W, AW = self.B, self.data_width, self.aw
        PTR = AW + 1
        s, cap, accept = a.s, a.cap, a.accept
        op_now = cap.now(BTH_AT)
        is_write_now = (op_now >= Opcode.WRITE_FIRST) & (op_now <= Opcode.WRITE_ONLY_IMM)
        imm_now = (op_now == Opcode.WRITE_LAST_IMM) | (op_now == Opcode.WRITE_ONLY_IMM)
        ts_now = cap.now(BTH_AT + 8)[proto.BTH_TS_BIT]
        psel_now = Signal(2)
        m.d.comb += psel_now.eq(ts_now + imm_now)

        def beats_after_start(p):          # this beat completes a word: beat >= P // B + 1
            return ~const_lt(cap.beat, p // B + 1)

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

        wreq_n = accept & is_write_now & self._per_p(m, beats_after_start, psel_now) & ~fr_ovf
        wreq_f = a.fin & fl_req & ~fin_ovf
        wreq = wreq_n | wreq_f
        cur_res = Mux(wreq_f, fin_res, fr_res)
        do_write = Signal()
        m.d.comb += do_write.eq(wreq & ~buf.full & (cur_res | slot_ok))
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
        m.d.comb += [buf.wr.addr.eq(buf.wp[:AW]), buf.wr.data.eq(wdata),
                     buf.wr.en.eq(do_write)]
        return SimpleNamespace(
            is_write_now=is_write_now, psel_now=psel_now, fr_res=fr_res, fr_ovf=fr_ovf,
            fr_wrote=fr_wrote, fr_start=fr_start, fin_res=fin_res, fin_ovf=fin_ovf,
            fin_wrote=fin_wrote, fin_start=fin_start, fl_req=fl_req, fl_psel=fl_psel,
            slots=slots, slot_ok=slot_ok, head_pop=head_pop, wreq_n=wreq_n, wreq_f=wreq_f,
            do_write=do_write, ovf_set=ovf_set, res_set=res_set)

    def _writer_frame_state(self, m, a, buf, w):
        """The writer's per-frame state: set as the frame writes, moved to its ``fin_*``
        registers (and the flush requested) with the last beat, then cleared."""
        B, s, cap = self.B, a.s, a.cap

        def tail_word(p):                  # a last beat that holds payload-side bytes
            return ~const_lt(cap.beat, p // B) & s.tkeep[p % B]

        wreq_n, do_write = w.wreq_n, w.do_write
        with m.If(a.last):
            m.d.sync += [
                w.fin_res.eq(w.fr_res | (wreq_n & w.res_set)),
                w.fin_ovf.eq(w.fr_ovf | (wreq_n & w.ovf_set)),
                w.fin_wrote.eq(w.fr_wrote | (wreq_n & do_write)),
                w.fin_start.eq(Mux(w.fr_wrote, w.fr_start, buf.wp)),
                w.fl_req.eq(w.is_write_now & self._per_p(m, tail_word, w.psel_now)),
                w.fl_psel.eq(w.psel_now),
                w.fr_res.eq(0), w.fr_ovf.eq(0), w.fr_wrote.eq(0),
            ]
        with m.Elif(a.accept):
            with m.If(w.res_set & wreq_n):
                m.d.sync += w.fr_res.eq(1)
            with m.If(w.ovf_set & wreq_n):
                m.d.sync += w.fr_ovf.eq(1)
            with m.If(do_write & wreq_n & ~w.fr_wrote):
                m.d.sync += [w.fr_wrote.eq(1), w.fr_start.eq(buf.wp)]

    def _stage_b_check(self, m, io, a, buf, w):
        """Stage B, the cycle after the last beat: :class:`HeaderCheck` on the kept bytes,
        the flush's share of the buffer state, and the frame's summary into the FIFO."""
        regs, cap, PTR = io.regs, a.cap, self.aw + 1
        summary = data.StructLayout({
            "cause": 3, "check_icrc": 1, "too_long": 1, "no_room": 1, "kind": KIND_BITS,
            "res": 1, "wrote": 1, "start": PTR, "end": PTR, "body": BODY,
        })
        m.submodules.check = chk = HeaderCheck(self.pmtu_max)
        pmtu = Signal(16)                # the register, at most pmtu_max; changes rarely
        m.d.sync += pmtu.eq(Mux(regs["pmtu"]["bytes"] > self.pmtu_max, self.pmtu_max,
                                regs["pmtu"]["bytes"]))
        m.d.comb += [
            chk.bus.eq(Cat(*(cap.regs[i] if i in cap.regs else Const(0, 8)
                             for i in range(HDR_BYTES)))),
            chk.n.eq(a.fin_len), chk.bad.eq(a.fin_bad), chk.meta.eq(a.fin_meta),
            chk.udp_dport.eq(regs["udp_dport"]["port"]), chk.pmtu.eq(pmtu),
            chk.trim_dscp.eq(regs["trim_dscp"]["dscp"]),
            chk.trim_lasthop_dscp.eq(regs["trim_lasthop_dscp"]["dscp"]),
            chk.stev_swap.eq(regs["stev_swap"]["swap"]),
        ]
        kind = chk.kind
        # The flush write happens in this cycle; a data frame that wrote nothing reserves its
        # held-queue entry now.
        wreq_f, do_write, fin = w.wreq_f, w.do_write, a.fin
        b_res = w.fin_res | (wreq_f & w.res_set)
        b_ovf = w.fin_ovf | (wreq_f & w.ovf_set)
        b_wrote = w.fin_wrote | (wreq_f & do_write)
        late_res = fin & chk.data_frame & ~b_res & ~b_ovf
        late_ok = late_res & w.slot_ok

        sm = Signal(summary)
        m.d.comb += [
            sm.cause.eq(chk.cause), sm.check_icrc.eq(chk.check_icrc),
            sm.too_long.eq(chk.too_long),
            sm.no_room.eq((kind == K_DATA) & (b_ovf | (late_res & ~w.slot_ok))),
            sm.kind.eq(kind), sm.res.eq(b_res | late_ok), sm.wrote.eq(b_wrote),
            sm.start.eq(Mux(w.fin_wrote, w.fin_start, buf.wp)),
            sm.end.eq(buf.wp + (wreq_f & do_write)),
            sm.body.eq(chk.body),
        ]

        m.submodules.summary = sfifo = SyncFIFO(width=summary.size, depth=FIFO_DEPTH)
        m.d.comb += [sfifo.w_en.eq(fin), sfifo.w_data.eq(sm)]
        return SimpleNamespace(summary=summary, sfifo=sfifo, late_ok=late_ok)

    def _stage_d_records(self, m, a, b):
        """Stage D: the summary and the ICRC verdict registered, the drop decided, the
        record written into its FIFO (the record outputs), ``tag`` counted."""
        sfifo, crc = b.sfifo, a.crc
        # The ICRC verdict and the summary are registered first: both come at the end of
        # deep logic (the CRC's 32-bit compare, the summary's distributed RAM).
        hd = Signal(b.summary)
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
        m.submodules.ev_probe_fifo = evp_fifo = SyncFIFOBuffered(width=EV_PROBE.size,
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
            evp_fifo.w_data.eq(hd.body.ev_probe),
            evp_fifo.w_en.eq(take & (hd.kind == K_EV_PROBE)),
        ]
        for fifo, port in ((pkt_fifo, self.pkt), (ack_fifo, self.ack), (nak_fifo, self.nak),
                           (peer_fifo, self.peer), (evp_fifo, self.ev_probe)):
            m.d.comb += [port.payload.eq(fifo.r_data), port.valid.eq(fifo.r_rdy),
                         fifo.r_en.eq(port.ready)]
        with m.If(hold):
            m.d.sync += tag.eq(tag + 1)
        return SimpleNamespace(hd=hd, done=done, late_cause=late_cause, take=take, hold=hold,
                               tag=tag, fifos=(pkt_fifo, ack_fifo, nak_fifo, peer_fifo,
                                               evp_fifo))

    def _credits(self, m, a, d):
        """Credits: frames past their last beat whose record is not yet in a FIFO, plus the
        FIFO's level, never exceed its depth. Registered from last cycle's counts, with one
        frame of margin (at most one last beat a cycle)."""
        inflight = Signal(range(FIFO_DEPTH + 1))
        m.d.sync += inflight.eq(inflight + a.last - d.done)
        m.d.sync += a.room.eq((inflight + 2 <= FIFO_DEPTH) &
                              Cat(*(inflight + fifo.level + 2 <= FIFO_DEPTH
                                    for fifo in d.fifos)).all())

    def _buffer_commit(self, m, buf, w, b, d):
        """Buffer commit: a kept frame's words become a held entry; a dropped frame's words
        are rolled back, or become a hole the reader skips. The write pointer and the
        held-queue slot count."""
        B, PTR, lb = self.B, self.aw + 1, ceil_log2(self.B)
        # A held-queue entry carries its payload's word count, whether it is one word, and
        # the last word's last lane, worked out before the queue so that the reader, which
        # decides from the entry in the cycle it sees it, has no arithmetic on that path.
        held = data.StructLayout({"hole": 1, "wrote": 1, "start": PTR, "end": PTR,
                                  "words": 16, "one": 1, "tail": lb, "place": PLACE})
        hd, hold, wp, do_write = d.hd, d.hold, buf.wp, w.do_write
        m.submodules.held = queue = SyncFIFOBuffered(width=held.size, depth=self.max_held)
        rollback = d.done & ~hold & hd.wrote & (wp == hd.end) & ~do_write
        hole = d.done & ~hold & hd.wrote & ~rollback
        entry = Signal(held)
        m.d.comb += [
            entry.hole.eq(~hold), entry.wrote.eq(hd.wrote), entry.start.eq(hd.start),
            entry.end.eq(hd.end),
            entry.place.qp.eq(hd.body.pkt.qp), entry.place.psn.eq(hd.body.pkt.psn),
            entry.place.va.eq(hd.body.pkt.va), entry.place.length.eq(hd.body.pkt.length),
            entry.place.tag.eq(d.tag),
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
        # entry leaves the head (release engine) or when the frame leaves none.
        m.d.sync += w.slots.eq(w.slots + (w.res_set | b.late_ok)
                               - (d.done & hd.res & ~(hold | hole)) - w.head_pop)
        return SimpleNamespace(held=held, lb=lb, queue=queue)

    def _release_engine(self, m, io, buf, w, c):
        """The release engine (reader): the head held entry waits for its verdict; a place
        verdict gives a place record and reads the payload out on ``m_axis``, a word a
        cycle; a hole entry is freed without one."""
        B, AW, PTR, lb = self.B, self.aw, self.aw + 1, c.lb
        vi, out, rd, queue = io.vi, io.out, buf.rd, c.queue
        m.submodules.place_fifo = place_fifo = SyncFIFOBuffered(width=PLACE.size, depth=4)
        m.d.comb += [self.place.payload.eq(place_fifo.r_data),
                     self.place.valid.eq(place_fifo.r_rdy), place_fifo.r_en.eq(self.place.ready)]
        # The head entry comes from a register (block RAM has a slow clock-to-output).
        m.submodules.head_skid = head_skid = MetaSkidBuffer(c.held)
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
        out_free = ~o_valid | out.tready

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
            m.d.sync += buf.rp.eq(head.end)
        with m.Elif(reading & issue & last_word):
            m.d.sync += buf.rp.eq(r_end)
        m.d.comb += w.head_pop.eq(pop_hole | v_take)
        m.d.comb += [head_skid.o.ready.eq(pop_hole | v_take), vi.ready.eq(v_take),
                     place_fifo.w_en.eq(v_take & place_it),
                     place_fifo.w_data.eq(head.place)]
        drive_axis(m, out, valid=o_valid, data=rd.data, keep=o_keep, last=o_last, user=0)
        return SimpleNamespace(vmatch=vmatch, place_it=place_it, v_take=v_take)

    def _counters(self, m, io, buf, w, d, r):
        """The event counters (one event a cycle each) and the status register."""
        regs, hd, done, take, late_cause = io.regs, d.hd, d.done, d.take, d.late_cause
        v_take, place_it, vmatch = r.v_take, r.place_it, r.vmatch
        ev = Signal(data.StructLayout({name: 1 for name in RX_COUNTERS}))
        k = hd.kind
        m.d.comb += [
            ev.frames.eq(done), ev.data.eq(d.hold),
            ev.trimmed.eq(take & (k == K_TRIM)), ev.probes.eq(take & (k == K_PROBE)),
            ev.sacks.eq(take & (k == K_SACK)), ev.nacks.eq(take & (k == K_NACK)),
            ev.acks.eq(take & (k == K_ACK)), ev.naks.eq(take & (k == K_NAK)),
            ev.port_status.eq(take & (k == K_PEER)),
            ev.ev_probes.eq(take & (k == K_EV_PROBE)),
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
        event_counters(m, regs, ev, RX_COUNTERS, regs["control"]["clear"],
                       width=self.counter_width)
        m.d.comb += [regs["status"]["held"].eq(w.slots),
                     regs["status"]["buffer_words"].eq((buf.wp - buf.rp)[:self.aw + 1])]
