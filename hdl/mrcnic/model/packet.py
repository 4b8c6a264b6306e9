"""Bit-exact codec for MRC packets: the golden model of every frame the datapath sees.

A :class:`Packet` holds one header per attribute, each a plain ``dict`` keyed by the field
names of :mod:`mrcnic.base.proto` (reserved ``_`` fields left out), plus the payload and the ICRC.
Frames are Ethernet frames without FCS, ICRC included, as the datapath streams them.

Building::

    pkt = write_packet(Opcode.WRITE_ONLY, qp=0x12, psn=7, va=0x1000, rkey=0x55,
                       dma_length=4, payload=b"abcd", ev=0x12345678)
    pkt = encapsulate(pkt, outer_src=..., outer_dst=make_usid_address(0xFC000000, [1, 2]),
                      srh_segment=make_usid_address(0xFC000000, [3]))
    frame = encode(pkt)                 # bytes
    assert decode(frame) == pkt

Public API (see each docstring):

* data: :class:`Packet`, :class:`PacketError` (the only exception any function here raises
  for bad input; a ``ValueError``);
* codec: :func:`encode`, :func:`decode`, :func:`finalize`, :func:`icrc`;
* builders: :func:`write_packet`, :func:`ack_packet`, :func:`sack_packet`,
  :func:`nack_packet`, :func:`probe_packet`, :func:`endpoint_packet`, :func:`rng_packet`;
* EV and SACK helpers: :func:`stev_split`, :func:`stev_ev`, :func:`sack_bitmap`,
  :func:`sack_psns`, :func:`sack_base`, :func:`ack_psn`;
* SRv6: :func:`encapsulate`, :func:`decapsulate`, :func:`make_usid_address`,
  :func:`split_usid_address`, :func:`usid_shift`, :func:`switch_forward`.

Derived fields. Ethertype, IPv6 version and next headers, IPv6 payload lengths, UDP length,
BTH pad count, BTH ts bit (on writes: set iff a TSETH is present), SRH hdr_ext_len,
routing_type and last_entry, and the ICRC are *derived*: :func:`finalize` computes them, and
every builder returns a finalized packet. :func:`encode` writes every field exactly as stored
(so that tests can build deliberately broken frames with ``check=False``); with the default
``check=True`` it refuses a packet whose frame would not decode back to the same packet.

Decisions of this model (the spec's decisions live in :mod:`mrcnic.base.proto`):

* Pad (RoCE rule): a packet that carries a payload (writes and endpoint packets) has
  BTH pad = (4 - len(payload) % 4) % 4 zero bytes after the payload, before the ICRC.
  :attr:`Packet.payload` never includes them. :func:`decode` rejects non-zero pad bytes and a
  payload-plus-pad length that is not a multiple of 4, so that ``encode(decode(b)) == b``.
* Strictness: reserved bits must be zero, control packets (ACK, SACK, NACK, probe) carry no
  bytes after their headers, BTH tver must be 0, TSETH type 1, endpoint packets go to QP
  :data:`~mrcnic.base.proto.ENDPOINT_QP`, and the frame ends exactly where the IPv6 payload length
  says (an MRC frame is at least 78 bytes, so Ethernet padding never occurs). A frame that
  breaks any rule raises :class:`PacketError`; otherwise decoding loses no bit.
* UDP checksum: carried verbatim and never checked (the ICRC protects the packet).
* SRH: RFC 8754 with hdr_ext_len = 2n (no TLVs), n >= 0 segments, last_entry = n - 1
  (0 when n = 0), segments_left <= n. ``srh["segments"]`` is the segment list in wire order:
  ``segments[0]`` is the *last* segment of the path.
* Switch hop limit: a switch that would forward (uSID shift or SRH End) a packet arriving
  with hop limit 0 or 1 drops it (RFC 8200 / RFC 8986 Time Exceeded); both forwarding actions
  decrement the hop limit (RFC 8986 End decrements it too). Local delivery does not look at it.
* Encapsulation copies the inner DSCP, ECN and flow label to the outer header unless told
  otherwise; decapsulation strips the outer header and SRH and changes nothing inside (read
  ``pkt.outer`` first for its DSCP/ECN).
"""

