"""Reference model of the receive PSN tracker (``PsnTracker``), packet by packet.

It keeps, per QP, the set of PSNs that arrived above CACK and applies spec §5 in the order
the block documents; it knows nothing of chunks, rings or pipelines. One call of
:meth:`PsnTrackerModel.packet` returns what the block emits for that packet: its verdict
record, the SACK or NACK descriptor (or None), and the WRITE-with-immediate completions it
releases, in order.
"""

from mrcnic.base import proto
from mrcnic.base.proto import NackCode, Opcode, SackMode, psn_add, psn_diff
from mrcnic.base.rules import SACK_BITMAP_BITS as BITMAP_BITS, SACK_OFFSET
from mrcnic.base.records import Verdict, ack_desc_fields

__all__ = ["PsnTrackerModel"]

_HALF = 1 << (proto.PSN_BITS - 1)


def _distance(a, b):
    """``a - b`` as a signed PSN distance (-2^23 .. 2^23 - 1)."""
    d = psn_diff(a, b)
    return d - (1 << proto.PSN_BITS) if d >= _HALF else d


def _signed16_or_zero(value):
    """``value`` (a signed PSN distance) as a 16-bit two's complement, or 0 if it does not fit."""
    if -(1 << 15) <= value < (1 << 15):
        return value & 0xFFFF
    return 0


class _Qp:
    def __init__(self, start_psn, mpr):
        self.cack = psn_add(start_psn, -1)
        self.hi = self.cack
        self.mpr = mpr
        self.got = set()         # PSNs above cack that arrived
        self.since = 0           # placed packets since the last SACK
        self.bytes = 0           # payload bytes placed, mod 2^32


