"""Decisions a block and its reference model share, declared once.

A block's gateware and its model (:mod:`mrcnic.model`) are written independently of each
other; what they must agree on beyond the wire formats (:mod:`mrcnic.base.proto`) and the
records (:mod:`mrcnic.base.records`) is here: register defaults the model starts from, the
scan order's step, the SACK window's base, the retransmit timeout's formula and the names of
the retransmit tracker's counters. The gateware imports these, the models import these, and
neither imports the other.
"""

from mrcnic.base import proto
from mrcnic.base.proto import EvState
from mrcnic.base.records import TIME_BITS

__all__ = ["EVENT_MASK_DEFAULT", "RESEED_MULT", "SACK_OFFSET", "SACK_BITMAP_BITS",
           "RETRY_FOREVER", "MAX_TIMEOUT_EXP", "timeout_ticks", "RETRANSMIT_COUNTERS",
           "RETRANSMIT_COUNTER_NAMES"]


# --- Path selector -------------------------------------------------------------------------

# The EV state changes reported as events by default: into GOOD and into ASSUMED_BAD.
EVENT_MASK_DEFAULT = (1 << EvState.GOOD) | (1 << EvState.ASSUMED_BAD)
RESEED_MULT = 5                # seed' = 5 x seed + stride: full period for an odd stride


# --- PSN tracker ---------------------------------------------------------------------------

SACK_OFFSET = 1                # decision: SACK_BASE = CACK + 1, the lowest hole
SACK_BITMAP_BITS = proto.SETH.width("bitmap")


# --- Retransmit tracker --------------------------------------------------------------------

RETRY_FOREVER = 25             # retry_max = 25: retransmit without end (§4)
MAX_TIMEOUT_EXP = TIME_BITS - 2     # backoff stops doubling at 2^30 ticks


def timeout_ticks(t, retries, retry_linear):
    """The timeout after ``retries`` timeouts of a QP's oldest PSN, in ticks (the model's
    and the docs' formula; the gateware computes the same)."""
    exp = t + max(0, retries - retry_linear)
    return 1 << min(exp, MAX_TIMEOUT_EXP)


RETRANSMIT_COUNTERS = [
    ("sent_new", "New PSNs recorded"),
    ("sent_rtx", "Retransmissions recorded"),
    ("sent_bad", "Sent records neither the next PSN nor an outstanding one: ignored"),
    ("sent_acked", "Retransmissions of a PSN at or before CACK: ignored"),
    ("sent_ring_full", "New PSNs refused: outstanding PSNs of the QP at the limit"),
    ("sent_over_credit", "New PSNs recorded although the QP had no credit"),
    ("sacks", "SACKs applied (not ignored)"),
    ("sack_stale", "SACKs with CACK before the stored CACK (stale, moving backwards): "
                   "ignored"),
    ("sack_unsent", "SACKs acknowledging a PSN never sent: ignored"),
    ("sack_duplicate", "SACKs that acknowledged nothing new"),
    ("nacks", "NACKs for an outstanding PSN: a request made (rtx_nack) or skipped as "
              "pending (rtx_pending_skip)"),
    ("nack_acked", "NACKs for a PSN already acknowledged: ignored"),
    ("nack_unsent", "NACKs for a PSN never sent: ignored"),
    ("nack_unknown", "NACKs with an unknown reason: ignored"),
    ("nack_fatal", "NACKs 0x19 (QP to error)"),
    ("no_qp", "Records (sent, ack, cwnd) for a QP index >= qps: ignored"),
    ("in_error", "Sent and ack records for a QP in error: ignored"),
    ("releases", "Release records"),
    ("feedback", "Feedback records"),
    ("rtx_nack", "Retransmit requests from NACKs"),
    ("rtx_hole", "Retransmit requests from SACK holes"),
    ("rtx_timeout", "Retransmit requests from timeouts"),
    ("retries_exhausted", "QPs put in error by retry exhaustion"),
    ("scan_visits", "QP visits of the timer scan"),
    ("scan_yields", "Cycles the timer scan gave up to the SACK path or a full FIFO"),
    ("rtx_pending_skip", "Hole and NACK requests not made: the PSN's retransmission is "
                         "already requested and not yet resent"),
    ("pending_full", "Retransmit requests made but not remembered as pending: the "
                     "pending table was full"),
    ("hole_young", "Holes past the reorder guard not requested yet: sent less than "
                   "reorder_time before the SACK's trigger PSN"),
]
RETRANSMIT_COUNTER_NAMES = [name for name, _ in RETRANSMIT_COUNTERS]
