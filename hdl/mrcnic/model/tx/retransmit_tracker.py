"""Reference model of the sender's reliability block (``RetransmitTracker``), event by event.

Per QP it keeps CACK, the next PSN, the set of PSNs SACKed above CACK, the highest
acknowledged PSN, the hole mark and the per-PSN records as Python sets and dicts, and one
set, shared by all QPs and at most ``pending`` long, of the (QP, PSN) whose retransmission
was requested and not yet resent (:data:`~mrcnic.tx.retransmit_tracker.PENDING_RULE`); it
knows nothing of words, banks, laps, slots or pipelines. :meth:`RetransmitTrackerModel.sent`,
:meth:`~RetransmitTrackerModel.ack` and :meth:`~RetransmitTrackerModel.scan` return what
the block emits for that event, per output stream, in order.

:func:`closed_loop` runs a whole connection at model level (sender, lossy reordering
channel, the receiver's :class:`~mrcnic.model.rx.psn_tracker.PsnTrackerModel`, this model
deciding the retransmissions) and returns the sender's input events, for the tests.
"""

from mrcnic.base import proto
from mrcnic.base.records import FeedbackKind, nack_kind, sack_kind, ErrorCause, RtxCause
from mrcnic.base.proto import NackCode, Opcode, SackMode, psn_add, psn_diff
from mrcnic.base.rules import (
    RETRANSMIT_COUNTER_NAMES as COUNTER_NAMES, RETRY_FOREVER, timeout_ticks)
from mrcnic.model.rx.psn_tracker import PsnTrackerModel

__all__ = ["RetransmitTrackerModel", "closed_loop", "OUTPUTS"]

HALF = 1 << (proto.PSN_BITS - 1)
OUTPUTS = ("rtx", "feedback", "release", "qp_error")
TIME_MASK = (1 << 32) - 1
TIME_ORIGIN = 1 << 20       # closed_loop's send times with a time guard: step - this


def _after(a, b):
    return 0 < psn_diff(a, b) < HALF


def _signed16(v):
    return v - (1 << 16) if v >= 1 << 15 else v


def _clamp(d):
    """A PSN distance as a position in the two 64-PSN words a SACK covers (0 .. 128)."""
    return 0 if d >= HALF else min(d, 128)


class _Qp:
    def __init__(self, start, mpr):
        self.cack = psn_add(start, -1)
        self.nxt = start
        self.hi = self.cack
        self.mark = start
        self.mpr = mpr
        self.cwnd = (1 << 32) - 1
        self.err = False
        self.retries = 0
        self.sacked = set()      # PSNs after CACK acknowledged by a bitmap
        self.rec = {}            # psn -> [ev, time, tag, rtx] for the last `outstanding` sent
        self.fired = {}          # psn -> (time, rtx) of the transmission that timed out