import dataclasses
import ipaddress
import struct
import zlib
from dataclasses import dataclass, field

from mrcnic.base import proto
from mrcnic.base.proto import (ETH, IPV6, SRH, UDP, BTH, METH, TSETH, RETH, IMMDT, AETH, SETH, CC_STATE,
                     NETH, PETH, ICRC_LEN, SRH_FIXED_LEN, SRH_SEGMENT_LEN, NackCode, Opcode,
                     SackMode)


__all__ = [
    "Packet", "PacketError",
    "encode", "decode", "finalize", "icrc",
    "write_packet", "ack_packet", "sack_packet", "nack_packet", "probe_packet",
    "endpoint_packet", "port_status_packet", "port_status", "rng_packet",
    "stev_split", "stev_ev", "sack_bitmap", "sack_psns", "sack_base", "ack_psn",
    "encapsulate", "decapsulate", "make_usid_address", "split_usid_address", "usid_shift",
    "switch_forward", "SHIFT", "END", "LOCAL", "DROP",
]


class PacketError(ValueError):
    """A frame, packet or argument that breaks the MRC wire format."""


# Model defaults for the builders (not decisions of the spec): locally administered MACs,
# unique-local addresses, a RoCEv2-style source port.
DEFAULT_SRC_MAC = 0x02_00_00_00_00_01
DEFAULT_DST_MAC = 0x02_00_00_00_00_02
DEFAULT_SRC_IP = int(ipaddress.IPv6Address("fd00::1"))
DEFAULT_DST_IP = int(ipaddress.IPv6Address("fd00::2"))
DEFAULT_HOP_LIMIT = 64
DEFAULT_UDP_SPORT = 0xC000
DEFAULT_MPR = 8                  # the public MRC example's window: 8 x 128 = 1024 PSNs


# --- Packet --------------------------------------------------------------------------------

# Headers after the BTH, in the one order in which any valid packet carries a subset of them.
_EXT = (("meth", METH), ("tseth", TSETH), ("reth", RETH), ("immdt", IMMDT), ("aeth", AETH),
        ("seth", SETH), ("cc_state", CC_STATE), ("neth", NETH), ("peth", PETH))
_EXT_NAMES = tuple(name for name, _ in _EXT)

_HEADER_OF = {"eth": ETH, "outer": IPV6, "ip": IPV6, "udp": UDP, "bth": BTH, **dict(_EXT)}


def _public_fields(header):
    return tuple(f for f in header.fields if not f.startswith("_"))


_FIELDS = {name: _public_fields(h) for name, h in _HEADER_OF.items()}
# The SRH dict replaces proto's single ``segment`` by the list of any length RFC 8754 allows.
_SRH_FIXED_FIELDS = tuple(f for f in _public_fields(SRH) if f != "segment")
_FIELDS["srh"] = _SRH_FIXED_FIELDS + ("segments",)


@dataclass
class Packet:
    """One MRC packet. Attributes in wire order; absent headers are ``None``.

    ``eth``, ``outer`` (SRv6 outer IPv6), ``srh``, ``ip`` (the RoCEv2 IPv6 header), ``udp``,
    ``bth`` and the extension headers are dicts of field values (ints); ``srh`` has
    ``segments``, a list of 128-bit ints. ``payload`` excludes the pad bytes. ``icrc`` is the
    int whose little-endian bytes end the frame; ``None`` means "compute it when encoding".
    """
    eth: dict = field(default_factory=dict)
    outer: dict | None = None
    srh: dict | None = None
    ip: dict = field(default_factory=dict)
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
_ICRC_MASK = int.from_bytes(_ICRC_MASK_BYTES, "big")
_ICRC_HEAD = len(_ICRC_MASK_BYTES)
_ICRC_SEED = zlib.crc32(b"\xff" * 8)      # the 8 bytes standing in for the IB LRH


