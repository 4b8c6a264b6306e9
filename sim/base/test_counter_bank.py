"""mrcnic.base.csr.counters: event counters in distributed RAM (``event_counters(...,
storage="ram")``), read through CsrBlock by random AXI reads at random times and checked
against an exact Python count; clears at random times (in the same cycles as events and
reads); width 16 wrapping; N = 1, 2, 7, 28, 40 counters; the flip-flop storage under the
same test; the bank alone against reference flip-flop counters in every cycle; the
parameter errors; a bounded formal check of the bank against flip-flop counters."""

import pytest
from amaranth.asserts import AnySeq
from amaranth.hdl import Assert, Elaboratable, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from mrcnic.base.csr import (CounterBank, CsrBlock, CsrError, Field, Register, RegisterMap,
                             event_counters)
from mrcnic.base.csr.counters import bank_addresses
from mrcnic.flow.formal import prove
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import run, seeded, soak

SCRATCH = 0x5A5A_0F0F


def increment_widths(n, wide=False):
    """Event widths of ``n`` counters: 1, 2 and 3 bits in turn; with ``wide`` the last a
    10-bit increment (up to 1023 per cycle, so that 16 bits wrap within a few hundred
    cycles; it also widens every counter's low part, see CounterBank)."""
    widths = [(1, 2, 3)[i % 3] for i in range(n)]
    if wide:
        widths[-1] = 10
    return widths


class Counted(Elaboratable):
    """``n`` counters behind a register map: ``control.clear`` (w1p) at 0x0, an rw
    ``scratch`` at 0x4 (reset ``SCRATCH``), counters ``c0`` .. at 0x8 on; ``storage`` as
    :func:`event_counters` takes it."""

    def __init__(self, n, width=32, storage="ram", wide=False):
        self.names = [f"c{i}" for i in range(n)]
        self.widths = increment_widths(n, wide)
        self.regmap = RegisterMap(f"counted{n}", [
            Register("control", [Field("clear", 1, "w1p")]),
            Register("scratch", [Field("value", 32, "rw", reset=SCRATCH)]),
            *[Register(nm, [Field("count", 32, "ro")]) for nm in self.names],
        ])
        self.width = width
        self.storage = storage
        self.csr = CsrBlock(self.regmap)
        self.events = Signal(data.StructLayout(dict(zip(self.names, self.widths))))

    def elaborate(self, platform):
        m = Module()
        m.submodules.csr = csr = self.csr
        f = csr.fields
        event_counters(m, f, self.events, self.names, f["control"]["clear"],
                       width=self.width, storage=self.storage)
        return m


