"""Path feedback: what the transmit side learns about an EV, for the path selector.

:class:`mrcnic.retransmit_tracker.RetransmitTracker` (SACKs, NACKs, timeouts) and the receive
side (probe answers) write one :data:`EV_FEEDBACK` record per observation;
:class:`mrcnic.path_selector.PathSelector` applies the EV state transitions of spec §4 to it.
The record names the EV by its *index* in the QP's EV set (0 .. ev_count - 1), never by its
expanded bits, so the selector needs no reverse lookup.

Decisions kept here
    * The EV of a SACK's feedback is the EV index the sender recorded when it last sent the
      PSN that triggered the SACK (CACK + ack_psn_offset); of a NACK's, the EV index recorded
      for the NACK PSN; of a timeout, the EV index of the PSN that timed out. The echoed
      entropy is not used to find the EV: in STEV and UDP modes it is the expanded EV, which
      has no cheap inverse.
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

from .ack_desc import QP_INDEX_BITS
from .proto import NackCode, SackMode

__all__ = ["FeedbackKind", "EV_FEEDBACK", "EV_INDEX_BITS", "RESOURCE_NACKS", "PROBE_KINDS",
           "PEER_STATUS",
           "sack_kind", "nack_kind", "ev_feedback_fields"]

EV_INDEX_BITS = 8       # an EV's index in its QP's set; ev_count <= 256


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
# QP it is for (PORT_STATUS dst_id) and the peer's port mask. The transmit half turns it
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
