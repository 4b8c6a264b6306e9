"""Packet builders (data, ACK, SACK, NACK, probe, endpoint and port status packets), the SACK
helpers and random packets (:mod:`mrcnic.model.packet` says how to use them).
"""


import ipaddress

from mrcnic.base import proto
from mrcnic.base.proto import SETH, NackCode, Opcode, SackMode
from mrcnic.model.packet.codec import (
    DEFAULT_DST_IP, DEFAULT_DST_IP4, DEFAULT_DST_MAC, DEFAULT_HOP_LIMIT, DEFAULT_MPR,
    DEFAULT_SRC_IP, DEFAULT_SRC_IP4, DEFAULT_SRC_MAC, DEFAULT_UDP_SPORT, Packet, PacketError, _FIELDS, _HEADER_OF,
    _carries_payload, _layout, _opcode, finalize)



# --- Builders ------------------------------------------------------------------------------

def _mac(value):
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 6 or not all(len(p) == 2 for p in parts):
            raise PacketError(f"bad MAC address {value!r}")
        try:
            return int("".join(parts), 16)
        except ValueError:
            raise PacketError(f"bad MAC address {value!r}") from None
    return int(value)


def _address(value, kind, name):
    """``value`` (an int, a string or an ``ipaddress`` ``kind``) as an int."""
    if isinstance(value, (str, kind)):
        try:
            return int(kind(value))
        except ValueError:
            raise PacketError(f"bad {name} address {value!r}") from None
    return int(value)


def _ip6(value):
    return _address(value, ipaddress.IPv6Address, "IPv6")


def _ip4(value):
    return _address(value, ipaddress.IPv4Address, "IPv4")


def _s16(value, what):
    """Two's-complement 16-bit field value of a signed offset."""
    if not -0x8000 <= value <= 0x7FFF:
        raise PacketError(f"{what} {value} does not fit a signed 16-bit field")
    return value & 0xFFFF


def _signed16(value):
    return value - 0x10000 if value & 0x8000 else value


def stev_split(ev, swap=False):
    """``(udp_src_port, flow_label)`` carrying the 32-bit STEV ``ev`` (spec 2.3 decision; the
    halves swapped with ``swap``)."""
    try:
        return proto.stev_split(ev, swap)
    except ValueError as e:
        raise PacketError(str(e)) from None


def stev_ev(pkt, swap=False):
    """The 32-bit STEV a packet carries in its (inner) flow label and UDP source port (the
    halves swapped with ``swap``). Over IPv4 there is no flow label: that half reads 0."""
    flow = 0 if pkt.ipv4 is not None else pkt.ip["flow_label"]
    return proto.stev_join(pkt.udp["src_port"], flow, swap)


def srv6_ev_index(pkt):
    """The EV index an SRv6-mode packet carries (:func:`~mrcnic.base.proto.srv6_entropy`)."""
    return proto.srv6_ev_index(stev_ev(pkt))


def _base(opcode, qp, psn, *, src_mac=DEFAULT_SRC_MAC, dst_mac=DEFAULT_DST_MAC,
          src_ip=None, dst_ip=None, ev=None, udp_sport=None,
          flow_label=None, dscp=0, ecn=0, hop_limit=DEFAULT_HOP_LIMIT,
          udp_dport=proto.UDP_DPORT_DEFAULT, pkey=proto.PKEY_DEFAULT, se=0, migreq=0,
          fecn=0, becn=0, ack_req=0, rtx=0, ipv4=False, identification=0):
    """The Ethernet, IP, UDP and BTH headers every builder shares (keyword arguments of
    every builder: the list above). ``ipv4``: UDP mode over IPv4 (``src_ip``/``dst_ip``
    then IPv4 addresses, default 10.0.0.1 and 10.0.0.2; ``hop_limit`` the TTL; no flow
    label, so an ``ev`` must fit the UDP source port)."""
    if ev is not None:
        if udp_sport is not None or flow_label is not None:
            raise PacketError("give either ev or udp_sport/flow_label, not both")
        udp_sport, flow_label = stev_split(ev)
        if ipv4 and flow_label:
            raise PacketError(f"ev {ev:#x}: over IPv4 the EV is the UDP source port alone "
                              f"(16 bits)")
    if ipv4:
        if flow_label:
            raise PacketError("IPv4 has no flow label")
        ip = {"ip": None, "ipv4": {
            "dscp": dscp, "ecn": ecn, "ttl": hop_limit, "identification": identification,
            "src": _ip4(DEFAULT_SRC_IP4 if src_ip is None else src_ip),
            "dst": _ip4(DEFAULT_DST_IP4 if dst_ip is None else dst_ip)}}
    else:
        ip = {"ip": {"dscp": dscp, "ecn": ecn,
                     "flow_label": 0 if flow_label is None else flow_label,
                     "hop_limit": hop_limit,
                     "src": _ip6(DEFAULT_SRC_IP if src_ip is None else src_ip),
                     "dst": _ip6(DEFAULT_DST_IP if dst_ip is None else dst_ip)}}
    return Packet(
        eth={"dst": _mac(dst_mac), "src": _mac(src_mac)},
        **ip,
        udp={"src_port": DEFAULT_UDP_SPORT if udp_sport is None else udp_sport,
             "dst_port": udp_dport, "checksum": 0},
        bth={"opcode": int(opcode), "se": se, "m": migreq, "pkey": pkey, "fecn": fecn,
             "becn": becn, "dest_qp": qp, "ack_req": ack_req, "rtx": rtx, "psn": psn},
    )


