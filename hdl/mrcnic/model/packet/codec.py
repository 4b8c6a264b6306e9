"""The packet codec: :class:`Packet`, :func:`encode`, :func:`decode`, :func:`finalize` and the ICRC
(:mod:`mrcnic.model.packet` says how to use them).
"""


import dataclasses
import ipaddress
import struct
import zlib
from dataclasses import dataclass, field

from mrcnic.base import proto
from mrcnic.base.proto import (
    ETH, IPV4, IPV6, SRH, UDP, BTH, METH, TSETH, RETH, IMMDT, AETH, SETH, CC_STATE, NETH, PETH,
    ICRC_LEN, SRH_FIXED_LEN, SRH_SEGMENT_LEN, Opcode)



class PacketError(ValueError):
    """A frame, packet or argument that breaks the MRC wire format."""


# Model defaults for the builders (not decisions of the spec): locally administered MACs,
# unique-local addresses, a RoCEv2-style source port.
DEFAULT_SRC_MAC = 0x02_00_00_00_00_01
DEFAULT_DST_MAC = 0x02_00_00_00_00_02
DEFAULT_SRC_IP = int(ipaddress.IPv6Address("fd00::1"))
DEFAULT_DST_IP = int(ipaddress.IPv6Address("fd00::2"))
DEFAULT_SRC_IP4 = int(ipaddress.IPv4Address("10.0.0.1"))      # UDP mode over IPv4
DEFAULT_DST_IP4 = int(ipaddress.IPv4Address("10.0.0.2"))
DEFAULT_HOP_LIMIT = 64
DEFAULT_UDP_SPORT = 0xC000
DEFAULT_MPR = 8                  # the public MRC example's window: 8 x 128 = 1024 PSNs


# --- Packet --------------------------------------------------------------------------------

# Headers after the BTH, in the one order in which any valid packet carries a subset of them.
_EXT = (("meth", METH), ("tseth", TSETH), ("reth", RETH), ("immdt", IMMDT), ("aeth", AETH),
        ("seth", SETH), ("cc_state", CC_STATE), ("neth", NETH), ("peth", PETH))
_EXT_NAMES = tuple(name for name, _ in _EXT)

_HEADER_OF = {"eth": ETH, "outer": IPV6, "ip": IPV6, "ipv4": IPV4, "udp": UDP, "bth": BTH, **dict(_EXT)}


def _public_fields(header):
    return tuple(f for f in header.fields if not f.startswith("_"))


_FIELDS = {name: _public_fields(h) for name, h in _HEADER_OF.items()}
# The SRH dict replaces proto's single ``segment`` by the list of any length RFC 8754 allows.
_SRH_FIXED_FIELDS = tuple(f for f in _public_fields(SRH) if f != "segment")
_FIELDS["srh"] = _SRH_FIXED_FIELDS + ("segments",)


@dataclass
class Packet:
    """One MRC packet. Attributes in wire order; absent headers are ``None``.

    ``eth``, ``outer`` (SRv6 outer IPv6), ``srh``, ``ip`` (the RoCEv2 IPv6 header), ``ipv4``
    (in its place in UDP mode over IPv4: then ``ip`` is None, and there is no ``outer`` or
    ``srh``), ``udp``, ``bth`` and the extension headers are dicts of field values (ints);
    ``srh`` has ``segments``, a list of 128-bit ints. ``payload`` excludes the pad bytes. ``icrc`` is the
    int whose little-endian bytes end the frame; ``None`` means "compute it when encoding".
    """
    eth: dict = field(default_factory=dict)
    outer: dict | None = None
    srh: dict | None = None
    ip: dict | None = field(default_factory=dict)
    ipv4: dict | None = None
    udp: dict = field(default_factory=dict)
    bth: dict = field(default_factory=dict)
    meth: dict | None = None
    tseth: dict | None = None
    reth: dict | None = None
    immdt: dict | None = None
    aeth: dict | None = None
    seth: dict | None = None
    cc_state: dict | None = None
    neth: dict | None = None
    peth: dict | None = None
    payload: bytes = b""
    icrc: int | None = None

    @property
    def opcode(self):
        """The BTH opcode as an :class:`~mrcnic.base.proto.Opcode` (PacketError if unknown)."""
        return _opcode(self.bth.get("opcode"))

    @property
    def headers(self):
        """Names of the headers present, in wire order."""
        return [f.name for f in dataclasses.fields(self)
                if f.name not in ("payload", "icrc") and getattr(self, f.name) is not None]

    def copy(self):
        """A copy whose dicts (and SRH segment list) can be changed without touching this one."""
        changes = {}
        for name in self.headers:
            d = dict(getattr(self, name))
            if "segments" in d:
                d["segments"] = list(d["segments"])
            changes[name] = d
        return dataclasses.replace(self, **changes)


