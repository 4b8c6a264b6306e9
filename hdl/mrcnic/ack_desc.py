"""The SACK/NACK descriptor: what the receive side decides to answer, before it is a frame.

:class:`mrcnic.psn_tracker.PsnTracker` writes one :data:`ACK_DESC` record per SACK or NACK it
decides to send; :class:`mrcnic.ack_generator.AckGenerator` turns each record into a complete
control frame. The record carries every field of SETH + CC_STATE (SACK) or NETH (NACK) that
depends on the packet or the QP's receive state; what depends only on the connection
(addresses, remote QP number, DSCP) is the generator's per-QP context.

Decisions kept here
    * The control frame leaves with the echoed ``entropy`` as its own 32-bit STEV (UDP
      source port and flow label, :func:`mrcnic.proto.stev_split`): a SACK returns on the
      reverse of the EV it acknowledges.
    * SETH/NETH ``src_id`` is the local QP index, ``dst_id`` the remote QP number's low 16
      bits (the generator's context).
"""

from amaranth.lib import data

from . import proto

__all__ = ["ACK_DESC", "ack_desc_fields", "QP_INDEX_BITS"]

QP_INDEX_BITS = 16      # local QP index in descriptors and records (a block has <= 2^16 QPs)

ACK_DESC = data.StructLayout({
    "nack":           1,      # 0: SACK (BTH 0xDC, SETH + CC_STATE); 1: NACK (0xDD, NETH)
    "qp":             QP_INDEX_BITS,
    # SACK
    "cack":           proto.PSN_BITS,
    "ack_psn_offset": 16,     # signed: the PSN that triggered the SACK = cack + offset
    "sack_offset":    16,     # signed: SACK_BASE = cack + offset
    "bitmap":         64,     # bit i: PSN SACK_BASE + i has arrived
    "m":              2,      # proto.SackMode
    "pr":             1,      # answers a probe
    "mpr":            8,
    "ooo_count":      15,     # CC_STATE: PSNs above cack that have arrived (saturating)
    "rcvd_bytes":     24,     # CC_STATE: payload bytes received on the QP / 256, mod 2^24
    # NACK
    "reason":         8,      # proto.NackCode
    "psn":            proto.PSN_BITS,   # NACK PSN
    # both
    "entropy":        32,     # echoed from the data packet (0 if it had none)
    "timestamp":      16,     # echoed TSETH timestamp (CC_STATE / NETH), 128 ns units
})


def ack_desc_fields():
    """``{name: width}`` of :data:`ACK_DESC`, in layout order (for models and testbenches)."""
    return {name: field.width for name, field in ACK_DESC}
