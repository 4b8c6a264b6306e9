"""Two NICs in one simulation top: :class:`NicPair`, for ``mrcnic demo`` and the end-to-end
tests. Every port of NIC ``a`` is a port of the pair prefixed ``a_`` (``a_wr``,
``a_m0_axis``, ``a_s_axil``...), and likewise for ``b``; the fabric between their plane
ports lives in the testbench (:mod:`mrcnic.netsim.fabric`). Besides, ``a_tx_valid`` and
``b_tx_valid`` gather the ``tvalid`` of the NIC's plane outputs and ``a_pl_valid``/``b_pl_valid``
those of its placement outputs, one bit per plane, so that a testbench reads one signal to
know which ports have a beat.
"""

from amaranth.hdl import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from mrcnic.nic import MrcNic, _forward

__all__ = ["NicPair"]


class NicPair(wiring.Component):
    def __init__(self, **nic_params):
        self.a, self.b = MrcNic(**nic_params), MrcNic(**nic_params)
        planes = self.a.planes
        members = {}
        for side, nic in (("a", self.a), ("b", self.b)):
            for name, member in nic.signature.members.items():
                members[f"{side}_{name}"] = member
            members[f"{side}_tx_valid"] = Out(planes)
            members[f"{side}_pl_valid"] = Out(planes)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for side, nic in (("a", self.a), ("b", self.b)):
            m.submodules[side] = nic
            for name, member in nic.signature.members.items():
                _forward(m, member, getattr(self, f"{side}_{name}"), getattr(nic, name))
            planes = range(nic.planes)
            m.d.comb += [
                getattr(self, f"{side}_tx_valid").eq(
                    Cat(*(getattr(nic, f"m{p}_axis").tvalid for p in planes))),
                getattr(self, f"{side}_pl_valid").eq(
                    Cat(*(getattr(nic, f"pl{p}_axis").tvalid | getattr(nic, f"place{p}").valid
                          for p in planes))),
            ]
        return m
