"""Tests of the MRC packet codec (mrcnic.model.packet).

scapy 2.8 is the independent reference for Ethernet, IPv6, SRH, UDP, BTH, AETH and the RoCEv2
ICRC; the MRC extension headers are checked against byte layouts written out here with
``struct`` and against the spec's worked SACK example. Then round trips, the uSID walk, and
fuzzing: whatever bytes it is given, ``decode`` raises PacketError or returns a packet that
encodes back to the very same bytes.
"""

import ipaddress
import random
import struct

import pytest
from scapy.compat import raw
from scapy.contrib.roce import AETH as ScapyAETH, BTH as ScapyBTH
from scapy.layers.inet import IP as ScapyIP, UDP as ScapyUDP
from scapy.layers.inet6 import IPv6 as ScapyIPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether
from scapy.packet import Raw

import testkit.scapy_mrc  # noqa: F401  (scapy's BTH on MRC's UDP port)

from mrcnic.base import proto
from mrcnic.base.proto import NackCode, Opcode, SackMode
from mrcnic.model import packet as pk
from mrcnic.model.packet import PacketError
from testkit import interop
from testkit.simtools import seeded


WRITES = [op for op in Opcode if op.is_write]
CONTROL = [Opcode.ACK, Opcode.SACK, Opcode.NACK, Opcode.PROBE]
ENDPOINT = [Opcode.EP_REQUEST, Opcode.EP_RESPONSE]
ETH_LEN, IP6_LEN, UDP_LEN, BTH_LEN = 14, 40, 8, 12


def mac_str(v):
    return ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))


def ip_str(v):
    return str(ipaddress.IPv6Address(v))


def ip(text):
    return int(ipaddress.IPv6Address(text))


def scapy_stack(pkt):
    """Ether / IPv6 (or IPv4) / UDP / BTH of ``pkt`` (a plain, non-encapsulated packet) in
    scapy, which fills in the lengths, the IPv4 header checksum and the ICRC."""
    e, u, b = pkt.eth, pkt.udp, pkt.bth
    if pkt.ipv4 is not None:
        i = pkt.ipv4
        ip_layer = ScapyIP(tos=i["dscp"] << 2 | i["ecn"], id=i["identification"],
                           flags=i["flags"], ttl=i["ttl"],
                           src=str(ipaddress.IPv4Address(i["src"])),
                           dst=str(ipaddress.IPv4Address(i["dst"])))
    else:
        i = pkt.ip
        ip_layer = ScapyIPv6(tc=i["dscp"] << 2 | i["ecn"], fl=i["flow_label"],
                             hlim=i["hop_limit"], src=ip_str(i["src"]), dst=ip_str(i["dst"]))
    return (Ether(dst=mac_str(e["dst"]), src=mac_str(e["src"]))
            / ip_layer
            / ScapyUDP(sport=u["src_port"], dport=u["dst_port"], chksum=u["checksum"])
            / ScapyBTH(opcode=b["opcode"], solicited=b["se"], migreq=b["m"],
                       padcount=b["pad"], version=b["tver"], pkey=b["pkey"], fecn=b["fecn"],
                       becn=b["becn"], dqpn=b["dest_qp"], ackreq=b["ack_req"],
                       resv7=b["rtx"] << proto.BTH_RTX_BIT | b["ts"] << proto.BTH_TS_BIT,
                       psn=b["psn"]))


def ext_bytes(pkt):
    """The extension headers of ``pkt`` written out by hand (independent of proto.Header and
    its constants), in the layouts of the two public MRC implementations
    (:mod:`testkit.interop`: SETH M at byte 1 bits 6:5 and pr at bit 1, NETH cc_type in byte
    16's high nibble, PETH with the PDC ids at bytes 8-11 and a TSETH-like timestamp word at
    12-15)."""
    return b"".join(interop.encode(name, getattr(pkt, name)) for name in interop.SIZES
                    if getattr(pkt, name) is not None)


def frame_with(pkt, change):
    """Frame of a copy of ``pkt`` after ``change(copy)``, written verbatim, ICRC recomputed."""
    p = pkt.copy()
    change(p)
    p.icrc = None
    return pk.encode(p, check=False)


# --- scapy cross-checks --------------------------------------------------------------------

@pytest.mark.parametrize("ipv4", [False, True], ids=["ipv6", "ipv4"])
def test_builders_match_scapy_bytes(ipv4):
    """Every builder over IPv6 and, in UDP mode, over IPv4 (scapy's header checksum and its
    RoCEv2 ICRC over IPv4: type of service, TTL and checksum as ones)."""
    rng = seeded()
    ip_bits, ev_bits = (32, 16) if ipv4 else (128, 32)
    for n in range(120):
        op = [*WRITES, *CONTROL, *ENDPOINT][n % 12]
        net = dict(src_mac=rng.getrandbits(48), dst_mac=rng.getrandbits(48),
                   src_ip=rng.getrandbits(ip_bits), dst_ip=rng.getrandbits(ip_bits),
                   ev=rng.getrandbits(ev_bits), dscp=rng.getrandbits(6), ecn=rng.getrandbits(2),
                   hop_limit=rng.getrandbits(8), ack_req=rng.getrandbits(1),
                   rtx=rng.getrandbits(1), fecn=rng.getrandbits(1), becn=rng.getrandbits(1))
        if ipv4:
            net.update(ipv4=True, identification=rng.getrandbits(16))
        payload = rng.randbytes(rng.randrange(40))
        if op.is_write:
            pkt = pk.write_packet(op, rng.getrandbits(24), rng.getrandbits(24),
                                  rng.getrandbits(64), rng.getrandbits(32),
                                  rng.getrandbits(32), payload,
                                  imm=rng.getrandbits(32) if op.has_immdt else None,
                                  ts=rng.choice([None, rng.getrandbits(16)]),
                                  tsr=rng.getrandbits(1), rqmsn=rng.getrandbits(16),
                                  msn=rng.getrandbits(16), **net)
        elif op == Opcode.ACK:
            pkt = pk.ack_packet(rng.getrandbits(24), rng.getrandbits(24), rng.getrandbits(24),
                                syndrome=rng.getrandbits(8), **net)
        elif op == Opcode.SACK:
            pkt = pk.sack_packet(rng.getrandbits(24), rng.getrandbits(24), rng.getrandbits(64),
                                 sack_offset=rng.randrange(-300, 300),
                                 ack_psn_offset=rng.randrange(-300, 300),
                                 m=rng.choice(list(SackMode)), pr=rng.getrandbits(1),
                                 entropy=rng.getrandbits(32), src_id=rng.getrandbits(16),
                                 dst_id=rng.getrandbits(16), cc_type=rng.getrandbits(4),
                                 flags=rng.getrandbits(4), mpr=rng.getrandbits(8),
                                 cc_timestamp=rng.getrandbits(16),
                                 ooo_count=rng.getrandbits(15), restore_cwnd=1,
                                 rcv_cwnd_pen=rng.getrandbits(7),
                                 rcvd_bytes=rng.getrandbits(24), **net)
        elif op == Opcode.NACK:
            pkt = pk.nack_packet(rng.getrandbits(24), rng.getrandbits(24),
                                 rng.choice(list(NackCode)), vendor=rng.getrandbits(8),
                                 entropy=rng.getrandbits(32), src_id=rng.getrandbits(16),
                                 dst_id=rng.getrandbits(16), cc_type=rng.getrandbits(4),
                                 flags=rng.getrandbits(4), timestamp=rng.getrandbits(16),
                                 **net)
        elif op == Opcode.PROBE:
            pkt = pk.probe_packet(rng.getrandbits(24), rng.getrandbits(16),
                                  src_id=rng.getrandbits(16), dst_id=rng.getrandbits(16),
                                  timestamp=rng.getrandbits(16), **net)
        else:
            pkt = pk.endpoint_packet(op, payload, **net)
        pad = 0 if op in CONTROL else -len(payload) % 4
        body = ext_bytes(pkt) + (b"" if op in CONTROL else payload) + bytes(pad)
        ref = scapy_stack(pkt) / Raw(body)       # scapy fills lengths and computes the ICRC
        assert pk.encode(pkt) == raw(ref), (op, n)
        assert ScapyBTH in Ether(raw(ref)) and pk.decode(raw(ref)) == pkt
        assert pkt.bth["pad"] == pad
        if op == Opcode.ACK:                     # scapy also knows the AETH
            aeth = ScapyAETH(syndrome=pkt.aeth["syndrome"], msn=pkt.aeth["msn"])
            assert pk.encode(pkt) == raw(scapy_stack(pkt) / aeth)


