"""An example register block for the cocotb test of ``mrcnic.base.csr.regs`` on exported Verilog.

Its fields are brought out as ports so the testbench can see what the gateware sees:
``enable``/``mode`` (rw), ``start`` (w1p pulse), ``count`` (ro, driven by the testbench),
``error_set`` (sets the w1c ``error`` bit).
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr import AxiLiteSignature, CsrBlock, Field, Register, RegisterMap

ID_VALUE = 0x4D524331

REGS = RegisterMap("example", [
    Register("id", [Field("value", 32, "ro", reset=ID_VALUE, desc="constant")]),
    Register("ctrl", [Field("enable", 1, "rw"), Field("mode", 3, "rw", reset=2),
                      Field("start", 1, "w1p", offset=8)]),
    Register("status", [Field("count", 16, "ro"), Field("error", 1, "w1c", offset=31)]),
    Register("scratch", [Field("value", 32, "rw", reset=0x12345678)]),
    Register("version", [Field("minor", 16, "ro", reset=1), Field("major", 16, "ro")]),
])
UNMAPPED = 0x18    # five registers leave 0x14..0x1f of the 5-bit space unmapped


class CsrExample(wiring.Component):
    def __init__(self):
        super().__init__({
            "s_axil": In(AxiLiteSignature(REGS.addr_width)),
            "enable": Out(1), "mode": Out(3), "start": Out(1), "error": Out(1),
            "count": In(16), "error_set": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.csr = csr = CsrBlock(REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        f = csr.fields
        m.d.comb += [
            self.enable.eq(f["ctrl"]["enable"]), self.mode.eq(f["ctrl"]["mode"]),
            self.start.eq(f["ctrl"]["start"]), self.error.eq(f["status"]["error"]),
            f["status"]["count"].eq(self.count), f["status"]["error_set"].eq(self.error_set),
        ]
        return m
