"""A board's serial port in a cocotb testbench: status lines decoded from the top's ``tx``
pin as a person at the port would read them, and commands typed on ``rx``."""

import re

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, FallingEdge
from cocotb.utils import get_sim_time

__all__ = ["Serial", "start_top"]


class Serial:
    """Lines ``<prefix> name=HEX ...`` from ``dut.tx``; ``trouble(line)`` true when a line
    reports something bad (every line :meth:`line` reads is checked). ``divisor``: the bit
    time in clock cycles, ``clock_ns`` the clock period. Each line is a dict of its items,
    with ``cycle``: the clock cycle in which its last character ended."""

    def __init__(self, dut, divisor, prefix, trouble, clock_ns):
        self.dut, self.divisor, self.trouble, self.clock_ns = dut, divisor, trouble, clock_ns
        self.pattern = re.compile(prefix + r"((?: \w+=[0-9A-F]+)+)\r\n")
        self.lines = []
        self.seen = 0                                    # lines looked at by line()
        self.text = ""
        self.arrived = Event()
        dut.rx.value = 1
        cocotb.start_soon(self._read())

    async def _read(self):
        dut, d = self.dut, self.divisor
        while True:
            await FallingEdge(dut.tx)
            await ClockCycles(dut.clk, d // 2)
            if int(dut.tx.value):
                continue                                 # a glitch, not a start bit
            byte = 0
            for k in range(8):
                await ClockCycles(dut.clk, d)
                byte |= int(dut.tx.value) << k
            await ClockCycles(dut.clk, d)
            assert int(dut.tx.value) == 1, "stop bit low on tx"
            self.text += chr(byte)
            found = self.pattern.search(self.text)
            if found:
                line = {k: int(v, 16) for k, v in
                        (item.split("=") for item in found.group(1).split())}
                line["cycle"] = round(get_sim_time("ns") / self.clock_ns)
                self.lines.append(line)
                self.arrived.set()
                self.text = self.text[found.end():]

    async def type(self, text):
        dut, d = self.dut, self.divisor
        for ch in text:
            for bit in [0] + [ord(ch) >> k & 1 for k in range(8)] + [1]:
                dut.rx.value = bit
                await ClockCycles(dut.clk, d)

    async def line(self, where, limit):
        """The next line for which ``where(line)`` holds, among the next ``limit``; every
        line read on the way must report nothing bad."""
        for _ in range(limit):
            while self.seen == len(self.lines):
                self.arrived.clear()
                await self.arrived.wait()
            line = self.lines[self.seen]
            self.seen += 1
            self.dut._log.info("status: %s", " ".join(f"{k}={v:x}" for k, v in line.items()))
            assert not self.trouble(line), f"the self-test reports trouble: {line}"
            if where(line):
                return line
        raise AssertionError(f"not seen in {limit} lines; the last: {line}")


async def start_top(dut, divisor, prefix, trouble, clock_ns=40):
    """Clock and reset a self-test top with its buttons released; its :class:`Serial`."""
    cocotb.start_soon(Clock(dut.clk, clock_ns, unit="ns").start())
    serial = Serial(dut, divisor, prefix, trouble, clock_ns)
    dut.buttons.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    return serial