def write_packet(opcode, qp, psn, va, rkey, dma_length, payload=b"", *, imm=None, ts=None,
                 tsr=0, rqmsn=0, msn=0, **net):
    """A WRITE_* packet: BTH | METH | [TSETH if ``ts`` is not None] | RETH | [ImmDt] | payload.

    ``imm`` is required on WRITE_LAST_IMM / WRITE_ONLY_IMM and refused elsewhere; ``ts`` is the
    16-bit TSETH timestamp (128 ns units). ``net``: ``src_mac``, ``dst_mac``, ``src_ip``,
    ``dst_ip`` (int or text), ``ev`` (32-bit STEV) or ``udp_sport``/``flow_label``, ``dscp``,
    ``ecn``, ``hop_limit``, ``udp_dport``, ``pkey``, ``se``, ``migreq``, ``fecn``, ``becn``,
    ``ack_req``, ``rtx``.
    """
    op = _opcode(int(opcode))
    if not op.is_write:
        raise PacketError(f"{op.name} is not a WRITE opcode")
    if op.has_immdt != (imm is not None):
        raise PacketError(f"{op.name} " + ("needs imm" if op.has_immdt else "takes no imm"))
    pkt = _base(op, qp, psn, **net)
    pkt.meth = {"rqmsn": rqmsn, "msn": msn}
    if ts is not None:
        pkt.tseth = {"timestamp": ts, "tsr": tsr, "type": proto.TSETH_TYPE}
    pkt.reth = {"va": va, "rkey": rkey, "dma_length": dma_length}
    if imm is not None:
        pkt.immdt = {"imm": imm}
    pkt.payload = bytes(payload)
    return finalize(pkt)


def ack_packet(qp, psn, msn=0, *, syndrome=0, **net):
    """An ACK (0xD1): BTH | AETH. ``net`` as for :func:`write_packet`."""
    pkt = _base(Opcode.ACK, qp, psn, **net)
    pkt.aeth = {"syndrome": syndrome, "msn": msn}
    return finalize(pkt)


def sack_packet(qp, cack_psn, bitmap=0, *, sack_offset=1, ack_psn_offset=0,
                m=SackMode.NONE, pr=0, entropy=0, src_id=0, dst_id=0, cc_type=0, flags=0,
                mpr=DEFAULT_MPR, cc_timestamp=0, ooo_count=0, restore_cwnd=0, rcv_cwnd_pen=0,
                rcvd_bytes=0, psn=0, **net):
    """A SACK (0xDC): BTH | SETH | CC_STATE.

    ``sack_offset`` and ``ack_psn_offset`` are signed (SACK_BASE = CACK + sack_offset);
    bit i of ``bitmap`` reports PSN SACK_BASE + i (see :func:`sack_bitmap`). ``psn`` is the
    BTH PSN, which the spec gives no meaning on a SACK. ``net`` as for :func:`write_packet`.
    """
    pkt = _base(Opcode.SACK, qp, psn, **net)
    pkt.seth = {"m": int(m), "pr": pr, "ack_psn_offset": _s16(ack_psn_offset, "ack_psn_offset"),
                "entropy": entropy, "src_id": src_id, "dst_id": dst_id, "cack_psn": cack_psn,
                "cc_type": cc_type, "flags": flags, "mpr": mpr,
                "sack_offset": _s16(sack_offset, "sack_offset"), "bitmap": bitmap}
    pkt.cc_state = {"timestamp": cc_timestamp, "ooo_count": ooo_count,
                    "restore_cwnd": restore_cwnd, "rcv_cwnd_pen": rcv_cwnd_pen,
                    "rcvd_bytes": rcvd_bytes}
    return finalize(pkt)


