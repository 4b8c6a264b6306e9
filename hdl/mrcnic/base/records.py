"""The records the blocks exchange, each declared once.

Every record that passes from one block to another (or out of the NIC to its user) is a
``data.StructLayout`` of this module; a block imports the records of its ports from here and
never from the block at the other end. Field layouts of the wire live in
:mod:`mrcnic.base.proto`.

Transmit, in the order a packet meets them:

==================  ==========================================================================
:data:`WR`          a work request (the user to the segmenter); :data:`WR_DONE` its completion
:data:`SEG_PKT`     a packet of a message (the segmenter to the transmit half's credit check)
:data:`REQUEST`     a path request (to the path selector); :func:`response_layout` its answer,
                    :func:`probe_layout` a probe or port status announcement to send
:data:`TX_DESC`     a packet descriptor (to the RoCEv2 framer)
:data:`PAYLOAD_REQ` a packet's payload (the transmit half to the user)
:func:`sent_layout` a packet put on the wire (to the retransmit tracker); :func:`rtx_layout` a
                    retransmit request and :func:`release_layout` acknowledged PSNs (from it)
:data:`CWND_IN`     a congestion window (to the retransmit tracker); :data:`QP_ERROR` a QP
                    gone to error (from it)
:data:`EV_FEEDBACK` what an EV experienced (to the path selector); :data:`PEER_STATUS` a
                    peer's port mask (the receive parser to the transmit half)
==================  ==========================================================================

Receive:

==================  ==========================================================================
:data:`DECAP_META`  a frame's outer header (the SRv6 remover to the RoCEv2 parser)
:data:`PKT_IN`      a packet's header fields (the parser, through memory protection, to the
                    PSN tracker); :data:`RX_PKT` the same with its RETH
:data:`NAK`         an AETH NAK to send (memory protection to the ACK generator)
:data:`EV_PROBE`    an EV probe request to answer (the receive parser to the ACK generator)
:data:`VERDICT`     the PSN tracker's verdict (:class:`Verdict`); :data:`VERDICT_IN` what the
                    parser is told of a held payload
:data:`PLACE`       a payload to write at its address (the parser to the user)
:data:`COMPLETION`  a WRITE-with-immediate completion (the PSN tracker to the user)
:data:`ACK_DESC`    a SACK or NACK to send (the PSN tracker to the ACK generator); also what
                    the receive parser finds in a received SACK or NACK
==================  ==========================================================================

Decisions kept here
    * The control frame leaves with the echoed ``entropy`` as its own 32-bit STEV (UDP
      source port and flow label, :func:`mrcnic.base.proto.stev_split`, halves swapped by
      the ACK generator's ``stev_swap`` as the receive parser's swapped them): a SACK returns
      on the reverse of the EV it acknowledges.
    * SETH/NETH ``src_id`` is the local QP index, ``dst_id`` the remote QP number's low 16
      bits (the ACK generator's context).
    * Every data packet carries METH and RETH, and a TSETH when MrcTx's
      ``timestamp.tseth`` register asks (off after reset). ``entropy`` is written as a
      32-bit STEV into the inner flow label and UDP source port
      (:func:`mrcnic.base.proto.stev_split`); in SRv6 modes it is the EV's index (spec §2.3).
    * Feedback names the EV by its *index* in the QP's EV set (0 .. ev_count - 1), never by
      its expanded bits, so the selector needs no reverse lookup. The EV of a SACK's
      feedback is the EV index the sender recorded when it last sent the PSN that triggered
      the SACK (CACK + ack_psn_offset); of a NACK's, the EV index recorded for the NACK PSN;
      of a timeout, the EV index of the PSN that timed out. The echoed entropy is not used
      to find the EV: in STEV and UDP modes it is the expanded EV, which has no cheap
      inverse.
    * Probe answers (a SACK with pr = 1) carry no PSN. The path selector keeps at most one
      probe outstanding per QP and applies a PROBE_* record to that probe's EV, and only when
      the record's ``entropy`` equals the 32-bit entropy the probe was sent with (otherwise
      the answer is stale: counted, ignored). For every other kind ``entropy`` is ignored.
    * Which NACK reasons are "resource" NACKs (no state change, §4): :data:`RESOURCE_NACKS`.
    * A peer's port status update (§4 "Ports": a 32-bit port mask) reaches the selector as
      a PEER_PORTS record of one of the QPs to that peer, the mask in ``entropy``: it
      applies to the QP's EV profile, so that every QP sharing the profile stops using the
      planes whose port is down at the far end.
"""

