"""RoCEv2/MRC data and probe frames from packet descriptors and payloads: :class:`RoceTx`
(``roce-tx``).

The transmit frame builder of :class:`~mrcnic.tx.mrc_tx.MrcTx`: each packet descriptor and its
payload become one complete RoCEv2 WRITE frame, METH and RETH included, its ICRC computed in
line; a PROBE descriptor becomes an MRC probe frame and an EP_REQUEST descriptor a port status
update, neither with a payload. The frames go on to :class:`~mrcnic.tx.srv6_encap.Srv6Encap`.

Operation, decisions and measured figures: docs/blocks/roce-tx.md.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto

from mrcnic.base.records import QP_INDEX_BITS, MAX_PAYLOAD, TX_DESC
from mrcnic.base.crc import CrcStream
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters, ipv6_registers, mac_registers)
from mrcnic.base.proto import (BTH, ERTH, ETH, IMMDT, IPV6, METH, PETH, RETH, TSETH,
                               UDP, Opcode)
from mrcnic.base.stream import (AxiStreamSignature, MetaSkidBuffer, SkidBuffer, check_data_width,
                     drive_axis, keep_count, meta_stream)

__all__ = ["RoceTx", "TX_REGS", "HEADER_LEN", "PROBE_HEADER_LEN", "HOP_LIMIT_DEFAULT"]

# Header bytes before the payload, by the 4-byte headers a write carries besides METH and
# RETH (ImmDt, TSETH: 0, 1 or 2 of them); a probe's headers (no payload).
assert IMMDT.size == TSETH.size == 4
HEADER_LEN = {k: ETH.size + IPV6.size + UDP.size + BTH.size + METH.size + RETH.size + 4 * k
              for k in range(3)}
PROBE_HEADER_LEN = ETH.size + IPV6.size + UDP.size + BTH.size + PETH.size      # 90
# Bytes the UDP and IPv6 length fields count besides the payload and pad.
_L4_FIXED = UDP.size + BTH.size + METH.size + RETH.size + proto.ICRC_LEN
_L4_PROBE = UDP.size + BTH.size + PETH.size + proto.ICRC_LEN                   # 40
# The bytes after the BTH: METH | [TSETH] | RETH | [ImmDt], or a probe's PETH and zeros
# (never sent).
_EXT_BYTES = METH.size + TSETH.size + RETH.size + IMMDT.size
HOP_LIMIT_DEFAULT = 64
TX_COUNTERS = ["frames", "retransmissions", "bad_qp", "bad_opcode", "too_long", "payload"]

TX_REGS = RegisterMap("roce_tx", [
    *mac_registers("local", "Source (this NIC)"),
    *ipv6_registers("local", "Source (this NIC)"),
    Register("config", [
        Field("udp_dport", 16, "rw", reset=proto.UDP_DPORT_DEFAULT,
              desc="UDP destination port"),
        Field("pkey", 16, "rw", reset=proto.PKEY_DEFAULT, desc="BTH P_Key"),
    ]),
    Register("ipv6", [
        Field("dscp_data", 6, "rw", reset=proto.DSCP_DATA,
              desc="DSCP of first transmissions"),
        Field("dscp_rtx", 6, "rw", reset=proto.DSCP_RTX,
              desc="DSCP of retransmissions (descriptor rtx = 1)"),
        Field("ecn", 2, "rw", reset=proto.ECN_ECT0, desc="ECN codepoint sent"),
        Field("hop_limit", 8, "rw", reset=HOP_LIMIT_DEFAULT, desc="IPv6 hop limit"),
    ]),
    Register("ctx_qp", [Field("qp", QP_INDEX_BITS, "rw",
                              desc="Local QP index of the context entry ctx_write writes")]),
    *mac_registers("ctx", "Context: destination (the peer)"),
    *ipv6_registers("ctx", "Context: destination (the peer)"),
    Register("ctx_remote_qp", [Field("qpn", proto.PSN_BITS, "rw",
                                     desc="Context: remote QP number (BTH dest_qp)")]),
    Register("control", [
        Field("ctx_write", 1, "w1p",
              desc="Write the ctx_* registers into the context of QP ctx_qp (the next "
                   "cycle); nothing when ctx_qp is not below qps"),
        Field("clear", 1, "w1p", desc="Zero every counter"),
    ]),
    Register("info", [Field("qps", 17, "ro", desc="QP contexts (the qps parameter)")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("frames", "Frames sent"),
        ("retransmissions", "Frames sent with rtx = 1"),
        ("bad_qp", "Frames sent bad: qp not below qps"),
        ("bad_opcode", "Frames sent bad: neither a WRITE opcode nor a probe nor a port "
                       "status update"),
        ("too_long", f"Frames sent bad: length above {MAX_PAYLOAD}, or a probe with a "
                     f"length"),
        ("payload", "Frames sent bad: payload frame shorter or longer than length, or bad"),
    ]],
])

_CTX = data.StructLayout({"mac": 48, "ip": 128, "remote_qp": 24})


class RoceTx(wiring.Component):
    """RoCEv2 WRITE frames from descriptors and payloads; probe and port status frames.

    Each ``desc`` record becomes one frame on ``m_axis``, no FCS::

        Eth | IPv6 | UDP | BTH | METH | RETH | [ImmDt] | payload | pad | ICRC

    94 header bytes, 98 with the ImmDt of WRITE_LAST_IMM / WRITE_ONLY_IMM; ``length``
    payload bytes from one ``s_axis`` frame (none for length 0); BTH pad = (-length) mod 4
    zero bytes; the ICRC (spec §2.1) computed while the frame streams. The descriptor gives
    the BTH, METH, RETH and ImmDt fields and the STEV ``entropy`` (flow label and UDP source
    port); the QP's context, a table written through the registers, gives the Ethernet and
    IPv6 destinations and the remote QP number; registers give the rest (sources, UDP port,
    P_Key, DSCP of first transmissions and of retransmissions, ECN, hop limit). A PROBE
    (0xDE) descriptor becomes a 94-byte probe frame, Eth | IPv6 | UDP | BTH | PETH | ICRC,
    and an EP_REQUEST (0xD8) one a port status update of the same shape
    (:data:`~mrcnic.base.proto.ERTH`, op EP_PORT_STATUS, the descriptor's ``timestamp``);
    neither takes a payload. A bad descriptor or
    payload (QP not below ``qps``, unknown opcode, too long, payload shorter or longer than
    ``length``) still gives its frame, marked with ``tuser[0]`` on its last beat and
    counted; the frames after it are not affected.

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 2048. Default 512.
    qps : int
        QP contexts, 1 .. 65536. Default 64.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    desc : stream of :data:`~mrcnic.base.records.TX_DESC`, in
        One descriptor per frame.
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Payloads: one frame per WRITE descriptor with ``length`` > 0, in descriptor order;
        ``tuser[0]`` marks a bad payload.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Frames; ``tuser[0]`` on the last beat of a bad one.
    s_axil : AXI4-Lite, in
        Registers, :data:`TX_REGS`: sources, UDP port, P_Key, DSCP, ECN, hop limit, the
        context table, counters.
    latency : int
        Cycles from a descriptor's handshake to its frame's first beat.

    Every ready is a register (skid buffers on ``desc``, ``s_axis`` and ``m_axis``).

    Latency
    -------
    :attr:`latency` = 5 + the CRC's latency cycles from a descriptor's handshake to the
    frame's first beat, when idle and the payload is there (descriptor slice, S1, the beat
    generator, the CRC's stages, the output slice): 10 at 64 and 128 bits, 11 at 256 and
    512, 12 at 1024 and 2048. The same for a probe.

    Throughput
    ----------
    One beat a cycle with no idle cycle between frames, probes included: a frame of ``n``
    bytes takes ceil(n / B) beats on a B-byte bus (a probe 12 beats at 64 bits, 2 at 512,
    1 from 1024).

    Raises
    ------
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, ``qps`` is not an int in
        1 .. 65536, or ``counter_width`` is not 0, 16 or 32.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, data_width=512, qps=64, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        check_data_width(data_width, minimum=64, maximum=2048, power_of_two=True)
        if not isinstance(qps, int) or not 1 <= qps <= 1 << QP_INDEX_BITS:
            raise ValueError(f"qps = {qps!r} is outside 1 .. {1 << QP_INDEX_BITS}")
        self.data_width = data_width
        self.qps = qps
        self.B = data_width // 8
        self.crc_latency = CrcStream.latency_of(data_width)
        # The descriptor slice, S1 (the table read), G, the CRC's stages, the output slice,
        # counted from the descriptor's handshake to the output beat's.
        self.latency = 5 + self.crc_latency
        super().__init__({
            "desc": In(meta_stream(TX_DESC)),
            "s_axis": In(AxiStreamSignature(data_width)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "s_axil": In(AxiLiteSignature(TX_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        # The registers: sources, ports, DSCP, the context entry to write, counters.
        f = self._registers(m)
        # The context table: written from the ctx_* registers, read by the descriptor slice.
        rd = self._context_table(m, f)
        # R0 and S1: the descriptor slice addresses the table; S1 holds the descriptor.
        s1x = self._stage_s1_descriptor(m, rd)
        # S1's frame header, from its descriptor, its context and the registers.
        hd = self._stage_s1_header(m, f, rd, s1x)
        # G's state, the payload slice and the handshakes that move G.
        g = self._stage_g_state(m, s1x, hd)
        # G's beat: header, payload and zero lanes into o1, the CRC's input.
        o1 = self._stage_g_beat(m, g)
        # G steps a beat on, taking a payload beat when it needs one.
        self._stage_g_step(m, g)
        # G loads S1's frame when it takes S1.
        self._stage_g_load(m, s1x, hd, g)
        # The ICRC beside a delay line of its length, written into the frame's last bytes.
        stage, out_lanes = self._stage_icrc(m, g, o1)
        # The output slice, tuser[0] on a bad frame's last beat.
        self._stage_output(m, g, stage, out_lanes)
        # The counters of the frames handed on.
        self._counters(m, f, g, stage)
        return m

    @staticmethod
    def _ip(f, prefix):            # register 0 holds the address's first bytes
        return Cat(*(f[f"{prefix}{i}"]["ip"] for i in reversed(range(4))))

    def _below_qps(self, qp):
        return Const(1, 1) if self.qps == 1 << QP_INDEX_BITS else qp < self.qps

    def _registers(self, m):
        """The register block on ``s_axil``; returns its fields."""
        m.submodules.csr = csr = CsrBlock(TX_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        f = csr.fields
        m.d.comb += f["info"]["qps"].eq(self.qps)
        return f

    def _context_table(self, m, f):
        """The context table, one entry per QP; returns its read port."""
        m.submodules.ctx = ctx = Memory(shape=_CTX, depth=max(self.qps, 2), init=[])
        wr = ctx.write_port()
        rd = ctx.read_port()
        ctx_qp = f["ctx_qp"]["qp"]
        m.d.comb += [
            wr.addr.eq(ctx_qp),
            wr.data.mac.eq(Cat(f["ctx_mac_lo"]["mac"], f["ctx_mac_hi"]["mac"])),
            wr.data.ip.eq(self._ip(f, "ctx_ip")),
            wr.data.remote_qp.eq(f["ctx_remote_qp"]["qpn"]),
            wr.en.eq(f["control"]["ctx_write"] & self._below_qps(ctx_qp)),
        ]
        return rd

    def _stage_s1_descriptor(self, m, rd):
        """R0 (descriptor slice, addresses the table) and S1 (the descriptor)."""
        m.submodules.desc_skid = r0 = MetaSkidBuffer(TX_DESC)
        wiring.connect(m, wiring.flipped(self.desc), r0.i)
        s1 = Signal(TX_DESC)
        s1_valid = Signal()
        s1_take = Signal()                 # G takes S1 this cycle
        s1_load = ~s1_valid | s1_take
        # A probe, and the payload length the frame carries (0 for a probe, whatever the
        # descriptor says), decoded as S1 loads so that S1's adders see registers.
        s1_probe = Signal()                # a probe or a port status update: no payload
        s1_ep = Signal()                   # a port status update
        s1_length = Signal.like(s1.length)
        r0_ep = r0.o.payload.opcode == int(Opcode.EP_REQUEST)
        r0_probe = (r0.o.payload.opcode == int(Opcode.PROBE)) | r0_ep
        m.d.comb += [r0.o.ready.eq(s1_load), rd.addr.eq(r0.o.payload.qp), rd.en.eq(s1_load)]
        with m.If(s1_load):
            m.d.sync += [s1.eq(r0.o.payload), s1_valid.eq(r0.o.valid), s1_probe.eq(r0_probe),
                         s1_ep.eq(r0_ep),
                         s1_length.eq(Mux(r0_probe, 0, r0.o.payload.length))]
        return SimpleNamespace(s1=s1, s1_valid=s1_valid, s1_take=s1_take, s1_probe=s1_probe,
                               s1_ep=s1_ep, s1_length=s1_length)

    def _stage_s1_header(self, m, f, rd, s1x):
        """The header of S1's frame, and the decodes G loads and counts with it."""
        s1, s1_ep = s1x.s1, s1x.s1_ep
        op = s1.opcode
        probe = s1x.s1_probe
        is_write = (op >= int(Opcode.WRITE_FIRST)) & (op <= int(Opcode.WRITE_ONLY_IMM))
        has_imm = (op == int(Opcode.WRITE_LAST_IMM)) | (op == int(Opcode.WRITE_ONLY_IMM))
        ts = s1.ts & is_write & ~probe      # a TSETH after the METH (BTH ts)
        extra = Signal(2)                   # 4-byte headers besides METH and RETH: 0 .. 2
        m.d.comb += extra.eq(has_imm + ts)
        length = s1x.s1_length
        pad = (-length)[:2]
        ack_req = s1.ack_req & ~probe       # a probe: A = 0, rtx = 0 (never retransmitted)
        rtx = s1.rtx & ~probe
        l4_len = Signal(16)
        m.d.comb += l4_len.eq(Mux(probe, _L4_PROBE, _L4_FIXED + 4 * extra) + length + pad)
        ctx_ok = self._below_qps(s1.qp)
        c = rd.data
        reth_imm = Cat(RETH.assemble({"va": s1.va, "rkey": s1.rkey, "dma_length": s1.dma_length}),
                       IMMDT.assemble({"imm": s1.imm}))
        ipv6 = f["ipv6"]
        sport, flow = s1.entropy[:proto.STEV_PORT_BITS], s1.entropy[proto.STEV_PORT_BITS:]
        header = Cat(
            ETH.assemble({"dst": Mux(ctx_ok, c.mac, 0),
                          "src": Cat(f["local_mac_lo"]["mac"], f["local_mac_hi"]["mac"]),
                          "ethertype": proto.ETHERTYPE_IPV6}),
            IPV6.assemble({"version": proto.IPV6_VERSION,
                           "dscp": Mux(rtx, ipv6["dscp_rtx"], ipv6["dscp_data"]),
                           "ecn": ipv6["ecn"], "flow_label": flow,
                           "payload_length": l4_len, "next_header": proto.IPPROTO_UDP,
                           "hop_limit": ipv6["hop_limit"], "src": self._ip(f, "local_ip"),
                           "dst": Mux(ctx_ok, c.ip, 0)}),
            UDP.assemble({"src_port": sport, "dst_port": f["config"]["udp_dport"],
                          "length": l4_len}),
            BTH.assemble({"opcode": op, "pad": pad, "tver": proto.BTH_TVER,
                          "pkey": f["config"]["pkey"],
                          "dest_qp": Mux(s1_ep, proto.ENDPOINT_QP,
                                         Mux(ctx_ok, c.remote_qp, 0)), "ack_req": ack_req,
                          "rtx": rtx, "ts": ts, "psn": s1.psn}),
            Mux(probe,
                Cat(Mux(s1_ep,
                        ERTH.assemble({
                            "op": proto.EP_PORT_STATUS, "ports": s1.imm, "src_id": s1.qp,
                            "dst_id": Mux(ctx_ok, c.remote_qp, 0)[:ERTH.width("dst_id")],
                            "timestamp": s1.timestamp, "type": proto.TSETH_TYPE}),
                        PETH.assemble({
                            "probe_id": s1.msn, "src_id": s1.qp,
                            "dst_id": Mux(ctx_ok, c.remote_qp, 0)[:PETH.width("dst_id")],
                            "timestamp": s1.timestamp, "type": proto.TSETH_TYPE})),
                    Const(0, 8 * (_EXT_BYTES - PETH.size))),
                Cat(METH.assemble({"rqmsn": s1.rqmsn, "msn": s1.msn}),
                    Mux(ts, Cat(TSETH.assemble({"timestamp": s1.timestamp,
                                                "type": proto.TSETH_TYPE}), reth_imm),
                        Cat(reth_imm, Const(0, 8 * TSETH.size))))),
        )
        hlen = Mux(probe, PROBE_HEADER_LEN, HEADER_LEN[0] + 4 * extra)
        return SimpleNamespace(header=header, hlen=hlen, is_write=is_write, extra=extra,
                               probe=probe, length=length, pad=pad, rtx=rtx, ctx_ok=ctx_ok)

    def _stage_g_state(self, m, s1x, hd):
        """G, the beat generator: its registers, the payload slice, and what moves G."""
        B, W = self.B, self.data_width
        en = Signal()                       # the pipeline after S1 moves (output has room)
        g_active = Signal()                 # G holds a frame
        hdr = Signal(len(hd.header))        # header bytes still to send, from byte 0
        extra = Signal(2)                   # the header is HEADER_LEN[extra] bytes
        # Bytes from this beat's first one to the end of: the header; the payload; the pad
        # (where the ICRC starts). Counted down a beat at a time, so that every lane's
        # choice is a compare of a register with a constant.
        rem_hdr = Signal(range(-B, HEADER_LEN[2] + 1))
        rem_data = Signal(range(-2 * B, 1 << 18))
        rem_crc = Signal(range(-2 * B, 1 << 18))
        pay_left = Signal(range((1 << 16) // B + 2))         # payload beats still to take
        last_keep = Signal(range(B + 1))    # bytes of the last payload beat
        first = Signal()
        short = Signal()                    # the payload frame ended early: zeros follow
        drain = Signal()                    # the payload frame is longer: drop up to tlast
        pbad = Signal()                     # the payload did not match the descriptor
        prev = Signal(W)
        cause = Signal(data.StructLayout({"bad_qp": 1, "bad_opcode": 1, "too_long": 1,
                                           "rtx": 1}))

        m.submodules.pay_skid = pay = SkidBuffer(W)
        wiring.connect(m, wiring.flipped(self.s_axis), pay.s_axis)
        p = pay.m_axis

        # This beat takes a payload beat: past the header's first beat, payload beats left,
        # the payload frame not ended early. A register, worked out a beat ahead, since it
        # decides whether G moves, and so the descriptor slice's ready.
        need = Signal()
        # The frame's last beat, as a register: it steers S1, the descriptor slice and the
        # counters, so it must not be an adder and a compare deep.
        g_last = Signal()
        fire = en & g_active & (~need | (p.tvalid & ~drain))
        take = fire & need
        m.d.comb += s1x.s1_take.eq(en & (~g_active | (fire & g_last)))
        m.d.comb += p.tready.eq(take | drain)
        with m.If(drain & p.tvalid & p.tlast):
            m.d.sync += drain.eq(0)

        last_pay = pay_left == 1
        pay_wrong = p.tuser[0] | (p.tlast != last_pay) | Mux(
            last_pay, keep_count(p.tkeep) != last_keep, ~p.tkeep.all())
        pbad_now = pbad | (take & pay_wrong)
        return SimpleNamespace(
            en=en, g_active=g_active, hdr=hdr, extra=extra, rem_hdr=rem_hdr, rem_data=rem_data,
            rem_crc=rem_crc, pay_left=pay_left, last_keep=last_keep, first=first, short=short,
            drain=drain, pbad=pbad, prev=prev, cause=cause, p=p, need=need, g_last=g_last,
            fire=fire, take=take, last_pay=last_pay, pbad_now=pbad_now)

    def _stage_g_beat(self, m, g):
        """G's beat into o1: header bytes, then payload bytes, then zeros; the CRC's view."""
        B, W = self.B, self.data_width
        # The lanes: header bytes, then payload bytes from the current and previous payload
        # beats (the header ends at 94, 98 or 102 mod B), then zeros.
        off = {k: HEADER_LEN[k] % B for k in HEADER_LEN}
        cur = Mux(g.need, g.p.tdata, 0)
        lanes = []
        for i in range(B):
            def src(o, i=i):
                return cur.word_select(i - o, 8) if i >= o else g.prev.word_select(i - o + B, 8)
            pay_byte = src(off[0])
            for k in (1, 2):
                if off[k] != off[0]:
                    pay_byte = Mux(g.extra == k, src(off[k]), pay_byte)
            hdr_byte = g.hdr.word_select(i, 8) if 8 * i < len(g.hdr) else Const(0, 8)
            lanes.append(Mux(g.rem_hdr > i, hdr_byte, Mux(g.rem_data > i, pay_byte, 0)))

        def therm(n):
            return Cat(*[n > i for i in range(B)])

        rem_crc = g.rem_crc
        o1 = {"valid": Signal(name="o1_valid"), "data": Signal(W, name="o1_data"),
              "keep": Signal(B, name="o1_keep"), "last": Signal(name="o1_last"),
              "crc_keep": Signal(B, name="o1_crc_keep"), "crc_valid": Signal(name="o1_crc_v"),
              "crc_first": Signal(name="o1_crc_first"), "crc_last": Signal(name="o1_crc_last"),
              "icrc": Signal(range(-proto.ICRC_LEN, B + 1), name="o1_icrc"),
              "cause": Signal(5, name="o1_cause")}
        with m.If(g.en):
            m.d.sync += [
                o1["valid"].eq(g.fire), o1["data"].eq(Cat(*lanes)),
                o1["keep"].eq(therm(rem_crc + proto.ICRC_LEN)), o1["last"].eq(g.g_last),
                o1["crc_keep"].eq(therm(rem_crc)), o1["crc_valid"].eq(g.fire & (rem_crc > 0)),
                o1["crc_first"].eq(g.first), o1["crc_last"].eq(rem_crc <= B),
                o1["icrc"].eq(Mux(rem_crc >= B, B, rem_crc)),
                o1["cause"].eq(Cat(g.cause, g.pbad_now)),
            ]
        return o1

    def _stage_g_step(self, m, g):
        """G moves a beat on; a payload beat taken becomes the previous one."""
        B, W = self.B, self.data_width
        p, take, last_pay = g.p, g.take, g.last_pay
        rem_hdr, rem_data, rem_crc = g.rem_hdr, g.rem_data, g.rem_crc
        with m.If(g.fire):
            ends_short = take & p.tlast & ~last_pay
            left_next = Mux(take, g.pay_left != 1, g.pay_left != 0)
            m.d.sync += g.need.eq((rem_hdr < 2 * B) & left_next & ~g.short & ~ends_short)
            # rem_hdr stops once past the header, so that it never wraps on long frames.
            m.d.sync += [rem_hdr.eq(Mux(rem_hdr < 0, rem_hdr, rem_hdr - B)),
                         rem_data.eq(rem_data - B),
                         g.g_last.eq(rem_crc <= 2 * B - proto.ICRC_LEN),
                         rem_crc.eq(rem_crc - B), g.hdr.eq(g.hdr >> W), g.first.eq(0),
                         g.pbad.eq(g.pbad_now)]
        with m.If(take):
            m.d.sync += [g.prev.eq(p.tdata), g.pay_left.eq(g.pay_left - 1)]
            with m.If(p.tlast & ~last_pay):
                m.d.sync += g.short.eq(1)
            with m.If(last_pay & ~p.tlast):
                m.d.sync += g.drain.eq(1)

    def _stage_g_load(self, m, s1x, hd, g):
        """G loads S1's frame: its header, its byte counts, its causes of badness."""
        B = self.B
        hlen, length, pad, probe = hd.hlen, hd.length, hd.pad, hd.probe
        cause = g.cause
        with m.If(s1x.s1_take):
            m.d.sync += [
                g.need.eq(s1x.s1_valid & (hlen < B) & (length != 0)),
                g.g_active.eq(s1x.s1_valid), g.hdr.eq(hd.header), g.extra.eq(hd.extra),
                g.first.eq(1),
                g.rem_hdr.eq(hlen), g.rem_data.eq(hlen + length),
                g.rem_crc.eq(hlen + length + pad),
                g.g_last.eq(hlen + length + pad + proto.ICRC_LEN <= B),
                g.pay_left.eq((length + B - 1) >> (B.bit_length() - 1)),
                g.last_keep.eq(((length - 1) & (B - 1)) + 1),
                g.short.eq(0), g.pbad.eq(0),
                cause.bad_qp.eq(~hd.ctx_ok), cause.bad_opcode.eq(~hd.is_write & ~probe),
                cause.too_long.eq((s1x.s1.length > MAX_PAYLOAD) | (probe & (s1x.s1.length != 0))),
                cause.rtx.eq(hd.rtx),
            ]

    def _stage_icrc(self, m, g, o1):
        """The ICRC beside a delay line of its length; returns the line's end and the lanes
        with the ICRC written in."""
        B, W = self.B, self.data_width
        m.submodules.crc = crc = CrcStream(W)
        m.d.comb += [crc.en.eq(g.en), crc.valid.eq(o1["crc_valid"]), crc.data.eq(o1["data"]),
                     crc.keep.eq(o1["crc_keep"]), crc.first.eq(o1["crc_first"]),
                     crc.last.eq(o1["crc_last"])]
        stage = o1
        for i in range(crc.latency):
            nxt = {n: Signal.like(v, name=f"d{i + 1}_{n}") for n, v in stage.items()
                   if not n.startswith("crc_")}
            with m.If(g.en):
                m.d.sync += [nxt[n].eq(stage[n]) for n in nxt]
            stage = nxt
        crc_hold = Signal(32)
        with m.If(crc.done):
            m.d.sync += crc_hold.eq(crc.crc)
        icrc = Mux(crc.done, crc.crc, crc_hold)
        out_lanes = []
        for i in range(B):
            byte = stage["data"].word_select(i, 8)
            for b in range(proto.ICRC_LEN):           # the ICRC goes out LSB first
                if -proto.ICRC_LEN < i - b <= B:
                    byte = Mux(stage["icrc"] == i - b, icrc.word_select(b, 8), byte)
            out_lanes.append(byte)
        return stage, out_lanes

    def _stage_output(self, m, g, stage, out_lanes):
        """The output slice; its ready moves everything after S1."""
        cause_out = stage["cause"]
        bad_out = cause_out[0] | cause_out[1] | cause_out[2] | cause_out[4]

        m.submodules.out_skid = out = SkidBuffer(self.data_width)
        wiring.connect(m, out.m_axis, wiring.flipped(self.m_axis))
        drive_axis(m, out.s_axis, valid=stage["valid"], data=Cat(*out_lanes),
                   keep=stage["keep"], last=stage["last"], user=stage["last"] & bad_out)
        m.d.comb += g.en.eq(out.s_axis.tready)

    def _counters(self, m, f, g, stage):
        """The event counters, one event per frame handed to the output slice."""
        cause_out = stage["cause"]
        handed = g.en & stage["valid"] & stage["last"]
        events = Signal(data.StructLayout({n: 1 for n in TX_COUNTERS}))
        m.d.comb += [
            events.frames.eq(handed), events.retransmissions.eq(handed & cause_out[3]),
            events.bad_qp.eq(handed & cause_out[0]), events.bad_opcode.eq(handed & cause_out[1]),
            events.too_long.eq(handed & cause_out[2]), events.payload.eq(handed & cause_out[4]),
        ]
        event_counters(m, f, events, TX_COUNTERS, f["control"]["clear"], width=self.counter_width)