def nack_packet(qp, nack_psn, reason=NackCode.TRIMMED, *, vendor=0, entropy=0, src_id=0,
                dst_id=0, cc_type=0, flags=0, timestamp=0, psn=0, **net):
    """A NACK (0xDD): BTH | NETH. ``net`` as for :func:`write_packet`."""
    pkt = _base(Opcode.NACK, qp, psn, **net)
    pkt.neth = {"reason": int(reason), "vendor": vendor, "entropy": entropy, "src_id": src_id,
                "dst_id": dst_id, "nack_psn": nack_psn, "cc_type": cc_type, "flags": flags,
                "timestamp": timestamp}
    return finalize(pkt)


def probe_packet(qp, probe_id, *, src_id=0, dst_id=0, timestamp=0, psn=0, **net):
    """A probe (0xDE): BTH | PETH. ``net`` as for :func:`write_packet`."""
    pkt = _base(Opcode.PROBE, qp, psn, **net)
    pkt.peth = {"probe_id": probe_id, "src_id": src_id, "dst_id": dst_id,
                "timestamp": timestamp, "type": proto.TSETH_TYPE}
    return finalize(pkt)


def endpoint_packet(opcode, body=b"", *, psn=0, **net):
    """An endpoint request (0xD8) or response (0xD9) to QP ``ENDPOINT_QP``: BTH | body."""
    op = _opcode(int(opcode))
    if op not in (Opcode.EP_REQUEST, Opcode.EP_RESPONSE):
        raise PacketError(f"{op.name} is not an endpoint opcode")
    pkt = _base(op, proto.ENDPOINT_QP, psn, **net)
    pkt.payload = bytes(body)
    return finalize(pkt)


def port_status_packet(ports, *, src_id=0, dst_id=0, timestamp=0, psn=0, **net):
    """A port status update (spec §4 "Ports"): an endpoint request whose body is an
    :data:`~mrcnic.base.proto.ERTH` with op EP_PORT_STATUS, the sender's port mask ``ports``
    (bit p = port p up), for the receiver's QP ``dst_id``, and ``timestamp``. ``net`` as for
    :func:`write_packet`."""
    body = proto.ERTH.pack(op=proto.EP_PORT_STATUS, ports=ports, src_id=src_id,
                           dst_id=dst_id, timestamp=timestamp, type=proto.TSETH_TYPE)
    return endpoint_packet(Opcode.EP_REQUEST, body, psn=psn, **net)


def ev_probe_packet(timestamp, *, src_id=0, dst_id=0, psn=0, **net):
    """An EV probe request: an endpoint request whose :data:`~mrcnic.base.proto.ERTH` has op
    EP_EV_PROBE and the sender's ``timestamp`` (TSETH units), sent on the EV under test
    (``ev`` in ``net``, as for :func:`write_packet`); the ids as in a port status update."""
    body = proto.ERTH.pack(op=proto.EP_EV_PROBE, src_id=src_id, dst_id=dst_id,
                           timestamp=timestamp, type=proto.TSETH_TYPE)
    return endpoint_packet(Opcode.EP_REQUEST, body, psn=psn, **net)


def ev_probe_response_packet(request, *, psn=None, **net):
    """The answer to the EV probe request ``request`` (a decoded packet): an endpoint response
    whose :data:`~mrcnic.base.proto.EETH` has op EP_EV_PROBE, echoes the request's
    timestamp and carries its QP ids swapped (src_id the request's dst_id, dst_id its
    src_id), with the request's BTH PSN unless ``psn`` says otherwise, on the request's
    entropy (its UDP source port and flow label) and IP version unless ``net`` says
    otherwise."""
    erth = endpoint_request(request)
    if erth is None or erth["op"] != proto.EP_EV_PROBE:
        raise PacketError("not an EV probe request")
    body = proto.EETH.pack(op=proto.EP_EV_PROBE, src_id=erth["dst_id"], dst_id=erth["src_id"],
                           timestamp=erth["timestamp"])
    net.setdefault("ipv4", request.ipv4 is not None)
    if "ev" not in net and "udp_sport" not in net and "flow_label" not in net:
        net["udp_sport"] = request.udp["src_port"]
        if request.ipv4 is None and not net.get("ipv4"):
            net["flow_label"] = request.ip["flow_label"]
    return endpoint_packet(Opcode.EP_RESPONSE, body,
                           psn=request.bth["psn"] if psn is None else psn, **net)


def endpoint_request(pkt):
    """The :data:`~mrcnic.base.proto.ERTH` fields of a decoded endpoint request (any op),
    else None."""
    if pkt.bth["opcode"] != Opcode.EP_REQUEST or len(pkt.payload) != proto.ERTH.size:
        return None
    return proto.ERTH.unpack(pkt.payload)


