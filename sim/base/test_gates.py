"""Small gateware helpers: mrcnic.base.gates.register_copies (the copies of a register
survive synthesis as registers of their own: Yosys merges registers loaded alike when their
resets are alike), plus_not (a + ~b with no inverter in front of its carry chain), and the
retransmit tracker's bit searches against Python."""

import random

import pytest
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.gates import plus_not, register_copies
from mrcnic.flow.ecp5 import parse_yosys_stat
from mrcnic.flow.tools import yosys_alone


class _Fanout(wiring.Component):
    i: In(4)
    o: Out(16)

    def elaborate(self, platform):
        m = Module()
        r = Signal(4, name="r")
        cs = register_copies(r, ("a", "b", "c"))
        m.d.sync += [r.eq(self.i), *(c.eq(self.i) for c in cs)]
        m.d.comb += self.o.eq(Cat(r, *cs))
        return m


def test_copies_stay_registers_of_their_own(tmp_path):
    stat, _ = yosys_alone(_Fanout(), "top", tmp_path, "synth_ecp5 -top top")
    assert parse_yosys_stat(stat)["ffs"] == 16


class _PlusNot(wiring.Component):
    a: In(10)
    b: In(10)
    o: Out(11)

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal(10), Signal(10)
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.o.eq(plus_not(ra, rb))]
        return m


def test_plus_not_maps_to_the_carry_chain_alone(tmp_path):
    """Registers into plus_not into registers: carry-chain cells and no LUT (``ra + ~rb``
    maps to ten LUT4 inverters in front of the same chain)."""
    stat, _ = yosys_alone(_PlusNot(), "top", tmp_path, "synth_ecp5 -top top")
    cells = stat["design"]["num_cells_by_type"]
    assert cells.get("CCU2C", 0) > 0 and cells.get("LUT4", 0) == 0, cells


@pytest.mark.parametrize("wa,wb", [(1, 1), (6, 6), (10, 4), (4, 10), (24, 24)])
def test_plus_not_against_python(wa, wb):
    """plus_not(a, b) = a + (2^W - 1 - b), W the wider width, on max(wa, wb) + 1 bits."""
    from amaranth.sim import Simulator
    a, b = Signal(wa), Signal(wb)
    out = plus_not(a, b)
    w = max(wa, wb)
    assert len(out) == w + 1
    m = Module()
    o = Signal(w + 1)
    m.d.comb += o.eq(out)
    rng = random.Random(wa * 100 + wb)
    edge = lambda n: [0, 1, (1 << n) - 1, (1 << n) - 2 if n > 1 else 0]
    pairs = [(x, y) for x in edge(wa) for y in edge(wb)]
    pairs += [(rng.getrandbits(wa), rng.getrandbits(wb)) for _ in range(300)]

    async def bench(ctx):
        for x, y in pairs:
            ctx.set(a, x)
            ctx.set(b, y)
            assert ctx.get(o) == x + (1 << w) - 1 - y, (x, y)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


def test_names_and_limit():
    r = Signal(3, name="q")
    cs = register_copies(r, ("x", "y"))
    assert [c.name for c in cs] == ["q_x", "q_y"] and all(len(c) == 3 for c in cs)
    with pytest.raises(ValueError, match="at most 3 copies"):
        register_copies(r, ("a", "b", "c", "d"))


def test_lowest_set_and_at_most_one_against_python():
    """The retransmit tracker's bit searches (common.py) on every pattern of up to three
    bits set in 16, and on random ones: the carry-chain and the chainless lowest set bit
    agree with Python's, and at_most_one with a bit count."""
    from amaranth.sim import Simulator
    from mrcnic.tx.retransmit_tracker.common import at_most_one, lowest_set
    m = Module()
    v = Signal(16)
    found_c, idx_c, _ = lowest_set(m, v, "c")
    found_n, idx_n, _ = lowest_set(m, v, "n", carry=False)
    amo = Signal()
    m.d.comb += amo.eq(at_most_one(v))
    rng = random.Random(7)
    pats = {0} | {1 << a | 1 << b | 1 << c for a in range(16) for b in range(16)
                  for c in range(16)} | {rng.getrandbits(16) for _ in range(200)}

    async def bench(ctx):
        for p in sorted(pats):
            ctx.set(v, p)
            low = (p & -p).bit_length() - 1
            got = ctx.get(Cat(found_c, idx_c, found_n, idx_n, amo))
            f_c, i_c = got & 1, got >> 1 & 15
            f_n, i_n, a = got >> 5 & 1, got >> 6 & 15, got >> 10 & 1
            assert (f_c, f_n) == (p != 0,) * 2 and a == (bin(p).count("1") <= 1), hex(p)
            if p:
                assert i_c == i_n == low, hex(p)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
