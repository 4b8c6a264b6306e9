"""Transmit-side records: the packet descriptor, and what the sender and its retransmit
tracker tell each other.

The segmentation (and a retransmission) writes one :data:`TX_DESC` record per data packet;
:class:`mrcnic.roce_tx.RoceTx` turns the record and the packet's payload into a complete
RoCEv2 frame with METH and RETH (spec §2.1), ICRC included, ready for the encapsulation.

Decisions kept here
    * Every data packet carries METH and RETH; no TSETH is sent.
    * ``entropy`` is written as a 32-bit STEV into the inner flow label and UDP source port
      (:func:`mrcnic.proto.stev_split`); in SRv6 modes it is the EV's index (spec §2.3).
"""

from amaranth.lib import data

from . import proto
from .ack_desc import QP_INDEX_BITS
from .ev_feedback import EV_INDEX_BITS

__all__ = ["TX_DESC", "MAX_PAYLOAD", "TIME_BITS", "TICK_NS", "sent_layout", "rtx_layout",
           "release_layout"]

MAX_PAYLOAD = 9216          # the largest payload a descriptor may ask for (a jumbo frame)

TX_DESC = data.StructLayout({
    "qp":         QP_INDEX_BITS,      # local QP index: selects the connection's context
    "psn":        proto.PSN_BITS,
    "opcode":     8,                  # proto.Opcode, a WRITE_* opcode
    "ack_req":    1,                  # BTH A
    "rtx":        1,                  # BTH rtx: a retransmission (and the retransmit DSCP)
    "va":         64,                 # RETH: this packet's own remote address
    "rkey":       32,
    "dma_length": 32,                 # RETH: the length of the whole operation
    "length":     16,                 # payload bytes of this packet
    "imm":        32,                 # ImmDt, on WRITE_LAST_IMM / WRITE_ONLY_IMM only
    "rqmsn":      16,                 # METH
    "msn":        16,
    "entropy":    32,
})


# --- Between the sender and the retransmit tracker ----------------------------------------

TIME_BITS = 32              # time base and send times, in ticks
TICK_NS = 1024              # decision: one tick of ``now`` is 1.024 us, the unit of §4


def sent_layout(tag_width=32):
    """One packet put on the wire (to the retransmit tracker)."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "psn": proto.PSN_BITS,
                              "ev": EV_INDEX_BITS, "time": TIME_BITS, "tag": tag_width,
                              "rtx": 1})


def rtx_layout(tag_width=32):
    """A retransmit request (from the retransmit tracker)."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "psn": proto.PSN_BITS, "tag": tag_width,
                              "ev": EV_INDEX_BITS,      # the EV that failed: avoid it
                              "cause": 2})              # retransmit_tracker.RtxCause


def release_layout(tag_width=32):
    """PSNs ``first`` .. ``last`` acknowledged (from the retransmit tracker)."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "first": proto.PSN_BITS,
                              "last": proto.PSN_BITS, "tag": tag_width})   # tag of ``last``
