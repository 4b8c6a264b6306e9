"""Interoperability with the two other public MRC implementations (docs/interop.md), both
directions, every header the three of us share:

* frames whose headers after UDP are laid out as theirs (:mod:`testkit.interop`: literal
  byte and bit positions, nothing from ``proto``), with a distinctive non-zero value in every
  field, read by our packet model and by our receive parser's gateware
  (:class:`~mrcnic.rx.roce_rx.header_check.HeaderCheck`, stage B of RoceRx);
* our frames (the packet model's builders, to which the transmit blocks' model-match tests
  hold their gateware byte for byte) read with their layouts.

Moving a field in ``proto`` fails both directions."""

import pytest
from amaranth.sim import Simulator

from mrcnic.base import proto
from mrcnic.base.proto import NackCode, Opcode
from mrcnic.base.records import DECAP_META
from mrcnic.model import packet as pk
from mrcnic.rx.roce_rx.header_check import (HDR_BYTES, K_DATA, K_EV_PROBE, K_NACK, K_PEER,
                                            K_PROBE, K_SACK, HeaderCheck)
from testkit import interop
from testkit.simtools import seeded

ETH_IP_UDP = 14 + 40 + 8
LAYOUT = {Opcode.SACK: ("seth", "cc_state"), Opcode.NACK: ("neth",), Opcode.PROBE: ("peth",)}
# Fields the formats fix: RoCEv2's transport version, the timestamp words' format type.
FIXED = {("bth", "tver"): 0, ("tseth", "type"): 1, ("peth", "type"): 1}
WIDTHS = {
    "bth": {"opcode": 8, "se": 1, "m": 1, "pad": 2, "tver": 4, "pkey": 16, "fecn": 1,
            "becn": 1, "dest_qp": 24, "ack_req": 1, "rtx": 1, "ts": 1, "psn": 24},
    "meth": {"rqmsn": 16, "msn": 16}, "tseth": {"timestamp": 16, "tsr": 1, "type": 4},
    "reth": {"va": 64, "rkey": 32, "dma_length": 32}, "immdt": {"imm": 32},
    "seth": {"m": 2, "pr": 1, "ack_psn_offset": 16, "entropy": 32, "src_id": 16,
             "dst_id": 16, "cack_psn": 24, "cc_type": 4, "flags": 4, "mpr": 8,
             "sack_offset": 16, "bitmap": 64},
    "cc_state": {"timestamp": 16, "ooo_count": 15, "restore_cwnd": 1, "rcv_cwnd_pen": 7,
                 "rcvd_bytes": 24},
    "neth": {"reason": 8, "vendor": 8, "entropy": 32, "src_id": 16, "dst_id": 16,
             "nack_psn": 24, "cc_type": 4, "flags": 4, "timestamp": 16},
    "peth": {"vendor": 8, "probe_id": 16, "src_id": 16, "dst_id": 16, "timestamp": 16,
             "tsr": 1, "type": 4},
}


def distinctive(rng, name):
    """Every field of header ``name`` random and non-zero (but those the format fixes)."""
    return {f: FIXED.get((name, f), rng.randrange(1, 1 << w))
            for f, w in WIDTHS[name].items()}


def their_frame(rng, op, ts=0, payload=b"", body=None, ipv4=False):
    """``(frame, {header: fields})``: Ethernet, IPv6 (``ipv4``: IPv4, as the ns-3 model
    sends) and UDP from our model (RoCEv2's, not MRC's), then the BTH and the MRC headers of
    ``op`` in their layout, the payload and the RoCEv2 ICRC."""
    if op.is_write:
        names = ("meth",) + (("tseth",) if ts else ()) + ("reth",) + \
                (("immdt",) if op.has_immdt else ())
    else:
        names = LAYOUT.get(op, ())
    fields = {n: distinctive(rng, n) for n in names}
    pad = -len(payload) % 4 if op.is_write else 0
    fields["bth"] = dict(distinctive(rng, "bth"), opcode=int(op), ts=ts, pad=pad)
    if body is not None:                # an endpoint packet: its ERTH or EETH
        payload = body
        fields["bth"]["dest_qp"] = proto.ENDPOINT_QP
    body = (interop.bth_encode(fields["bth"])
            + b"".join(interop.encode(n, fields[n]) for n in names) + payload + bytes(pad))
    length = 8 + len(body) + proto.ICRC_LEN
    if ipv4:
        outer = pk.encode(pk.write_packet(Opcode.WRITE_ONLY, 0, 0, 0, 0, 0, ipv4=True,
                                          ev=rng.getrandbits(16)))
        eth, ip, udp = bytearray(outer[:14]), bytearray(outer[14:34]), bytearray(outer[34:42])
        ip[2:4] = (20 + length).to_bytes(2, "big")
        ip[10:12] = bytes(2)
        ip[10:12] = proto.ipv4_checksum(ip).to_bytes(2, "big")
        udp[4:6] = length.to_bytes(2, "big")
    else:
        outer = pk.encode(pk.write_packet(Opcode.WRITE_ONLY, 0, 0, 0, 0, 0,
                                          ev=rng.getrandbits(32)))
        eth, ip, udp = bytearray(outer[:14]), bytearray(outer[14:54]), bytearray(outer[54:62])
        ip[4:6] = udp[4:6] = length.to_bytes(2, "big")
    inner = bytes(ip + udp) + body
    return bytes(eth) + inner + pk.icrc(inner, ipv4=ipv4).to_bytes(4, "little"), fields


