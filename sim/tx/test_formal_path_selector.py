"""Formal (bounded) check of PathSelector: an EV that is DENIED, ASSUMED_BAD, or on a port
that is disabled, down or without credit is never emitted, nor the EV a retransmission
avoids; the output streams keep the stream rule. Every EV starts in any state (loaded or
not, active or not); feedback, requests and port inputs are free."""

import pytest
from amaranth.asserts import AnySeq
from amaranth.hdl import Module
from amaranth.lib import wiring

from mrcnic.flow.formal import prove
from mrcnic.tx.path_selector import PathSelector

TINY = dict(qps=2, ev_count=4, planes=2, profiles=1, ev_bits=32)


class FreePorts(wiring.Component):
    """The selector with its port inputs (``port_up``, ``credit``) free in every cycle and
    its streams and registers passed through (the stream rules apply to streams only)."""

    def __init__(self, inner):
        self.inner = inner
        members = {k: v for k, v in inner.signature.members.items()
                   if k not in ("port_up", "credit")}
        super().__init__(wiring.Signature(members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self.inner
        for name, member in self.signature.members.items():
            if member.flow == wiring.In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(inner, name))
            else:
                wiring.connect(m, getattr(inner, name), wiring.flipped(getattr(self, name)))
        m.d.comb += [inner.port_up.eq(AnySeq(inner.planes)),
                     inner.credit.eq(AnySeq(inner.planes))]
        return m


@pytest.mark.formal
def test_never_emits_a_bad_denied_or_disabled_ev(tmp_path):
    log = prove(FreePorts(PathSelector(**TINY, formal=True)), "path_selector", 10, tmp_path)
    assert "DONE (PASS" in log


@pytest.mark.formal
def test_the_property_catches_a_selector_without_the_final_check(tmp_path):
    """Without the S4 recheck, feedback or a port going down while a decision is in
    flight lets a bad EV out: the same proof must fail."""
    with pytest.raises(AssertionError, match=r"DONE \(FAIL"):
        prove(FreePorts(PathSelector(**TINY, formal=True, _skip_recheck=True)),
              "path_selector_broken", 8, tmp_path)
