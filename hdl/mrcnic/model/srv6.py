"""Reference model of the transmit encapsulation (``Srv6Encap``), byte by byte.

:func:`encap` takes one frame (bytes, as on AXI-Stream: Ethernet first, ICRC last, no FCS),
its descriptor (a dict with the fields of ``ENCAP_DESC``: ``mode``, ``ev`` (256-bit int, first
EV field most significant), ``entropy``, ``outer_src``, ``dscp``, ``ecn``, ``hop_limit``), and
the register values, and returns what the block sends: ``(frame, bad, causes)``.

It works on bytes and the spec, not on the gateware's structure: flow label and UDP source
port are written at their offsets, the ICRC is recomputed as ``zlib.crc32`` would see the
change (by the affine property, :func:`mrcnic.base.crc.correction`), and the outer headers are
packed with :mod:`mrcnic.base.proto`. The tests also check its output against
:func:`mrcnic.model.packet.encapsulate` and a full ICRC recomputation.
"""

from mrcnic.base import proto
from mrcnic.base.crc import correction
from mrcnic.base.proto import ETH, IPV6, SRH, EvMode

__all__ = ["encap", "decap", "srh_end", "entropy_of", "CAUSES", "DECAP_CAUSES"]

CAUSES = ("in_bad", "not_roce", "truncated", "length", "too_long")
MIN_ROCE_FRAME = ETH.size + IPV6.size + 8 + proto.BTH.size + proto.ICRC_LEN     # 78
IP, PLEN, NH, SPORT, DPORT = 14, 18, 20, 54, 56


def entropy_of(desc, stev_swap=0):
    """``(udp_src_port, flow_label_low16)`` the descriptor's mode writes (spec §2.3)."""
    mode = EvMode(desc["mode"])
    ev = desc["ev"]
    if mode == EvMode.STEV:
        e = ev >> 224
    elif mode == EvMode.UDP:
        e = ev >> 240
    else:
        e = desc["entropy"]
    return proto.stev_split(e & 0xFFFFFFFF, swap=stev_swap and mode != EvMode.UDP)


def encap(frame, desc, *, in_bad=False, udp_dport=proto.UDP_DPORT_DEFAULT, stev_swap=0,
          max_frame=9216):
    frame = bytes(frame)
    mode = EvMode(desc["mode"])
    causes = {"in_bad"} if in_bad else set()
    if mode == EvMode.PASS:
        return frame, bool(in_bad), causes

    n = len(frame)
    out = bytearray(frame)
    port, flow = entropy_of(desc, stev_swap)
    if mode in (EvMode.STEV, EvMode.SRV6, EvMode.SRV6_SRH):
        for pos, value in ((IP + 1, frame[IP + 1] & 0xF0 if n > IP + 1 else 0),
                           (IP + 2, flow >> 8), (IP + 3, flow & 0xFF)):
            if pos < n:
                out[pos] = value
    plen = int.from_bytes(frame[PLEN:PLEN + 2], "big") if n >= PLEN + 2 else None
    length = IP + IPV6.size + plen if plen is not None else None
    if n >= SPORT + 2:
        old = int.from_bytes(frame[SPORT:SPORT + 2], "big")
        out[SPORT:SPORT + 2] = port.to_bytes(2, "big")
        k = length - (SPORT + 2 + proto.ICRC_LEN)
        if k >= 0:
            fix = correction(old, port, 2, k).to_bytes(4, "little")
            for i in range(4):
                if length - 4 + i < n:
                    out[length - 4 + i] ^= fix[i]

    # Checks, each on the bytes that are there.
    def differs(pos, size, want):
        return n >= pos + size and int.from_bytes(frame[pos:pos + size], "big") != want
    if (differs(12, 2, proto.ETHERTYPE_IPV6) or (n > IP and frame[IP] >> 4 != 6) or
            differs(NH, 1, proto.IPPROTO_UDP) or differs(DPORT, 2, udp_dport)):
        causes.add("not_roce")
    if n < MIN_ROCE_FRAME:
        causes.add("truncated")
    else:
        if length != n:
            causes.add("length")
        if length > max_frame:
            causes.add("too_long")

    insert = {EvMode.SRV6: 0, EvMode.SRV6_SRH: 1}.get(mode)
    if insert is not None and plen is not None:
        srh = insert == 1
        ev = desc["ev"]
        outer = IPV6.pack(version=6, dscp=desc["dscp"], ecn=desc["ecn"], flow_label=flow,
                          payload_length=(plen + (proto.OUTER_SRH_LEN if srh
                                                  else proto.OUTER_IPV6_LEN)) & 0xFFFF,
                          next_header=proto.IPPROTO_ROUTING if srh else proto.IPPROTO_IPV6,
                          hop_limit=desc["hop_limit"], src=desc["outer_src"], dst=ev >> 128)
        if srh:
            outer += SRH.pack(next_header=proto.IPPROTO_IPV6, hdr_ext_len=2,
                              routing_type=proto.SRH_ROUTING_TYPE, segments_left=1,
                              last_entry=0, segment=ev & ((1 << 128) - 1))
        out = out[:IP] + outer + out[IP:]
    return bytes(out), bool(causes), causes


