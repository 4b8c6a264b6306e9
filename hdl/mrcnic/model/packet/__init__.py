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
  :func:`nack_packet`, :func:`probe_packet`, :func:`endpoint_packet`,
  :func:`port_status_packet`, :func:`ev_probe_packet`, :func:`ev_probe_response_packet`,
  :func:`rng_packet`; endpoint bodies: :func:`endpoint_request`, :func:`endpoint_response`,
  :func:`port_status`;
* EV and SACK helpers: :func:`stev_split`, :func:`stev_ev`, :func:`srv6_ev_index`,
  :func:`sack_bitmap`, :func:`sack_psns`, :func:`sack_base`, :func:`ack_psn`;
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
* IPv4 (UDP mode, ``ipv4=True`` in the builders; ``Packet.ipv4`` in place of ``ip``): RFC
  791 without options (IHL 5), never a fragment (MF clear, offset 0; Don't Fragment set by
  default), the header checksum derived by :func:`finalize` and checked by :func:`decode`;
  the ICRC replaces the type of service, TTL and header checksum by ones (RoCEv2 over IPv4).
  No flow label: the EV is the UDP source port. The SRv6 modes stay IPv6
  (:func:`encapsulate` refuses an IPv4 packet).
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

from mrcnic.model.packet.codec import (DEFAULT_DST_IP, DEFAULT_DST_MAC, DEFAULT_HOP_LIMIT,
                                       DEFAULT_MPR, DEFAULT_SRC_IP, DEFAULT_SRC_IP4,
                                       DEFAULT_DST_IP4, DEFAULT_SRC_MAC,
                                       DEFAULT_UDP_SPORT, Packet, PacketError, decode, encode,
                                       finalize, icrc)
from mrcnic.model.packet.build import (ack_packet, ack_psn, endpoint_packet, endpoint_request,
                                       endpoint_response, ev_probe_packet,
                                       ev_probe_response_packet, nack_packet,
                                       port_status, port_status_packet, probe_packet,
                                       rng_packet, sack_base, sack_bitmap, sack_packet,
                                       sack_psns, srv6_ev_index, stev_ev, stev_split,
                                       write_packet)
from mrcnic.model.packet.usid import (DROP, END, LOCAL, SHIFT, decapsulate, encapsulate,
                                      make_usid_address, split_usid_address, switch_forward,
                                      usid_shift)

__all__ = [
    "Packet", "PacketError", "DEFAULT_SRC_MAC", "DEFAULT_DST_MAC", "DEFAULT_SRC_IP",
    "DEFAULT_DST_IP", "DEFAULT_SRC_IP4", "DEFAULT_DST_IP4", "DEFAULT_HOP_LIMIT", "DEFAULT_UDP_SPORT", "DEFAULT_MPR",
    "encode", "decode", "finalize", "icrc",
    "write_packet", "ack_packet", "sack_packet", "nack_packet", "probe_packet",
    "endpoint_packet", "port_status_packet", "port_status", "ev_probe_packet",
    "ev_probe_response_packet", "endpoint_request", "endpoint_response", "rng_packet",
    "stev_split", "stev_ev", "srv6_ev_index", "sack_bitmap", "sack_psns", "sack_base", "ack_psn",
    "encapsulate", "decapsulate", "make_usid_address", "split_usid_address", "usid_shift",
    "switch_forward", "SHIFT", "END", "LOCAL", "DROP",
]
