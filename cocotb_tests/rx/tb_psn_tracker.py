"""cocotb testbench of PsnTracker on the exported Verilog: random arrival orders with loss,
duplication, trimming, probes and stray records, every verdict, SACK/NACK descriptor and
completion matched against the reference model, counters read over AXI4-Lite."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from mrcnic.base.records import ACK_DESC, COMPLETION, PKT_IN, VERDICT
from mrcnic.model.rx.psn_tracker import PsnTrackerModel, random_arrivals
from mrcnic.rx.psn_tracker import TRACKER_REGS
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource, MetaSink

OUTPUTS = (("verdict", VERDICT), ("ack", ACK_DESC), ("cpl", COMPLETION))


class TrackerTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        p = self.params
        self.qps, self.mpr_max, self.wimm = p["qps"], p["mpr_max"], p["max_wimm_dest"]
        self.source = MetaSource.cocotb(dut, "pkt", [n for n, _ in PKT_IN], dut.clk)
        self.sinks = {name: MetaSink.cocotb(dut, name, [n for n, _ in layout], dut.clk)
                      for name, layout in OUTPUTS}
        self.axil, self.regs = self.registers(TRACKER_REGS)
        self.accepted = BeatCounter(dut.clk, dut.pkt_valid, dut.pkt_ready)
        self.model = None

    async def start(self, sack_every=8, setup=()):
        await self.reset()
        self.model = PsnTrackerModel(self.qps, self.mpr_max, self.wimm, sack_every)
        await self.regs.write_fields("config", sack_every=sack_every)
        for action, qp, *args in setup:
            while (await self.regs.read_fields("status"))["busy"]:
                pass
            await self.regs.write_fields("qp_select", qp=qp)
            if action == "open":
                start, mpr = args
                await self.regs.write_fields("qp_start", psn=start)
                await self.regs.write_fields("qp_mpr", mpr=mpr)
                await self.regs.write_fields("qp_command", open=1)
                getattr(self.model, action)(qp, start, mpr or None)
            else:
                await self.regs.write_fields("qp_command", close=1)
                self.model.close(qp)
            while (await self.regs.read_fields("status"))["busy"]:
                pass

    async def run(self, records):
        want = {name: [] for name, _ in OUTPUTS}
        for rec in records:
            verdict, ack, cpls = self.model.packet(rec)
            want["verdict"].append(verdict)
            if ack is not None:
                want["ack"].append(ack)
            want["cpl"] += cpls
        base = {name: len(s.records) for name, s in self.sinks.items()}
        for rec in records:
            self.source.send_nowait(rec)
        for cycle in range(60 * len(records) + 5000):
            if all(len(s.records) - base[n] >= len(want[n]) for n, s in self.sinks.items()):
                break
            await RisingEdge(self.dut.clk)
        for name, s in self.sinks.items():
            got = s.records[base[name]:]
            assert len(got) == len(want[name]), \
                f"{name}: {len(got)} records, model {len(want[name])}"
            for i, (g, w) in enumerate(zip(got, want[name])):
                assert g == w, f"{name} {i}: {g} != model {w}"

    async def check_counters(self):
        await self.cycles(4)
        for name, count in self.model.counts.items():
            got = await self.regs.read(name)
            assert got == count, f"counter {name}: {got}, model {count}"


@cocotb.test()
async def matches_the_model_under_random_traffic(dut):
    tb = TrackerTB(dut)
    await tb.start(sack_every=random.choice([0, 1, 4, 8]))
    spread = min(60, tb.mpr_max * 128 // 5)
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.1, 0.8)]:
        tb.source.set_pause_generator(random_pauses(idle))
        for s in tb.sinks.values():
            s.set_pause_generator(random_pauses(bp))
        n = soak(1500 if long_runs() else 40)
        recs = random_arrivals(random.Random(random.getrandbits(64)), n,
                               qps=tb.qps, spread=spread, stray=0.01)
        # Continue each QP from where the model's CACK stands.
        await tb.run(recs)
    await tb.check_counters()
    await tb.cycles(5)


@cocotb.test()
async def one_packet_per_cycle(dut):
    """One QP streaming in order: a record every two cycles; then QPs in turn, in order:
    one record per cycle."""
    tb = TrackerTB(dut)
    await tb.start(sack_every=8)
    n = 1000 if long_runs() else 40
    for qps, spacing in ((1, 2), (tb.qps, 1)):
        nxt = {q: tb.model.cack(q) + 1 & 0xFFFFFF for q in range(qps)}
        recs = []
        for i in range(n):
            q = i % qps
            recs.append({**dict.fromkeys((f for f, _ in PKT_IN), 0), "qp": q, "psn": nxt[q],
                         "opcode": 0xC7, "length": 4096, "entropy": random.getrandbits(32)})
            nxt[q] = nxt[q] + 1 & 0xFFFFFF
        start = len(tb.sinks["verdict"].records)
        await tb.run(recs)
        c = tb.sinks["verdict"].cycles[start:]
        assert c[-1] - c[0] == spacing * (n - 1), \
            f"{n} verdicts took {c[-1] - c[0] + 1} cycles"
        tb.log.info("measured: %d records on %d QP(s) in turn in %d cycles", n, qps,
                    c[-1] - c[0] + 1)
    await tb.cycles(5)


@cocotb.test()
async def psn_wrap_commands_and_an_ack_storm(dut):
    """QPs opened near the PSN wrap with small windows, one closed; an ACK-request storm on
    one QP under heavy backpressure on the descriptors disturbs no other QP."""
    tb = TrackerTB(dut)
    qps = min(tb.qps, 4)
    mpr = max(1, tb.mpr_max // 2)
    starts = {q: (0xFFFFFF - random.randrange(300)) for q in range(qps)}
    setup = [("open", q, starts[q], mpr) for q in range(qps)]
    if tb.qps > qps:
        setup.append(("close", qps))
    await tb.start(sack_every=4, setup=setup)
    tb.sinks["ack"].set_pause_generator(random_pauses(0.9))
    n = soak(800 if long_runs() else 40)
    recs = random_arrivals(random.Random(random.getrandbits(64)), n, qps=qps, start=starts,
                           spread=min(40, mpr * 128 // 5), ack_req=0.0)
    storm = [dict(r, ack_req=1) if r["qp"] == 0 else r for r in recs]
    if tb.qps > qps:
        storm.append({**storm[0], "qp": qps})
    await tb.run(storm)
    await tb.check_counters()
    await tb.cycles(5)
