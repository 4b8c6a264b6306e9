"""Reference model of receive memory protection (``MemoryProtect``), record by record.

A region table (R_Key -> base, length, writable, protection domain), a protection domain and
an error flag per QP, and the counters. :meth:`MemoryProtectModel.record` takes one
``RX_PKT`` record (a dict) and returns ``(out, nak)``: the record with ``deny`` added, and
the NAK record (a dict ``{qp, psn, syndrome}``) or None. The table operations return False
and set a flag in :attr:`MemoryProtectModel.errors` when their index is out of range,
changing nothing. Plain integers, exact arithmetic: no pipelines, no bit widths but the
fields'. The rules: a QP index >= ``qps`` passes; a QP in error has every record denied
(``qp_in_error``, no NAK); a WRITE (0xC6..0xCB) not trimmed is checked against the
lowest-indexed valid region with its R_Key (``unknown_rkey``), its domain (``pd_mismatch``),
its write permission (``read_only``) and base <= va, va + length <= min(base + region
length, 2^64) (``out_of_range``); the first failure denies, NAKs (syndrome 0x62) and puts
the QP in error.
"""

import copy

from mrcnic.base import proto

__all__ = ["MemoryProtectModel", "CAUSES", "COUNTERS", "apply_op", "random_setup",
           "random_records"]

CAUSES = ["unknown_rkey", "pd_mismatch", "read_only", "out_of_range"]
COUNTERS = ["records", "checked", "denied", *CAUSES, "qp_in_error", "naks"]
WRITES = range(0xC6, 0xCC)


class MemoryProtectModel:
    def __init__(self, regions=16, qps=64):
        self.regions, self.qps = regions, qps
        self.table = [None] * regions          # None or dict(rkey, base, length, writable, pd)
        self.pd = [0] * qps
        self.error = [False] * qps
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.errors = {"bad_region": False, "bad_qp": False}

    def copy(self):
        return copy.deepcopy(self)

    # --- Table operations ---

    def _refused(self, value, limit, error):
        """True (and ``error`` set) when ``value`` is not below ``limit``: the command is
        refused and writes nothing."""
        if 0 <= value < limit:
            return False
        self.errors[error] = True
        return True

    def write_region(self, index, rkey, base, length, writable, pd):
        if self._refused(index, self.regions, "bad_region"):
            return False
        self.table[index] = {"rkey": rkey, "base": base, "length": length,
                             "writable": bool(writable), "pd": pd}
        return True

    def invalidate(self, index):
        if self._refused(index, self.regions, "bad_region"):
            return False
        self.table[index] = None
        return True

    def set_pd(self, qp, pd):
        if self._refused(qp, self.qps, "bad_qp"):
            return False
        self.pd[qp] = pd
        return True

    def clear_error(self, qp):
        if self._refused(qp, self.qps, "bad_qp"):
            return False
        self.error[qp] = False
        return True

    def in_error(self, qp):
        return 0 <= qp < self.qps and self.error[qp]

    def clear_counts(self):
        self.counts = dict.fromkeys(COUNTERS, 0)

    # --- Records ---

    def lookup(self, rkey):
        """The lowest-indexed valid region with ``rkey``, or None."""
        for entry in self.table:
            if entry is not None and entry["rkey"] == rkey:
                return entry
        return None

    def cause(self, rec):
        """Why a checked WRITE is refused (a name from :data:`CAUSES`), or None."""
        region = self.lookup(rec["rkey"])
        if region is None:
            return "unknown_rkey"
        if region["pd"] != self.pd[rec["qp"]]:
            return "pd_mismatch"
        if not region["writable"]:
            return "read_only"
        start, end = rec["va"], rec["va"] + rec["length"]
        limit = min(region["base"] + region["length"], 1 << 64)    # nothing wraps past 2^64
        if start < region["base"] or end > limit:
            return "out_of_range"
        return None

    def record(self, rec):
        c = self.counts
        c["records"] += 1
        qp = rec["qp"]
        deny, nak = 0, None
        if qp >= self.qps:
            pass                                   # the tracker answers it (NO_QP)
        elif self.error[qp]:
            c["qp_in_error"] += 1
            deny = 1
        elif rec["opcode"] in WRITES and not rec["trimmed"]:
            c["checked"] += 1
            why = self.cause(rec)
            if why is not None:
                c[why] += 1
                c["naks"] += 1
                self.error[qp] = True
                nak = {"qp": qp, "psn": rec["psn"],
                       "syndrome": proto.AETH_SYNDROME_ACCESS_ERROR}
                deny = 1
        c["denied"] += deny
        return dict(rec, deny=deny), nak

    def records(self, recs):
        outs, naks = [], []
        for r in recs:
            o, n = self.record(r)
            outs.append(o)
            if n is not None:
                naks.append(n)
        return outs, naks


# --- Table operations as data, and random traffic (shared by the tests) -------------------

def apply_op(model, op):
    """Apply one table operation: ``("region", index, rkey, base, length, writable, pd)``,
    ``("invalidate", index)``, ``("pd", qp, pd)``, ``("clear_error", qp)``."""
    kind, *args = op
    return {"region": model.write_region, "invalidate": model.invalidate,
            "pd": model.set_pd, "clear_error": model.clear_error}[kind](*args)