_OPCODES = {int(op): op for op in Opcode}
_CONTROL_LAYOUT = {
    Opcode.ACK: ("aeth",),
    Opcode.SACK: ("seth", "cc_state"),
    Opcode.NACK: ("neth",),
    Opcode.PROBE: ("peth",),
    Opcode.EP_REQUEST: (),
    Opcode.EP_RESPONSE: (),
}


def _opcode(value):
    try:
        return _OPCODES[value]
    except (KeyError, TypeError):
        shown = f"{value:#04x}" if isinstance(value, int) else repr(value)
        raise PacketError(f"unknown BTH opcode {shown}") from None


def _layout(op, ts):
    """Extension headers ``op`` carries, in wire order; ``ts`` = BTH ts bit (writes only)."""
    if op.is_write:
        return ("meth",) + (("tseth",) if ts else ()) + ("reth",) + \
               (("immdt",) if op.has_immdt else ())
    return _CONTROL_LAYOUT[op]


def _carries_payload(op):
    return op.is_write or op in (Opcode.EP_REQUEST, Opcode.EP_RESPONSE)


# --- ICRC ----------------------------------------------------------------------------------

def _ones(header, *fields):
    return header.pack(**{f: (1 << header.width(f)) - 1 for f in fields})


# The ICRC replaces fields by ones: OR-ing with this mask over the first 60 bytes of the inner
# packet (IPv6 | UDP | BTH) does exactly that, with the positions taken from proto.
_ICRC_MASK_BYTES = (_ones(IPV6, "dscp", "ecn", "flow_label", "hop_limit")
                    + _ones(UDP, "checksum")
                    + _ones(BTH, "fecn", "becn", "_rsvd4"))
# Over IPv4 (RoCEv2 Annex A17): the type of service (DSCP and ECN), the TTL and the header
# checksum are the IPv4 header's fields replaced by ones.
_ICRC_MASK4_BYTES = (_ones(IPV4, "dscp", "ecn", "ttl", "checksum")
                     + _ones(UDP, "checksum")
                     + _ones(BTH, "fecn", "becn", "_rsvd4"))
_ICRC_SEED = zlib.crc32(b"\xff" * 8)      # the 8 bytes standing in for the IB LRH


def icrc(inner, *, ipv4=False):
    """RoCEv2 ICRC of ``inner``: the inner IPv6 header (with ``ipv4``, in UDP mode, the IPv4
    header) through the last byte before the ICRC.

    The frame carries ``struct.pack('<I', icrc(inner))``. Outer IPv6 and SRH are never part of
    ``inner`` (spec 2.1 decision).
    """
    mask, name = (_ICRC_MASK4_BYTES, "IPv4") if ipv4 else (_ICRC_MASK_BYTES, "IPv6")
    if len(inner) < len(mask):
        raise PacketError(f"ICRC input of {len(inner)} bytes is shorter than {name}+UDP+BTH "
                          f"({len(mask)} bytes)")
    n = len(mask)
    head = (int.from_bytes(inner[:n], "big") | int.from_bytes(mask, "big")).to_bytes(n, "big")
    return zlib.crc32(inner[n:], zlib.crc32(head, _ICRC_SEED))


# --- Encoding ------------------------------------------------------------------------------

def _pack(name, values):
    header = _HEADER_OF[name]
    try:
        return header.pack(**values)
    except (ValueError, TypeError) as e:     # out-of-range or unknown field, from proto
        raise PacketError(f"{name}: {e}") from None


def _pack_srh(srh):
    segments = srh.get("segments", [])
    fixed = {k: v for k, v in srh.items() if k != "segments"}
    try:
        # proto's SRH declares the fixed part followed by one segment; keep the fixed part.
        out = [SRH.pack(**fixed, segment=0)[:SRH_FIXED_LEN]]
        for s in segments:
            out.append(int(s).to_bytes(SRH_SEGMENT_LEN, "big"))
    except (ValueError, TypeError, OverflowError) as e:
        raise PacketError(f"srh: {e}") from None
    return b"".join(out)


