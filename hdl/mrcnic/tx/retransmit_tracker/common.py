"""Constants, record layouts and bit-search helpers of
:class:`~mrcnic.tx.retransmit_tracker.RetransmitTracker`'s stages (no state, no ports).

The helpers build small, shallow decodes rather than comparators and shifters: positions in
the two 64-PSN words a SACK straddles (:func:`ge_mask`, :func:`dist_ge_mask`), the lowest
and highest set bits of a vector in two levels (:func:`lowest_set`, :func:`highest_set`),
equality in two-bit parts for a register between the parts and their AND
(:func:`_eq_parts`)."""

from amaranth.hdl import Cat, Const, Mux, Signal, Value
from amaranth.lib import data
from amaranth.utils import ceil_log2

from mrcnic.base import proto
from mrcnic.base.records import EV_INDEX_BITS, TIME_BITS
from mrcnic.base.rules import RETRANSMIT_COUNTER_NAMES, RETRANSMIT_COUNTERS


PSN = proto.PSN_BITS
HALF = 1 << (PSN - 1)
WORD = 64                   # PSNs per bitmap word; a SACK's 64 bits straddle two
BITMAP_BITS = 64
FIFO_DEPTH = 16
HOLE_GROUP = 16             # bits of the two words the hole engine searches a cycle
MAX_PENDING = 64            # entries of the pending-retransmission table, at most
EPOCH_BITS = 4              # opens of a QP told apart in its bitmap words and timer marks
CREDIT_RULE = "bytes in flight = (next PSN - CACK) x 2^pmtu_log2, at most cwnd"
HOLE_RULE = ("a hole is requested once, when a PSN reorder_guard or more after it is "
             "acknowledged; then only by its timeout")

TIME_RULE = ("with reorder_time > 0, a hole counts as lost only when it was sent at least "
             "reorder_time ticks before the PSN whose arrival triggered the SACK; the first "
             "hole that was not stays the QP's mark, so later SACKs judge it again")

PENDING_RULE = ("a hole, NACK or timeout request for a PSN whose retransmission is already "
                "requested and not yet resent is not made")






# A per-PSN record: its EV, send time and whether it was a retransmission, and the QP's
# epoch when it was written (a record of an earlier open is no record of this one).
REC = data.StructLayout({"ev": EV_INDEX_BITS, "time": TIME_BITS, "rtx": 1,
                         "epoch": EPOCH_BITS})

COUNTERS = RETRANSMIT_COUNTERS
COUNTER_NAMES = RETRANSMIT_COUNTER_NAMES


def _over_window(diff):
    """A non-negative PSN distance (mod 2^24) past the two-word window (over 128), from its
    bits: any bit above 128's, or 128's with a lower one (no comparator after the adder)."""
    return diff[8:-1].any() | (diff[7] & diff[:7].any())


def _clamp(diff):
    """A PSN distance (mod 2^24) as a position 0 .. 128 in a two-word window: 0 when
    negative."""
    diff = Value.cast(diff)[:PSN]
    return Mux(diff[-1], 0, Mux(_over_window(diff), 2 * WORD, diff[:8]))


def _clamp_max(diff, floor):
    """``max(floor, _clamp(diff))`` for a position ``floor`` 0 .. 128: the comparison with
    ``floor`` takes the distance's low 8 bits, which leave the adder's carry chain first,
    beside the tests of its high bits (not after the clamp)."""
    diff = Value.cast(diff)[:PSN]
    low = diff[:8]
    return Mux(diff[-1], floor,
               Mux(_over_window(diff), 2 * WORD, Mux(low > floor, low, floor)))


def _or_index(onehot):
    """Index of the one set bit of ``onehot``: bit b is the OR of the positions with bit b
    set (no priority logic: the input has at most one bit set)."""
    n = len(onehot)
    bits = max(1, ceil_log2(n))
    masks = [sum(1 << j for j in range(n) if j >> b & 1) for b in range(bits)]
    return Cat(*((onehot & mask) != 0 for mask in masks))


def lowest_set(m, vec, name, carry=True):
    """``(found, index, one-hot)`` of the lowest set bit of ``vec``: isolate it (x & -x, a
    carry chain; or with ``carry`` False, each bit ANDed with none below it set: two LUT
    levels for 8 bits, no chain to enter and leave), then encode."""
    n = len(vec)
    iso = Signal(n, name=f"{name}_iso")
    if carry:
        m.d.comb += iso.eq(vec & (~vec + 1)[:n])
    else:
        m.d.comb += iso.eq(Cat(*(vec[i] & ~vec[:i].any() if i else vec[0] for i in range(n))))
    return vec.any(), _or_index(iso), iso


def at_most_one(vec):
    """Whether at most one bit of ``vec`` is set: per four bits, any and two or more (one
    LUT each), then no group with two and at most one group with any (no carry chain)."""
    groups = [vec[i:i + 4] for i in range(0, len(vec), 4)]
    anys = Cat(*(g.any() for g in groups))
    twos = Cat(*(Cat(*(g[a] & g[b] for a in range(len(g)) for b in range(a + 1, len(g)))).any()
                 for g in groups))
    if len(groups) == 1:
        return ~twos[0]
    return ~twos.any() & at_most_one(anys)