TOP = 1 << 64
MAX_LEN = (1 << 16) - 1          # RX_PKT length: 16 bits


def random_setup(rng, regions, qps, pds=(0, 1, 2, 3)):
    """Operations that give every QP a domain from ``pds`` and fill the region table with
    regions chosen for their edges: at address 0, at the top of the address space, of
    length 0, reaching past 2^64, read-only (one at least), a duplicate R_Key (the lower index wins), and
    one entry written then invalidated."""
    ops = [("pd", q, rng.choice(pds)) for q in range(qps)]
    # One read-only region for sure (a quarter of the rest are), never the invalidated one.
    gone, readonly = rng.randrange(regions), rng.randrange(regions)
    if regions > 1:
        while gone == readonly:
            gone = rng.randrange(regions)
    rkeys = set()
    for i in range(regions):
        rkey = rng.getrandbits(32)
        while rkey in rkeys:
            rkey = rng.getrandbits(32)
        if rkeys and rng.random() < 0.1 and i != readonly:
            rkey = rng.choice(sorted(rkeys))                 # duplicate R_Key
        rkeys.add(rkey)
        shape = rng.choice(["low", "top", "random", "random", "zero", "past_top", "small"]
                           if i != readonly else ["low", "top", "random", "small"])
        if shape == "low":
            base, length = 0, rng.randrange(1, 1 << 20)
        elif shape == "top":
            length = rng.randrange(1, 1 << 20)
            base = TOP - length
        elif shape == "zero":
            base, length = rng.getrandbits(64), 0
        elif shape == "past_top":
            base, length = TOP - rng.randrange(1, 1 << 12), rng.randrange(1 << 12, 1 << 64)
        elif shape == "small":
            base, length = rng.getrandbits(64) & ~0xFFF, rng.randrange(1, 64)
        else:
            base, length = rng.getrandbits(64), rng.getrandbits(rng.choice([16, 24, 40, 64]))
        writable = i != readonly and rng.random() < 0.75
        ops.append(("region", i, rkey, base, length, int(writable), rng.choice(pds)))
    if regions > 1:
        ops.append(("invalidate", gone))
    return ops


def random_records(rng, model, n, *, probe=0.08, trimmed=0.08, other=0.04, foreign=0.06,
                   unknown=0.06):
    """``n`` RX_PKT records against ``model``'s tables: WRITEs of every opcode whose R_Key,
    QP and range are drawn to hit each check and each range edge (va = base, end = base +
    length exactly, one byte over, one byte under the base, length 0, ends past 2^64),
    probes, trimmed WRITEs, other opcodes and QP indexes >= qps."""
    regions = [e for e in model.table if e is not None]
    recs = []
    for _ in range(n):
        qp = rng.randrange(model.qps)
        rec = {"qp": qp, "psn": rng.getrandbits(24), "opcode": rng.randrange(0xC6, 0xCC),
               "ack_req": rng.getrandbits(1), "rtx": rng.getrandbits(1),
               "ce": rng.getrandbits(1), "trimmed": 0, "lasthop": 0, "length": 0,
               "entropy": rng.getrandbits(32), "timestamp": rng.getrandbits(16),
               "imm": rng.getrandbits(32), "tag": rng.getrandbits(16), "va": 0, "rkey": 0,
               "dma_length": rng.getrandbits(32), "slot": 1}
        x = rng.random()
        if x < foreign:
            rec["qp"] = rng.randrange(model.qps, 1 << 16)
        x = rng.random()
        if x < probe:
            rec.update(opcode=0xDE, slot=0, va=rng.getrandbits(64))
        elif x < probe + other:
            rec.update(opcode=rng.choice([0x00, 0xC5, 0xCC, 0xD1, 0xDC, 0xFF]), slot=0)
        if rec["opcode"] in WRITES and rng.random() < trimmed:
            rec.update(trimmed=1, lasthop=rng.getrandbits(1), slot=0)
        if not regions or rng.random() < unknown:
            rec.update(rkey=rng.getrandbits(32), va=rng.getrandbits(64),
                       length=rng.randrange(MAX_LEN + 1))
            recs.append(rec)
            continue
        region = rng.choice(regions)
        rec["rkey"] = region["rkey"]
        if rec["qp"] < model.qps and rng.random() < 0.8:
            same = [q for q in range(model.qps) if model.pd[q] == region["pd"]]
            if same:
                rec["qp"] = rng.choice(same)
        base = region["base"]
        limit = min(base + region["length"], TOP)
        length = rng.choice([0, 1, rng.randrange(MAX_LEN + 1),
                             rng.randrange(min(MAX_LEN, max(0, limit - base)) + 1)])
        edge = rng.choice(["base", "end", "over", "under", "inside", "inside", "wrap",
                           "random"])
        if edge == "base":
            va = base
        elif edge == "end":
            va = limit - length
        elif edge == "over":
            va = limit - length + 1
        elif edge == "under":
            va = base - 1
        elif edge == "inside":
            va = base + rng.randrange(max(1, limit - base - length + 1))
        elif edge == "wrap":
            length = rng.randrange(2, MAX_LEN + 1)
            va = TOP - rng.randrange(1, length)
        else:
            va = rng.getrandbits(64)
        rec.update(va=va % TOP, length=length)
        recs.append(rec)
    return recs