def icrc(inner):
    """RoCEv2 ICRC of ``inner``: the inner IPv6 header through the last byte before the ICRC.

    The frame carries ``struct.pack('<I', icrc(inner))``. Outer IPv6 and SRH are never part of
    ``inner`` (spec 2.1 decision).
    """
    if len(inner) < _ICRC_HEAD:
        raise PacketError(f"ICRC input of {len(inner)} bytes is shorter than IPv6+UDP+BTH "
                          f"({_ICRC_HEAD} bytes)")
    head = (int.from_bytes(inner[:_ICRC_HEAD], "big") | _ICRC_MASK).to_bytes(_ICRC_HEAD, "big")
    return zlib.crc32(inner[_ICRC_HEAD:], zlib.crc32(head, _ICRC_SEED))


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
    """Inner IPv6 header through the pad bytes: exactly what the ICRC covers."""
    parts = [_pack("ip", pkt.ip), _pack("udp", pkt.udp), _pack("bth", pkt.bth)]
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
    crc = icrc(inner) if pkt.icrc is None else pkt.icrc
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

    Missing fields get defaults (addresses, hop limit 64, P_Key 0xFFFF, UDP ports, TSETH
    type 1, else 0). Derived: ethertype, versions, next headers, IPv6 payload lengths, UDP
    length, BTH pad and (on writes) ts bit, SRH hdr_ext_len / routing_type / last_entry
    (segments_left defaults to the segment count), and the ICRC. Raises :class:`PacketError`
    if the opcode is unknown, the headers present are not the opcode's, or a value does not
    fit its field.
    """
    p = pkt.copy()
    for name in ("eth", "outer", "ip", "udp", "bth", *_EXT_NAMES):
        setattr(p, name, _normalized(name, getattr(p, name)))
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
    p.eth["ethertype"] = proto.ETHERTYPE_IPV6
    p.ip.update(version=proto.IPV6_VERSION, next_header=proto.IPPROTO_UDP,
                payload_length=udp_length)
    p.udp["length"] = udp_length

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
    p.icrc = icrc(_inner_bytes(p))
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
    if eth["ethertype"] != proto.ETHERTYPE_IPV6:
        raise PacketError(f"ethertype {eth['ethertype']:#06x} is not IPv6 "
                          f"({proto.ETHERTYPE_IPV6:#06x})")
    pkt = Packet(eth=eth)

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
    inner_start = r.pos - IPV6.size

    pkt.udp = r.header("udp", "UDP header")
    if pkt.udp["length"] != pkt.ip["payload_length"]:
        raise PacketError(f"UDP length {pkt.udp['length']} disagrees with IPv6 "
                          f"payload_length {pkt.ip['payload_length']}")
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
        want = icrc(buf[inner_start:r.end])
        if pkt.icrc != want:
            raise PacketError(f"bad ICRC: frame carries {pkt.icrc:#010x}, "
                              f"computed {want:#010x}")
    return pkt


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


def _ip6(value):
    if isinstance(value, (str, ipaddress.IPv6Address)):
        try:
            return int(ipaddress.IPv6Address(value))
        except ValueError:
            raise PacketError(f"bad IPv6 address {value!r}") from None
    return int(value)


def _s16(value, what):
    """Two's-complement 16-bit field value of a signed offset."""
    if not -0x8000 <= value <= 0x7FFF:
        raise PacketError(f"{what} {value} does not fit a signed 16-bit field")
    return value & 0xFFFF


def _signed16(value):
    return value - 0x10000 if value & 0x8000 else value


def stev_split(ev):
    """``(udp_src_port, flow_label)`` carrying the 32-bit STEV ``ev`` (spec 2.3 decision)."""
    try:
        return proto.stev_split(ev)
    except ValueError as e:
        raise PacketError(str(e)) from None


def stev_ev(pkt):
    """The 32-bit STEV a packet carries in its (inner) flow label and UDP source port."""
    return proto.stev_join(pkt.udp["src_port"], pkt.ip["flow_label"])