def _inner_bytes(pkt):
    """Inner IPv6 (or IPv4) header through the pad bytes: exactly what the ICRC covers."""
    ip = _pack("ip", pkt.ip) if pkt.ipv4 is None else _pack("ipv4", pkt.ipv4)
    parts = [ip, _pack("udp", pkt.udp), _pack("bth", pkt.bth)]
    for name in _EXT_NAMES:
        values = getattr(pkt, name)
        if values is not None:
            parts.append(_pack(name, values))
    parts.append(bytes(pkt.payload))
    parts.append(bytes(pkt.bth.get("pad", 0)))
    return b"".join(parts)


def encode(pkt, *, check=True):
    """Frame (no FCS, ICRC included) with every field of ``pkt`` written as stored.

    A ``None`` ICRC is computed. With ``check`` (default) the frame is decoded again and must
    give back ``pkt``: a stale length, pad, ICRC or a header the opcode does not carry raises
    :class:`PacketError` naming the first disagreeing field (:func:`finalize` fixes those).
    ``check=False`` writes malformed frames on purpose, e.g. for negative gateware tests.
    """
    parts = [_pack("eth", pkt.eth)]
    if pkt.outer is not None:
        parts.append(_pack("outer", pkt.outer))
    if pkt.srh is not None:
        parts.append(_pack_srh(pkt.srh))
    inner = _inner_bytes(pkt)
    crc = icrc(inner, ipv4=pkt.ipv4 is not None) if pkt.icrc is None else pkt.icrc
    try:
        parts += [inner, struct.pack("<I", crc)]
    except struct.error as e:
        raise PacketError(f"icrc {crc!r}: {e}") from None
    frame = b"".join(parts)
    if check:
        want = pkt if pkt.icrc is not None else dataclasses.replace(pkt, icrc=crc)
        got = decode(frame, udp_dport=None)
        if got != want:
            raise PacketError(f"packet is not self-consistent ({_difference(want, got)}); "
                              f"finalize() it")
    return frame


def _short(value):
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return repr(value)


def _difference(want, got):
    for f in dataclasses.fields(Packet):
        a, b = getattr(want, f.name), getattr(got, f.name)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for key in dict.fromkeys([*a, *b]):
                if a.get(key, "nothing") != b.get(key, "nothing"):
                    return (f"{f.name}.{key}: packet has {_short(a.get(key, 'nothing'))}, "
                            f"frame decodes to {_short(b.get(key, 'nothing'))}")
        return f"{f.name}: packet has {_short(a)}, frame decodes to {_short(b)}"
    return "no difference"


# --- finalize ------------------------------------------------------------------------------

# Values a field takes when a dict given to finalize() leaves it out (others default to 0).
_DEFAULTS = {
    "eth": {"dst": DEFAULT_DST_MAC, "src": DEFAULT_SRC_MAC},
    "outer": {"hop_limit": DEFAULT_HOP_LIMIT},
    "ip": {"hop_limit": DEFAULT_HOP_LIMIT, "src": DEFAULT_SRC_IP, "dst": DEFAULT_DST_IP},
    "ipv4": {"ttl": DEFAULT_HOP_LIMIT, "flags": proto.IPV4_FLAGS_DF, "src": DEFAULT_SRC_IP4,
             "dst": DEFAULT_DST_IP4},
    "udp": {"src_port": DEFAULT_UDP_SPORT, "dst_port": proto.UDP_DPORT_DEFAULT},
    "bth": {"pkey": proto.PKEY_DEFAULT, "tver": proto.BTH_TVER},
    "tseth": {"type": proto.TSETH_TYPE},
}


def _normalized(name, values):
    if values is None:
        return None
    unknown = [k for k in values if k not in _FIELDS[name]]
    if unknown:
        raise PacketError(f"{name} has no field {unknown[0]!r}")
    defaults = _DEFAULTS.get(name, {})
    return {f: values.get(f, defaults.get(f, 0)) for f in _FIELDS[name]}


