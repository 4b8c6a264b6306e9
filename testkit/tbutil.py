"""Testbench base for cocotb tests on exported blocks (runs inside the simulator).

``TB`` owns the clock, the reset, and helpers every block's testbench shares; a block's
testbench subclasses it and adds its cocotbext-axi sources and sinks. Randomness comes from
Python's ``random``, which cocotb seeds from the seed the harness prints.
"""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import (AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamSink,
                           AxiStreamSource)

from mrcnic.host.driver import RegisterDriver


def params():
    return json.loads(os.environ["MRCNIC_PARAMS"])


def soak(count):
    """``count`` times the soak factor (``MRCNIC_SOAK``, set by ``make soak``)."""
    return count * max(1, int(os.environ.get("MRCNIC_SOAK", "1")))


def long_runs():
    """Verilator takes the long traffic runs; Icarus, several times slower on wide designs,
    runs a shorter cross-check of the same tests (``make soak`` runs both in full)."""
    return (os.environ.get("MRCNIC_SIMULATOR") != "icarus"
            or int(os.environ.get("MRCNIC_SOAK", "1")) > 1)


def random_pauses(probability, rng=random):
    """Endless pause pattern for cocotbext-axi: True (pause) with ``probability``."""
    while True:
        yield rng.random() < probability


class TB:
    clock_ns = 10

    def __init__(self, dut):
        self.dut = dut
        self.params = params()
        self.log = dut._log
        cocotb.start_soon(Clock(dut.clk, self.clock_ns, unit="ns").start())

    def axis_source(self, prefix="s_axis"):
        return AxiStreamSource(AxiStreamBus.from_prefix(self.dut, prefix), self.dut.clk,
                               self.dut.rst)

    def axis_sink(self, prefix="m_axis"):
        return AxiStreamSink(AxiStreamBus.from_prefix(self.dut, prefix), self.dut.clk,
                             self.dut.rst)

    def registers(self, regmap, prefix="s_axil"):
        """``(master, driver)``: cocotbext-axi's AXI4-Lite master on ``prefix`` and the
        project's RegisterDriver for ``regmap`` on top of it, as a user's software."""
        master = AxiLiteMaster(AxiLiteBus.from_prefix(self.dut, prefix), self.dut.clk,
                               self.dut.rst)
        return master, RegisterDriver(regmap, master.read_dword, master.write_dword)

    async def reset(self, cycles=4):
        self.dut.rst.value = 1
        for _ in range(cycles):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def cycles(self, n):
        for _ in range(n):
            await RisingEdge(self.dut.clk)


class BeatCounter:
    """Records the cycle of every handshake on a valid/ready pair (for throughput checks)."""

    def __init__(self, clk, valid, ready):
        self.clk, self.valid, self.ready = clk, valid, ready
        self.cycles = []
        self.cycle = 0
        cocotb.start_soon(self._run())

    async def _run(self):
        while True:
            await RisingEdge(self.clk)
            if self.valid.value == 1 and self.ready.value == 1:
                self.cycles.append(self.cycle)
            self.cycle += 1