def highest_set(m, vec, name, derived=()):
    """``(found, index, values)`` of the highest set bit of ``vec`` (a multiple of 8 bits
    long), in two levels: per byte whether any bit is set and the index of its highest,
    then the highest byte with a bit set, whose index is taken (an AND-OR: the bytes'
    one-hot).

    ``derived`` lists functions of the index (an adder, a comparison): each is worked out
    per byte from that byte's index, beside the search for the highest byte, and taken
    by the same AND-OR (``values``), rather than worked out from the index after it."""
    n = len(vec)
    B = 8
    assert n % B == 0
    nb = n // B
    octets = [vec[k * B:(k + 1) * B] for k in range(nb)]
    any_ = Signal(nb, name=f"{name}_bytes")
    m.d.comb += any_.eq(Cat(*(o.any() for o in octets)))

    def top(bits):
        """One-hot of the highest set bit of ``bits`` (all zero if none)."""
        return Cat(*(bits[j] & ~bits[j + 1:].any() if j + 1 < len(bits) else bits[j]
                     for j in range(len(bits))))
    top_byte = Signal(nb, name=f"{name}_top_byte")
    m.d.comb += top_byte.eq(top(any_))
    low = Const(0, 3)
    values = [Const(0, 1) for _ in derived]
    for k, o in enumerate(octets):
        idx = Signal(3, name=f"{name}_idx{k}")
        m.d.comb += idx.eq(_or_index(top(o)))
        low = low | Mux(top_byte[k], idx, 0)
        full = Cat(idx, Const(k, max(1, ceil_log2(nb))))
        values = [val | Mux(top_byte[k], fn(full), 0) for val, fn in zip(values, derived)]
    return any_.any(), Cat(low, _or_index(top_byte)), values


def _after(x, y):
    """PSN ``x`` after ``y`` (mod 2^24, within half the space)."""
    d = (x - y)[:PSN]
    return (d != 0) & ~d[-1]


def _clamp_signed(x):
    """A signed distance (a few bits wider than 8) as a position 0 .. 128: 0 when
    negative."""
    x = Value.cast(x).as_signed()
    # The tests read the bits (the sign, any bit above 128's, 128's with a lower one): no
    # comparator after the adder that makes x.
    over = x[8:-1].any() | (x[7] & x[:7].any())
    return Mux(x[-1], 0, Mux(over, 2 * WORD, x[:8]))


def _clamp_signed_less64(x):
    """``_clamp_signed(x - 64)`` from the bits of ``x``: below 0 when ``x`` is below 64
    (negative, or no bit at or above 64's); over 128 when above 192; else the low 8 bits
    of ``x`` - 64 (its bits 6 and 7 less one). No second adder."""
    x = Value.cast(x).as_signed()
    neg = x[-1] | ~x[6:-1].any()
    over = x[8:-1].any() | (x[7] & x[6] & x[:6].any())
    return Mux(neg, 0, Mux(over, 2 * WORD, Cat(x[:6], (x[6:8] - 1)[:2])))


def ge_mask(pos, n):
    """Bits j of an n-bit mask set where j >= pos (pos 0 .. n), as a two-level decode (the
    high and the low bits of pos compared apart) rather than a shifter."""
    pos = Value.cast(pos)
    w = max(1, (n - 1).bit_length())
    top = pos[w:].any() if len(pos) > w else Const(0)
    x = pos[:w]
    lb = min(4, w)
    lo, hi = x[:lb], x[lb:]
    # (The comparisons that always hold or fail written as constants: a Verilog lint flags
    # a constant comparison.)
    le_lo = [lo <= k if k < (1 << lb) - 1 else Const(1, 1) for k in range(1 << lb)]
    if len(hi):
        lt_hi = [hi < k if k else Const(0, 1) for k in range((n - 1 >> lb) + 1)]
        eq_hi = [hi == k for k in range((n - 1 >> lb) + 1)]
        bits = [lt_hi[j >> lb] | (eq_hi[j >> lb] & le_lo[j & ((1 << lb) - 1)])
                for j in range(n)]
    else:
        bits = [le_lo[j] for j in range(n)]
    return Cat(*(~top & b for b in bits))


def dist_ge_mask(diff, n):
    """``ge_mask(_clamp(diff), n)`` from the PSN distance itself: all ones when it is
    negative, none when it is n or more, else the bits at or above it (no clamp in
    front of the decode)."""
    diff = Value.cast(diff)[:PSN]
    return Mux(diff[-1], Const((1 << n) - 1, n), ge_mask(diff[:-1], n))


def dist_lt_mask(diff, n):
    """``lt_mask(_clamp(diff), n)``."""
    return ~dist_ge_mask(diff, n)


def lt_mask(pos, n):
    """Bits j set where j < pos."""
    return ~ge_mask(pos, n)


def _eq_parts(a, b, group=1):
    """``a == b`` in parts, for a register between the parts and their AND: one bit per
    two bits of each (a 4-input function), or with ``group`` > 1 the AND of that many such
    bits (one level more)."""
    a, b = Value.cast(a), Value.cast(b)
    pairs = [a[i:i + 2] == b[i:i + 2] for i in range(0, len(a), 2)]
    return Cat(*(Cat(*pairs[i:i + group]).all() for i in range(0, len(pairs), group)))


