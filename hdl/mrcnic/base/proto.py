"""MRC wire format: every header, declared once, and the constants of the spec.

Each header is a list of ``(field, width_in_bits)`` in wire order. Network byte order is
handled in exactly one place, :meth:`Header.wire_bit`: the field bit numbering of the wire
(bit 7 of byte 0 first, multi-byte fields big-endian) is mapped there to

* Python: ``bytes`` (``pack``/``unpack``), and
* gateware: an AXI-Stream-ordered bus, where byte ``i`` of the header is ``bus[8*i:8*i+8]``
  (byte 0 of a frame is ``tdata[7:0]``), through :meth:`Header.get` and :meth:`Header.assemble`.

Every decision of ``mrc-datapath-spec.md`` that fixes a number (UDP port, BTH flag bits, STEV
split, SETH bit positions, PETH layout) is a named constant below and nowhere else.
"""

import enum

from amaranth.hdl import Cat, Const, Value
from amaranth.lib import data


__all__ = [
    "Header", "HEADERS",
    "ETH", "IPV6", "IPV4", "SRH", "UDP", "BTH", "METH", "TSETH", "RETH", "IMMDT", "AETH",
    "SETH", "CC_STATE", "NETH", "PETH", "ERTH", "EETH", "EP_PORT_STATUS", "EP_EV_PROBE",
    "ICRC_LEN", "ipv4_checksum",
    "Opcode", "NackCode", "SackMode", "EvMode", "EvState",
]