DECAP_CAUSES = ("in_bad", "version", "length", "srh", "inner", "truncated", "too_long")


def decap(frame, *, in_bad=False, srh_any_left=0, max_frame=9216 + 64):
    """What ``Srv6Decap`` does with one frame: ``(frame, bad, causes, meta)``.

    ``meta`` has the fields of ``DECAP_META`` (mode, dscp, ecn, flow_label, hop_limit, srh,
    residue, bad); the header fields are the first IPv6 header's, for any IPv6 frame of at
    least 54 bytes, else 0. Only frames of Ethernet type IPv6 with outer version 6 and Next Header 41
    or 43 are stripped (of 40 or 64 bytes); the checks follow the spec's SRv6 rules.
    """
    frame = bytes(frame)
    n = len(frame)
    causes = {"in_bad"} if in_bad else set()
    if n > max_frame:
        causes.add("too_long")
    meta = {"mode": int(EvMode.PASS), "dscp": 0, "ecn": 0, "flow_label": 0, "hop_limit": 0,
            "srh": 0, "residue": 0, "bad": 0}
    strip = 0
    is_ipv6 = n >= IP and int.from_bytes(frame[12:14], "big") == proto.ETHERTYPE_IPV6
    if is_ipv6 and n > IP and frame[IP] >> 4 != 6:
        causes.add("version")
    elif is_ipv6 and n > NH and frame[NH] in (proto.IPPROTO_IPV6, proto.IPPROTO_ROUTING):
        srh = frame[NH] == proto.IPPROTO_ROUTING
        strip = proto.OUTER_SRH_LEN if srh else proto.OUTER_IPV6_LEN
        inner = IP + strip
        if n < inner + IPV6.size:
            causes.add("truncated")
        else:
            if frame[inner] >> 4 != 6:
                causes.add("inner")
            if n != IP + IPV6.size + int.from_bytes(frame[PLEN:PLEN + 2], "big"):
                causes.add("length")
        if srh and n >= IP + IPV6.size + 5:
            s = frame[IP + IPV6.size:]
            left_ok = s[3] == 0 or (srh_any_left and s[3] == 1)
            if (s[0], s[1], s[2], s[4]) != (proto.IPPROTO_IPV6, 2, proto.SRH_ROUTING_TYPE,
                                            0) or not left_ok:
                causes.add("srh")
        meta.update(mode=int(EvMode.SRV6_SRH if srh else EvMode.SRV6), srh=int(srh))
    if is_ipv6 and n >= IP + IPV6.size:
        # The first IPv6 header (the outer one when encapsulated), for any IPv6 frame.
        hdr = IPV6.unpack(frame[IP:IP + IPV6.size])
        meta.update(dscp=hdr["dscp"], ecn=hdr["ecn"], flow_label=hdr["flow_label"],
                    hop_limit=hdr["hop_limit"], residue=hdr["dst"])
    out = frame[:IP] + frame[IP + strip:] if strip else frame
    if strip and n < IP + strip:
        out = frame[:IP]
    meta["bad"] = int(bool(causes))
    return out, bool(causes), causes, meta


def srh_end(frame):
    """The frame as the last SRv6 switch of a path leaves it: with an SRH, its segment
    copied into the outer destination and segments left 0 (RFC 8986 End, spec §2.4); any
    other frame unchanged. The inner packet and its ICRC are not touched."""
    from mrcnic.model import packet as pk
    pkt = pk.decode(frame, check_icrc=False, udp_dport=None)
    if pkt.srh is None or not pkt.srh["segments"]:
        return bytes(frame)
    pkt.outer["dst"] = pkt.srh["segments"][0]
    pkt.srh["segments_left"] = 0
    return pk.encode(pkt, check=False)