import enum

from amaranth.lib import data

from mrcnic.base import proto
from mrcnic.base.proto import NackCode, SackMode

__all__ = [
    "QP_INDEX_BITS", "EV_INDEX_BITS", "TIME_BITS", "TICK_NS", "TS_UNIT_NS", "MAX_PAYLOAD",
    # transmit
    "WR", "WR_DONE", "SEG_PKT", "REQUEST", "response_layout", "probe_layout", "TX_DESC",
    "PAYLOAD_REQ", "sent_layout", "rtx_layout", "release_layout", "RtxCause", "ErrorCause",
    "CWND_IN", "QP_ERROR",
    # path feedback
    "FeedbackKind", "EV_FEEDBACK", "RESOURCE_NACKS", "PROBE_KINDS", "PEER_STATUS",
    "sack_kind", "nack_kind", "ev_feedback_fields",
    # receive
    "DECAP_META", "PKT_IN", "RX_PKT", "NAK", "EV_PROBE", "Verdict", "VERDICT", "VERDICT_IN",
    "PLACE", "COMPLETION", "ACK_DESC", "ack_desc_fields",
]


# --- Identifiers and time --------------------------------------------------------------------

QP_INDEX_BITS = 16      # local QP index in descriptors and records (a block has <= 2^16 QPs)
EV_INDEX_BITS = 8       # an EV's index in its QP's set; ev_count <= 256
TIME_BITS = 32          # time base and send times, in ticks
TICK_NS = 1024          # decision: one tick of ``now`` is 1.024 us, the unit of §4
TS_UNIT_NS = 128        # the unit of the 16-bit timestamps (TSETH, PETH, CC_STATE, NETH)
MAX_PAYLOAD = 9216      # the largest payload a descriptor may ask for (a jumbo frame)


# --- Transmit --------------------------------------------------------------------------------

WR = data.StructLayout({
    "qp": QP_INDEX_BITS, "wr_id": 16, "va": 64, "rkey": 32, "length": 32, "imm": 32,
    "with_imm": 1,
})
WR_DONE = data.StructLayout({"qp": QP_INDEX_BITS, "wr_id": 16})

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
    "ts":         1,                  # a write carries a TSETH (BTH ts) with `timestamp`
    "timestamp":  16,                 # TSETH, or a probe's PETH, timestamp: 128 ns units
})

# A packet of a message as the segmenter makes it: the descriptor but its entropy (the path
# is not chosen yet), the tag it carries through the retransmit tracker (bits 7:0 its
# message's slot in the QP's ring, bits 8 and up the ring position's lap), where its payload
# is, and the EV a retransmission must avoid.
SEG_PKT = data.StructLayout({
    **{name: field.shape for name, field in TX_DESC
       if name not in ("entropy", "ts", "timestamp")},
    "tag": 32, "wr_id": 16, "offset": 32, "avoid": EV_INDEX_BITS,
})

REQUEST = data.StructLayout({
    "qp":    QP_INDEX_BITS,
    "psn":   proto.PSN_BITS,
    "rtx":   1,                   # a retransmission: never on ``avoid``
    "avoid": EV_INDEX_BITS,       # the EV the failed transmission used
})


def response_layout(ev_bits):
    """The path selector's answer to a :data:`REQUEST`."""
    return data.StructLayout({
        "qp":       QP_INDEX_BITS,
        "psn":      proto.PSN_BITS,
        "rtx":      1,
        "none":     1,            # no usable EV: nothing to send, retry later
        "ev":       EV_INDEX_BITS,
        "plane":    3,
        "entropy":  32,
        "expanded": ev_bits,      # the expanded EV, first wire bit most significant
    })


def probe_layout(ev_bits):
    """A probe, or a port status announcement, the path selector asks to be sent."""
    return data.StructLayout({
        "qp":       QP_INDEX_BITS,
        "ev":       EV_INDEX_BITS,
        "plane":    3,
        "entropy":  32,
        "expanded": ev_bits,
        "announce": 1,            # a port status update, not a probe
        "ports":    8,            # announce: this NIC's ports enabled and up, bit = plane
    })


PAYLOAD_REQ = data.StructLayout({"qp": QP_INDEX_BITS, "wr_id": 16, "offset": 32,
                                 "length": 16})