def _base(opcode, qp, psn, *, src_mac=DEFAULT_SRC_MAC, dst_mac=DEFAULT_DST_MAC,
          src_ip=DEFAULT_SRC_IP, dst_ip=DEFAULT_DST_IP, ev=None, udp_sport=None,
          flow_label=None, dscp=0, ecn=0, hop_limit=DEFAULT_HOP_LIMIT,
          udp_dport=proto.UDP_DPORT_DEFAULT, pkey=proto.PKEY_DEFAULT, se=0, migreq=0,
          fecn=0, becn=0, ack_req=0, rtx=0):
    """The Ethernet, IPv6, UDP and BTH headers every builder shares (keyword arguments
    of every builder: the list above)."""
    if ev is not None:
        if udp_sport is not None or flow_label is not None:
            raise PacketError("give either ev or udp_sport/flow_label, not both")
        udp_sport, flow_label = stev_split(ev)
    return Packet(
        eth={"dst": _mac(dst_mac), "src": _mac(src_mac)},
        ip={"dscp": dscp, "ecn": ecn,
            "flow_label": 0 if flow_label is None else flow_label,
            "hop_limit": hop_limit, "src": _ip6(src_ip), "dst": _ip6(dst_ip)},
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
                dst_id=0, cc_type=0, timestamp=0, psn=0, **net):
    """A NACK (0xDD): BTH | NETH. ``net`` as for :func:`write_packet`."""
    pkt = _base(Opcode.NACK, qp, psn, **net)
    pkt.neth = {"reason": int(reason), "vendor": vendor, "entropy": entropy, "src_id": src_id,
                "dst_id": dst_id, "nack_psn": nack_psn, "cc_type": cc_type,
                "timestamp": timestamp}
    return finalize(pkt)


def probe_packet(qp, probe_id, *, src_id=0, dst_id=0, timestamp=0, psn=0, **net):
    """A probe (0xDE): BTH | PETH. ``net`` as for :func:`write_packet`."""
    pkt = _base(Opcode.PROBE, qp, psn, **net)
    pkt.peth = {"probe_id": probe_id, "src_id": src_id, "dst_id": dst_id,
                "timestamp": timestamp}
    return finalize(pkt)


def endpoint_packet(opcode, body=b"", *, psn=0, **net):
    """An endpoint request (0xD8) or response (0xD9) to QP ``ENDPOINT_QP``: BTH | body."""
    op = _opcode(int(opcode))
    if op not in (Opcode.EP_REQUEST, Opcode.EP_RESPONSE):
        raise PacketError(f"{op.name} is not an endpoint opcode")
    pkt = _base(op, proto.ENDPOINT_QP, psn, **net)
    pkt.payload = bytes(body)
    return finalize(pkt)


def port_status_packet(ports, *, src_id=0, dst_id=0, psn=0, **net):
    """A port status update (spec §4 "Ports"): an endpoint request whose body is
    :data:`~mrcnic.base.proto.PORT_STATUS` with the sender's port mask ``ports`` (bit p = port p
    up), for the receiver's QP ``dst_id``. ``net`` as for :func:`write_packet`."""
    body = proto.PORT_STATUS.pack(type=proto.EP_PORT_STATUS, ports=ports, src_id=src_id,
                                  dst_id=dst_id)
    return endpoint_packet(Opcode.EP_REQUEST, body, psn=psn, **net)


def port_status(pkt):
    """The :data:`~mrcnic.base.proto.PORT_STATUS` fields of a decoded packet that is a port status
    update, else None."""
    if (pkt.bth["opcode"] != Opcode.EP_REQUEST or len(pkt.payload) != proto.PORT_STATUS.size
            or pkt.payload[0] != proto.EP_PORT_STATUS):
        return None
    return proto.PORT_STATUS.unpack(pkt.payload)


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
    (IPv6-in-IPv6), ``"srh"`` (outer + SRH; one segment, sometimes 0, 2 or 3) or ``None``
    for a random choice. Payloads (writes, endpoint) are 0..``max_payload`` bytes, every
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
    if encap != "none":
        pkt.outer = _random_fields(rng, "outer")
    if encap == "srh":
        n = rng.choice((1, 1, 1, 1, 0, 2, 3))
        pkt.srh = {"segments_left": rng.randrange(n + 1), "flags": rng.getrandbits(8),
                   "tag": rng.getrandbits(16),
                   "segments": [rng.getrandbits(128) for _ in range(n)]}
    elif encap not in ("none", "outer"):
        raise PacketError(f"encap {encap!r} is not 'none', 'outer' or 'srh'")
    return finalize(pkt)


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