def test_scapy_parses_our_frames():
    rng = seeded()
    for _ in range(200):
        pkt = pk.rng_packet(rng, encap=rng.choice(["none", "outer", "srh"]))
        frame = pk.encode(pkt)
        s = Ether(frame)
        assert s.dst == mac_str(pkt.eth["dst"]) and s.src == mac_str(pkt.eth["src"])
        if pkt.outer is not None:
            o = s[ScapyIPv6]
            assert (o.tc, o.fl, o.plen, o.hlim, o.src, o.dst) == (
                pkt.outer["dscp"] << 2 | pkt.outer["ecn"], pkt.outer["flow_label"],
                pkt.outer["payload_length"], pkt.outer["hop_limit"], ip_str(pkt.outer["src"]),
                ip_str(pkt.outer["dst"]))
            assert o.nh == (43 if pkt.srh else 41)
        if pkt.srh is not None:
            h = s[IPv6ExtHdrSegmentRouting]
            assert (h.nh, h.len, h.type, h.segleft, h.lastentry, h.tag) == (
                41, 2 * len(pkt.srh["segments"]), 4, pkt.srh["segments_left"],
                pkt.srh["last_entry"], pkt.srh["tag"])
            if not pkt.srh["segments"]:
                continue     # scapy reads last_entry + 1 addresses: it cannot parse n = 0
            assert h.addresses == [ip_str(a) for a in pkt.srh["segments"]]
        i = s[ScapyUDP].underlayer
        assert (i.tc, i.fl, i.plen, i.nh, i.hlim, i.src, i.dst) == (
            pkt.ip["dscp"] << 2 | pkt.ip["ecn"], pkt.ip["flow_label"],
            pkt.ip["payload_length"], 17, pkt.ip["hop_limit"], ip_str(pkt.ip["src"]),
            ip_str(pkt.ip["dst"]))
        u = s[ScapyUDP]
        assert (u.sport, u.dport, u.len, u.chksum) == (
            pkt.udp["src_port"], 4971, pkt.udp["length"], pkt.udp["checksum"])
        b, mb = s[ScapyBTH], pkt.bth
        assert (b.opcode, b.solicited, b.migreq, b.padcount, b.version, b.pkey, b.fecn,
                b.becn, b.dqpn, b.ackreq, b.psn) == (
            mb["opcode"], mb["se"], mb["m"], mb["pad"], 0, mb["pkey"], mb["fecn"], mb["becn"],
            mb["dest_qp"], mb["ack_req"], mb["psn"])
        assert b.resv7 == mb["rtx"] << 5 | mb["ts"] << 4
        # scapy reads the ICRC big-endian; the wire carries it least significant byte first.
        assert b.icrc == int.from_bytes(struct.pack("<I", pkt.icrc), "big")
        # scapy's ICRC of the inner packet, for every encapsulation (outer/SRH excluded).
        assert b.compute_icrc(b"") == frame[-4:]
        assert raw(b.payload) == ext_bytes(pkt) + pkt.payload + bytes(mb["pad"])


def test_icrc_matches_scapy_over_sizes():
    rng = seeded()
    sizes = list(range(0, 70)) + [rng.randrange(70, 9000) for _ in range(30)] + [4096, 8192]
    for n in sizes:
        # Explicit MACs: without them scapy spends a second on neighbour resolution.
        ref = (Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01")
               / ScapyIPv6(tc=rng.getrandbits(8), fl=rng.getrandbits(20),
                           hlim=rng.getrandbits(8), src=ip_str(rng.getrandbits(128)),
                           dst=ip_str(rng.getrandbits(128)))
               / ScapyUDP(sport=rng.getrandbits(16), dport=4971, chksum=rng.getrandbits(16))
               / ScapyBTH(opcode=Opcode.EP_REQUEST, fecn=rng.getrandbits(1),
                          becn=rng.getrandbits(1), dqpn=2, psn=rng.getrandbits(24),
                          padcount=-n % 4)
               / Raw(rng.randbytes(n) + bytes(-n % 4)))
        frame = raw(ref)
        assert pk.icrc(frame[ETH_LEN:-4]) == struct.unpack("<I", frame[-4:])[0], n
        assert pk.decode(frame).icrc == pk.icrc(frame[ETH_LEN:-4])


def test_icrc_covers_exactly_the_spec_fields():
    rng = seeded()
    pkt = pk.write_packet(Opcode.WRITE_FIRST, 5, 6, 7, 8, 9, rng.randbytes(24),
                          ev=rng.getrandbits(32))
    inner = pk.encode(pkt)[ETH_LEN:-4]
    base = pk.icrc(inner)
    # Bits replaced by ones: traffic class + flow label (IPv6 bits 4..31), hop limit (byte 7),
    # UDP checksum (bytes 46-47), BTH byte 4 (byte 52).
    masked = set(range(4, 32)) | set(range(56, 64)) | set(range(368, 384)) | \
        set(range(416, 424))
    for bit in range(8 * len(inner)):
        flipped = bytearray(inner)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        assert (pk.icrc(bytes(flipped)) == base) == (bit in masked), bit


