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

from mrcnic.base.csr.regs import RegisterDriver


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


class MetaSource:
    """Drives a metadata stream ``<prefix>_<field>``/``_valid``/``_ready`` from dicts, with an
    optional pause generator (True = hold valid low this cycle)."""

    def __init__(self, dut, prefix, fields, clk):
        self.dut, self.prefix, self.fields, self.clk = dut, prefix, list(fields), clk
        self.queue = []
        self.pause = None
        self.sent = 0
        getattr(dut, f"{prefix}_valid").value = 0
        cocotb.start_soon(self._run())

    def set_pause_generator(self, gen):
        self.pause = gen

    def send_nowait(self, record):
        self.queue.append(record)

    async def _run(self):
        valid = getattr(self.dut, f"{self.prefix}_valid")
        ready = getattr(self.dut, f"{self.prefix}_ready")
        driving = False     # what we drive; a write is only seen in the next time step
        while True:
            await RisingEdge(self.clk)
            if driving and ready.value == 1:
                self.sent += 1
                self.queue.pop(0)
                driving = False
            if not driving and self.queue and not (self.pause and next(self.pause)):
                for name in self.fields:
                    getattr(self.dut, f"{self.prefix}_{name}").value = self.queue[0][name]
                driving = True
            valid.value = int(driving)


class MetaSink:
    """Collects a metadata stream ``<prefix>_<field>``/``_valid``/``_ready`` as dicts (one key
    per field), with an optional pause generator (True = hold ready low this cycle)."""

    def __init__(self, dut, prefix, fields, clk):
        self.dut, self.prefix, self.fields, self.clk = dut, prefix, list(fields), clk
        self.records = []
        self.pause = None
        cocotb.start_soon(self._run())

    def set_pause_generator(self, gen):
        self.pause = gen

    async def _run(self):
        valid = getattr(self.dut, f"{self.prefix}_valid")
        ready = getattr(self.dut, f"{self.prefix}_ready")
        while True:
            r = not (self.pause and next(self.pause))
            ready.value = int(r)
            await RisingEdge(self.clk)
            if r and valid.value == 1:
                self.records.append({n: int(getattr(self.dut, f"{self.prefix}_{n}").value)
                                     for n in self.fields})
