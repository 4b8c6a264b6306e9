"""Stage B of :class:`~mrcnic.rx.roce_rx.RoceRx`: :class:`HeaderCheck`, and the frame positions,
record kinds and drop causes it shares with the rest of the block.

Operation, decisions and measured figures: docs/blocks/roce-rx.md.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto

from mrcnic.base.records import ACK_DESC, EV_PROBE, NAK, RX_PKT, PEER_STATUS, DECAP_META
from mrcnic.base.proto import (
    AETH, BTH, CC_STATE, ETH, IMMDT, IPV6, NETH, PETH, ERTH, RETH, SETH, TSETH, UDP,
    EvMode, Opcode)


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
               Opcode.EP_REQUEST: EXT_AT + ERTH.size}

# Record kinds (stage B -> stage D).
K_DATA, K_TRIM, K_PROBE, K_SACK, K_NACK, K_ACK, K_NAK, K_PEER, K_EV_PROBE = range(9)
KIND_BITS = 4
# Drop causes found in stage B, by priority; the ICRC, too_long and no_room come after.
C_NONE, C_IN_BAD, C_NOT_ROCE, C_TRUNCATED, C_OPCODE, C_LENGTH = range(6)


# The record of a frame, one of these by its kind.
BODY = data.UnionLayout({"pkt": RX_PKT, "ack": ACK_DESC, "nak": NAK, "peer": PEER_STATUS,
                         "ev_probe": EV_PROBE})


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
    stev_swap : Signal(1), in
        The register of that name: which halves of the EV the UDP source port and the flow
        label carry (:func:`mrcnic.base.proto.stev_join`).
    cause : Signal(3), out
        The first failing check: 0 none, 1 ``in_bad``, 2 ``not_roce``, 3 ``truncated``, 4
        ``opcode``, 5 ``length``.
    check_icrc : Signal(1), out
        The ICRC is to be checked (the frame is not trimmed).
    too_long : Signal(1), out
        A WRITE, not trimmed, whose payload is longer than ``pmtu``.
    kind : Signal(4), out
        The record's kind: data, trimmed, probe, SACK, NACK, AETH ACK, AETH NAK, port
        status, EV probe request (0 .. 8).
    data_frame : Signal(1), out
        A WRITE at least as long as Ethernet to BTH.
    body : Signal(union of ``pkt``, ``ack``, ``nak``, ``peer``, ``ev_probe``), out
        The record, as :data:`~mrcnic.base.records.RX_PKT`,
        :data:`~mrcnic.base.records.ACK_DESC`, :data:`~mrcnic.base.records.NAK`,
        :data:`~mrcnic.base.records.PEER_STATUS` or :data:`~mrcnic.base.records.EV_PROBE`
        by ``kind``.

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
            "trim_lasthop_dscp": In(6), "stev_swap": In(1),
            "cause": Out(3), "check_icrc": Out(1), "too_long": Out(1),
            "kind": Out(KIND_BITS), "data_frame": Out(1),
            "body": Out(BODY),
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
        ep_op = get(ERTH, "op", EXT_AT)
        ep_bad = (op == Opcode.EP_REQUEST) & (
            (get(BTH, "dest_qp", BTH_AT) != proto.ENDPOINT_QP) |
            ((ep_op != proto.EP_PORT_STATUS) & (ep_op != proto.EP_EV_PROBE)))
        opcode_bad = ~short & Mux(trimmed, ~is_write, ~known | ep_bad)
        plen = get(IPV6, "payload_length", IP_AT)
        length_bad = ((plen != n_minus(UDP_AT)) | (get(UDP, "length", UDP_AT) != plen) |
                      Mux(is_write, (rest[:2] != 0) | payload[-1], (rest != 0) | (pad != 0)))
        too_long = is_write & ~trimmed & (payload > self.pmtu)
        cause = Mux(self.bad, C_IN_BAD, Mux(not_roce, C_NOT_ROCE, Mux(
            truncated, C_TRUNCATED, Mux(opcode_bad, C_OPCODE, Mux(
                ~trimmed & length_bad, C_LENGTH, C_NONE)))))

        syndrome = get(AETH, "syndrome", EXT_AT)
        kind = Signal(KIND_BITS)
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
            m.d.comb += kind.eq(Mux(ep_op == proto.EP_EV_PROBE, K_EV_PROBE, K_PEER))
        with m.Else():
            m.d.comb += kind.eq(K_DATA)

        body = self.body
        pk = body.pkt
        control = Cat(*(kind == k for k in (K_SACK, K_NACK, K_PEER, K_EV_PROBE, K_NAK))).any()
        with m.If(control):
            self._control_body(m, get, kind, syndrome)
        with m.Else():
            m.d.comb += [
                pk.qp.eq(get(BTH, "dest_qp", BTH_AT)[:16]), pk.psn.eq(get(BTH, "psn", BTH_AT)),
                pk.opcode.eq(op), pk.ack_req.eq(get(BTH, "ack_req", BTH_AT)),
                pk.rtx.eq(get(BTH, "rtx", BTH_AT)), pk.ce.eq(ecn == proto.ECN_CE),
                pk.trimmed.eq(trimmed), pk.lasthop.eq(trimmed & lasthop),
                pk.entropy.eq(proto_stev(get(UDP, "src_port", UDP_AT),
                                         get(IPV6, "flow_label", IP_AT), self.stev_swap)),
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

    def _control_body(self, m, get, kind, syndrome):
        """The record of a control frame (SACK, NACK, port status update, EV probe request,
        AETH NAK) into ``body``, by ``kind``."""
        body = self.body
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
            m.d.comb += [body.peer.qp.eq(get(ERTH, "dst_id", EXT_AT)),
                         body.peer.ports.eq(get(ERTH, "ports", EXT_AT))]
        with m.Elif(kind == K_EV_PROBE):
            # Answered on the request's own EV, from the context of the QP it names, to the
            # requester's QP.
            m.d.comb += [
                body.ev_probe.qp.eq(get(ERTH, "dst_id", EXT_AT)),
                body.ev_probe.peer_id.eq(get(ERTH, "src_id", EXT_AT)),
                body.ev_probe.psn.eq(get(BTH, "psn", BTH_AT)),
                body.ev_probe.entropy.eq(proto_stev(get(UDP, "src_port", UDP_AT),
                                                   get(IPV6, "flow_label", IP_AT),
                                                   self.stev_swap)),
                body.ev_probe.timestamp.eq(get(ERTH, "timestamp", EXT_AT)),
            ]
        with m.Elif(kind == K_NAK):
            m.d.comb += [body.nak.qp.eq(get(BTH, "dest_qp", BTH_AT)[:16]),
                         body.nak.psn.eq(get(BTH, "psn", BTH_AT)),
                         body.nak.syndrome.eq(syndrome)]


def proto_stev(udp_src_port, flow_label, swap):
    """Gateware :func:`mrcnic.base.proto.stev_join`: EV[15:0] from the port, EV[31:16] from the
    flow label's low bits; the other way round with ``swap``."""
    port, flow = udp_src_port[:proto.STEV_PORT_BITS], flow_label[:proto.STEV_FLOW_BITS]
    return Mux(swap, Cat(flow, port), Cat(port, flow))
