"""Event counters kept in distributed RAM: :class:`CounterBank`.

:func:`mrcnic.base.csr.gateware.event_counters` keeps each count in flip-flops by default;
with ``storage="ram"`` it hands the counts to a :class:`CounterBank` that the block's
:class:`~mrcnic.base.csr.gateware.CsrBlock` reads. The bank can also be used on its own.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from mrcnic.base.csr.regs import CsrError

__all__ = ["CounterBank", "bank_addresses"]


def bank_addresses(words, index_bits):
    """The RAM addresses of counters held at register word indices ``words``: each word's
    low ``k`` bits, for the smallest ``k`` >= ``ceil(log2(len(words)))`` at which they are
    all distinct (at most ``index_bits``), so that a register read addresses the RAM with
    the low bits of its word index and no logic. Returns ``(k, addresses)``."""
    if len(set(words)) != len(words):
        raise CsrError(f"counter words {words} are not distinct")
    for k in range(ceil_log2(max(1, len(words))), index_bits + 1):
        addresses = [w & ((1 << k) - 1) for w in words]
        if len(set(addresses)) == len(addresses):
            return k, addresses
    raise CsrError(f"counter words {words} do not fit a {index_bits}-bit word index")


class CounterBank(wiring.Component):
    """``N`` event counters of ``width`` bits, their high bits in distributed RAM (an
    :class:`amaranth.lib.memory.Memory` with asynchronous read ports, which Yosys maps to
    LUT RAM on ECP5 and Xilinx), fed by one-cycle events that may all fire in the same
    cycle, and read one at a time, exactly.

    The events are registered once (as by the flip-flop counters of
    :func:`~mrcnic.base.csr.gateware.event_counters`). Each count is split at bit ``S``:
    the low ``S`` bits are a flip-flop counter of their own, with a carry bit set when it
    wraps; the high ``H = width - S`` bits are in the RAM, twice, as ``hi`` and ``hi + 1``.
    ``S`` is the least with ``2^S >= (N + 1) (2^w - 1)`` for the widest event width ``w``,
    so that the low bits wrap at most once in ``N + 1`` cycles. A round-robin pointer
    flushes one counter per cycle: ``RAM[p] <= (hi', hi' + 1)``, ``hi' = hi + carry``
    (written only when it changes: ``hi + 1`` and ``hi + 2``, no adder after the RAM in
    that cycle), and the carry it moved leaves the carry bit; a wrap on that edge sets it
    again, so no increment is lost, that of the flush cycle included. The flush takes the
    flags and ``hi + 1`` and ``hi + 2`` from registers loaded a cycle ahead (the pointer's
    order is fixed): the carry moved is the one the counter had a cycle before the
    flush, and a carry set on the last edge waits for the next flush (hence ``N + 1``).

    A read is ``(hi + carry) * 2^S + low``, with ``hi + carry`` picked from ``hi`` and
    ``hi + 1``: multiplexers, no adder. ``clear`` zeroes the low bits and the carries and
    sets a per-counter "cleared" bit on its edge (the registered events of the clear's
    cycle are dropped, as by the flip-flop counters: the events presented in the clear's
    cycle and after are counted from zero); a cleared counter's ``hi`` reads (and is
    flushed) as 0 until the pointer reaches it, within ``N`` cycles, and writes over it
    (so two clears closer than ``N`` cycles are exact too). Reset sets the cleared bits,
    so the RAM never needs initialising. If ``S >= width`` the counts are all in
    flip-flops and there is no RAM.

    Parameters
    ----------
    increments : dict of str to int
        The counters, by name, each with the width (1 .. 16) of its event: the increment
        added per cycle, 0 .. ``2^w - 1``. 1 .. 64 counters. A wide event widens every
        counter's low part (``S``).
    width : int
        16 or 32: the counters' width (16 wraps at ``2^16``).
    addresses : list of int, optional
        The RAM address of each counter, in the order of ``increments``, distinct, >= 0;
        default ``0 .. N-1``. :class:`~mrcnic.base.csr.gateware.CsrBlock` passes the low
        bits of the counters' register word indices (:func:`bank_addresses`). The address
        width ``addr_width`` is ``ceil(log2(max(addresses) + 1))``, the RAM's depth
        ``2^addr_width``.
    own_read : bool, keyword
        True (default): the bank selects ``read_data`` itself. False: ``read_data`` is
        left undriven and a reader that has its own multiplexers (CsrBlock, which puts
        ``low`` in its read tree) selects ``low``, ``carry`` and ``valid`` and combines
        them with ``read_hi`` and ``read_hi1`` by :func:`high_part`.

    Attributes
    ----------
    events : In(StructLayout(increments))
        One member per counter: the increment of this cycle.
    clear : In(1)
        Zero every counter (on the edge that ends a cycle in which it is high).
    read_addr : In(addr_width)
        The RAM address of the counter to read. Drive it from a flip-flop: the read is
        combinational through the RAM and the multiplexers.
    read_data : Out(width)
        The counter at ``read_addr`` (0 at an address with no counter), combinationally.
    read_hi, read_hi1 : Out(H)
        The RAM entry at ``read_addr``: ``hi`` and ``hi + 1``.
    low, carry, valid : list of Signal
        Per counter, in the order of ``increments``: the low ``S`` bits, the carry and
        "not cleared" (plain Signals, not ports; ``low`` and ``carry`` flip-flops).

    Latency
    -------
    ``read_data`` in cycle ``c`` counts the events presented up to cycle ``c - 2`` (one
    register, then the count), since the last ``clear`` (events presented in the clear's
    cycle count, those of the cycle before it do not): the value a flip-flop counter of
    :func:`~mrcnic.base.csr.gateware.event_counters` holds in cycle ``c``. A flush of the
    counter read on the same edge does not change the value read.

    Resources
    ---------
    Flip-flops: the registered events; per counter ``S`` low bits, a carry and a cleared
    bit; the two pointers (``addr_width`` bits each), the flush's two flags and two
    ``H``-bit registers; instead of ``width`` bits per counter. The RAM is ``2 H`` bits
    wide, with two read ports (the register read, the flush's read ahead) and one write
    port. Logic depth: the read is the multiplexers of ``low``, ``carry`` and ``valid``
    and one LUT after them (and after the RAM); the flush's write data one LUT after
    flip-flops; ``hi + 2`` the only carry chain after the RAM, into a register. Measured
    figures: docs/csr.md.

    Raises
    ------
    CsrError
        A ``ValueError``: no counters, more than 64, an increment width outside 1 .. 16,
        a width other than 16 or 32, addresses not distinct integers >= 0.
    """

    def __init__(self, increments, width=32, addresses=None, *, own_read=True):
        increments = dict(increments)
        n = len(increments)
        if not 1 <= n <= 64:
            raise CsrError(f"a CounterBank holds 1 to 64 counters, not {n}")
        for name, w in increments.items():
            if not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= 16:
                raise CsrError(f"counter {name!r}: increment width {w!r} is not 1 .. 16")
        if width not in (16, 32) or isinstance(width, bool):
            raise CsrError(f"a CounterBank's width is 16 or 32, not {width!r}")
        if addresses is None:
            addresses = list(range(n))
        addresses = list(addresses)
        if (len(addresses) != n or len(set(addresses)) != n
                or any(not isinstance(a, int) or isinstance(a, bool) or a < 0
                       for a in addresses)):
            raise CsrError(f"addresses {addresses} must be {n} distinct integers >= 0")
        self.increments = increments
        self.own_read = bool(own_read)
        self.width = width
        self.addresses = addresses
        self.addr_width = ceil_log2(max(addresses) + 1)
        self.depth = 1 << self.addr_width
        widest = max(increments.values())
        self.low_width = min(width, ceil_log2((n + 1) * ((1 << widest) - 1)))   # S
        self.high_width = width - self.low_width                            # H
        super().__init__({
            "events": In(data.StructLayout(increments)),
            "clear": In(1),
            "read_addr": In(self.addr_width),
            "read_data": Out(width),
            "read_hi": Out(self.high_width),
            "read_hi1": Out(self.high_width),
        })
        self.low = [Signal(self.low_width, name=f"low_{nm}") for nm in increments]
        self.carry = [Signal(name=f"carry_{nm}") for nm in increments]
        self.valid = [Signal(name=f"valid_{nm}") for nm in increments]

    def elaborate(self, platform):
        m = Module()
        names = list(self.increments)
        n, k, lw, hw = len(names), self.addr_width, self.low_width, self.high_width
        registered = Signal.like(self.events, name="events_r")
        m.d.sync += registered.eq(self.events)
        cleared = [Signal(init=1, name=f"cleared_{nm}") for nm in names]
        m.d.comb += [v.eq(~c) for v, c in zip(self.valid, cleared)]

        # The flush pointer (the address written) and the next (the address read ahead),
        # stepping through the counters' addresses in order.
        succ = {a: self.addresses[(i + 1) % n] for i, a in enumerate(self.addresses)}
        ptr = Signal(max(1, k), init=self.addresses[0], name="flush_ptr")
        nxt = Signal(max(1, k), init=succ[self.addresses[0]], name="flush_next")
        m.d.sync += ptr.eq(nxt)
        with m.Switch(nxt):
            for a, b in succ.items():
                with m.Case(a):
                    m.d.sync += nxt.eq(b)
        flush = [ptr == a for a in self.addresses]

        # The flags of the counter flushed in this cycle, registered a cycle ahead: its
        # "valid" and the carry it had then (a carry set on that edge stays for the next
        # flush, which S leaves room for).
        flush_valid = Signal(name="flush_valid")
        flush_carry = Signal(name="flush_carry")
        for i, nm in enumerate(names):
            low, carry = self.low[i], self.carry[i]
            total = Signal(lw + 1, name=f"low_sum_{nm}")
            m.d.comb += total.eq(low + getattr(registered, nm))
            with m.If(self.clear):
                m.d.sync += [low.eq(0), carry.eq(0), cleared[i].eq(1)]
            with m.Else():
                m.d.sync += [low.eq(total[:lw]),
                             carry.eq((carry & ~(flush[i] & flush_carry)) | total[lw])]
                with m.If(flush[i]):
                    m.d.sync += cleared[i].eq(0)

        at = dict(zip(self.addresses, range(n)))
        addr = self.read_addr[:k]
        if hw:
            m.submodules.ram = ram = Memory(shape=2 * hw, depth=self.depth, init=[])
            rd = ram.read_port(domain="comb")           # the register read
            if k:
                m.d.comb += rd.addr.eq(addr)
            m.d.comb += [self.read_hi.eq(rd.data[:hw]), self.read_hi1.eq(rd.data[hw:])]
            self._flush(m, ram, ptr, nxt, at, flush_valid, flush_carry)
        if not self.own_read:
            return m
        sel_low = _mux_tree(m, {a: self.low[i] for a, i in at.items()}, addr, lw, "read_low")
        if hw == 0:
            m.d.comb += self.read_data.eq(sel_low)
            return m
        sel = _mux_tree(m, {a: Cat(self.valid[i], self.carry[i]) for a, i in at.items()},
                        addr, 2, "read_flags")
        m.d.comb += self.read_data.eq(Cat(sel_low, high_part(sel[0], sel[1], self.read_hi,
                                                             self.read_hi1)))
        return m

    def _flush(self, m, ram, ptr, nxt, at, valid, carry):
        """``RAM[ptr] <= (hi', hi' + 1)``, ``hi' = (valid ? hi : 0) + carry``: written when
        the entry changes (a carry to move, or a stale entry), from the flags, ``hi + 1``
        and ``hi + 2``, all loaded a cycle ahead into registers (with one counter, from
        what is written on the edge before), so that the write's data is one LUT after
        flip-flops. A write in a clear's cycle is harmless: the cleared bit is set on the
        same edge."""
        hw, k, n = self.high_width, self.addr_width, len(at)
        ahead = ram.read_port(domain="comb")
        wr = ram.write_port()
        if k:
            m.d.comb += [ahead.addr.eq(nxt[:k]), wr.addr.eq(ptr[:k])]
        hi1, hi2 = Signal(hw, name="flush_hi1"), Signal(hw, name="flush_hi2")
        new_hi1 = Signal(hw, name="flush_new_hi1")
        m.d.comb += [
            new_hi1.eq(high_part(valid, carry, hi1, hi2, plus_one=True)),
            wr.en.eq(~valid | carry),
            wr.data.eq(Cat(high_part(valid, carry, hi1, hi1), new_hi1)),  # hi' = hi1 here
        ]
        if n > 1:
            # nxt differs from ptr: neither the entry read ahead nor its flags change on
            # this edge but by a clear.
            flags = _mux_tree(m, {a: Cat(self.valid[i], self.carry[i])
                                  for a, i in at.items()}, nxt[:k], 2, "flush_flags")
            m.d.sync += [valid.eq(flags[0] & ~self.clear), carry.eq(flags[1] & ~self.clear),
                         hi1.eq(ahead.data[hw:]), hi2.eq(ahead.data[hw:] + 1)]
        else:
            with m.If(wr.en):
                m.d.sync += [hi1.eq(new_hi1), hi2.eq(new_hi1 + 1)]
            m.d.sync += [valid.eq(~self.clear), carry.eq(self.carry[0] & ~carry & ~self.clear)]


def high_part(valid, carry, hi, hi1, plus_one=False):
    """A counter's high bits from its RAM entry (``hi``, ``hi1`` = ``hi + 1``) and its
    flags: ``hi + carry``, or ``carry`` (``carry + 1`` with ``plus_one``) if the entry
    is stale (not ``valid``, cleared since it was written)."""
    width = len(hi)
    stale = carry + 1 if plus_one else carry
    return Mux(valid, Mux(carry, hi1, hi), Value.cast(stale)[:width])


def _mux_tree(m, entries, index, width, name):
    """:func:`mrcnic.base.csr.gateware._mux_tree` (imported late: gateware imports this
    module)."""
    from mrcnic.base.csr.gateware import _mux_tree as tree
    return tree(m, entries, index, width, name)
