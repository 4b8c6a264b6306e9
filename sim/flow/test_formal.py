"""Bounded formal checks (SymbiYosys + z3): every output stream keeps the AXI-Stream rule
(valid held, payload stable until ready) whatever the inputs do within the rules."""

import pytest

from mrcnic.flow.formal import prove
from mrcnic.tx.srv6_encap import Srv6Encap
from mrcnic.rx.srv6_decap import Srv6Decap
from mrcnic.base.stream import SkidBuffer


@pytest.mark.formal
@pytest.mark.parametrize("name,make,depth", [
    ("skid_buffer", lambda: SkidBuffer(64), 12),
    ("srv6_encap", lambda: Srv6Encap(64), 10),      # about 40 seconds
    pytest.param("srv6_encap", lambda: Srv6Encap(64), 14,        # about 2 minutes
                 marks=pytest.mark.soak),
    ("srv6_decap", lambda: Srv6Decap(64), 14),      # about 30 seconds
    ("reorder_buffer", lambda: __import__("mrcnic.rx.reorder_buffer", fromlist=["_"])
     .ReorderBuffer(64, 4, 64), 10),                # about 25 seconds
    # Past the first frame's last beat at 64 bits (latency 4, 15 beats a SACK or an EV
    # answer); about 12 seconds.
    ("ack_generator", lambda: __import__("mrcnic.rx.ack_generator", fromlist=["_"])
     .AckGenerator(64, 2, counter_width=0), 20),
])
def test_output_streams_keep_the_rules(tmp_path, name, make, depth):
    log = prove(make(), name, depth, tmp_path)
    assert "DONE (PASS" in log


@pytest.mark.formal
def test_a_broken_block_is_caught(tmp_path):
    """The check can fail: a skid buffer whose output valid drops without ready."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring

    class Broken(wiring.Component):
        def __init__(self):
            self.core = SkidBuffer(64)
            super().__init__(self.core.signature)

        def elaborate(self, platform):
            from amaranth.hdl import Signal
            m = Module()
            m.submodules.core = self.core
            wiring.connect(m, wiring.flipped(self.s_axis), self.core.s_axis)
            toggle = Signal()
            m.d.sync += toggle.eq(~toggle)
            m.d.comb += [
                self.m_axis.tdata.eq(self.core.m_axis.tdata),
                self.m_axis.tkeep.eq(self.core.m_axis.tkeep),
                self.m_axis.tlast.eq(self.core.m_axis.tlast),
                self.m_axis.tuser.eq(self.core.m_axis.tuser),
                self.m_axis.tvalid.eq(self.core.m_axis.tvalid & toggle),
                self.core.m_axis.tready.eq(self.m_axis.tready & toggle),
            ]
            return m

    with pytest.raises(AssertionError, match=r"DONE \(FAIL"):
        prove(Broken(), "broken", 8, tmp_path)
