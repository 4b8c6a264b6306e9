"""mrcnic.base.gates.register_copies: the copies of a register survive synthesis as
registers of their own (Yosys merges registers loaded alike when their resets are alike)."""

import pytest
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.gates import register_copies
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


def test_names_and_limit():
    r = Signal(3, name="q")
    cs = register_copies(r, ("x", "y"))
    assert [c.name for c in cs] == ["q_x", "q_y"] and all(len(c) == 3 for c in cs)
    with pytest.raises(ValueError, match="at most 3 copies"):
        register_copies(r, ("a", "b", "c", "d"))