def gateware_parse(frames):
    """``[(kind, cause, body)]`` of HeaderCheck for each frame (MRC port, PASS mode)."""
    dut = HeaderCheck(4096)
    out = []

    async def bench(ctx):
        ctx.set(dut.udp_dport, proto.UDP_DPORT_DEFAULT)
        ctx.set(dut.pmtu, 4096)
        ctx.set(dut.trim_dscp, proto.DSCP_TRIMMED)
        ctx.set(dut.trim_lasthop_dscp, proto.DSCP_TRIMMED_LASTHOP)
        ctx.set(dut.meta.as_value(), DECAP_META.const({}).as_value().value)
        for frame in frames:
            ctx.set(dut.bus, int.from_bytes(frame[:HDR_BYTES], "little"))
            ctx.set(dut.n, len(frame))
            out.append((ctx.get(dut.kind), ctx.get(dut.cause), ctx.get(dut.body)))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    return out


def test_their_control_frames_read_by_our_model_and_gateware():
    rng = seeded()
    cases = [their_frame(rng, op) for op in (Opcode.SACK, Opcode.NACK, Opcode.PROBE)
             for _ in range(8)]
    parsed = gateware_parse([f for f, _ in cases])
    for (frame, want), (kind, cause, body) in zip(cases, parsed):
        pkt = pk.decode(frame)
        for name, fields in want.items():
            assert getattr(pkt, name) == fields, name
        assert cause == 0
        op = want["bth"]["opcode"]
        if op == Opcode.SACK:
            s, c, a = want["seth"], want["cc_state"], body.ack
            assert kind == K_SACK
            assert (a.m, a.pr, a.cack, a.ack_psn_offset, a.sack_offset, a.bitmap, a.mpr,
                    a.entropy) == (s["m"], s["pr"], s["cack_psn"], s["ack_psn_offset"],
                                   s["sack_offset"], s["bitmap"], s["mpr"], s["entropy"])
            assert (a.timestamp, a.ooo_count, a.rcvd_bytes) == \
                (c["timestamp"], c["ooo_count"], c["rcvd_bytes"])
        elif op == Opcode.NACK:
            n, a = want["neth"], body.ack
            assert kind == K_NACK and a.nack == 1
            assert (a.reason, a.psn, a.entropy, a.timestamp) == \
                (n["reason"], n["nack_psn"], n["entropy"], n["timestamp"])
        else:
            assert kind == K_PROBE
            assert body.pkt.timestamp == want["peth"]["timestamp"]
            assert body.pkt.psn == want["bth"]["psn"]


def test_their_data_frames_read_by_our_model_and_gateware():
    rng = seeded()
    ops = [o for o in Opcode if o.is_write]
    cases = [their_frame(rng, op, ts=k % 2, payload=rng.randbytes(rng.randrange(1, 24)))
             for op in ops for k in range(4)]
    parsed = gateware_parse([f for f, _ in cases])
    for (frame, want), (kind, cause, body) in zip(cases, parsed):
        pkt = pk.decode(frame)
        for name, fields in want.items():
            assert getattr(pkt, name) == fields, name
        assert (kind, cause) == (K_DATA, 0)
        p, r = body.pkt, want["reth"]
        assert (p.psn, p.rtx, p.ack_req, p.va, p.rkey, p.dma_length) == \
            (want["bth"]["psn"], want["bth"]["rtx"], want["bth"]["ack_req"], r["va"],
             r["rkey"], r["dma_length"])
        assert p.timestamp == (want["tseth"]["timestamp"] if "tseth" in want else 0)
        if "immdt" in want:
            assert p.imm == want["immdt"]["imm"]


