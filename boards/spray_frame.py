"""The frames of :class:`mrcnic.boards.spraytest.SprayTest`, declared once: what its
generator sends for frame ``seq`` of QP ``qp`` (the generator's header template is built
from :func:`frame`), and what its checker and the tests must find after the SRv6 header went
in and came out again. Like :mod:`mrcnic.base.proto` for the NIC's frames, it is a format,
not a model of the gateware.

A spray frame has the shape of a RoCEv2 packet (Ethernet, IPv6, UDP, BTH, ``payload``
bytes, ICRC; the SRv6 blocks look no further than the UDP header):

* Ethernet: to and from :data:`MAC`, IPv6;
* IPv6: flow label ``entropy[31:16]``, hop limit 64, from :data:`IP_BASE` with its low 32
  bits = ``seq``, to :data:`IP`;
* UDP: source port ``entropy[15:0]`` (``entropy`` 0 when sent; the EV's entropy,
  :func:`~mrcnic.base.proto.srv6_entropy`, after the encapsulator),
  destination :data:`~mrcnic.base.proto.UDP_DPORT_DEFAULT`, checksum 0;
* BTH: opcode WRITE_MIDDLE, P_Key 0xFFFF, destination QP ``qp``, PSN ``seq`` mod 2^24;
* payload: the byte at frame offset ``i`` is ``(i + seq[7:0]) mod 256`` XOR ``seq[15:8]``
  XOR ``seq[23:16]`` XOR ``seq[31:24]``, so a byte out of place, from another frame or a
  changed ``seq`` shows;
* ICRC: zero (the encapsulator patches it for the new UDP port; nothing checks it).
"""

from mrcnic.base import proto
from mrcnic.base.proto import BTH, ETH, IPV6, UDP, Opcode

__all__ = ["MAC", "IP", "IP_BASE", "HEADER_LEN", "frame", "frame_len", "ev_address",
           "ev_of_address"]

MAC = 0x02_4D_52_43_00_02
IP = 0xFD00 << 112 | 2
IP_BASE = 0xFD00 << 112 | 0x5350 << 32          # "SP", then the frame's sequence number
HEADER_LEN = ETH.size + IPV6.size + UDP.size + BTH.size          # 74


def frame_len(payload):
    return HEADER_LEN + payload + proto.ICRC_LEN


def frame(seq, qp, payload, entropy=0):
    """The bytes of spray frame ``seq`` of QP ``qp`` with ``payload`` payload bytes and the
    32-bit ``entropy`` (:func:`~mrcnic.base.proto.stev_split`)."""
    port, flow = proto.stev_split(entropy)
    length = UDP.size + BTH.size + payload + proto.ICRC_LEN
    head = (ETH.pack(dst=MAC, src=MAC, ethertype=0x86DD)
            + IPV6.pack(version=6, flow_label=flow, payload_length=length, next_header=17,
                        hop_limit=64, src=IP_BASE | seq & 0xFFFF_FFFF, dst=IP)
            + UDP.pack(src_port=port, dst_port=proto.UDP_DPORT_DEFAULT, length=length)
            + BTH.pack(opcode=int(Opcode.WRITE_MIDDLE), pkey=0xFFFF, dest_qp=qp,
                       psn=seq & proto.PSN_MASK))
    assert len(head) == HEADER_LEN
    low = seq & 0xFF
    high = (seq >> 8 ^ seq >> 16 ^ seq >> 24) & 0xFF
    body = bytes(((i + low) & 0xFF) ^ high for i in range(HEADER_LEN, HEADER_LEN + payload))
    return head + body + bytes(proto.ICRC_LEN)


def ev_address(e):
    """The SRv6 destination of EV ``e`` on the spray test's fabric (no switch routes it;
    the checker reads the EV back from it)."""
    return 0xFC00 << 112 | (0x100 + e) << 80


def ev_of_address(addr, ev_count):
    """The EV whose address is ``addr``, or None."""
    e = (addr >> 80 & 0xFFFF) - 0x100
    return e if 0 <= e < ev_count and ev_address(e) == addr else None