def test_srh_matches_scapy():
    rng = seeded()
    for _ in range(40):
        inner = pk.rng_packet(rng, encap="none")
        seg = rng.getrandbits(128)
        src, dst = rng.getrandbits(128), rng.getrandbits(128)
        dscp, ecn, hl, fl, tag = (rng.getrandbits(6), rng.getrandbits(2), rng.getrandbits(8),
                                  rng.getrandbits(20), rng.getrandbits(16))
        frame = pk.encapsulate(pk.encode(inner), outer_src=src, outer_dst=dst,
                               srh_segment=seg, dscp=dscp, ecn=ecn, hop_limit=hl,
                               flow_label=fl, srh_tag=tag)
        plain = pk.encode(inner)
        ref = (Ether(plain[:ETH_LEN])
               / ScapyIPv6(src=ip_str(src), dst=ip_str(dst), tc=dscp << 2 | ecn, fl=fl,
                           hlim=hl)
               / IPv6ExtHdrSegmentRouting(nh=41, addresses=[ip_str(seg)], segleft=1,
                                          lastentry=0, tag=tag)
               / Raw(plain[ETH_LEN:]))
        assert frame == raw(ref)
        # Sizes of the spec: +40 for the outer header, +24 more for the one-segment SRH.
        assert len(frame) == len(plain) + proto.OUTER_SRH_LEN
        no_srh = pk.encapsulate(plain, outer_src=src, outer_dst=dst, hop_limit=hl)
        ref = (Ether(plain[:ETH_LEN])
               / ScapyIPv6(src=ip_str(src), dst=ip_str(dst), nh=41, hlim=hl,
                           tc=inner.ip["dscp"] << 2 | inner.ip["ecn"],
                           fl=inner.ip["flow_label"])
               / Raw(plain[ETH_LEN:]))
        assert no_srh == raw(ref) and len(no_srh) == len(plain) + proto.OUTER_IPV6_LEN


def test_multi_segment_srh_from_scapy_decodes():
    rng = seeded()
    for n in (1, 2, 3, 5):
        plain = pk.encode(pk.rng_packet(rng, encap="none"))
        segs = [rng.getrandbits(128) for _ in range(n)]
        ref = (Ether(plain[:ETH_LEN]) / ScapyIPv6(src="::1", dst="::2")
               / IPv6ExtHdrSegmentRouting(nh=41, addresses=[ip_str(s) for s in segs],
                                          segleft=n - 1, tag=0x1234)
               / Raw(plain[ETH_LEN:]))
        pkt = pk.decode(raw(ref))
        assert pkt.srh == {"next_header": 41, "hdr_ext_len": 2 * n, "routing_type": 4,
                           "segments_left": n - 1, "last_entry": n - 1, "flags": 0,
                           "tag": 0x1234, "segments": segs}
        assert pk.encode(pkt) == raw(ref)


# --- MRC headers ---------------------------------------------------------------------------

def test_spec_sack_example():
    # PSNs 0..11 sent, 5 and 8 lost.
    arrived = set(range(12)) - {5, 8}
    cack = 4
    bitmap = pk.sack_bitmap(cack + 1, arrived)
    assert [bitmap >> i & 1 for i in range(7)] == [0, 1, 1, 0, 1, 1, 1]
    assert bitmap == 0b1110110
    pkt = pk.sack_packet(0x123, cack, bitmap, sack_offset=1, ack_psn_offset=7,
                         m=SackMode.SKIP_ONCE, pr=1, entropy=0xDEADBEEF, mpr=8)
    frame = pk.encode(pkt)
    seth = frame[ETH_LEN + IP6_LEN + UDP_LEN + BTH_LEN:][:28]
    assert frame[ETH_LEN + IP6_LEN + UDP_LEN] == 0xDC
    assert seth[1] == 0b0010_0010                    # M = 1 in bits 6:5, pr in bit 1
    assert seth[2:4] == b"\x00\x07"                  # ack_psn_offset
    assert seth[4:8] == bytes.fromhex("deadbeef")
    assert seth[13:16] == b"\x00\x00\x04"            # CACK PSN
    assert seth[17] == 8                             # MPR
    assert seth[18:20] == b"\x00\x01"                # sack_offset
    assert seth[20:27] == bytes(7) and seth[27] == 0b0111_0110   # bit 0 = LSB of byte 27
    assert len(frame) == ETH_LEN + IP6_LEN + UDP_LEN + BTH_LEN + 28 + 8 + 4

    got = pk.decode(frame)
    assert got == pkt and got.opcode == Opcode.SACK
    assert got.seth["cack_psn"] == 4 and got.seth["m"] == SackMode.SKIP_ONCE
    assert pk.sack_base(got.seth) == 5 and pk.ack_psn(got.seth) == 11
    assert pk.sack_psns(got.seth) == [6, 7, 9, 10, 11]
    assert {5, 8}.isdisjoint(pk.sack_psns(got.seth))


def test_sack_offsets_are_signed_and_wrap():
    pkt = pk.sack_packet(1, 2, 0b101, sack_offset=-3, ack_psn_offset=-1)
    assert pkt.seth["sack_offset"] == 0xFFFD and pkt.seth["ack_psn_offset"] == 0xFFFF
    assert pk.sack_base(pkt.seth) == proto.PSN_MASK      # 2 - 3 wraps to 2^24 - 1
    assert pk.sack_psns(pkt.seth) == [proto.PSN_MASK, 1]
    assert pk.ack_psn(pkt.seth) == 1
    assert pk.sack_bitmap(proto.PSN_MASK, {proto.PSN_MASK, 0, 62, 63}) == 0b11 | 1 << 63
    with pytest.raises(PacketError, match=r"^sack_offset 32768 does not fit a signed "
                                          r"16-bit field$"):
        pk.sack_packet(1, 2, sack_offset=0x8000)


