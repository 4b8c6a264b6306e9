"""cocotb test of a register block (mrcnic.base.csr) through cocotbext-axi's AXI4-Lite master,
with the project's RegisterDriver on top, as a user's software would drive it."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from testkit.csr_example import ID_VALUE, REGS, UNMAPPED
from testkit.tbutil import TB, random_pauses, soak


class CsrTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.axil, self.regs = self.registers(REGS)
        dut.count.value = 0
        dut.error_set.value = 0
        self.pulses = 0
        cocotb.start_soon(self._count_pulses())

    async def _count_pulses(self):
        while True:
            await RisingEdge(self.dut.clk)
            if self.dut.start.value == 1:
                self.pulses += 1

    def set_backpressure_generator(self, gen):
        self.axil.write_if.b_channel.set_pause_generator(gen)
        self.axil.read_if.r_channel.set_pause_generator(gen)


@cocotb.test()
async def reset_values_and_fields(dut):
    tb = CsrTB(dut)
    await tb.reset()
    assert await tb.regs.read("id") == ID_VALUE
    assert await tb.regs.read_fields("ctrl") == {"enable": 0, "mode": 2, "start": 0}
    assert await tb.regs.read("scratch") == 0x12345678
    await tb.regs.write_fields("ctrl", enable=1)
    await tb.cycles(2)
    assert dut.enable.value == 1 and dut.mode.value == 2, "rw fields not on the ports"
    await tb.regs.write_fields("ctrl", start=1)
    await tb.cycles(3)
    assert tb.pulses == 1, f"w1p pulsed {tb.pulses} cycles"
    assert dut.enable.value == 1, "read-modify-write lost the enable bit"
    dut.count.value = 0xBEEF
    await tb.cycles(1)
    assert await tb.regs.read_field("status", "count") == 0xBEEF
    dut.error_set.value = 1
    await tb.cycles(1)
    dut.error_set.value = 0
    assert await tb.regs.read_field("status", "error") == 1
    await tb.regs.write_fields("status", error=1)
    assert await tb.regs.read_field("status", "error") == 0
    await tb.cycles(4)


@cocotb.test()
async def unmapped_address_is_an_error(dut):
    tb = CsrTB(dut)
    await tb.reset()
    resp = await tb.axil.read(UNMAPPED, 4)
    assert int(resp.resp) == 2, f"read of an unmapped address answered {resp.resp}"
    resp = await tb.axil.write(UNMAPPED, b"\x01\x02\x03\x04")
    assert int(resp.resp) == 2, f"write to an unmapped address answered {resp.resp}"
    assert await tb.regs.read("scratch") == 0x12345678
    await tb.cycles(4)


@cocotb.test()
async def random_access_against_a_model(dut):
    """Seeded random reads and byte-masked writes of the rw scratch register under random
    B/R backpressure, checked against a Python copy."""
    tb = CsrTB(dut)
    await tb.reset()
    tb.set_backpressure_generator(random_pauses(0.5))
    model = 0x12345678
    addr = REGS.offset("scratch")
    for _ in range(soak(150)):
        if random.random() < 0.5:
            strb = random.randrange(1, 16)
            data = random.randbytes(4)
            await _masked_write(tb, addr, data, strb)
            for i in range(4):
                if strb >> i & 1:
                    model = (model & ~(0xFF << 8 * i)) | (data[i] << 8 * i)
        else:
            got = await tb.regs.read("scratch")
            assert got == model, f"scratch {got:#x}, model {model:#x}"
    await tb.cycles(4)


async def _masked_write(tb, addr, data, strb):
    # cocotbext-axi writes byte runs; a byte-masked word is written as its enabled bytes.
    for i in range(4):
        if strb >> i & 1:
            await tb.axil.write(addr + i, data[i:i + 1])