class RetransmitTrackerModel:
    """Parameters as the block's, plus the registers it reads."""

    def __init__(self, qps=64, outstanding=1024, tag_width=32, pending=16, *,
                 reorder_guard=3, timeout_exp=7, retry_linear=7, retry_max=RETRY_FOREVER,
                 pmtu_log2=12, initial_mpr=8, reorder_time=0):
        self.qps, self.outstanding, self.tag_width = qps, outstanding, tag_width
        self.pending_max = pending
        self.pending = set()     # (qp, psn): retransmission requested, not yet resent
        self.reorder_guard, self.timeout_exp = reorder_guard, timeout_exp
        self.reorder_time = reorder_time
        self.retry_linear, self.retry_max = retry_linear, retry_max
        self.pmtu_log2, self.initial_mpr = pmtu_log2, initial_mpr
        self.q = {i: _Qp(0, initial_mpr) for i in range(qps)}
        self.counts = dict.fromkeys(COUNTER_NAMES, 0)

    def _count(self, name, k=1):
        self.counts[name] += k

    def open(self, qp, start=0):
        self.q[qp] = _Qp(start, self.initial_mpr)
        self._forget(qp)

    # --- requests made and not yet resent ---------------------------------------------------

    def _forget(self, qp, upto=None):
        """Drop the QP's pending entries (those at or before ``upto`` only, when given)."""
        self.pending = {(q, p) for q, p in self.pending
                        if q != qp or (upto is not None and _after(p, upto))}

    def _remember(self, qp, psn):
        if (qp, psn) in self.pending:
            return
        if len(self.pending) >= self.pending_max:
            self._count("pending_full")
        else:
            self.pending.add((qp, psn))

    def acked(self, qp, psn):
        s = self.q[qp]
        return not _after(psn, s.cack) or psn in s.sacked

    # --- credit ---------------------------------------------------------------------------

    def credit(self, qp):
        if not 0 <= qp < self.qps:
            return False
        s = self.q[qp]
        out = psn_diff(s.nxt, s.cack)
        return (not s.err and out <= s.mpr * proto.MPR_UNIT_PSNS and out <= self.outstanding
                and (out << self.pmtu_log2) <= s.cwnd)

    def set_cwnd(self, qp, cwnd):
        if 0 <= qp < self.qps:
            self.q[qp].cwnd = cwnd
        else:
            self._count("no_qp")

    # --- sent records -----------------------------------------------------------------------

    def sent(self, r):
        qp, psn = r["qp"], r["psn"]
        if not 0 <= qp < self.qps:
            self._count("no_qp")
            return
        s = self.q[qp]
        if s.err:
            self._count("in_error")
            return
        if not r["rtx"] and psn == s.nxt:
            if psn_diff(s.nxt, s.cack) > self.outstanding:
                self._count("sent_ring_full")
                return
            if not self.credit(qp):
                self._count("sent_over_credit")
            s.rec[psn] = [r["ev"], r["time"], r["tag"], 0]
            s.rec.pop(psn_add(psn, -self.outstanding), None)
            s.fired.pop(psn, None)
            s.nxt = psn_add(psn, 1)
            self._count("sent_new")
        elif r["rtx"] and _after(psn, s.cack) and _after(s.nxt, psn):
            s.rec[psn][0:2] = [r["ev"], r["time"]]
            s.rec[psn][3] = 1
            self.pending.discard((qp, psn))
            self._count("sent_rtx")
        elif r["rtx"] and not _after(psn, s.cack):
            self._count("sent_acked")
        else:
            self._count("sent_bad")

    # --- SACK / NACK --------------------------------------------------------------------------

    def ack(self, a):
        out = {name: [] for name in OUTPUTS}
        qp = a["qp"]
        if not 0 <= qp < self.qps:
            self._count("no_qp")
            return out
        s = self.q[qp]
        if s.err:
            self._count("in_error")
            return out
        if a["nack"]:
            self._nack(qp, s, a, out)
        else:
            self._sack(qp, s, a, out)
        return out

    def _nack(self, qp, s, a, out):
        reason, psn = a["reason"], a["psn"]
        if reason == NackCode.UNEXPECTED_EVENT:
            self._count("nack_fatal")
            s.err = True
            self._forget(qp)
            out["qp_error"].append({"qp": qp, "cause": int(ErrorCause.NACK_FATAL)})
            return
        kind = nack_kind(reason)
        if kind is None:
            self._count("nack_unknown")
            return
        if not _after(s.nxt, psn):
            self._count("nack_unsent")
            return
        if self.acked(qp, psn):
            self._count("nack_acked")
            return
        ev, _, tag, _ = s.rec[psn]
        self._count("nacks")
        self._count("feedback")
        if (qp, psn) in self.pending:
            self._count("rtx_pending_skip")
        else:
            self._count("rtx_nack")
            out["rtx"].append({"qp": qp, "psn": psn, "tag": tag, "ev": ev,
                               "cause": int(RtxCause.NACK)})
            self._remember(qp, psn)
        out["feedback"].append({"qp": qp, "ev": ev, "kind": int(kind),
                                "entropy": a["entropy"]})

    def _sack(self, qp, s, a, out):
        C = a["cack"]
        if psn_diff(C, s.cack) >= HALF:
            self._count("sack_stale")
            return
        base = psn_add(C, _signed16(a["sack_offset"]))
        bits = [psn_add(base, i) for i in range(64) if a["bitmap"] >> i & 1]
        if not _after(s.nxt, C) or any(not _after(s.nxt, p) for p in bits):
            self._count("sack_unsent")
            return
        self._count("sacks")
        old_cack = s.cack
        new = [p for p in bits if _after(p, C)]
        advance = _after(C, s.cack)
        changed = advance or any(p not in s.sacked for p in new)
        s.sacked.update(new)
        if advance:
            s.cack = C
            s.sacked = {p for p in s.sacked if _after(p, C)}
            s.retries = 0
            self._forget(qp, upto=C)
        s.mpr = a["mpr"]
        for p in [C] + new:
            if _after(p, s.hi):
                s.hi = p
        # Holes within the two words this SACK covers.
        p0 = base & ~63
        lo = _clamp(psn_diff(psn_add(s.cack, 1), p0))
        mk = _clamp(psn_diff(s.mark, p0))
        hl = _clamp(psn_diff(s.nxt, p0))
        end = min(_clamp(psn_diff(psn_add(s.hi, 1 - self.reorder_guard), p0)), hl)
        start = max(lo, mk)
        holes = [psn_add(p0, j) for j in range(start, end)
                 if psn_add(p0, j) not in s.sacked]
        if end > start:
            s.mark = psn_add(p0, end)
        trig = psn_add(C, _signed16(a["ack_psn_offset"]))
        # The trigger's record: among the last `outstanding` sent since the QP's open (a PSN
        # before its first since the open has none).
        trig_ok = psn_diff(psn_add(s.nxt, -1), trig) < self.outstanding and trig in s.rec
        if not changed:
            self._count("sack_duplicate")
        else:
            if not a["pr"] and trig_ok:
                m = a["m"] if a["m"] in (0, 1, 2) else 0
                self._count("feedback")
                out["feedback"].append({"qp": qp, "ev": s.rec[trig][0],
                                        "kind": int(sack_kind(SackMode(m))),
                                        "entropy": a["entropy"]})
        if advance:
            self._count("releases")
            out["release"].append({"qp": qp, "first": psn_add(old_cack, 1), "last": C,
                                   "tag": s.rec[C][2]})
        young = None
        for p in holes:
            if self._young(s, p, trig, trig_ok):
                self._count("hole_young")
                if young is None:
                    young = s.mark = p
                continue
            if (qp, p) in self.pending:
                self._count("rtx_pending_skip")
                continue
            self._count("rtx_hole")
            out["rtx"].append({"qp": qp, "psn": p, "tag": s.rec[p][2], "ev": s.rec[p][0],
                               "cause": int(RtxCause.HOLE)})
            self._remember(qp, p)

    def _young(self, s, psn, trig, trig_ok):
        """The time guard (:data:`~mrcnic.tx.retransmit_tracker.TIME_RULE`): a hole sent less
        than ``reorder_time`` ticks before the SACK's trigger PSN (or after it, or with no
        record of the trigger) is not taken for lost yet."""
        if not self.reorder_time:
            return False
        if not trig_ok:
            return True
        d = (s.rec[trig][1] - s.rec[psn][1]) & TIME_MASK
        d = d - (1 << 32) if d >> 31 else d
        return d < self.reorder_time

    # --- timers -------------------------------------------------------------------------------

    def scan(self, now, qps=None):
        """One visit of every QP (in the order ``qps``, default 0 .. qps-1) by the timer at
        time ``now``, with nothing else happening meanwhile."""
        out = {name: [] for name in OUTPUTS}
        for qp in (range(self.qps) if qps is None else qps):
            s = self.q[qp]
            p = psn_add(s.cack, 1)
            while not s.err and _after(s.nxt, p):
                ev, time, tag, rtx = s.rec[p]
                to = timeout_ticks(self.timeout_exp, s.retries, self.retry_linear)
                if (not self.acked(qp, p) and (now - time) & TIME_MASK >= to
                        and s.fired.get(p) != (time, rtx) and (qp, p) not in self.pending):
                    head = p == psn_add(s.cack, 1)
                    if head and s.retries == self.retry_max < RETRY_FOREVER:
                        s.err = True
                        self._forget(qp)
                        self._count("retries_exhausted")
                        out["qp_error"].append({"qp": qp, "cause": int(ErrorCause.RETRIES)})
                        break
                    s.fired[p] = (time, rtx)
                    if head:
                        s.retries = min(31, s.retries + 1)
                    self._count("rtx_timeout")
                    self._count("feedback")
                    out["rtx"].append({"qp": qp, "psn": p, "tag": tag, "ev": ev,
                                       "cause": int(RtxCause.TIMEOUT)})
                    out["feedback"].append({"qp": qp, "ev": ev,
                                            "kind": int(FeedbackKind.TIMEOUT), "entropy": 0})
                    self._remember(qp, p)
                p = psn_add(p, 1)
        return out