def test_write_layout_and_stev():
    pkt = pk.write_packet(Opcode.WRITE_LAST_IMM, 0xABCDEF, 0x123456, 0x1122334455667788,
                          0x99AABBCC, 0x1000, b"xyz", imm=0xCAFEF00D, ts=0x1234, tsr=1,
                          rqmsn=3, msn=4, ev=0x87654321, rtx=1, ack_req=1)
    frame = pk.encode(pkt)
    i = ETH_LEN
    assert frame[i + 1:i + 4] == bytes([0x00, 0x87, 0x65])      # flow label = EV[31:16]
    assert frame[i + 40:i + 42] == bytes([0x43, 0x21])          # UDP sport = EV[15:0]
    assert frame[i + 42:i + 44] == (4971).to_bytes(2, "big")     # MRC's UDP port
    bth = frame[i + 48:i + 60]
    assert bth[0] == 0xC9 and bth[1] == 0x10                   # pad 1 in bits 5:4
    assert bth[5:8] == bytes.fromhex("abcdef")
    assert bth[8] == 0x80 | 0x20 | 0x10                         # A, rtx (bit 5), ts (bit 4)
    assert frame[i + 60:i + 64] == bytes.fromhex("00030004")    # METH
    assert frame[i + 64:i + 68] == bytes.fromhex("12348001")    # TSETH: TSR, type 1
    assert frame[i + 68:i + 84] == bytes.fromhex("112233445566778899aabbcc00001000")
    assert frame[i + 84:i + 88] == bytes.fromhex("cafef00d")
    assert frame[i + 88:-4] == b"xyz\x00"
    assert pk.stev_ev(pkt) == 0x87654321 and pk.stev_split(0x87654321) == (0x4321, 0x8765)
    assert pkt.ip["payload_length"] == pkt.udp["length"] == len(frame) - ETH_LEN - IP6_LEN
    plain = pk.write_packet(Opcode.WRITE_MIDDLE, 1, 2, 3, 4, 5, b"abcd")
    assert plain.tseth is None and plain.bth["ts"] == 0 and plain.bth["pad"] == 0


def test_endpoint_and_nack_and_probe_layouts():
    ep = pk.endpoint_packet(Opcode.EP_RESPONSE, b"hello")
    frame = pk.encode(ep)
    assert ep.bth["dest_qp"] == proto.ENDPOINT_QP and ep.bth["pad"] == 3
    assert frame[ETH_LEN + 60:-4] == b"hello\x00\x00\x00"
    nack = pk.nack_packet(9, 0x00ABCD, NackCode.PSN_OUT_OF_WINDOW, entropy=0x01020304,
                          timestamp=0xBEEF)
    neth = pk.encode(nack)[ETH_LEN + 60:-4]
    assert neth == bytes.fromhex("00000b00" "01020304" "00000000" "0000abcd" "0000beef")
    probe = pk.probe_packet(9, 0x7777, src_id=1, dst_id=2, timestamp=3)
    # Probe id at bytes 4-5, PDC ids at 8-11, the timestamp at 12-13, format type 1 at 14-15.
    assert pk.encode(probe)[ETH_LEN + 60:-4] == bytes.fromhex("00000000777700000001000200030001")


def test_finalize_fills_defaults_and_derived_fields():
    pkt = pk.finalize(pk.Packet(bth={"opcode": Opcode.WRITE_ONLY, "dest_qp": 3},
                                meth={}, reth={"dma_length": 6}, payload=b"abcdef"))
    assert pkt.eth["ethertype"] == 0x86DD and pkt.ip["version"] == 6
    assert pkt.bth["pkey"] == 0xFFFF and pkt.bth["pad"] == 2
    assert pkt.ip["payload_length"] == 8 + 12 + 4 + 16 + 8 + 4
    assert pk.decode(pk.encode(pkt)) == pkt
    enc = pk.finalize(pk.Packet(outer={"dst": 5}, srh={"segments": [1, 2]},
                                bth={"opcode": Opcode.ACK}, aeth={"msn": 1}))
    assert enc.outer["payload_length"] == 8 + 32 + 40 + 8 + 12 + 4 + 4
    assert enc.srh["segments_left"] == 2 and enc.srh["last_entry"] == 1
    assert enc.outer["next_header"] == 43 and enc.srh["next_header"] == 41


# --- Round trips ---------------------------------------------------------------------------