def finalize(pkt):
    """A copy of ``pkt`` with every dict complete and every derived field computed.

    Missing fields get defaults (addresses, hop limit or TTL 64, IPv4 Don't Fragment, P_Key
    0xFFFF, UDP ports, TSETH type 1, else 0). Derived: ethertype, versions, next headers, IPv6
    payload lengths, IPv4 IHL, protocol, total length and header checksum, UDP length, BTH
    pad and (on writes) ts bit, SRH hdr_ext_len / routing_type / last_entry (segments_left
    defaults to the segment count), and the ICRC. Raises :class:`PacketError` if the opcode
    is unknown, the headers present are not the opcode's, a value does not fit its field,
    or the packet has both or neither of ``ip`` and ``ipv4``, or ``ipv4`` with an outer
    header.
    """
    p = pkt.copy()
    for name in ("eth", "outer", "ip", "ipv4", "udp", "bth", *_EXT_NAMES):
        setattr(p, name, _normalized(name, getattr(p, name)))
    if (p.ip is None) == (p.ipv4 is None):
        raise PacketError("a packet has one RoCEv2 IP header: ip (IPv6) or ipv4, not "
                          + ("both" if p.ip is not None else "neither"))
    if p.ipv4 is not None and (p.outer is not None or p.srh is not None):
        raise PacketError("IPv4 is UDP mode only: no outer IPv6 header or SRH")
    p.payload = bytes(p.payload)

    op = _opcode(p.bth["opcode"])
    present = tuple(n for n in _EXT_NAMES if getattr(p, n) is not None)
    want = _layout(op, p.tseth is not None)
    if present != want:
        raise PacketError(f"{op.name} carries {', '.join(want) or 'no extension header'}, "
                          f"not {', '.join(present) or 'none'}")
    if p.payload and not _carries_payload(op):
        raise PacketError(f"{op.name} carries no payload, got {len(p.payload)} bytes")
    if op.is_write:
        p.bth["ts"] = int(p.tseth is not None)
    p.bth["pad"] = -len(p.payload) % 4

    udp_length = (UDP.size + BTH.size + sum(_HEADER_OF[n].size for n in present)
                  + len(p.payload) + p.bth["pad"] + ICRC_LEN)
    p.udp["length"] = udp_length
    if p.ipv4 is not None:
        p.eth["ethertype"] = proto.ETHERTYPE_IPV4
        p.ipv4.update(version=proto.IPV4_VERSION, ihl=proto.IPV4_IHL,
                      protocol=proto.IPPROTO_UDP, total_length=IPV4.size + udp_length,
                      checksum=0)
        p.ipv4["checksum"] = proto.ipv4_checksum(_pack("ipv4", p.ipv4))
    else:
        p.eth["ethertype"] = proto.ETHERTYPE_IPV6
        p.ip.update(version=proto.IPV6_VERSION, next_header=proto.IPPROTO_UDP,
                    payload_length=udp_length)

    if p.srh is not None:
        if p.outer is None:
            raise PacketError("an SRH needs an outer IPv6 header")
        unknown = [k for k in p.srh if k not in _FIELDS["srh"]]
        if unknown:
            raise PacketError(f"srh has no field {unknown[0]!r}")
        segments = [int(s) for s in p.srh.get("segments", [])]
        srh = {f: p.srh.get(f, 0) for f in _SRH_FIXED_FIELDS}
        srh.update(next_header=proto.IPPROTO_IPV6, hdr_ext_len=2 * len(segments),
                   routing_type=proto.SRH_ROUTING_TYPE, last_entry=max(len(segments) - 1, 0),
                   segments_left=p.srh.get("segments_left", len(segments)), segments=segments)
        p.srh = srh
    if p.outer is not None:
        srh_len = 0 if p.srh is None else SRH_FIXED_LEN + SRH_SEGMENT_LEN * len(p.srh["segments"])
        p.outer.update(version=proto.IPV6_VERSION,
                       next_header=proto.IPPROTO_IPV6 if p.srh is None
                       else proto.IPPROTO_ROUTING,
                       payload_length=srh_len + IPV6.size + udp_length)
    p.icrc = icrc(_inner_bytes(p), ipv4=p.ipv4 is not None)
    return p


# --- Decoding ------------------------------------------------------------------------------

_RESERVED = {h: tuple(f for f in h.fields if f.startswith("_")) for h in _HEADER_OF.values()}


