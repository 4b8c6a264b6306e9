"""cocotb testbench of MemoryProtect on the exported Verilog: random region tables and
record streams (every WRITE opcode, probes, trimmed packets, QP indexes out of range, range
edges, every cause) under random idle and backpressure on every port, each record and NAK
matched against mrcnic.model.rx.memory_protect, tables and counters through AXI4-Lite with
cocotbext-axi and RegisterDriver."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from mrcnic.rx.memory_protect import MP_COUNTERS, MP_OUT, MP_REGS, table_op
from mrcnic.model.rx.memory_protect import (MemoryProtectModel, apply_op, random_records,
                                         random_setup)
from mrcnic.base.records import NAK, RX_PKT
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource, MetaSink


class ProtectTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.regions, self.qps = self.params["regions"], self.params["qps"]
        self.source = MetaSource.cocotb(dut, "pkt", [n for n, _ in RX_PKT], dut.clk)
        self.out = MetaSink.cocotb(dut, "out", [n for n, _ in MP_OUT], dut.clk)
        self.nak = MetaSink.cocotb(dut, "nak", [n for n, _ in NAK], dut.clk)
        self.axil, self.regs = self.registers(MP_REGS)
        self.accepted = BeatCounter(dut.clk, dut.pkt_valid, dut.pkt_ready)
        self.model = MemoryProtectModel(self.regions, self.qps)

    async def op(self, op):
        await table_op(self.regs, op)
        apply_op(self.model, op)

    def stalls(self, idle, bp):
        self.source.set_pause_generator(random_pauses(idle))
        self.out.set_pause_generator(random_pauses(bp))
        self.nak.set_pause_generator(random_pauses(bp))

    async def run(self, records):
        """Send ``records``, wait for every output, compare with the model and the counters
        (cleared first), then clear the error bits the round set."""
        await self.regs.write_fields("control", clear=1)
        self.model.clear_counts()
        want_out, want_nak = self.model.records(records)
        base_out, base_nak = len(self.out.records), len(self.nak.records)
        for rec in records:
            self.source.send_nowait(rec)
        for _ in range(50 * len(records) + 2000):
            if (len(self.out.records) - base_out >= len(want_out) and
                    len(self.nak.records) - base_nak >= len(want_nak)):
                break
            await RisingEdge(self.dut.clk)
        await self.cycles(20)
        got_out, got_nak = self.out.records[base_out:], self.nak.records[base_nak:]
        assert len(got_out) == len(want_out), f"{len(got_out)} records, model {len(want_out)}"
        for i, (g, w) in enumerate(zip(got_out, want_out)):
            assert g == w, f"out {i}: {g} != model {w}"
        assert got_nak == want_nak
        for name in MP_COUNTERS:
            got = await self.regs.read(name)
            assert got == self.model.counts[name], \
                f"counter {name}: {got}, model {self.model.counts[name]}"
        for q in random.sample(range(self.qps), min(8, self.qps)):
            await self.regs.write_fields("qp_select", qp=q)
            err = (await self.regs.read_fields("qp_status"))["error"]
            assert err == int(self.model.error[q]), f"QP {q} error bit {err}"
        self.log.info("%d records: %s", len(records), self.model.counts)
        for q in range(self.qps):
            if self.model.error[q]:
                await self.op(("clear_error", q))


@cocotb.test()
async def random_traffic_matches_the_model(dut):
    tb = ProtectTB(dut)
    await tb.reset()
    info = await tb.regs.read_fields("info")
    assert info == {"regions": tb.regions, "qps": tb.qps}, info
    rng = random.Random(random.getrandbits(64))
    for op in random_setup(rng, tb.regions, tb.qps):
        await tb.op(op)
    per_round = min(60, 4 + 2 * tb.qps)
    rounds = soak(12 if long_runs() else 4)
    for idle, bp in [(0.0, 0.0), (0.3, 0.4), (0.5, 0.2)]:
        tb.stalls(idle, bp)
        for _ in range(rounds):
            start = len(tb.accepted.cycles)
            records = random_records(rng, tb.model, per_round)
            await tb.run(records)
            if idle == 0 and bp == 0:
                c = tb.accepted.cycles[start:]
                assert len(c) == len(records) and c[-1] - c[0] + 1 == len(records), \
                    f"{len(records)} records took {c[-1] - c[0] + 1} cycles"
    await tb.cycles(5)


@cocotb.test()
async def bad_register_input_is_refused(dut):
    tb = ProtectTB(dut)
    await tb.reset()
    await tb.op(("region", tb.regions, 0x55, 0, 1 << 40, 1, 0))
    assert (await tb.regs.read_fields("error")) == {"bad_region": 1, "bad_qp": 0, "busy": 0}
    await tb.op(("pd", tb.qps, 3))
    assert (await tb.regs.read_fields("error")) == {"bad_region": 1, "bad_qp": 1, "busy": 0}
    await tb.regs.write_fields("error", bad_region=1, bad_qp=1)
    assert (await tb.regs.read_fields("error")) == {"bad_region": 0, "bad_qp": 0, "busy": 0}
    rec = dict.fromkeys((n for n, _ in RX_PKT), 0)
    rec.update(qp=0, opcode=0xCA, rkey=0x55, va=0x10, length=4)
    await tb.run([rec])          # R_Key 0x55 never became a region: NAK, QP 0 in error
    assert tb.nak.records[-1] == {"qp": 0, "psn": 0, "syndrome": 0x62}
    await tb.cycles(5)