def check_random(n, width, storage, wide, cycles, rng):
    """Random events, AXI reads of random registers at random times with a random
    ``rready``, and clears written at random times of the busy phases (in the first 60% of the run, so
    that the wide counter wraps 16 bits in the rest), for ``cycles`` cycles. Every read is
    checked against the Python count of the cycle before its response first shows (the
    cycle R is loaded in, the edge the read is performed on). Returns tallies of what was
    covered."""
    dut = Counted(n, width, storage, wide)
    bus = dut.csr.s_axil
    clear = dut.csr.fields["control"]["clear"]
    mask = (1 << width) - 1
    addrs = [0x0, 0x4, *(0x8 + 4 * i for i in range(n))]
    tally = {"reads": 0, "counter_reads": 0, "clears": 0, "clear_and_read": 0,
             "clear_and_events": 0, "wrapped": 0}

    async def tb(ctx):
        count = [0] * n                  # the model's count in the current cycle
        prev_count = None                # ... and in the cycle before
        reg_ev = [0] * n                 # the events registered (presented a cycle before)
        pending = []                     # addresses whose AR was accepted, in order
        prev_rvalid = prev_rready = 0
        ar_valid, ar_addr, aw_w = 0, 0, 0
        for t in range(cycles):
            # --- Observe this cycle (outputs come from flip-flops) ---
            rvalid, rdata = ctx.get(bus.rvalid), ctx.get(bus.rdata)
            if rvalid and (not prev_rvalid or prev_rready):       # a new response
                addr = pending.pop(0)
                if addr == 0x0:
                    want = 0
                elif addr == 0x4:
                    want = SCRATCH
                else:
                    want = prev_count[(addr - 0x8) // 4]
                    tally["counter_reads"] += 1
                assert rdata == want, (f"cycle {t}: read of {addr:#x} gave {rdata:#x}, "
                                       f"want {want:#x}")
                tally["reads"] += 1
            arready, awready, wready = (ctx.get(bus.arready), ctx.get(bus.awready),
                                        ctx.get(bus.wready))
            cleared = ctx.get(clear)
            # --- Drive this cycle ---
            phase = (t // 64) % 4                # quiet, busy, all at once, sparse
            p = (0.05, 0.5, 1.0, 0.2)[phase]
            ev = {nm: (rng.randrange(1 << (w - 1), 1 << w) if rng.random() < p else 0)
                  for nm, w in zip(dut.names, dut.widths)}
            ctx.set(dut.events, ev)
            if not ar_valid and rng.random() < 0.6:
                ar_valid, ar_addr = 1, rng.choice(addrs)
            ctx.set(bus.arvalid, ar_valid)
            ctx.set(bus.araddr, ar_addr)
            rready = int(rng.random() < 0.7)
            ctx.set(bus.rready, rready)
            # (Clears are written in the busy phases only, so that they meet events: with
            # one counter, the clears of some seeds all fell where no event was, for
            # example SEED=3092408026.)
            if not aw_w and t < 0.6 * cycles and phase in (1, 2) and rng.random() < 0.04:
                aw_w = 1
            ctx.set(bus.awvalid, aw_w)
            ctx.set(bus.wvalid, aw_w)
            ctx.set(bus.awaddr, 0x0)
            ctx.set(bus.wdata, 1)
            ctx.set(bus.wstrb, 0xF)
            ctx.set(bus.bready, 1)
            # --- Tallies of coincidences ---
            if cleared:
                tally["clears"] += 1
                tally["clear_and_read"] += int(bool(rvalid))
                tally["clear_and_events"] += int(any(reg_ev))
            # --- The model's next cycle (flip-flop counter semantics) ---
            prev_count = list(count)
            if cleared:
                count = [0] * n
            else:
                for i in range(n):
                    s = count[i] + reg_ev[i]
                    tally["wrapped"] += int(s > mask)
                    count[i] = s & mask
            reg_ev = [ev[nm] for nm in dut.names]
            if ar_valid and arready:
                pending.append(ar_addr)
                ar_valid = 0
            if aw_w and awready and wready:
                aw_w = 0
            prev_rvalid, prev_rready = rvalid, rready
            await ctx.tick()

    run(dut, tb)
    return tally


@pytest.mark.parametrize("n,width,storage,wide", [
    (1, 32, "ram", False), (2, 32, "ram", False), (7, 32, "ram", False),
    (28, 32, "ram", False), (40, 32, "ram", False), (40, 32, "ram", True),
    (7, 16, "ram", True), (28, 16, "ram", True), (7, 32, "ff", False), (7, 16, "ff", True),
])
def test_random_reads_and_clears_against_the_count(n, width, storage, wide):
    tally = check_random(n, width, storage, wide, soak(1200), seeded())
    assert tally["counter_reads"] > 150
    assert tally["clears"] >= 5 and tally["clear_and_read"] and tally["clear_and_events"]
    assert (tally["wrapped"] > 0) == (width == 16)


@pytest.mark.parametrize("n,width,wide,low", [(1, 32, False, 1), (7, 32, False, 6),
                                               (28, 32, False, 8), (40, 32, True, 16),
                                               (28, 16, True, 15)])
def test_the_high_bits_are_in_ram(n, width, wide, low):
    """The split the random test runs at: counts pass ``2^low`` within its cycles (but
    for the wide counter of 40, whose high part a clear-free stretch reaches)."""
    from amaranth.hdl import Fragment
    dut = Counted(n, width, "ram", wide)
    Fragment.get(dut, None)
    assert dut.csr.counter_bank.low_width == low


def test_width_0_has_no_counters():
    """``width=0`` with ``storage="ram"``: no bank, and the counters' registers read 0."""
    dut = Counted(3, 0, "ram")

    async def tb(ctx):
        master = AxiLiteSimMaster(ctx, dut.csr.s_axil)
        ctx.set(dut.events, {"c0": 1, "c1": 3, "c2": 4095})
        await ctx.tick().repeat(5)
        assert [await master.read(0x8 + 4 * i) for i in range(3)] == [0, 0, 0]
        assert await master.read(0x4) == SCRATCH

    run(dut, tb)
    assert dut.csr.counter_bank is None


class BankAndReference(wiring.Component):
    """A CounterBank beside plain flip-flop counters (the semantics of ``event_counters``
    with ``storage="ff"``) on the same events and clear; ``agree`` is high while the
    bank's read of ``read_addr`` equals the reference counter there."""

    def __init__(self, widths, width):
        self.names = [f"c{i}" for i in range(len(widths))]
        self.bank = CounterBank(dict(zip(self.names, widths)), width)
        layout = data.StructLayout(dict(zip(self.names, widths)))
        super().__init__({"events": In(layout), "clear": In(1),
                          "read_addr": In(self.bank.addr_width), "agree": wiring.Out(1),
                          "ref_value": wiring.Out(width)})
        self.width = width

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank = bank = self.bank
        m.d.comb += [bank.events.eq(self.events), bank.clear.eq(self.clear),
                     bank.read_addr.eq(self.read_addr)]
        registered = Signal.like(self.events)
        m.d.sync += registered.eq(self.events)
        refs = []
        for nm in self.names:
            count = Signal(self.width, name=f"ref_{nm}")
            with m.If(self.clear):
                m.d.sync += count.eq(0)
            with m.Else():
                m.d.sync += count.eq(count + getattr(registered, nm))
            refs.append(count)
        with m.Switch(self.read_addr):
            for i, ref in enumerate(refs):
                with m.Case(i):
                    m.d.comb += self.ref_value.eq(ref)
        m.d.comb += self.agree.eq(bank.read_data == self.ref_value)
        return m


@pytest.mark.parametrize("widths,width", [([1], 32), ([2, 1], 16), ([1, 2, 3, 1, 2, 3, 12], 16),
                                          ([2] * 28, 32)])
def test_bank_alone_every_cycle(widths, width):
    """The bank's read equals the reference counter in every cycle, with random events,
    a random clear (frequent in the first half, rare in the second, so that the counts
    pass the low part) and a random read address (those with no counter read 0) every
    cycle."""
    rng = seeded()
    dut = BankAndReference(widths, width)

    async def tb(ctx):
        for t in range(soak(600)):
            ctx.set(dut.events, {nm: rng.randrange(1 << w) if rng.random() < 0.7 else 0
                                 for nm, w in zip(dut.names, widths)})
            ctx.set(dut.clear, int(rng.random() < (0.03 if t < soak(300) else 0.002)))
            ctx.set(dut.read_addr, rng.randrange(1 << dut.bank.addr_width))
            assert ctx.get(dut.agree), (f"cycle {t}: bank {ctx.get(dut.bank.read_data):#x}, "
                                        f"reference {ctx.get(dut.ref_value):#x}")
            await ctx.tick()

    run(dut, tb)


def test_ff_is_the_default_and_ram_makes_a_bank():
    from amaranth.hdl import Fragment
    ram, ff = Counted(2, storage="ram"), Counted(2, storage="ff")
    Fragment.get(ram, None)
    Fragment.get(ff, None)
    assert isinstance(ram.csr.counter_bank, CounterBank) and ff.csr.counter_bank is None
    assert ram.csr.counter_bank.addresses == [0, 1]         # words 2 and 3, low bit


def test_bank_addresses():
    """The low bits of the counters' word indices, as few as keep them distinct."""
    assert bank_addresses([8 + i for i in range(28)], 6) == (5, [8 + i & 31 for i in range(28)])
    assert bank_addresses([2, 3], 4) == (1, [0, 1])
    assert bank_addresses([2, 34], 6) == (6, [2, 34])
    assert bank_addresses([5], 3) == (0, [0])
    with pytest.raises(CsrError, match="do not fit"):
        bank_addresses([2, 34], 5)


@pytest.mark.parametrize("build,message", [
    (lambda: CounterBank({}, 32), "1 to 64 counters"),
    (lambda: CounterBank({f"c{i}": 1 for i in range(65)}, 32), "1 to 64 counters"),
    (lambda: CounterBank({"a": 0}, 32), "increment width 0"),
    (lambda: CounterBank({"a": 17}, 32), "increment width 17"),
    (lambda: CounterBank({"a": 1}, 24), "width is 16 or 32"),
    (lambda: CounterBank({"a": 1, "b": 1}, 32, addresses=[3, 3]), "distinct"),
    (lambda: CounterBank({"a": 1}, 32, addresses=[-1]), "integers >= 0"),
])
def test_bank_errors(build, message):
    with pytest.raises(CsrError, match=message):
        build()


def _call(storage="ram", regs=None, csr_given=True, twice=False):
    regs = regs or [Register("control", [Field("clear", 1, "w1p")]),
                    Register("a", [Field("count", 32, "ro")])]
    csr = CsrBlock(RegisterMap("m", regs))
    ev = Signal(data.StructLayout({"a": 1}))
    m = Module()
    fields = dict(csr.fields) if not csr_given else csr.fields
    for _ in range(2 if twice else 1):
        event_counters(m, fields, ev, ["a"], csr.fields["control"]["clear"],
                       storage=storage)


@pytest.mark.parametrize("call,message", [
    (lambda: _call(storage="lutram"), "storage 'lutram'"),
    (lambda: _call(csr_given=False), "needs the CsrBlock"),
    (lambda: _call(twice=True), "already has a counter bank"),
    (lambda: _call(regs=[Register("control", [Field("clear", 1, "w1p")]),
                         Register("a", [Field("count", 31, "ro"), Field("x", 1, "ro")])]),
     "one ro field 'count'"),
    (lambda: _call(regs=[Register("control", [Field("clear", 1, "w1p")]),
                         Register("a", [Field("count", 16, "ro")])]),
     "at least 32 bits"),
    (lambda: _call(regs=[Register("control", [Field("clear", 1, "w1p")]),
                         Register("a", [Field("count", 32, "rw")])]),
     "one ro field 'count'"),
])
def test_event_counters_errors(call, message):
    with pytest.raises(CsrError, match=message):
        call()


# --- Formal ------------------------------------------------------------------------------

class FormalBank(wiring.Component):
    """The bank against the reference counters, every input free in every cycle: the
    bank's read of any address equals the reference counter's value."""

    def __init__(self, widths, width):
        self.inner = BankAndReference(widths, width)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self.inner
        m.d.comb += [inner.events.eq(AnySeq(len(inner.events.as_value()))),
                     inner.clear.eq(AnySeq(1)),
                     inner.read_addr.eq(AnySeq(len(inner.read_addr)))]
        with m.If(inner.read_addr < len(inner.names)):
            m.d.comb += Assert(inner.agree)
        return m


@pytest.mark.formal
def test_formal_bank_equals_flip_flop_counters(tmp_path):
    """Bounded (12 cycles, over three flush rounds of three counters): from reset, with
    any events, clears and read addresses, the bank reads what flip-flop counters hold."""
    log = prove(FormalBank([1, 2, 3], 16), "counter_bank", 12, tmp_path)
    assert "DONE (PASS" in log