def test_random_round_trips():
    rng = seeded()
    seen = set()
    for n in range(800):
        op = list(Opcode)[n % len(Opcode)]
        encap = ["none", "outer", "srh", "ipv4"][n // len(Opcode) % 4]
        pkt = pk.rng_packet(rng, opcode=op, encap=encap)
        frame = pk.encode(pkt)
        got = pk.decode(frame)
        assert got == pkt
        assert pk.encode(got) == frame
        # Exactness without the model: lengths, pad and ICRC on the wire.
        if pkt.ipv4 is not None:
            assert len(frame) == ETH_LEN + pkt.ipv4["total_length"]
        else:
            assert len(frame) == ETH_LEN + IP6_LEN + (pkt.outer or pkt.ip)["payload_length"]
        assert struct.unpack("<I", frame[-4:])[0] == pkt.icrc
        if pkt.outer is not None:
            plain = pk.decapsulate(frame)
            assert pk.decapsulate(pkt) == pk.decode(plain)
            assert frame.endswith(plain[ETH_LEN:]) and frame[:ETH_LEN] == plain[:ETH_LEN]
            if pkt.srh is not None and len(pkt.srh["segments"]) == 1 \
                    and pkt.srh["segments_left"] == 1:
                again = pk.encapsulate(
                    plain, outer_src=pkt.outer["src"], outer_dst=pkt.outer["dst"],
                    srh_segment=pkt.srh["segments"][0], dscp=pkt.outer["dscp"],
                    ecn=pkt.outer["ecn"], hop_limit=pkt.outer["hop_limit"],
                    flow_label=pkt.outer["flow_label"], srh_tag=pkt.srh["tag"],
                    srh_flags=pkt.srh["flags"])
                assert again == frame
        seen.add((op, encap, pkt.tseth is not None, pkt.bth["pad"]))
    assert {s[0] for s in seen} == set(Opcode)
    assert any(s[2] for s in seen) and {s[3] for s in seen} == {0, 1, 2, 3}


def test_encapsulated_packet_object_equals_encapsulated_frame():
    rng = seeded()
    for _ in range(30):
        pkt = pk.rng_packet(rng, encap="none")
        kw = dict(outer_src=rng.getrandbits(128), outer_dst=rng.getrandbits(128),
                  srh_segment=rng.choice([None, rng.getrandbits(128)]))
        enc = pk.encapsulate(pkt, **kw)
        assert pk.encode(enc) == pk.encapsulate(pk.encode(pkt), **kw)
        assert enc.ip == pkt.ip and enc.icrc == pkt.icrc and pkt.outer is None
        assert pk.decode(pk.encode(enc)) == enc


# --- SRv6 uSID -----------------------------------------------------------------------------

def test_usid_address_and_shift():
    loc = 0xFC000000
    addr = pk.make_usid_address(loc, [0x0100, 0x0200, 0x0300])
    assert addr == ip("fc00:0:100:200:300::")
    assert pk.split_usid_address(addr) == (loc, [0x100, 0x200, 0x300])
    assert pk.usid_shift(addr) == ip("fc00:0:200:300::")
    full = pk.make_usid_address(loc, [1, 2, 3, 4, 5, 6])
    assert full == ip("fc00:0:1:2:3:4:5:6")
    assert pk.usid_shift(full) == ip("fc00:0:2:3:4:5:6:0")
    # The locator block never moves, whatever the container holds.
    assert pk.usid_shift(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")) == \
        ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:0")
    assert pk.usid_shift(ip("fc00:0:1::")) == ip("fc00::")


def test_usid_walk_to_exhaustion_then_srh_segment():
    loc = 0xFC000000
    outer = {"dst": pk.make_usid_address(loc, [0x0100, 0x0200, 0x0300]), "hop_limit": 10,
             "src": 1}
    srh = {"segments_left": 1, "segments": [pk.make_usid_address(loc, [0x0400, 0x0500])]}
    steps = []
    for _ in range(6):
        new_outer, new_srh, action = pk.switch_forward(outer, srh)
        steps.append((action, ip_str(new_outer["dst"]), new_outer["hop_limit"],
                      new_srh["segments_left"]))
        if action == pk.LOCAL:
            assert (new_outer, new_srh) == (outer, srh)
            break
        outer, srh = new_outer, new_srh
    assert steps == [
        (pk.SHIFT, "fc00:0:200:300::", 9, 1),
        (pk.SHIFT, "fc00:0:300::", 8, 1),
        (pk.END, "fc00:0:400:500::", 7, 0),
        (pk.SHIFT, "fc00:0:500::", 6, 0),
        (pk.LOCAL, "fc00:0:500::", 6, 0),
    ]
    # The segment list itself is never rewritten.
    assert srh["segments"] == [pk.make_usid_address(loc, [0x0400, 0x0500])]


def test_srh_end_uses_rfc8754_indexing():
    segs = [ip("fc00:0:a::"), ip("fc00:0:b::"), ip("fc00:0:c::")]    # [0] is the last
    outer = {"dst": ip("fc00:0:1::"), "hop_limit": 64}
    srh = {"segments_left": 3, "segments": segs}
    visited = []
    while True:
        outer, srh, action = pk.switch_forward(outer, srh)
        if action == pk.LOCAL:
            break
        visited.append(ip_str(outer["dst"]))
    assert visited == ["fc00:0:c::", "fc00:0:b::", "fc00:0:a::"]
    assert outer["hop_limit"] == 61


def test_switch_hop_limit_decision():
    srh = {"segments_left": 1, "segments": [ip("fc00:0:2::")]}
    for hl in (0, 1):
        shift = {"dst": ip("fc00:0:1:2::"), "hop_limit": hl}
        assert pk.switch_forward(shift) == (shift, None, pk.DROP)
        end = {"dst": ip("fc00:0:1::"), "hop_limit": hl}
        assert pk.switch_forward(end, srh) == (end, srh, pk.DROP)
        # A packet for this node is delivered whatever its hop limit.
        assert pk.switch_forward(end)[2] == pk.LOCAL
    assert pk.switch_forward({"dst": ip("fc00:0:1:2::"), "hop_limit": 2})[0]["hop_limit"] == 1


def test_switch_forward_on_decoded_packet():
    loc = 0xFC000000
    pkt = pk.encapsulate(pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 3, 4, 5, b"hi"),
                         outer_src=ip("fc00::9"),
                         outer_dst=pk.make_usid_address(loc, [7, 8]),
                         srh_segment=pk.make_usid_address(loc, [9]))
    frame = pk.encode(pkt)
    for expect in (pk.SHIFT, pk.END, pk.LOCAL):
        p = pk.decode(frame)
        p.outer, p.srh, action = pk.switch_forward(p.outer, p.srh)
        assert action == expect
        frame = pk.encode(p)          # the ICRC stays valid: the outer header is outside it
    assert pk.split_usid_address(pk.decode(frame).outer["dst"]) == (loc, [9])
    assert pk.decode(pk.decapsulate(frame)) == pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 3, 4,
                                                               5, b"hi")


# --- Fuzzing -------------------------------------------------------------------------------

def decode_or_error(frame, **kw):
    """The packet, or None on PacketError; any other exception fails the test."""
    try:
        return pk.decode(frame, **kw)
    except PacketError:
        return None


def sample_frames(rng):
    out = []
    for op in Opcode:
        for encap in ("none", "outer", "srh", "ipv4"):
            out.append(pk.encode(pk.rng_packet(rng, opcode=op, encap=encap, max_payload=24)))
    return out


def test_garbage_raises_only_packet_error():
    rng = seeded()
    frames = sample_frames(rng)
    for _ in range(3000):
        assert decode_or_error(rng.randbytes(rng.randrange(200))) is None
    # Plausible garbage: a valid start, then random bytes; and random byte overwrites.
    for _ in range(3000):
        f = bytearray(rng.choice(frames))
        cut = rng.randrange(len(f))
        if rng.getrandbits(1):
            f[cut:] = rng.randbytes(rng.randrange(len(f) - cut + 40))
        else:
            for _ in range(rng.randrange(1, 4)):
                f[rng.randrange(len(f))] = rng.getrandbits(8)
        for check in (True, False):
            got = decode_or_error(bytes(f), check_icrc=check, udp_dport=None)
            if got is not None:
                assert pk.encode(got, check=False) == bytes(f)


def test_every_truncation_raises():
    rng = seeded()
    for frame in sample_frames(rng):
        for n in range(len(frame)):
            with pytest.raises(PacketError):
                pk.decode(frame[:n], check_icrc=False)
        with pytest.raises(PacketError):
            pk.decode(frame + b"\0", check_icrc=False)


def test_every_bit_flip():
    rng = seeded()
    for frame in sample_frames(rng):
        pkt = pk.decode(frame)
        inner = ETH_LEN if pkt.outer is None else len(frame) - IP6_LEN - pkt.ip["payload_length"]
        # Bits the ICRC does not protect: Ethernet, outer IPv6, SRH, and its masked fields
        # (over IPv4 the UDP checksum and BTH byte 4: the header checksum catches a flip in
        # the type of service, TTL or itself).
        unprotected = set(range(8 * inner))
        masked = ((208, 224), (256, 264)) if pkt.ipv4 is not None else \
            ((4, 32), (56, 64), (368, 384), (416, 424))
        for lo, hi in masked:
            unprotected |= set(range(8 * inner + lo, 8 * inner + hi))
        accepted = 0
        for bit in range(8 * len(frame)):
            f = bytearray(frame)
            f[bit // 8] ^= 0x80 >> (bit % 8)
            f = bytes(f)
            loose = decode_or_error(f, check_icrc=False)
            if loose is not None:                      # nothing lost in decoding
                assert pk.encode(loose, check=False) == f
                assert loose != pkt
            if decode_or_error(f) is not None:
                assert bit in unprotected, bit
                accepted += 1
        # MAC addresses alone give 96 accepted flips: make sure the check is not vacuous.
        assert accepted >= 96


# --- Errors --------------------------------------------------------------------------------

def _write(payload=b"12345678", **kw):
    return pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 3, 4, len(payload), payload, **kw)