class PsnTrackerModel:
    """Parameters as the block's (``qps``, ``mpr_max``, ``max_wimm_dest``), plus the
    ``sack_every`` register. Every QP starts open at PSN 0 with MPR = ``mpr_max``."""

    def __init__(self, qps=64, mpr_max=8, max_wimm_dest=8, sack_every=8):
        self.qps, self.mpr_max, self.max_wimm_dest = qps, mpr_max, max_wimm_dest
        self.sack_every = sack_every
        self.qp = {q: _Qp(0, mpr_max) for q in range(qps)}
        self.held = []           # (qp, psn, imm, tag) of WRITE-with-immediate not yet complete
        self.counts = {}

    def _count(self, name):
        self.counts[name] = self.counts.get(name, 0) + 1

    def open(self, qp, start_psn=0, mpr=None):
        """Set up ``qp`` to receive from ``start_psn``; its held completions are discarded."""
        mpr = self.mpr_max if mpr is None else mpr
        if not (0 <= qp < self.qps and 1 <= mpr <= self.mpr_max):
            raise ValueError(f"open qp {qp} mpr {mpr}: out of range")
        self.qp[qp] = _Qp(start_psn, mpr)
        self.held = [h for h in self.held if h[0] != qp]

    def close(self, qp):
        self.qp[qp] = None
        self.held = [h for h in self.held if h[0] != qp]

    def cack(self, qp):
        return self.qp[qp].cack

    # ----------------------------------------------------------------------------------------

    def _advance(self, s):
        while psn_add(s.cack, 1) in s.got:
            s.cack = psn_add(s.cack, 1)
            s.got.discard(s.cack)

    def _release(self, qp, s):
        done = [h for h in self.held if h[0] == qp and psn_diff(s.cack, h[1]) < _HALF]
        done.sort(key=lambda h: psn_diff(s.cack, h[1]), reverse=True)     # oldest PSN first
        self.held = [h for h in self.held if h not in done]
        return [{"qp": h[0], "psn": h[1], "imm": h[2], "tag": h[3]} for h in done]

    def _desc(self, qp, s, **fields):
        desc = dict.fromkeys(ack_desc_fields(), 0)
        desc.update(qp=qp, cack=s.cack, mpr=s.mpr, ooo_count=min(len(s.got), (1 << 15) - 1),
                    rcvd_bytes=(s.bytes >> 8) & 0xFFFFFF)
        desc.update(fields)
        return desc

    def _sack(self, qp, s, pkt, *, pr=0, trigger=None):
        s.since = 0
        bitmap = sum(1 << i for i in range(BITMAP_BITS)
                     if psn_add(s.cack, SACK_OFFSET + i) in s.got)
        offset = 0 if trigger is None else _signed16_or_zero(_distance(trigger, s.cack))
        self._count("sacks")
        return self._desc(qp, s, nack=0, ack_psn_offset=offset, sack_offset=SACK_OFFSET,
                          bitmap=bitmap, m=int(SackMode.SKIP_ONCE if pkt["ce"] else
                                               SackMode.NONE),
                          pr=pr, psn=0 if trigger is None else trigger,
                          entropy=pkt["entropy"], timestamp=pkt["timestamp"])

    def _nack(self, qp, s, pkt, reason):
        self._count("nacks")
        return self._desc(qp, s, nack=1, reason=int(reason), psn=pkt["psn"],
                          entropy=pkt["entropy"], timestamp=pkt["timestamp"])

    def packet(self, pkt):
        """``pkt``: a dict with the fields of ``PKT_IN``. Returns ``(verdict, desc, completions)``."""
        qp, psn = pkt["qp"], pkt["psn"]
        self._count("packets")

        def verdict(v):
            self._count(v.name.lower())
            return {"qp": qp, "psn": psn, "verdict": int(v), "tag": pkt["tag"]}

        s = self.qp.get(qp) if qp < self.qps else None
        if s is None:
            return verdict(Verdict.NO_QP), None, []
        op = pkt["opcode"]
        if op == Opcode.PROBE:
            return verdict(Verdict.PROBE), self._sack(qp, s, pkt, pr=1), []
        if pkt["trimmed"]:
            reason = NackCode.TRIMMED_LASTHOP if pkt["lasthop"] else NackCode.TRIMMED
            return verdict(Verdict.TRIMMED), self._nack(qp, s, pkt, reason), []
        if not (Opcode.WRITE_FIRST <= op <= Opcode.WRITE_ONLY_IMM):
            return verdict(Verdict.BAD_OPCODE), None, []

        d = psn_diff(psn, s.cack)
        if d == 0 or d >= _HALF or psn in s.got:
            return verdict(Verdict.DUPLICATE), self._sack(qp, s, pkt, trigger=psn), []
        if d > s.mpr * proto.MPR_UNIT_PSNS:
            return (verdict(Verdict.OUT_OF_WINDOW),
                    self._nack(qp, s, pkt, NackCode.PSN_OUT_OF_WINDOW), [])

        wimm = op in (Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM)
        immediate = d == 1
        if wimm and not immediate and len(self.held) >= self.max_wimm_dest:
            return verdict(Verdict.NO_RESOURCE), self._nack(qp, s, pkt, NackCode.NO_RESOURCE), []

        # Placed.
        new_hole = psn_diff(psn, s.hi) > 1 and psn_diff(psn, s.hi) < _HALF
        # Fills the lowest hole with later PSNs already there: CACK will move past it.
        fills = d == 1 and psn_add(psn, 1) in s.got
        if psn_diff(psn, s.hi) < _HALF:
            s.hi = psn
        s.got.add(psn)
        s.bytes = (s.bytes + pkt["length"]) & 0xFFFFFFFF
        completions = []
        if wimm and immediate:
            completions.append({"qp": qp, "psn": psn, "imm": pkt["imm"], "tag": pkt["tag"]})
        elif wimm:
            self.held.append((qp, psn, pkt["imm"], pkt["tag"]))
        self._advance(s)
        if wimm and immediate:
            self._count("completions")
        released = self._release(qp, s)
        for _ in released:
            self._count("completions")
        completions += released

        s.since += 1
        due = (pkt["ack_req"] or pkt["rtx"] or pkt["ce"] or new_hole or fills
               or (self.sack_every and s.since >= self.sack_every))
        v = verdict(Verdict.PLACE)
        return v, (self._sack(qp, s, pkt, trigger=psn) if due else None), completions