def test_their_frames_over_ipv4_read_by_our_model():
    """The ns-3 model runs RoCEv2 over IPv4 only: its SACK, NACK, probe and write frames over
    IPv4 (UDP mode) read by our packet model, every field as sent."""
    rng = seeded()
    cases = [their_frame(rng, op, ipv4=True) for op in (Opcode.SACK, Opcode.NACK, Opcode.PROBE)
             for _ in range(4)]
    cases += [their_frame(rng, op, ts=k % 2, payload=rng.randbytes(rng.randrange(1, 24)),
                          ipv4=True) for op in Opcode if op.is_write for k in range(2)]
    for frame, want in cases:
        pkt = pk.decode(frame)
        assert pkt.ip is None and pkt.ipv4["protocol"] == 17
        for name, fields in want.items():
            assert getattr(pkt, name) == fields, name


def our_frames(rng):
    """``(frame, packet)`` from our builders, every field distinctive."""
    out = []
    for _ in range(6):
        s, c, n, pe = (distinctive(rng, h) for h in ("seth", "cc_state", "neth", "peth"))
        net = dict(ev=rng.getrandbits(32), ack_req=1, rtx=1)
        out.append(pk.sack_packet(
            rng.getrandbits(24), s["cack_psn"], s["bitmap"],
            sack_offset=s["sack_offset"] - (1 << 16 if s["sack_offset"] >> 15 else 0),
            ack_psn_offset=s["ack_psn_offset"] - (1 << 16 if s["ack_psn_offset"] >> 15 else 0),
            m=s["m"] % 3, pr=s["pr"], entropy=s["entropy"], src_id=s["src_id"],
            dst_id=s["dst_id"], cc_type=s["cc_type"], flags=s["flags"], mpr=s["mpr"],
            cc_timestamp=c["timestamp"], ooo_count=c["ooo_count"],
            restore_cwnd=c["restore_cwnd"], rcv_cwnd_pen=c["rcv_cwnd_pen"],
            rcvd_bytes=c["rcvd_bytes"], psn=rng.getrandbits(24), **net))
        out.append(pk.nack_packet(
            rng.getrandbits(24), n["nack_psn"], NackCode.PSN_OUT_OF_WINDOW, vendor=n["vendor"],
            entropy=n["entropy"], src_id=n["src_id"], dst_id=n["dst_id"],
            cc_type=n["cc_type"], flags=n["flags"], timestamp=n["timestamp"],
            psn=rng.getrandbits(24), **net))
        out.append(pk.probe_packet(rng.getrandbits(24), pe["probe_id"], src_id=pe["src_id"],
                                   dst_id=pe["dst_id"], timestamp=pe["timestamp"],
                                   psn=rng.getrandbits(24), **net))
        for op in (o for o in Opcode if o.is_write):
            out.append(pk.write_packet(op, rng.getrandbits(24), rng.getrandbits(24),
                                       rng.getrandbits(64), rng.getrandbits(32),
                                       rng.getrandbits(32), rng.randbytes(9),
                                       imm=rng.getrandbits(32) if op.has_immdt else None,
                                       ts=rng.getrandbits(16) if rng.getrandbits(1) else None,
                                       rqmsn=rng.getrandbits(16), msn=rng.getrandbits(16),
                                       **net))
    return [(pk.encode(p), p) for p in out]


def test_our_frames_read_with_their_layouts():
    rng = seeded()
    for frame, pkt in our_frames(rng):
        at = ETH_IP_UDP
        assert interop.bth_decode(frame[at:]) == pkt.bth
        at += 12
        for name in interop.SIZES:
            want = getattr(pkt, name)
            if want is None:
                continue
            assert interop.decode(name, frame[at:]) == want, name
            at += interop.SIZES[name]
        assert frame[at:len(frame) - 4 - pkt.bth["pad"]] == pkt.payload