class _Reader:
    """Walks a frame header by header; every read is bounds-checked against ``end``."""

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def need(self, size, what):
        if self.pos + size > self.end:
            raise PacketError(f"truncated {what}: needs {size} bytes at offset {self.pos}, "
                              f"{max(self.end - self.pos, 0)} left")

    def header(self, name, what):
        header = _HEADER_OF[name]
        self.need(header.size, what)
        values = header.unpack(self.buf[self.pos:self.pos + header.size], reserved=True)
        for r in _RESERVED[header]:
            if values.pop(r):
                raise PacketError(f"{what} reserved bits {r} are not zero")
        self.pos += header.size
        return values

    def ipv6(self, name, what):
        ip = self.header(name, what)
        if ip["version"] != proto.IPV6_VERSION:
            raise PacketError(f"{what} version {ip['version']} is not {proto.IPV6_VERSION}")
        left = self.end - self.pos
        if ip["payload_length"] != left:
            raise PacketError(f"{what} payload_length {ip['payload_length']} disagrees with "
                              f"the {left} bytes after its header")
        return ip

    def ipv4(self):
        start = self.pos
        ip = self.header("ipv4", "IPv4 header")
        if ip["version"] != proto.IPV4_VERSION:
            raise PacketError(f"IPv4 header version {ip['version']} is not "
                              f"{proto.IPV4_VERSION}")
        if ip["ihl"] != proto.IPV4_IHL:
            raise PacketError(f"IPv4 IHL {ip['ihl']}: options are not supported (IHL "
                              f"{proto.IPV4_IHL})")
        if proto.ipv4_checksum(self.buf[start:self.pos]):
            raise PacketError(f"bad IPv4 header checksum {ip['checksum']:#06x}")
        if ip["flags"] & 0b001 or ip["fragment_offset"]:
            raise PacketError("a fragment of an IPv4 packet (MF set or a fragment offset)")
        if ip["flags"] & 0b100:
            raise PacketError("IPv4 reserved flag bit is not zero")
        left = self.end - self.pos
        if ip["total_length"] != IPV4.size + left:
            raise PacketError(f"IPv4 total_length {ip['total_length']} disagrees with the "
                              f"{IPV4.size + left} bytes from its header on")
        if ip["protocol"] != proto.IPPROTO_UDP:
            raise PacketError(f"IPv4 protocol {ip['protocol']} is not UDP "
                              f"({proto.IPPROTO_UDP})")
        return ip

    def srh(self):
        self.need(SRH_FIXED_LEN, "SRH")
        # proto's SRH is the fixed part plus one segment: unpack the fixed part alone.
        srh = SRH.unpack(self.buf[self.pos:self.pos + SRH_FIXED_LEN].ljust(SRH.size, b"\0"))
        del srh["segment"]
        self.pos += SRH_FIXED_LEN
        if srh["routing_type"] != proto.SRH_ROUTING_TYPE:
            raise PacketError(f"SRH routing type {srh['routing_type']} is not "
                              f"{proto.SRH_ROUTING_TYPE}")
        if srh["hdr_ext_len"] % 2:
            raise PacketError(f"SRH hdr_ext_len {srh['hdr_ext_len']} is odd: "
                              f"SRH TLVs are not supported")
        n = srh["hdr_ext_len"] // 2
        if srh["last_entry"] != max(n - 1, 0):
            raise PacketError(f"SRH last_entry {srh['last_entry']} disagrees with its "
                              f"{n} segments")
        if srh["segments_left"] > n:
            raise PacketError(f"SRH segments_left {srh['segments_left']} exceeds its "
                              f"{n} segments")
        self.need(n * SRH_SEGMENT_LEN, "SRH segment list")
        srh["segments"] = [int.from_bytes(self.buf[p:p + SRH_SEGMENT_LEN], "big")
                           for p in range(self.pos, self.pos + n * SRH_SEGMENT_LEN,
                                          SRH_SEGMENT_LEN)]
        self.pos += n * SRH_SEGMENT_LEN
        if srh["next_header"] != proto.IPPROTO_IPV6:
            raise PacketError(f"SRH next header {srh['next_header']} is not IPv6 "
                              f"({proto.IPPROTO_IPV6})")
        return srh


def _ipv6_headers(r, pkt):
    """The IPv6 headers of a frame (the RoCEv2 one, behind an outer header and SRH in the
    SRv6 modes) into ``pkt``; returns where the ICRC's input starts (the inner header)."""
    first = r.ipv6("ip", "IPv6 header")
    nh = first["next_header"]
    if nh == proto.IPPROTO_UDP:
        pkt.ip = first
    elif nh in (proto.IPPROTO_IPV6, proto.IPPROTO_ROUTING):
        pkt.outer = first
        if nh == proto.IPPROTO_ROUTING:
            pkt.srh = r.srh()
        pkt.ip = r.ipv6("ip", "inner IPv6 header")
        if pkt.ip["next_header"] != proto.IPPROTO_UDP:
            raise PacketError(f"inner IPv6 next header {pkt.ip['next_header']} is not UDP "
                              f"({proto.IPPROTO_UDP})")
    else:
        raise PacketError(f"IPv6 next header {nh} is not UDP ({proto.IPPROTO_UDP}), IPv6 "
                          f"({proto.IPPROTO_IPV6}) or Routing ({proto.IPPROTO_ROUTING})")
    return r.pos - IPV6.size