def _srh():
    return pk.encapsulate(_write(), outer_src=1, outer_dst=2, srh_segment=3)


def _set(name, **values):
    return lambda p: getattr(p, name).update(values)


def _poke(frame, **offsets):
    """``frame`` with single bytes replaced: ``_poke(f, b19=20)`` sets byte 19 to 20."""
    f = bytearray(frame)
    for key, value in offsets.items():
        f[int(key[1:])] = value
    return bytes(f)


def _lengths(p, udp_length):
    p.ip["payload_length"] = p.udp["length"] = udp_length


# Offsets in a plain frame: IPv6 at 14, UDP at 54, BTH at 62, first extension header at 74.
# _write() is a WRITE_ONLY with 8 payload bytes: UDP length 52, frame 106 bytes.
DECODE_ERRORS = {
    "short frame": (lambda: bytes(10),
                    "truncated Ethernet header: needs 14 bytes at offset 0, 10 left"),
    "ethertype": (lambda: frame_with(_write(), _set("eth", ethertype=0x8100)),
                  "ethertype 0x8100 is not IPv6 (0x86dd) or IPv4 (0x0800)"),
    # IPv4 (UDP mode): IPv4 at 14, UDP at 34; _write4() is 86 bytes, UDP length 52.
    "ipv4 as ipv6": (lambda: frame_with(_write(), _set("eth", ethertype=0x0800)),
                     "IPv4 header version 6 is not 4"),
    "ipv4 truncated": (lambda: pk.encode(_write4())[:30],
                       "truncated IPv4 header: needs 20 bytes at offset 14, 16 left"),
    "ipv4 options": (lambda: _ipv4_frame(ihl=6),
                     "IPv4 IHL 6: options are not supported (IHL 5)"),
    "ipv4 checksum": (lambda: _poke(pk.encode(_write4()), b24=0),
                      "bad IPv4 header checksum 0x00a3"),
    "ipv4 fragment": (lambda: _ipv4_frame(flags=0b001),
                      "a fragment of an IPv4 packet (MF set or a fragment offset)"),
    "ipv4 fragment offset": (lambda: _ipv4_frame(fragment_offset=8),
                             "a fragment of an IPv4 packet (MF set or a fragment offset)"),
    "ipv4 reserved flag": (lambda: _ipv4_frame(flags=0b110),
                           "IPv4 reserved flag bit is not zero"),
    "ipv4 length": (lambda: _ipv4_frame(total_length=71),
                    "IPv4 total_length 71 disagrees with the 72 bytes from its header on"),
    "ipv4 protocol": (lambda: _ipv4_frame(protocol=6), "IPv4 protocol 6 is not UDP (17)"),
    "ipv4 udp length": (lambda: frame_with(_write4(), _set("udp", length=51)),
                        "UDP length 51 disagrees with IPv4 total_length 72 less its header"),
    "ipv6 truncated": (lambda: pk.encode(_write())[:40],
                       "truncated IPv6 header: needs 40 bytes at offset 14, 26 left"),
    "ipv6 version": (lambda: frame_with(_write(), _set("ip", version=4)),
                     "IPv6 header version 4 is not 6"),
    "trailing byte": (lambda: pk.encode(_write()) + b"\0",
                      "IPv6 header payload_length 52 disagrees with the 53 bytes after its "
                      "header"),
    "missing byte": (lambda: pk.encode(_write())[:-1],
                     "IPv6 header payload_length 52 disagrees with the 51 bytes after its "
                     "header"),
    "next header": (lambda: frame_with(_write(), _set("ip", next_header=6)),
                    "IPv6 next header 6 is not UDP (17), IPv6 (41) or Routing (43)"),
    "inner next header": (lambda: frame_with(_srh(), _set("ip", next_header=41)),
                          "inner IPv6 next header 41 is not UDP (17)"),
    "inner version": (lambda: frame_with(_srh(), _set("ip", version=5)),
                      "inner IPv6 header version 5 is not 6"),
    "inner length": (lambda: frame_with(_srh(), _set("ip", payload_length=51)),
                     "inner IPv6 header payload_length 51 disagrees with the 52 bytes after "
                     "its header"),
    "srh routing type": (lambda: frame_with(_srh(), _set("srh", routing_type=3)),
                         "SRH routing type 3 is not 4"),
    "srh odd length": (lambda: frame_with(_srh(), _set("srh", hdr_ext_len=3)),
                       "SRH hdr_ext_len 3 is odd: SRH TLVs are not supported"),
    "srh last entry": (lambda: frame_with(_srh(), _set("srh", last_entry=1)),
                       "SRH last_entry 1 disagrees with its 1 segments"),
    "srh segments left": (lambda: frame_with(_srh(), _set("srh", segments_left=2)),
                          "SRH segments_left 2 exceeds its 1 segments"),
    "srh next header": (lambda: frame_with(_srh(), _set("srh", next_header=17)),
                        "SRH next header 17 is not IPv6 (41)"),
    # Frame ends after the SRH, whose hdr_ext_len claims two segments (outer length 24).
    "srh segment list": (lambda: _poke(pk.encode(_srh())[:78], b19=24, b55=4, b58=1),
                         "truncated SRH segment list: needs 32 bytes at offset 62, 16 left"),
    "srh truncated": (lambda: _poke(pk.encode(_srh())[:58], b19=4),
                      "truncated SRH: needs 8 bytes at offset 54, 4 left"),
    "udp length": (lambda: frame_with(_write(), _set("udp", length=51)),
                   "UDP length 51 disagrees with IPv6 payload_length 52"),
    "udp port": (lambda: frame_with(_write(), _set("udp", dst_port=4791)),
                 "UDP destination port 4791 is not 4971"),
    # IPv6 and UDP lengths 20: the frame ends 8 bytes into the BTH, before a 4-byte ICRC.
    "bth truncated": (lambda: _poke(pk.encode(_write())[:74], b19=20, b59=20),
                      "truncated BTH: needs 12 bytes at offset 62, 8 left"),
    "opcode": (lambda: frame_with(_write(), _set("bth", opcode=0x04)),
               "unknown BTH opcode 0x04"),
    "tver": (lambda: frame_with(_write(), _set("bth", tver=1)), "BTH tver 1 is not 0"),
    "bth reserved": (lambda: _poke(pk.encode(_write()), b66=0x01),
                     "BTH reserved bits _rsvd4 are not zero"),
    "bth flag reserved": (lambda: _poke(pk.encode(_write()), b70=0x40),
                          "BTH reserved bits _rsvd8_6 are not zero"),
    "seth reserved": (lambda: _poke(pk.encode(pk.sack_packet(1, 2)), b86=0x80),
                      "SETH reserved bits _rsvd12 are not zero"),
    "tseth type": (lambda: frame_with(_write(ts=5), _set("tseth", type=2)),
                   "TSETH type 2 is not 1"),
    "endpoint qp": (lambda: frame_with(pk.endpoint_packet(Opcode.EP_REQUEST, b"x"),
                                       _set("bth", dest_qp=3)),
                    "EP_REQUEST to QP 0x3, not the endpoint QP 0x2"),
    "reth truncated": (lambda: frame_with(_write(), lambda p: (
        setattr(p, "reth", None), setattr(p, "payload", b""), _lengths(p, 28))),
        "truncated RETH: needs 16 bytes at offset 78, 0 left"),
    "control trailing bytes": (lambda: frame_with(pk.sack_packet(1, 2), lambda p: (
        setattr(p, "payload", b"abcd"), _lengths(p, 64))),
        "SACK has 4 bytes after its headers, expected none"),
    "control pad": (lambda: _poke(pk.encode(pk.ack_packet(1, 2)), b63=0x20),
                    "BTH pad count 2 on ACK, which has no payload"),
    "unaligned": (lambda: frame_with(_write(), lambda p: (
        setattr(p, "payload", b"123456789"), _lengths(p, 53))),
        "payload and pad take 9 bytes, not a multiple of 4"),
    "pad count too big": (lambda: _poke(pk.encode(_write(b"")), b63=0x30),
                          "BTH pad count 3 exceeds the 0 bytes after the headers"),
    "pad bytes": (lambda: _poke(pk.encode(_write(b"12345")), b101=1),
                  "pad bytes 000001 are not zero"),
}


