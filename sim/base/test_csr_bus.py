"""CsrBus on Amaranth's simulator: register blocks behind one port, the directory walked as
software would, bad addresses answered SLVERR, under a slow and erratic master."""

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring

from mrcnic.base.csr import AxiLiteSignature, CsrBlock, CsrError
from mrcnic.host.driver import RegisterDriver
from mrcnic.base.csr.bus import BLOCK_TYPES, MAGIC, CsrBus
from mrcnic.tx.roce_tx import TX_REGS
from mrcnic.tx.segmenter import SEG_REGS
from testkit.axil import SLVERR, AxiLiteError, AxiLiteSimMaster
from testkit.simtools import run, seeded


class Two(wiring.Component):
    """Two register blocks (the RoceTx and TxSegmenter maps) behind one CsrBus."""

    def __init__(self):
        self.bus = CsrBus([("roce-tx", TX_REGS.addr_width), ("tx-segmenter",
                                                              SEG_REGS.addr_width)])
        super().__init__({"s_axil": wiring.In(AxiLiteSignature(self.bus.addr_width))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bus = self.bus
        m.submodules.a = a = CsrBlock(TX_REGS)
        m.submodules.b = b = CsrBlock(SEG_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), self.bus.s_axil)
        wiring.connect(m, self.bus.m_axil[0], a.s_axil)
        wiring.connect(m, self.bus.m_axil[1], b.s_axil)
        self.fields = (a.fields, b.fields)
        return m


def test_blocks_directory_and_errors():
    rng = seeded()
    dut = Two()
    wb = dut.bus.window_bits

    async def tb(ctx):
        master = AxiLiteSimMaster(ctx, dut.s_axil, rng=rng)
        # Walk the directory.
        assert await master.read(0) == MAGIC
        info = await master.read(4)
        assert info & 0xFFFF == 2 and info >> 16 == wb
        found, entry = [], await master.read(12)
        while entry:
            kind = await master.read(entry) >> 16
            base = await master.read(entry + 4)
            found.append((kind, base))
            entry = await master.read(entry + 12)
        assert found == [(BLOCK_TYPES["roce-tx"], 1 << wb), (BLOCK_TYPES["tx-segmenter"],
                                                              2 << wb)]
        # Each block's registers through its window, as its own driver addresses them.
        tx = RegisterDriver(TX_REGS, master.read, master.write, base=1 << wb)
        seg = RegisterDriver(SEG_REGS, master.read, master.write, base=2 << wb)
        for i in range(10):
            v = rng.getrandbits(16)
            await tx.write_fields("config", udp_dport=v)
            await seg.write("qp_start", v)
            assert await tx.read_field("config", "udp_dport") == v
            assert await seg.read("qp_start") == v
        # The directory is read only; a window past the last block answers SLVERR.
        with pytest.raises(AxiLiteError) as e:
            await master.write(8, 1)
        assert e.value.resp == SLVERR
        assert await master.read(8) == 1
        if 3 << wb < 1 << dut.bus.addr_width:
            with pytest.raises(AxiLiteError):
                await master.read(3 << wb)
        # And the blocks still answer after the errors.
        assert await tx.read_field("config", "udp_dport") == v

    run(dut, tb)


def test_bad_blocks_are_refused():
    with pytest.raises(CsrError):
        CsrBus([])
    with pytest.raises(CsrError):
        CsrBus([("no-such-block", 8)])
    with pytest.raises(CsrError):
        CsrBus([("roce-tx", 30)])