def decode(frame, *, check_icrc=True, udp_dport=proto.UDP_DPORT_DEFAULT):
    """The :class:`Packet` of ``frame`` (bytes-like, no FCS, ICRC at the end).

    ``udp_dport`` is the RoCEv2 port register (``None`` accepts any port). Raises
    :class:`PacketError`, and only that, for any bytes that are not a valid MRC frame; with
    ``check_icrc=False`` a wrong ICRC is kept in ``icrc`` instead. A non-bytes argument is a
    ``TypeError``.
    """
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise TypeError(f"decode takes a bytes-like frame, not {type(frame).__name__}")
    buf = bytes(frame)
    r = _Reader(buf)
    eth = r.header("eth", "Ethernet header")
    if eth["ethertype"] not in (proto.ETHERTYPE_IPV6, proto.ETHERTYPE_IPV4):
        raise PacketError(f"ethertype {eth['ethertype']:#06x} is not IPv6 "
                          f"({proto.ETHERTYPE_IPV6:#06x}) or IPv4 "
                          f"({proto.ETHERTYPE_IPV4:#06x})")
    pkt = Packet(eth=eth)

    if eth["ethertype"] == proto.ETHERTYPE_IPV4:
        pkt.ip, pkt.ipv4 = None, r.ipv4()
        inner_start = r.pos - IPV4.size
        udp_length = pkt.ipv4["total_length"] - IPV4.size
        ip_length = f"IPv4 total_length {pkt.ipv4['total_length']} less its header"
    else:
        inner_start = _ipv6_headers(r, pkt)
        udp_length = pkt.ip["payload_length"]
        ip_length = f"IPv6 payload_length {udp_length}"

    pkt.udp = r.header("udp", "UDP header")
    if pkt.udp["length"] != udp_length:
        raise PacketError(f"UDP length {pkt.udp['length']} disagrees with {ip_length}")
    if udp_dport is not None and pkt.udp["dst_port"] != udp_dport:
        raise PacketError(f"UDP destination port {pkt.udp['dst_port']} is not {udp_dport}")

    # From here on the last ICRC_LEN bytes are off limits: they are the ICRC.
    r.end = len(buf) - ICRC_LEN
    bth = pkt.bth = r.header("bth", "BTH")
    op = _opcode(bth["opcode"])
    if bth["tver"] != proto.BTH_TVER:
        raise PacketError(f"BTH tver {bth['tver']} is not {proto.BTH_TVER}")
    if op in (Opcode.EP_REQUEST, Opcode.EP_RESPONSE) and bth["dest_qp"] != proto.ENDPOINT_QP:
        raise PacketError(f"{op.name} to QP {bth['dest_qp']:#x}, not the endpoint QP "
                          f"{proto.ENDPOINT_QP:#x}")
    for name in _layout(op, bth["ts"]):
        setattr(pkt, name, r.header(name, _HEADER_OF[name].name))
    if pkt.tseth is not None and pkt.tseth["type"] != proto.TSETH_TYPE:
        raise PacketError(f"TSETH type {pkt.tseth['type']} is not {proto.TSETH_TYPE}")

    rest = buf[r.pos:r.end]
    pad = bth["pad"]
    if not _carries_payload(op):
        if rest:
            raise PacketError(f"{op.name} has {len(rest)} bytes after its headers, "
                              f"expected none")
        if pad:
            raise PacketError(f"BTH pad count {pad} on {op.name}, which has no payload")
    else:
        if len(rest) % 4:
            raise PacketError(f"payload and pad take {len(rest)} bytes, not a multiple of 4")
        if pad > len(rest):
            raise PacketError(f"BTH pad count {pad} exceeds the {len(rest)} bytes after "
                              f"the headers")
        if any(rest[len(rest) - pad:]):
            raise PacketError(f"pad bytes {rest[len(rest) - pad:].hex()} are not zero")
        pkt.payload = rest[:len(rest) - pad]

    pkt.icrc = int.from_bytes(buf[r.end:], "little")
    if check_icrc:
        want = icrc(buf[inner_start:r.end], ipv4=pkt.ipv4 is not None)
        if pkt.icrc != want:
            raise PacketError(f"bad ICRC: frame carries {pkt.icrc:#010x}, "
                              f"computed {want:#010x}")
    return pkt