# --- Traffic for the tests ---------------------------------------------------------------------

def closed_loop(rng, n_events, *, qps=4, outstanding=128, tag_width=32, loss=0.03,
                trim=0.02, dup=0.02, ack_loss=0.05, ack_dup=0.03, spread=12, ce=0.03,
                ack_req=0.1, stray=0.02, reorder_guard=3, pending=16, rtx_lag=0,
                reorder_time=0):
    """A sender on ``qps`` QPs talking to a receiver through a channel that loses, trims,
    duplicates and reorders data packets and loses, duplicates and reorders SACKs/NACKs.
    The sender sends new PSNs while it has credit and resends what this model requests
    (on another EV), each request after 0 .. ``rtx_lag`` steps (so that SACKs and NACKs
    arrive while a resend is pending), at most one resend per step, oldest first; the
    tracker here has ``pending`` entries in its table. Returns the sender's input events
    in order: ``("sent", record)`` and ``("ack", desc, sent_before)`` where
    ``sent_before`` is how many sent records came before it (an ack must not be fed
    before them). A ``stray`` share of acks is wrong on
    purpose: replayed stale SACKs, unknown QPs, SACKs of unsent PSNs, NACKs for acked
    PSNs, unknown NACK reasons. With ``reorder_time``, the tracker here has that time
    guard and each record's send time is its step, less :data:`TIME_ORIGIN` (so that a
    time base left at 0 sees every send in the past, by less than 2^21 ticks); otherwise
    every send time is 0."""
    tracker = RetransmitTrackerModel(qps, outstanding, tag_width, pending,
                                     reorder_guard=reorder_guard, reorder_time=reorder_time)
    rx = PsnTrackerModel(qps=qps, mpr_max=8, max_wimm_dest=8, sack_every=4)
    events, n_sent = [], 0
    in_flight = []               # (time, order, kind, payload)
    order = 0
    old_acks = []
    rtx_queue = []
    t = 0
    tag_mask = (1 << tag_width) - 1

    def send(rec):
        nonlocal n_sent, order
        if reorder_time:
            rec["time"] = (t - TIME_ORIGIN) & TIME_MASK
        events.append(("sent", rec))
        n_sent += 1
        tracker.sent(rec)
        fate = rng.random()
        pkt = {"qp": rec["qp"], "psn": rec["psn"], "opcode": int(Opcode.WRITE_MIDDLE),
               "ack_req": int(rng.random() < ack_req), "rtx": rec["rtx"],
               "ce": int(rng.random() < ce), "trimmed": 0, "lasthop": 0, "length": 1024,
               "entropy": rec["ev"], "timestamp": 0, "imm": 0, "tag": 0}
        if fate < loss:
            return
        if fate < loss + trim:
            pkt["trimmed"] = 1
            pkt["lasthop"] = rng.randrange(2)
        for _ in range(2 if rng.random() < dup else 1):
            order += 1
            in_flight.append((t + rng.randrange(spread + 1), order, "data", pkt))

    def deliver_ack(desc):
        nonlocal order
        if rng.random() < ack_loss:
            return
        for _ in range(2 if rng.random() < ack_dup else 1):
            order += 1
            in_flight.append((t + rng.randrange(spread + 1), order, "ack", desc))

    def feed_ack(desc):
        events.append(("ack", desc, n_sent))
        out = tracker.ack(desc)
        for r in out["rtx"]:
            rtx_queue.append((t + rng.randrange(rtx_lag + 1) if rtx_lag else t, r))

    while len(events) < n_events:
        t += 1
        # Deliver what is due.
        in_flight.sort()
        while in_flight and in_flight[0][0] <= t:
            _, _, kind, payload = in_flight.pop(0)
            if kind == "data":
                _, desc, _ = rx.packet(payload)
                if desc is not None:
                    deliver_ack(desc)
            else:
                feed_ack(payload)
                old_acks.append(payload)
        if rng.random() < stray and old_acks:
            kind = rng.randrange(5)
            base = dict(rng.choice(old_acks))
            if kind == 0:                                   # replayed, maybe stale
                feed_ack(base)
            elif kind == 1:                                 # unknown QP
                feed_ack({**base, "qp": qps + rng.randrange(4)})
            elif kind == 2 and not base["nack"]:            # acknowledges unsent PSNs
                q = base["qp"]
                feed_ack({**base, "cack": tracker.q[q].cack, "sack_offset": 1,
                          "bitmap": 1 << rng.randrange(40, 64) | base["bitmap"]})
            elif kind == 3:                                 # NACK for an acked PSN
                q = base["qp"]
                feed_ack({**base, "nack": 1, "reason": int(NackCode.TRIMMED),
                          "psn": psn_add(tracker.q[q].cack, -rng.randrange(3))})
            else:                                           # unknown reason
                feed_ack({**base, "nack": 1, "reason": rng.choice([0x00, 0x03, 0x20])})
        # Send: retransmissions first, then one new PSN on a QP with credit.
        due = [i for i, (at, _) in enumerate(rtx_queue) if at <= t]
        if due:
            _, r = rtx_queue.pop(due[0])
            q = r["qp"]
            if not tracker.acked(q, r["psn"]) and _after(tracker.q[q].nxt, r["psn"]):
                send({"qp": q, "psn": r["psn"], "ev": (r["ev"] + 1 + rng.randrange(7)) & 255,
                      "time": 0, "tag": r["tag"], "rtx": 1})
        q = rng.randrange(qps)
        if tracker.credit(q) and rng.random() < 0.8:
            s = tracker.q[q]
            send({"qp": q, "psn": s.nxt, "ev": rng.randrange(256), "time": 0,
                  "tag": rng.getrandbits(tag_width) & tag_mask, "rtx": 0})
        elif not in_flight and not rtx_queue:
            # Stuck on a loss the SACKs cannot show (no PSN past it): resend the oldest.
            for q2 in range(qps):
                s = tracker.q[q2]
                p = psn_add(s.cack, 1)
                if _after(s.nxt, p):
                    send({"qp": q2, "psn": p, "ev": rng.randrange(256), "time": 0,
                          "tag": s.rec[p][2], "rtx": 1})
                    break
    return events[:n_events]