def sent_layout(tag_width=32):
    """One packet put on the wire (to the retransmit tracker)."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "psn": proto.PSN_BITS,
                              "ev": EV_INDEX_BITS, "time": TIME_BITS, "tag": tag_width,
                              "rtx": 1})


def rtx_layout(tag_width=32):
    """A retransmit request (from the retransmit tracker)."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "psn": proto.PSN_BITS, "tag": tag_width,
                              "ev": EV_INDEX_BITS,      # the EV that failed: avoid it
                              "cause": 2})              # RtxCause


def release_layout(tag_width=32):
    """PSNs ``first`` .. ``last`` acknowledged (from the retransmit tracker)."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "first": proto.PSN_BITS,
                              "last": proto.PSN_BITS, "tag": tag_width})   # tag of ``last``


class RtxCause(enum.IntEnum):
    NACK = 0        # NACK TRIMMED, TRIMMED_LASTHOP or resource
    HOLE = 1        # SACK hole past the reorder guard
    TIMEOUT = 2     # retransmit timeout


class ErrorCause(enum.IntEnum):
    NACK_FATAL = 0  # NACK 0x19 UNEXPECTED_EVENT
    RETRIES = 1     # retries exhausted


CWND_IN = data.StructLayout({"qp": QP_INDEX_BITS, "cwnd": 32})
# A round-trip time sample (MrcTx's ``rtt``): a SACK or NACK that echoes a timestamp this NIC
# sent (a probe's PETH, or a data packet's TSETH), ``rtt`` = the time base's timestamp at its
# arrival less the echoed one, modulo 2^16, in 128 ns units; ``entropy`` is the echoed EV
# (the SACK's or NACK's), ``probe`` marks a probe's answer.
RTT_SAMPLE = data.StructLayout({"qp": QP_INDEX_BITS, "entropy": 32, "probe": 1, "nack": 1,
                                "rtt": 16})
QP_ERROR = data.StructLayout({"qp": QP_INDEX_BITS, "cause": 2})     # ErrorCause


# --- Path feedback ---------------------------------------------------------------------------

class FeedbackKind(enum.IntEnum):
    """What happened to a packet (or probe) sent on an EV; §4 says what each does."""
    ACKED           = 0     # SACKed with M = NONE: no change
    SKIP_ONCE       = 1     # SACK M = SKIP_ONCE (ECN-marked): GOOD -> SKIP
    ALWAYS_SKIP     = 2     # SACK M = ALWAYS_SKIP: -> ASSUMED_BAD
    TRIMMED         = 3     # NACK TRIMMED: GOOD -> SKIP
    TRIMMED_LASTHOP = 4     # NACK TRIMMED_LASTHOP: no change
    RESOURCE        = 5     # NACK of RESOURCE_NACKS: no change
    TIMEOUT         = 6     # retransmit timeout with neither SACK nor trim: -> ASSUMED_BAD
    PROBE_GOOD      = 7     # probe answered with M = NONE: -> GOOD
    PROBE_SKIP      = 8     # probe answered with M = SKIP_ONCE: -> SKIP
    PROBE_BAD       = 9     # probe answered with M = ALWAYS_SKIP: stays ASSUMED_BAD
    PEER_PORTS      = 10    # the QP's peer reports its ports: bit p of ``entropy`` = port p
                            # up (the 32-bit port mask of §4 "Ports"); ``ev`` ignored


PROBE_KINDS = (FeedbackKind.PROBE_GOOD, FeedbackKind.PROBE_SKIP, FeedbackKind.PROBE_BAD)

FEEDBACK_KIND_BITS = 4

# NACK reasons that say "the receiver had no room", not "the path is bad".
RESOURCE_NACKS = (NackCode.NO_BITMAP, NackCode.NO_PKT_BUFFER, NackCode.NO_RESOURCE,
                  NackCode.PSN_OUT_OF_WINDOW)

EV_FEEDBACK = data.StructLayout({
    "qp":      QP_INDEX_BITS,
    "ev":      EV_INDEX_BITS,       # EV index in the QP's set (ignored for PROBE_* and
                                    # PEER_PORTS)
    "kind":    FEEDBACK_KIND_BITS,  # FeedbackKind
    "entropy": 32,                  # PROBE_* kinds: the echoed entropy of the answer;
                                    # PEER_PORTS: the peer's port mask
})

# A peer's port status update as the receive parser finds it (RoceRx ``peer``): the local
# QP it is for (ERTH dst_id) and the peer's port mask. The transmit half turns it
# into a PEER_PORTS record for the selector.
PEER_STATUS = data.StructLayout({"qp": QP_INDEX_BITS, "ports": 32})


def sack_kind(m, probe=False):
    """The :class:`FeedbackKind` of a SACK with SETH M = ``m`` (pr = ``probe``)."""
    m = SackMode(m)
    if probe:
        return {SackMode.NONE: FeedbackKind.PROBE_GOOD,
                SackMode.SKIP_ONCE: FeedbackKind.PROBE_SKIP,
                SackMode.ALWAYS_SKIP: FeedbackKind.PROBE_BAD}[m]
    return {SackMode.NONE: FeedbackKind.ACKED,
            SackMode.SKIP_ONCE: FeedbackKind.SKIP_ONCE,
            SackMode.ALWAYS_SKIP: FeedbackKind.ALWAYS_SKIP}[m]


def nack_kind(reason):
    """The :class:`FeedbackKind` of a NACK with ``reason``, or None when it says nothing of
    the path (UNEXPECTED_EVENT: the QP goes to error instead)."""
    if reason == NackCode.TRIMMED:
        return FeedbackKind.TRIMMED
    if reason == NackCode.TRIMMED_LASTHOP:
        return FeedbackKind.TRIMMED_LASTHOP
    if reason in RESOURCE_NACKS:
        return FeedbackKind.RESOURCE
    return None


def ev_feedback_fields():
    """``{name: width}`` of :data:`EV_FEEDBACK`, in layout order (for models and benches)."""
    return {name: field.width for name, field in EV_FEEDBACK}


# --- Receive ---------------------------------------------------------------------------------

DECAP_META = data.StructLayout({
    "mode":       3,      # EvMode.PASS, SRV6 or SRV6_SRH
    "dscp":       6,
    "ecn":        2,
    "flow_label": 20,
    "hop_limit":  8,
    "srh":        1,
    "residue":    128,    # outer destination address as received
    "bad":        1,
})

PKT_IN = data.StructLayout({
    "qp":        QP_INDEX_BITS,
    "psn":       proto.PSN_BITS,
    "opcode":    8,
    "ack_req":   1,
    "rtx":       1,
    "ce":        1,          # ECN CE on arrival
    "trimmed":   1,
    "lasthop":   1,          # trimmed at the last hop
    "length":    16,         # payload bytes
    "entropy":   32,
    "timestamp": 16,
    "imm":       32,
    "tag":       16,
})

RX_PKT = data.StructLayout({
    **{name: f.shape for name, f in PKT_IN},
    "va": 64, "rkey": 32, "dma_length": 32,
    "slot": 1,              # a payload is held: a verdict must come back quoting `tag`
})

NAK = data.StructLayout({"qp": 16, "psn": proto.PSN_BITS, "syndrome": 8})

# An EV probe request (ERTH op EP_EV_PROBE) to answer with an EETH: ``qp`` the local QP it
# names (ERTH dst_id: the context the answer's addresses come from), ``peer_id`` the
# requester's QP (ERTH src_id), the request's BTH ``psn``, ``entropy`` (its STEV, on which
# the answer returns, as a SACK's) and ``timestamp`` (echoed).
EV_PROBE = data.StructLayout({"qp": QP_INDEX_BITS, "peer_id": 16, "psn": proto.PSN_BITS,
                              "entropy": 32, "timestamp": 16})


class Verdict(enum.IntEnum):
    PLACE = 0
    DUPLICATE = 1
    OUT_OF_WINDOW = 2
    TRIMMED = 3
    NO_QP = 4
    BAD_OPCODE = 5
    NO_RESOURCE = 6
    PROBE = 7


VERDICT = data.StructLayout({"qp": QP_INDEX_BITS, "psn": proto.PSN_BITS, "verdict": 3,
                             "tag": 16})
VERDICT_IN = data.StructLayout({"tag": 16, "place": 1})
PLACE = data.StructLayout({"qp": 16, "psn": proto.PSN_BITS, "va": 64, "length": 16,
                           "tag": 16})
COMPLETION = data.StructLayout({"qp": QP_INDEX_BITS, "psn": proto.PSN_BITS, "imm": 32,
                                "tag": 16})

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