def endpoint_response(pkt):
    """The :data:`~mrcnic.base.proto.EETH` fields of a decoded endpoint response (any op),
    else None."""
    if pkt.bth["opcode"] != Opcode.EP_RESPONSE or len(pkt.payload) != proto.EETH.size:
        return None
    return proto.EETH.unpack(pkt.payload)


def port_status(pkt):
    """The :data:`~mrcnic.base.proto.ERTH` fields of a decoded packet that is a port status
    update, else None."""
    erth = endpoint_request(pkt)
    return erth if erth is not None and erth["op"] == proto.EP_PORT_STATUS else None


# --- SACK helpers --------------------------------------------------------------------------

_BITMAP_BITS = SETH.width("bitmap")


def sack_base(seth):
    """SACK_BASE = CACK + sack_offset (signed), modulo 2^24."""
    return proto.psn_add(seth["cack_psn"], _signed16(seth["sack_offset"]))


def ack_psn(seth):
    """The PSN that triggered the SACK: CACK + ack_psn_offset (signed), modulo 2^24."""
    return proto.psn_add(seth["cack_psn"], _signed16(seth["ack_psn_offset"]))


def sack_bitmap(base, received):
    """SETH bitmap: bit i set iff PSN base + i (mod 2^24) is in ``received``."""
    received = set(received)
    return sum(1 << i for i in range(_BITMAP_BITS) if proto.psn_add(base, i) in received)


def sack_psns(seth):
    """PSNs the bitmap of ``seth`` reports as arrived, in bit order."""
    base = sack_base(seth)
    return [proto.psn_add(base, i) for i in range(_BITMAP_BITS) if seth["bitmap"] >> i & 1]


# --- Random packets ------------------------------------------------------------------------

def _random_fields(rng, name):
    header = _HEADER_OF[name]
    return {f: rng.getrandbits(header.width(f)) for f in _FIELDS[name]}


def rng_packet(rng, *, opcode=None, encap=None, max_payload=300,
               udp_dport=proto.UDP_DPORT_DEFAULT):
    """A random valid, finalized packet; every field not fixed by the format is random.

    ``opcode``: one opcode, or ``None`` for a random one. ``encap``: ``"none"``, ``"outer"``
    (IPv6-in-IPv6), ``"srh"`` (outer + SRH; one segment, sometimes 0, 2 or 3), ``"ipv4"``
    (UDP mode over IPv4: no outer header, Don't Fragment set or not) or ``None`` for a random
    choice among the IPv6 ones. Payloads (writes, endpoint) are 0..``max_payload`` bytes, every
    length modulo 4 equally likely.
    """
    op = _opcode(int(opcode)) if opcode is not None else rng.choice(list(Opcode))
    pkt = Packet(eth=_random_fields(rng, "eth"), ip=_random_fields(rng, "ip"),
                 udp=_random_fields(rng, "udp"), bth=_random_fields(rng, "bth"))
    pkt.udp["dst_port"] = udp_dport
    pkt.bth.update(opcode=int(op), tver=proto.BTH_TVER)
    if op in (Opcode.EP_REQUEST, Opcode.EP_RESPONSE):
        pkt.bth["dest_qp"] = proto.ENDPOINT_QP
    for name in _layout(op, rng.getrandbits(1)):
        setattr(pkt, name, _random_fields(rng, name))
    if pkt.tseth is not None:
        pkt.tseth["type"] = proto.TSETH_TYPE
    if _carries_payload(op):
        # Small payloads are where pad and truncation bugs live: favour them.
        n = rng.randrange(min(max_payload, 16) + 1) if rng.getrandbits(1) \
            else rng.randrange(max_payload + 1)
        pkt.payload = rng.randbytes(n)

    encap = encap or rng.choice(("none", "outer", "srh"))
    if encap == "ipv4":
        pkt.ip = None
        pkt.ipv4 = _random_fields(rng, "ipv4")
        pkt.ipv4.update(flags=rng.choice((0, proto.IPV4_FLAGS_DF)), fragment_offset=0)
    elif encap != "none":
        pkt.outer = _random_fields(rng, "outer")
    if encap == "srh":
        n = rng.choice((1, 1, 1, 1, 0, 2, 3))
        pkt.srh = {"segments_left": rng.randrange(n + 1), "flags": rng.getrandbits(8),
                   "tag": rng.getrandbits(16),
                   "segments": [rng.getrandbits(128) for _ in range(n)]}
    elif encap not in ("none", "outer", "ipv4"):
        raise PacketError(f"encap {encap!r} is not 'none', 'outer', 'srh' or 'ipv4'")
    return finalize(pkt)