def _write4():
    return pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 0, 0, 8, b"12345678", ipv4=True)


def _ipv4_frame(**fields):
    """Frame of _write4() with ``fields`` of its IPv4 header changed, the header checksum
    made valid again (so that the decoder reaches the check under test)."""
    p = _write4()
    p.ipv4.update(fields, checksum=0)
    p.ipv4["checksum"] = proto.ipv4_checksum(proto.IPV4.pack(**p.ipv4))
    p.icrc = None
    return pk.encode(p, check=False)


@pytest.mark.parametrize("case", DECODE_ERRORS)
def test_decode_error_messages(case):
    make, message = DECODE_ERRORS[case]
    frame = make()
    with pytest.raises(PacketError) as info:
        pk.decode(frame, check_icrc=False)
    assert str(info.value) == message


def test_decode_error_is_a_value_error_and_port_is_a_register():
    frame = frame_with(_write(), _set("udp", dst_port=4791))
    assert pk.decode(frame, udp_dport=4791).udp["dst_port"] == 4791
    assert pk.decode(frame, udp_dport=None).udp["dst_port"] == 4791
    assert issubclass(PacketError, ValueError)


def test_bad_icrc():
    frame = pk.encode(_write())
    good = struct.unpack("<I", frame[-4:])[0]
    bad = frame[:-4] + struct.pack("<I", good ^ 0x80000000)
    with pytest.raises(PacketError) as info:
        pk.decode(bad)
    assert str(info.value) == f"bad ICRC: frame carries {good ^ 0x80000000:#010x}, " \
                              f"computed {good:#010x}"
    assert pk.decode(bad, check_icrc=False).icrc == good ^ 0x80000000
    # A payload change is caught by the ICRC too.
    with pytest.raises(PacketError, match="^bad ICRC"):
        pk.decode(_poke(frame, b100=frame[100] ^ 1))


def _stale_payload():
    p = _write()
    p.payload = b"1234567890ab"
    return pk.encode(p)


def _stale_icrc():
    p = _write()
    p.reth["rkey"] ^= 1
    return pk.encode(p)


def _raw_srh_segments():
    p = _srh()
    p.srh["segments"] = [1 << 128]
    return pk.encode(p)


OTHER_ERRORS = {
    "stale length": (_stale_payload,
                     "IPv6 header payload_length 52 disagrees with the 56 bytes after its "
                     "header"),
    "stale icrc": (_stale_icrc, "bad ICRC: frame carries 0x"),
    "missing field": (lambda: pk.encode(pk.Packet(**{**vars(_write()), "icrc": None,
                                                     "meth": {"msn": 1}})),
                      "packet is not self-consistent (meth.rqmsn: packet has 'nothing', "
                      "frame decodes to 0); finalize() it"),
    "wide field": (lambda: pk.finalize(pk.Packet(bth={"opcode": 0xD1, "psn": 1 << 24},
                                                 aeth={})),
                   "bth: BTH.psn = 0x1000000 does not fit 24 bits"),
    "unknown field": (lambda: pk.finalize(pk.Packet(bth={"opcode": 0xD1, "qp": 1},
                                                    aeth={})),
                      "bth has no field 'qp'"),
    "unknown opcode": (lambda: pk.finalize(pk.Packet(bth={"opcode": 0x11})),
                       "unknown BTH opcode 0x11"),
    "wrong headers": (lambda: pk.finalize(pk.Packet(bth={"opcode": 0xCA}, meth={})),
                      "WRITE_ONLY carries meth, reth, not meth"),
    "payload on sack": (lambda: pk.finalize(pk.Packet(bth={"opcode": 0xDC}, seth={},
                                                      cc_state={}, payload=b"x")),
                        "SACK carries no payload, got 1 bytes"),
    "srh without outer": (lambda: pk.finalize(pk.Packet(srh={}, bth={"opcode": 0xD1},
                                                        aeth={})),
                          "an SRH needs an outer IPv6 header"),
    "wide segment": (_raw_srh_segments, "srh: int too big to convert"),
    "wide icrc": (lambda: pk.encode(pk.Packet(**{**vars(_write()), "icrc": 1 << 32})),
                  "icrc 4294967296: "),
    "imm missing": (lambda: pk.write_packet(Opcode.WRITE_ONLY_IMM, 1, 2, 3, 4, 5),
                    "WRITE_ONLY_IMM needs imm"),
    "imm refused": (lambda: pk.write_packet(Opcode.WRITE_LAST, 1, 2, 3, 4, 5, imm=1),
                    "WRITE_LAST takes no imm"),
    "not a write": (lambda: pk.write_packet(Opcode.ACK, 1, 2, 3, 4, 5),
                    "ACK is not a WRITE opcode"),
    "not endpoint": (lambda: pk.endpoint_packet(Opcode.PROBE), "PROBE is not an endpoint opcode"),
    "ev and port": (lambda: _write(ev=1, udp_sport=2),
                    "give either ev or udp_sport/flow_label, not both"),
    "wide ev": (lambda: _write(ev=1 << 32), "STEV EV 0x100000000 does not fit 32 bits"),
    "bad mac": (lambda: _write(src_mac="02:00:00:00:00"), "bad MAC address '02:00:00:00:00'"),
    "bad ip": (lambda: _write(dst_ip="fd00::g"), "bad IPv6 address 'fd00::g'"),
    "short icrc input": (lambda: pk.icrc(bytes(59)),
                         "ICRC input of 59 bytes is shorter than IPv6+UDP+BTH (60 bytes)"),
    "encapsulate twice": (lambda: pk.encapsulate(_srh(), outer_src=1, outer_dst=2),
                          "packet is already SRv6-encapsulated"),
    "decapsulate plain": (lambda: pk.decapsulate(pk.encode(_write())),
                          "packet is not SRv6-encapsulated"),
    "bad segment": (lambda: pk.encapsulate(_write(), outer_src=1, outer_dst=2,
                                           srh_segment=-1),
                    "SRH segment -1 is not a 128-bit integer"),
    "usid zero": (lambda: pk.make_usid_address(0xFC000000, [1, 0, 2]),
                  "uSID 0x0 is not in 0x0001..0xffff (0x0000 ends the container)"),
    "usid count": (lambda: pk.make_usid_address(0xFC000000, [1] * 7),
                   "7 uSIDs do not fit one address (at most 6)"),
    "usid locator": (lambda: pk.make_usid_address(1 << 32, [1]),
                     "locator 0x100000000 does not fit 32 bits"),
    "shift range": (lambda: pk.usid_shift(1 << 128),
                    f"destination {1 << 128} is not a 128-bit integer"),
    "srh segments left": (lambda: pk.switch_forward({"dst": 1 << 96, "hop_limit": 9},
                                                    {"segments_left": 2, "segments": [5]}),
                          "SRH segments_left 2 exceeds its 1 segments"),
    "rng encap": (lambda: pk.rng_packet(random.Random(1), encap="gre"),
                  "encap 'gre' is not 'none', 'outer', 'srh' or 'ipv4'"),
}


