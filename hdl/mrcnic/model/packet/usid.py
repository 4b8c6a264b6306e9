"""SRv6 in the packet model: uSID addresses, a switch's forwarding step, encapsulation and
decapsulation (:mod:`mrcnic.model.packet` says how to use them).
"""



from mrcnic.base import proto
from mrcnic.base.proto import ICRC_LEN, SRH_FIXED_LEN, SRH_SEGMENT_LEN
from mrcnic.model.packet.codec import (
    DEFAULT_HOP_LIMIT, Packet, PacketError, _inner_bytes, decode, encode)
from mrcnic.model.packet.build import _ip6



# --- SRv6 ----------------------------------------------------------------------------------

_ADDR_BITS = 128
_ADDR_MASK = (1 << _ADDR_BITS) - 1
# Bits after the locator block and the active uSID: the rest of the uSID container.
_NEXT_BITS = _ADDR_BITS - proto.SRV6_LBL_BITS - proto.SRV6_USID_BITS
_NEXT_MASK = (1 << _NEXT_BITS) - 1
_LBL_MASK = ((1 << proto.SRV6_LBL_BITS) - 1) << (_ADDR_BITS - proto.SRV6_LBL_BITS)
_MAX_USIDS = (_ADDR_BITS - proto.SRV6_LBL_BITS) // proto.SRV6_USID_BITS
_USID_MASK = (1 << proto.SRV6_USID_BITS) - 1

# Actions of switch_forward().
SHIFT = "shift"      # uN: next uSID shifted into place
END = "end"          # End: next SRH segment copied into the destination
LOCAL = "local"      # address exhausted, no segment left: the packet is for this node
DROP = "drop"        # would be forwarded with hop limit 0 or 1


def _check_addr(addr, what="address"):
    if not isinstance(addr, int) or not 0 <= addr <= _ADDR_MASK:
        raise PacketError(f"{what} {addr!r} is not a 128-bit integer")


def make_usid_address(locator, usids):
    """Destination address: 32-bit ``locator`` block, then the uSIDs, then zeros (spec 2.4)."""
    if not 0 <= locator < 1 << proto.SRV6_LBL_BITS:
        raise PacketError(f"locator {locator:#x} does not fit {proto.SRV6_LBL_BITS} bits")
    if len(usids) > _MAX_USIDS:
        raise PacketError(f"{len(usids)} uSIDs do not fit one address (at most {_MAX_USIDS})")
    addr = locator
    for u in usids:
        if not 0 < u <= _USID_MASK:
            raise PacketError(f"uSID {u:#x} is not in 0x0001..{_USID_MASK:#x} "
                              f"(0x0000 ends the container)")
        addr = addr << proto.SRV6_USID_BITS | u
    return addr << (proto.SRV6_USID_BITS * (_MAX_USIDS - len(usids)))


def split_usid_address(addr):
    """``(locator, [uSIDs up to the first 0x0000])`` of a uSID address."""
    _check_addr(addr)
    usids = []
    for k in range(_MAX_USIDS):
        u = addr >> (_ADDR_BITS - proto.SRV6_LBL_BITS - proto.SRV6_USID_BITS * (k + 1)) \
            & _USID_MASK
        if u == 0:
            break
        usids.append(u)
    return addr >> (_ADDR_BITS - proto.SRV6_LBL_BITS), usids


def usid_shift(dst):
    """uN shift (RFC 9800 NEXT-C-SID): bits 48..127 move to 32..111, the last 16 become 0."""
    _check_addr(dst, "destination")
    return (dst & _LBL_MASK) | ((dst & _NEXT_MASK) << proto.SRV6_USID_BITS)