def test_endpoint_requests_and_responses_both_ways():
    """ERTH and EETH (MRC-Client's, the ns-3 model has none): their port status update (op
    0) is a ``peer`` record for our receive parser, with the QP ids they leave reserved at 0
    (QP 0) or ours in them; their EV probe request (op 1) an ``ev_probe`` record (to
    answer, its timestamp and STEV); our port status update reads as their ERTH, op 0, and
    an EETH built with their layout reads back through ours."""
    rng = seeded()
    theirs = []
    for op, ids in ((proto.EP_PORT_STATUS, False), (proto.EP_PORT_STATUS, True),
                    (proto.EP_EV_PROBE, False)):
        f = {"op": op, "vendor": rng.randrange(1, 256), "ports": rng.randrange(1, 1 << 32),
             "src_id": rng.randrange(1, 1 << 16) if ids else 0,
             "dst_id": rng.randrange(1, 1 << 16) if ids else 0,
             "timestamp": rng.randrange(1, 1 << 16), "tsr": 1, "type": 1}
        frame, _ = their_frame(rng, Opcode.EP_REQUEST, body=interop.erth_encode(f))
        theirs.append((frame, f))
    parsed = gateware_parse([fr for fr, _ in theirs])
    for (frame, f), (kind, cause, body) in zip(theirs, parsed):
        pkt = pk.decode(frame)
        assert proto.ERTH.unpack(pkt.payload) == f
        if f["op"] == proto.EP_PORT_STATUS:
            assert pk.port_status(pkt) == f
            assert (kind, cause, body.peer.qp, body.peer.ports) == \
                (K_PEER, 0, f["dst_id"], f["ports"])
        else:
            assert pk.port_status(pkt) is None
            e = body.ev_probe
            assert (kind, cause, e.qp, e.peer_id, e.psn, e.timestamp, e.entropy) == \
                (K_EV_PROBE, 0, f["dst_id"], f["src_id"], pkt.bth["psn"], f["timestamp"],
                 pk.stev_ev(pkt))
    ours = pk.port_status_packet(0xA5A5_0F0F, src_id=0x1234, dst_id=0x5678, timestamp=0x9ABC,
                                 ev=rng.getrandbits(32))
    frame = pk.encode(ours)
    assert interop.bth_decode(frame[ETH_IP_UDP:])["dest_qp"] == proto.ENDPOINT_QP
    assert interop.erth_decode(frame[ETH_IP_UDP + 12:]) == {
        "op": 0, "vendor": 0, "ports": 0xA5A5_0F0F, "src_id": 0x1234, "dst_id": 0x5678,
        "timestamp": 0x9ABC, "tsr": 0, "type": 1}
    eeth = {"op": proto.EP_EV_PROBE, "src_id": 0, "dst_id": 0,
            "timestamp": rng.randrange(1, 1 << 16)}
    frame, _ = their_frame(rng, Opcode.EP_RESPONSE, body=interop.eeth_encode(eeth))
    got = proto.EETH.unpack(pk.decode(frame).payload)
    assert got == eeth


def test_ev_probe_builders_in_their_layouts():
    """Our EV probe request reads as their ERTH with op 1 and our timestamp; their request
    (MRC-Client's ERTH, op 1) answered by our response builder reads as their EETH, op 1,
    with the request's timestamp echoed, on the request's entropy."""
    rng = seeded()
    ev = rng.getrandbits(32)
    ours = pk.ev_probe_packet(0x4321, src_id=0x11, dst_id=0x22, ev=ev)
    frame = pk.encode(ours)
    assert interop.erth_decode(frame[ETH_IP_UDP + 12:]) == {
        "op": 1, "vendor": 0, "ports": 0, "src_id": 0x11, "dst_id": 0x22, "timestamp": 0x4321,
        "tsr": 0, "type": 1}
    f = {"op": proto.EP_EV_PROBE, "vendor": 7, "ports": 0, "src_id": 0, "dst_id": 0,
         "timestamp": rng.randrange(1, 1 << 16), "tsr": 1, "type": 1}
    request = pk.decode(their_frame(rng, Opcode.EP_REQUEST, body=interop.erth_encode(f))[0])
    answer = pk.encode(pk.ev_probe_response_packet(request))
    assert interop.bth_decode(answer[ETH_IP_UDP:])["opcode"] == Opcode.EP_RESPONSE
    assert interop.bth_decode(answer[ETH_IP_UDP:])["psn"] == request.bth["psn"]
    want = {"op": 1, "src_id": 0, "dst_id": 0, "timestamp": f["timestamp"]}
    assert interop.eeth_decode(answer[ETH_IP_UDP + 12:]) == want
    got = pk.decode(answer)
    assert pk.stev_ev(got) == pk.stev_ev(request)
    assert pk.endpoint_response(got) == want
    # Our own request's QP ids come back swapped, in the bytes their EETH leaves reserved.
    answer = pk.encode(pk.ev_probe_response_packet(pk.decode(frame)))
    assert interop.eeth_decode(answer[ETH_IP_UDP + 12:]) == {
        "op": 1, "src_id": 0x22, "dst_id": 0x11, "timestamp": 0x4321}
    assert pk.endpoint_request(got) is None and pk.port_status(request) is None
    with pytest.raises(pk.PacketError, match="not an EV probe request"):
        pk.ev_probe_response_packet(pk.port_status_packet(1))
    # Over IPv4 (UDP mode) the answer takes the request's UDP source port.
    four = pk.ev_probe_packet(5, ipv4=True, ev=0xC123)
    answer4 = pk.ev_probe_response_packet(four)
    assert answer4.ipv4 is not None and answer4.udp["src_port"] == 0xC123