@pytest.mark.parametrize("case", OTHER_ERRORS)
def test_encoder_and_builder_error_messages(case):
    make, message = OTHER_ERRORS[case]
    with pytest.raises(PacketError) as info:
        make()
    assert str(info.value).startswith(message), str(info.value)


# --- IPv4 (UDP mode) -----------------------------------------------------------------------

def test_ipv4_round_trip_and_derived_fields():
    rng = seeded()
    for _ in range(100):
        op = rng.choice([*WRITES, *CONTROL, *ENDPOINT])
        pkt = pk.finalize(pk.rng_packet(rng, opcode=op, encap="none"))
        four = pkt.copy()
        four.ip = None
        four.ipv4 = {"dscp": rng.getrandbits(6), "ecn": rng.getrandbits(2),
                     "identification": rng.getrandbits(16), "ttl": rng.getrandbits(8),
                     "src": rng.getrandbits(32), "dst": rng.getrandbits(32)}
        four = pk.finalize(four)
        frame = pk.encode(four)
        assert pk.decode(frame) == four
        # 20 bytes shorter than over IPv6, the same from the UDP header on but for the ICRC.
        six = pk.encode(pkt)
        assert len(frame) == len(six) - 20
        assert frame[34:-4] == six[54:-4]
        assert frame[12:14] == b"\x08\x00" and frame[14] == 0x45
        assert four.ipv4["total_length"] == len(frame) - 14
        assert four.ipv4["flags"] == proto.IPV4_FLAGS_DF
        assert proto.ipv4_checksum(frame[14:34]) == 0
        # scapy's RoCEv2 ICRC over IPv4 agrees.
        assert Ether(frame)[ScapyBTH].compute_icrc(b"") == frame[-4:]


def test_ipv4_icrc_covers_what_rocev2_says():
    """The ICRC over IPv4 covers every bit but the type of service, TTL and header checksum
    (and the UDP checksum and BTH byte 4, as over IPv6)."""
    inner = pk.encode(_write4())[ETH_LEN:-4]
    base = pk.icrc(inner, ipv4=True)
    # Bits replaced by ones: type of service (IPv4 byte 1), TTL (byte 8), header checksum
    # (bytes 10-11), UDP checksum (bytes 26-27), BTH byte 4 (byte 32).
    masked = set(range(8, 16)) | set(range(64, 72)) | set(range(80, 96)) | \
        set(range(208, 224)) | set(range(256, 264))
    for bit in range(8 * len(inner)):
        flipped = bytearray(inner)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        assert (pk.icrc(bytes(flipped), ipv4=True) == base) == (bit in masked), bit
    with pytest.raises(PacketError, match="shorter than IPv4\\+UDP\\+BTH \\(40 bytes\\)"):
        pk.icrc(bytes(39), ipv4=True)


def test_ipv4_builder_and_packet_rules():
    pkt = pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 0, 0, 4, b"abcd", ipv4=True, ev=0xBEEF,
                          src_ip="192.0.2.1", dst_ip="192.0.2.9", hop_limit=9)
    assert pkt.ip is None and pkt.headers[:3] == ["eth", "ipv4", "udp"]
    assert pkt.ipv4["src"] == ip4("192.0.2.1") and pkt.ipv4["ttl"] == 9
    assert pk.stev_ev(pkt) == 0xBEEF            # the EV is the UDP source port alone
    assert pkt.udp["src_port"] == 0xBEEF
    default = pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 0, 0, 0, ipv4=True)
    assert (default.ipv4["src"], default.ipv4["dst"]) == (pk.DEFAULT_SRC_IP4,
                                                          pk.DEFAULT_DST_IP4)
    with pytest.raises(PacketError, match="the EV is the UDP source port alone"):
        pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 0, 0, 0, ipv4=True, ev=0x10000)
    with pytest.raises(PacketError, match="IPv4 has no flow label"):
        pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 0, 0, 0, ipv4=True, flow_label=1)
    with pytest.raises(PacketError, match="bad IPv4 address"):
        pk.write_packet(Opcode.WRITE_ONLY, 1, 2, 0, 0, 0, ipv4=True, src_ip="fd00::1")
    with pytest.raises(PacketError, match="the SRv6 modes carry IPv6"):
        pk.encapsulate(pkt, outer_src=ip("fd00::1"), outer_dst=ip("fd00::2"))
    both = pkt.copy()
    both.ip = {}
    with pytest.raises(PacketError, match="ip \\(IPv6\\) or ipv4, not both"):
        pk.finalize(both)
    neither = pkt.copy()
    neither.ipv4 = None
    with pytest.raises(PacketError, match="not neither"):
        pk.finalize(neither)
    outer = pkt.copy()
    outer.outer = {}
    with pytest.raises(PacketError, match="IPv4 is UDP mode only"):
        pk.finalize(outer)


def ip4(text):
    return int(ipaddress.IPv4Address(text))