def random_arrivals(rng, n, *, qps=4, qp_list=None, start=None, spread=40, loss=0.02,
                    dup=0.01, trim=0.01, ce=0.02, ack_req=0.02, imm=0.3, stray=0.005):
    """``n`` PKT_IN records as a receiver sees them: each QP's PSNs sent in order from
    ``start[qp]`` (default 0), each arriving up to ``spread`` packets late, lost ones (and
    trimmed ones) sent again later with rtx = 1, some duplicated; messages of 1-4 packets,
    ``imm`` of them WRITE-with-immediate; a ``stray`` share of records that are wrong (a
    PSN far out of the window, an unknown QP, a bad opcode, a probe)."""
    qp_list = list(range(qps)) if qp_list is None else list(qp_list)
    start = start or {}
    nxt = {q: start.get(q, 0) for q in qp_list}
    left = {q: 0 for q in qp_list}          # packets left in the current message
    msg_imm = {q: False for q in qp_list}
    events = []                             # (arrival time, order, record)

    def rec(q, psn, opcode, **kw):
        r = {"qp": q, "psn": psn, "opcode": int(opcode), "ack_req": 0, "rtx": 0, "ce": 0,
             "trimmed": 0, "lasthop": 0, "length": rng.randrange(1, 4097),
             "entropy": rng.getrandbits(32), "timestamp": rng.getrandbits(16),
             "imm": rng.getrandbits(32) if opcode in (Opcode.WRITE_LAST_IMM,
                                                      Opcode.WRITE_ONLY_IMM) else 0,
             "tag": rng.getrandbits(16)}
        r.update(kw)
        return r

    t = 0
    while len(events) < n:
        q = rng.choice(qp_list)
        t += 1
        if rng.random() < stray:
            kind = rng.randrange(4)
            if kind == 0:
                r = rec(q, psn_add(nxt[q], rng.randrange(2000, 1 << 22)), Opcode.WRITE_MIDDLE)
            elif kind == 1:
                r = rec(rng.randrange(qps, 1 << 16), rng.getrandbits(24), Opcode.WRITE_ONLY)
            elif kind == 2:
                r = rec(q, nxt[q], rng.choice([Opcode.ACK, Opcode.SACK, 0x00, 0x64]))
            else:
                r = rec(q, 0, Opcode.PROBE, length=0)
            events.append((t, len(events), r))
            continue
        psn = nxt[q]
        nxt[q] = psn_add(psn, 1)
        if left[q] == 0:
            left[q] = rng.randrange(1, 5)
            msg_imm[q] = rng.random() < imm
            first = True
        else:
            first = False
        left[q] -= 1
        last = left[q] == 0
        if first and last:
            op = Opcode.WRITE_ONLY_IMM if msg_imm[q] else Opcode.WRITE_ONLY
        elif first:
            op = Opcode.WRITE_FIRST
        elif last:
            op = Opcode.WRITE_LAST_IMM if msg_imm[q] else Opcode.WRITE_LAST
        else:
            op = Opcode.WRITE_MIDDLE
        r = rec(q, psn, op, ack_req=int(rng.random() < ack_req), ce=int(rng.random() < ce))
        arrive = t + rng.randrange(spread + 1)
        fate = rng.random()
        if fate < loss or fate < loss + trim:
            if fate >= loss:                # trimmed: the header arrives, NACKed
                events.append((arrive, len(events),
                               {**r, "trimmed": 1, "lasthop": rng.randrange(2)}))
            again = arrive + spread + rng.randrange(spread + 1)
            events.append((again, len(events), {**r, "rtx": 1}))
        else:
            events.append((arrive, len(events), r))
            if rng.random() < dup:
                events.append((arrive + rng.randrange(2 * spread + 1), len(events), r))
    events.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in events[:n]]