def switch_forward(outer, srh=None):
    """What an SRv6 switch does with a packet it matched on locator + its own uSID (spec 2.4).

    Returns ``(new_outer, new_srh, action)`` with fresh dicts (the inputs are not changed):
    :data:`SHIFT` when more uSIDs follow (destination shifted, hop limit - 1); :data:`END`
    when the container is exhausted and the SRH has segments left (destination =
    ``segments[segments_left - 1]``, segments_left - 1, hop limit - 1); :data:`LOCAL` when
    both are exhausted; :data:`DROP` (nothing changed) when it would forward with hop limit
    0 or 1.
    """
    dst = outer["dst"]
    _check_addr(dst, "outer destination")
    new_outer = dict(outer)
    new_srh = None
    if srh is not None:
        new_srh = dict(srh, segments=list(srh.get("segments", [])))
    if dst & _NEXT_MASK:
        action, new_dst = SHIFT, usid_shift(dst)
    elif new_srh is not None and new_srh["segments_left"] > 0:
        left = new_srh["segments_left"]
        if left > len(new_srh["segments"]):
            raise PacketError(f"SRH segments_left {left} exceeds its "
                              f"{len(new_srh['segments'])} segments")
        action, new_dst = END, new_srh["segments"][left - 1]
    else:
        return new_outer, new_srh, LOCAL
    if outer["hop_limit"] <= 1:
        return new_outer, new_srh, DROP
    if action == END:
        new_srh["segments_left"] -= 1
    new_outer.update(dst=new_dst, hop_limit=outer["hop_limit"] - 1)
    return new_outer, new_srh, action


def encapsulate(pkt_or_frame, *, outer_src, outer_dst, srh_segment=None, dscp=None, ecn=None,
                hop_limit=DEFAULT_HOP_LIMIT, flow_label=None, srh_tag=0, srh_flags=0):
    """SRv6-encapsulate a plain packet or frame; returns the same kind (Packet or bytes).

    Adds the outer IPv6 header (next header 41), or outer IPv6 + SRH (next header 43, SRH next
    header 41, routing type 4) when ``srh_segment`` is given: one 128-bit segment, or a list
    in wire order (``[0]`` is the last segment); segments_left = last_entry + 1. ``dscp``,
    ``ecn``, ``flow_label`` default to the inner header's. The inner packet and its ICRC are
    untouched, even if wrong (a frame is decoded with ``check_icrc=False``).
    """
    is_frame = not isinstance(pkt_or_frame, Packet)
    pkt = decode(pkt_or_frame, check_icrc=False, udp_dport=None) if is_frame \
        else pkt_or_frame.copy()
    if pkt.outer is not None:
        raise PacketError("packet is already SRv6-encapsulated")
    if pkt.ipv4 is not None:
        raise PacketError("an IPv4 packet is UDP mode only: the SRv6 modes carry IPv6")
    outer_src, outer_dst = _ip6(outer_src), _ip6(outer_dst)
    _check_addr(outer_src, "outer source")
    _check_addr(outer_dst, "outer destination")
    # The inner packet's length as it will be written, whatever its own length fields say.
    inner_len = len(_inner_bytes(pkt)) + ICRC_LEN
    if srh_segment is None:
        srh_len = 0
    else:
        segments = [srh_segment] if isinstance(srh_segment, int) else list(srh_segment)
        for s in segments:
            _check_addr(s, "SRH segment")
        pkt.srh = {"next_header": proto.IPPROTO_IPV6, "hdr_ext_len": 2 * len(segments),
                   "routing_type": proto.SRH_ROUTING_TYPE, "segments_left": len(segments),
                   "last_entry": max(len(segments) - 1, 0), "flags": srh_flags,
                   "tag": srh_tag, "segments": segments}
        srh_len = SRH_FIXED_LEN + SRH_SEGMENT_LEN * len(segments)
    pkt.outer = {
        "version": proto.IPV6_VERSION,
        "dscp": pkt.ip["dscp"] if dscp is None else dscp,
        "ecn": pkt.ip["ecn"] if ecn is None else ecn,
        "flow_label": pkt.ip["flow_label"] if flow_label is None else flow_label,
        "payload_length": srh_len + inner_len,
        "next_header": proto.IPPROTO_IPV6 if pkt.srh is None else proto.IPPROTO_ROUTING,
        "hop_limit": hop_limit, "src": outer_src, "dst": outer_dst,
    }
    return encode(pkt, check=False) if is_frame else pkt


def decapsulate(pkt_or_frame):
    """Remove the outer IPv6 header and SRH; returns the same kind (Packet or bytes)."""
    is_frame = not isinstance(pkt_or_frame, Packet)
    pkt = decode(pkt_or_frame, check_icrc=False, udp_dport=None) if is_frame \
        else pkt_or_frame.copy()
    if pkt.outer is None:
        raise PacketError("packet is not SRv6-encapsulated")
    pkt.outer = pkt.srh = None
    return encode(pkt, check=False) if is_frame else pkt