class Header:
    """A fixed-size protocol header declared as ``(name, width)`` pairs in wire order.

    Field names starting with ``_`` are reserved: packed as zero (or as given), ignored by
    :meth:`unpack` unless ``reserved=True``.
    """

    def __init__(self, name, fields):
        self.name = name
        self.fields = {}
        offset = 0
        for field, width in fields:
            if field in self.fields:
                raise ValueError(f"{name}: duplicate field {field!r}")
            if width <= 0:
                raise ValueError(f"{name}: field {field!r} has width {width}")
            self.fields[field] = (offset, width)
            offset += width
        if offset % 8:
            raise ValueError(f"{name}: {offset} bits is not a whole number of bytes")
        self.bits = offset
        self.size = offset // 8

    def __repr__(self):
        return f"Header({self.name}, {self.size} bytes)"

    def __len__(self):
        return self.size

    def offset(self, field):
        """Byte offset and bit offset within that byte (0 = bit 7) of ``field``'s first bit."""
        start, _ = self.fields[field]
        return start // 8, start % 8

    def width(self, field):
        return self.fields[field][1]

    # The one place byte order lives.
    def wire_bit(self, field, k):
        """Bit index, in an AXI-Stream-ordered bus, of bit ``k`` (0 = LSB) of ``field``."""
        start, width = self.fields[field]
        if not 0 <= k < width:
            raise IndexError(f"{self.name}.{field} has {width} bits, no bit {k}")
        p = start + width - 1 - k          # position in the wire bit string, 0 = first on wire
        return 8 * (p // 8) + 7 - (p % 8)

    # Python side ----------------------------------------------------------------------------

    def pack(self, **values):
        """Bytes of the header. Unnamed fields are zero; out-of-range values raise ValueError."""
        word = 0
        for field, value in values.items():
            if field not in self.fields:
                raise ValueError(f"{self.name} has no field {field!r}")
            start, width = self.fields[field]
            value = int(value)
            if not 0 <= value < (1 << width):
                raise ValueError(f"{self.name}.{field} = {value:#x} does not fit {width} bits")
            word |= value << (self.bits - start - width)
        return word.to_bytes(self.size, "big")

    def unpack(self, buf, *, reserved=False):
        """Field dictionary of the first :attr:`size` bytes of ``buf``."""
        buf = bytes(buf)
        if len(buf) < self.size:
            raise ValueError(f"{self.name} needs {self.size} bytes, got {len(buf)}")
        word = int.from_bytes(buf[:self.size], "big")
        out = {}
        for field, (start, width) in self.fields.items():
            if field.startswith("_") and not reserved:
                continue
            out[field] = (word >> (self.bits - start - width)) & ((1 << width) - 1)
        return out

    # Gateware side --------------------------------------------------------------------------

    def get(self, bus, field, byte_offset=0):
        """``field`` of a header starting at byte ``byte_offset`` of an AXI-ordered ``bus``."""
        bus = Value.cast(bus)
        base = 8 * byte_offset
        width = self.width(field)
        if base + self.bits > len(bus):
            raise ValueError(f"{self.name} at byte {byte_offset} does not fit a "
                             f"{len(bus) // 8}-byte bus")
        return Cat(*(bus[base + self.wire_bit(field, k)] for k in range(width)))

    def assemble(self, values):
        """AXI-ordered value of ``size`` bytes from a ``{field: Value or int}`` mapping.

        Built of runs (a byte of a field, a run of zero bits) rather than single bits: the
        same value, a fraction of the terms for the simulators to compile."""
        src = [None] * self.bits                 # bus bit -> (Value, bit) or None for 0
        for field, value in values.items():
            width = self.width(field)
            value = Const(value, width) if isinstance(value, int) else Value.cast(value)
            if len(value) > width:
                raise ValueError(f"{self.name}.{field}: {len(value)}-bit value for a "
                                 f"{width}-bit field")
            value = value.as_unsigned()
            for k in range(len(value)):
                src[self.wire_bit(field, k)] = (value, k)
        runs, p = [], 0
        while p < self.bits:
            q = p + 1
            if src[p] is None:
                while q < self.bits and src[q] is None:
                    q += 1
                runs.append(Const(0, q - p))
            else:
                value, k = src[p]
                while q < self.bits and src[q] is not None and src[q][0] is value \
                        and src[q][1] == k + q - p:
                    q += 1
                runs.append(value[k:k + q - p])
            p = q
        return Cat(*runs)

    @property
    def layout(self):
        """A ``data.StructLayout`` with one member per non-reserved field (for metadata)."""
        return data.StructLayout({f: w for f, (_, w) in self.fields.items()
                                  if not f.startswith("_")})


# --- Decisions of the spec (one line each) ------------------------------------------------

# MRC's UDP port, not RoCEv2's 4791 (MRC-Client core/packet_builder.py, ROCE_UDP_PORT); a
# register in each block that writes or checks it.
UDP_DPORT_DEFAULT   = 4971
ETHERTYPE_IPV6      = 0x86DD
ETHERTYPE_IPV4      = 0x0800   # UDP mode only (RoCEv2 over IPv4); the SRv6 modes are IPv6
IPPROTO_UDP         = 17
IPPROTO_IPV6        = 41       # outer Next Header without SRH (IPv6-in-IPv6)
IPPROTO_ROUTING     = 43       # outer Next Header with SRH
IPPROTO_NONE        = 59
SRH_ROUTING_TYPE    = 4
IPV6_VERSION        = 6
IPV4_VERSION        = 4
IPV4_IHL            = 5        # 32-bit words: no options (a frame with options is refused)
IPV4_FLAGS_DF       = 0b010    # RoCEv2 over IPv4 sends unfragmented, Don't Fragment set
BTH_TVER            = 0
PKEY_DEFAULT        = 0xFFFF
BTH_RTX_BIT         = 5        # bit of BTH byte 8 that marks a retransmission
BTH_TS_BIT          = 4        # bit of BTH byte 8 that says a TSETH follows the METH
# SETH byte 1: bits 6:5 = M, bit 1 = pr (ns-3 uet-simulator src/mrc/model/mrc-header.cc
# MrcSethHeader::Serialize, flags (M << 5) | 0x0002; MRC-Client core/mrc_headers.py SETH).
SETH_M_SHIFT        = 5
SETH_PR_BIT         = 1        # pr: the SACK answers a probe
STEV_PORT_BITS      = 16       # EV[15:0] -> UDP source port
STEV_FLOW_BITS      = 16       # EV[31:16] -> flow label[15:0]; flow label[19:16] = 0
assert STEV_PORT_BITS == STEV_FLOW_BITS      # the swapped split exchanges equal halves
SRV6_LBL_BITS       = 32       # uSID locator block length
SRV6_USID_BITS      = 16       # uSID length
TSETH_TYPE          = 1
TIMESTAMP_UNIT_NS   = 128      # TSETH and CC_STATE timestamps
CC_BYTES_UNIT       = 256      # CC_STATE rcvd_bytes unit
MPR_UNIT_PSNS       = 128      # MPR counts receive window in 128-PSN units
PSN_BITS            = 24
ENDPOINT_QP         = 0x2      # destination QP of endpoint requests/responses
ICRC_LEN            = 4
AETH_SYNDROME_ACCESS_ERROR = 0x62

# Traffic classes. The spec leaves the codepoints to the operator: these are defaults of the
# registers that write or recognise them (a NIC, and the switches of mrcnic.netsim.fabric).
DSCP_DATA           = 0x0A     # first transmissions of data packets
DSCP_RTX            = 0x0C     # retransmissions (spec §4: "a retransmit DSCP")
DSCP_CONTROL        = 0x30     # SACK, NACK, probes
DSCP_TRIMMED        = 0x2C     # set by a switch that trimmed the packet
DSCP_TRIMMED_LASTHOP = 0x2D    # ... when that switch was the packet's last hop
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0, 1, 2, 3   # RFC 3168; NICs send ECT(0)
# Decision (trimming): a switch keeps the frame up to the end of the inner RETH (Ethernet,
# outer IPv6 and SRH if any, inner IPv6, UDP, BTH, METH, [TSETH], RETH) and drops the rest,
# payload and ICRC; it rewrites the outermost IPv6 header's DSCP and payload length only.
# The receiver recognises the DSCP before any other check and never checks the ICRC or the
# inner lengths of a trimmed packet.


class Opcode(enum.IntEnum):
    WRITE_FIRST     = 0xC6
    WRITE_MIDDLE    = 0xC7
    WRITE_LAST      = 0xC8
    WRITE_LAST_IMM  = 0xC9
    WRITE_ONLY      = 0xCA
    WRITE_ONLY_IMM  = 0xCB
    ACK             = 0xD1
    SACK            = 0xDC
    NACK            = 0xDD
    PROBE           = 0xDE
    EP_REQUEST      = 0xD8
    EP_RESPONSE     = 0xD9

    @property
    def is_write(self):
        return Opcode.WRITE_FIRST <= self <= Opcode.WRITE_ONLY_IMM

    @property
    def has_immdt(self):
        return self in (Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM)


class NackCode(enum.IntEnum):
    TRIMMED           = 0x01
    TRIMMED_LASTHOP   = 0x02
    NO_BITMAP         = 0x06
    NO_PKT_BUFFER     = 0x07
    NO_RESOURCE       = 0x0A
    PSN_OUT_OF_WINDOW = 0x0B
    UNEXPECTED_EVENT  = 0x19


class SackMode(enum.IntEnum):
    """SETH M: what the sender should do with the EV the acknowledged packet used."""
    NONE        = 0
    SKIP_ONCE   = 1
    ALWAYS_SKIP = 2


class EvMode(enum.IntEnum):
    """How an EV is written into a frame (spec §2.3)."""
    PASS     = 0
    STEV     = 1
    UDP      = 2
    SRV6     = 3
    SRV6_SRH = 4


# Limits of the controller API's EV formats (§3): up to 16 fields, each held in a 32-bit
# register.
MAX_FORMAT_FIELDS = 16
MAX_FIELD_WIDTH = 32


class EvState(enum.IntEnum):
    GOOD        = 0
    SKIP        = 1
    ASSUMED_BAD = 2
    DENIED      = 3


# --- Headers, in wire order ----------------------------------------------------------------

def _bth_byte8():
    # Byte 8 of the BTH: A at bit 7, the MRC flags at their decided bits, the rest reserved.
    named = {7: "ack_req", BTH_RTX_BIT: "rtx", BTH_TS_BIT: "ts"}
    return [(named.get(bit, f"_rsvd8_{bit}"), 1) for bit in range(7, -1, -1)]


def _seth_byte1():
    fields, bit = [], 7
    while bit >= 0:
        if bit == SETH_M_SHIFT + 1:
            fields.append(("m", 2)); bit -= 2
        elif bit == SETH_PR_BIT:
            fields.append(("pr", 1)); bit -= 1
        else:
            fields.append((f"_rsvd1_{bit}", 1)); bit -= 1
    return fields


ETH = Header("Ethernet", [("dst", 48), ("src", 48), ("ethertype", 16)])

IPV6 = Header("IPv6", [
    ("version", 4), ("dscp", 6), ("ecn", 2), ("flow_label", 20),
    ("payload_length", 16), ("next_header", 8), ("hop_limit", 8),
    ("src", 128), ("dst", 128),
])

# RFC 791, without options (IPV4_IHL): RoCEv2 over IPv4, MRC's UDP mode.
IPV4 = Header("IPv4", [
    ("version", 4), ("ihl", 4), ("dscp", 6), ("ecn", 2), ("total_length", 16),
    ("identification", 16), ("flags", 3), ("fragment_offset", 13), ("ttl", 8),
    ("protocol", 8), ("checksum", 16), ("src", 32), ("dst", 32),
])

# RFC 8754 Segment Routing Header with the single segment MRC uses (n = 1, hdr_ext_len = 2).
SRH = Header("SRH", [
    ("next_header", 8), ("hdr_ext_len", 8), ("routing_type", 8), ("segments_left", 8),
    ("last_entry", 8), ("flags", 8), ("tag", 16), ("segment", 128),
])
SRH_FIXED_LEN = 8              # bytes before the segment list
SRH_SEGMENT_LEN = 16

UDP = Header("UDP", [("src_port", 16), ("dst_port", 16), ("length", 16), ("checksum", 16)])

BTH = Header("BTH", [
    ("opcode", 8), ("se", 1), ("m", 1), ("pad", 2), ("tver", 4), ("pkey", 16),
    ("fecn", 1), ("becn", 1), ("_rsvd4", 6), ("dest_qp", 24),
    *_bth_byte8(), ("psn", 24),
])

METH = Header("METH", [("rqmsn", 16), ("msn", 16)])

TSETH = Header("TSETH", [("timestamp", 16), ("tsr", 1), ("_rsvd", 11), ("type", 4)])

RETH = Header("RETH", [("va", 64), ("rkey", 32), ("dma_length", 32)])

IMMDT = Header("ImmDt", [("imm", 32)])

AETH = Header("AETH", [("syndrome", 8), ("msn", 24)])

SETH = Header("SETH", [
    ("_rsvd0", 8), *_seth_byte1(), ("ack_psn_offset", 16), ("entropy", 32),
    ("src_id", 16), ("dst_id", 16), ("_rsvd12", 8), ("cack_psn", 24),
    ("cc_type", 4), ("flags", 4), ("mpr", 8), ("sack_offset", 16), ("bitmap", 64),
])

CC_STATE = Header("CC_STATE", [
    ("timestamp", 16), ("_rsvd", 1), ("ooo_count", 15),
    ("restore_cwnd", 1), ("rcv_cwnd_pen", 7), ("rcvd_bytes", 24),
])

# NETH byte 16: cc_type in the high nibble, flags in the low one, as in SETH (ns-3
# uet-simulator mrc-header.cc MrcNethHeader::Serialize; MRC-Client core/mrc_headers.py NETH).
NETH = Header("NETH", [
    ("_rsvd0", 16), ("reason", 8), ("vendor", 8), ("entropy", 32),
    ("src_id", 16), ("dst_id", 16), ("_rsvd12", 8), ("nack_psn", 24),
    ("cc_type", 4), ("flags", 4), ("_rsvd17", 8), ("timestamp", 16),
])

# PETH: vendor info at byte 3, the probe id at 4-5, bytes 6-7 reserved, the PDC ids at 8-11,
# then a timestamp word laid out as TSETH (timestamp, tsr, format type = TSETH_TYPE) at 12-15
# (ns-3 uet-simulator mrc-header.cc MrcPethHeader::Serialize; MRC-Client core/mrc_headers.py
# PETH).
PETH = Header("PETH", [
    ("_rsvd0", 24), ("vendor", 8), ("probe_id", 16), ("_rsvd6", 16), ("src_id", 16),
    ("dst_id", 16), ("timestamp", 16), ("tsr", 1), ("_rsvd14", 11), ("type", 4),
])

# ERTH, the endpoint request's header (0xD8 to BTH dest QP ENDPOINT_QP): the operation in
# byte 1 bits 1:0 (EP_PORT_STATUS, EP_EV_PROBE), vendor info at byte 3, the sender's port
# mask at 4-7 (bit p = its port p up), bytes 8-11 reserved, a timestamp word laid out as
# TSETH at 12-15; EETH, the endpoint response's (0xD9), its operation in byte 1 bits 5:4 and
# the request's timestamp echoed at 28-29, the rest reserved (MRC-Client core/mrc_headers.py
# ERTH, EETH; the ns-3 model has no endpoint operations).
# Decision: a port status update names the QP it is for: bytes 8-11, reserved in the public
# layout, carry QP ids as in SETH (src_id the sender's QP, dst_id the receiver's), so that
# a peer that leaves them 0 updates the receiver's QP 0. An EETH carries them at the same
# bytes (reserved there too), swapped from its request's: src_id the answering QP, dst_id
# the requester's, so that a requester can map an answer back to its QP.
ERTH = Header("ERTH", [
    ("_rsvd0", 8), ("_rsvd1", 6), ("op", 2), ("_rsvd2", 8), ("vendor", 8), ("ports", 32),
    ("src_id", 16), ("dst_id", 16), ("timestamp", 16), ("tsr", 1), ("_rsvd14", 11),
    ("type", 4),
])
EETH = Header("EETH", [
    ("_rsvd0", 8), ("_rsvd1a", 2), ("op", 2), ("_rsvd1b", 4), ("_rsvd2", 16),
    ("_rsvd4", 32), ("src_id", 16), ("dst_id", 16), ("_rsvd12", 128), ("timestamp", 16),
    ("_rsvd30", 16), ("_rsvd32", 32),
])
EP_PORT_STATUS = 0             # ERTH/EETH op: port status update
EP_EV_PROBE = 1                # ... EV probe

HEADERS = {h.name: h for h in
           (ETH, IPV6, IPV4, SRH, UDP, BTH, METH, TSETH, RETH, IMMDT, AETH, SETH, CC_STATE,
            NETH, PETH, ERTH, EETH)}

assert (ETH.size, IPV6.size, SRH.size, UDP.size, BTH.size) == (14, 40, 24, 8, 12)
assert IPV4.size == 4 * IPV4_IHL == 20
assert (METH.size, TSETH.size, RETH.size, IMMDT.size, AETH.size) == (4, 4, 16, 4, 4)
assert (SETH.size, CC_STATE.size, NETH.size, PETH.size) == (28, 8, 20, 16)
assert (ERTH.size, EETH.size) == (16, 36)

OUTER_IPV6_LEN = IPV6.size                 # bytes an SRv6 encapsulation inserts
OUTER_SRH_LEN = IPV6.size + SRH.size       # ... and with the one-segment SRH


# --- Where the EV goes (spec §2.3) ---------------------------------------------------------

# Bits of EV each mode carries on the wire, derived from the headers that carry it.
EV_BITS = {
    EvMode.STEV:     STEV_PORT_BITS + STEV_FLOW_BITS,
    EvMode.UDP:      UDP.width("src_port"),
    EvMode.SRV6:     IPV6.width("dst"),
    EvMode.SRV6_SRH: IPV6.width("dst") + SRH.width("segment"),
}
EV_MAX_BITS = max(EV_BITS.values())      # 256: the expanded EV a descriptor carries


# Decision: in the SRv6 modes (switches route on the uSIDs, not on the entropy) the entropy is
# the EV index in both 16-bit halves, each SRV6_ENTROPY_BASE | index: the UDP source port
# stays in the dynamic range 0xC000-0xFFFF, as RoCEv2 senders keep it, whichever half the
# STEV split (or its swap) puts there, so no sniffer or middlebox takes an MRC frame for a
# well-known service; the echoed entropy's low bits are still the index.
SRV6_ENTROPY_BASE = 0xC000


def srv6_entropy(ev_index):
    """The 32-bit entropy of EV index ``ev_index`` (< 2^14) in the SRv6 modes."""
    if not 0 <= ev_index < 1 << 14:
        raise ValueError(f"EV index {ev_index} does not fit 14 bits")
    half = SRV6_ENTROPY_BASE | ev_index
    return half << 16 | half


def srv6_ev_index(entropy):
    """The EV index an SRv6-mode entropy carries (its low 14 bits)."""
    return entropy & ((1 << 14) - 1)


def stev_split(ev, swap=False):
    """``(udp_src_port, flow_label)`` that carry the 32-bit STEV ``ev``: EV[15:0] in the UDP
    source port, EV[31:16] in flow label[15:0], flow label[19:16] zero; with ``swap`` the
    halves change places (EV[31:16] in the port, as MRC-Client's STRUCTURED_EV: the
    ``stev_swap`` registers of the inserter, the receive parser and the ACK generator)."""
    width = EV_BITS[EvMode.STEV]
    if not 0 <= ev < (1 << width):
        raise ValueError(f"STEV EV {ev:#x} does not fit {width} bits")
    lo, hi = ev & ((1 << STEV_PORT_BITS) - 1), ev >> STEV_PORT_BITS
    return (hi, lo) if swap else (lo, hi)


def stev_join(udp_src_port, flow_label, swap=False):
    """The 32-bit STEV carried by a UDP source port and a flow label (inverse of the split
    with the same ``swap``)."""
    port = udp_src_port & ((1 << STEV_PORT_BITS) - 1)
    flow = flow_label & ((1 << STEV_FLOW_BITS) - 1)
    return port << STEV_PORT_BITS | flow if swap else flow << STEV_PORT_BITS | port


# --- PSN arithmetic (spec §5): modulo 2^24 -------------------------------------------------

PSN_MASK = (1 << PSN_BITS) - 1


def ipv4_checksum(header):
    """The RFC 791 header checksum of ``header`` (the IPv4 header's bytes, its checksum field
    as it stands: pass it zeroed to compute one; a valid header gives 0)."""
    total = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def psn_add(a, b):
    return (a + b) & PSN_MASK


def psn_diff(a, b):
    """(a - b) mod 2^24."""
    return (a - b) & PSN_MASK


def psn_after(a, b):
    """True when ``a`` comes after ``b``: (a - b) mod 2^24 in 1 .. 2^23 - 1."""
    return 0 < psn_diff(a, b) < (1 << (PSN_BITS - 1))
