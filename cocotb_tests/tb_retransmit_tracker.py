"""cocotb testbench of RetransmitTracker on the exported Verilog: closed-loop traffic with
loss, reordering, duplication, trimming and stray SACK/NACKs, every retransmit request,
feedback, release and error record matched against the reference model (run afterwards in
the order the block took its inputs), counters read over AXI4-Lite; one record per cycle on
both inputs; timeouts against the model's timer pass."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from mrcnic.ack_desc import ACK_DESC, ack_desc_fields
from mrcnic.ev_feedback import EV_FEEDBACK
from mrcnic.model.retransmit_tracker import OUTPUTS, RetransmitTrackerModel, closed_loop
from mrcnic.retransmit_tracker import (QP_ERROR, RT_REGS, RtxCause, release_layout,
                                       rtx_layout, sent_layout)
from tbutil import TB, MetaSink, long_runs, random_pauses, soak


class TrackerTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        p = self.params
        self.qps, self.outstanding, self.tag_width = (p["qps"], p["outstanding"],
                                                      p["tag_width"])
        lays = {"rtx": rtx_layout(self.tag_width), "feedback": EV_FEEDBACK,
                "release": release_layout(self.tag_width), "qp_error": QP_ERROR}
        self.sinks = {name: MetaSink(dut, name, [n for n, _ in lay], dut.clk)
                      for name, lay in lays.items()}
        self.sent_fields = [n for n, _ in sent_layout(self.tag_width)]
        self.ack_fields = list(ack_desc_fields())
        self.axil, self.regs = self.registers(RT_REGS)
        dut.sent_valid.value = 0
        dut.ack_valid.value = 0
        dut.cwnd_valid.value = 0
        dut.now.value = 0
        dut.credit_qp.value = 0
        self.model = None
        self.stalls = {"sent": 0, "ack": 0}

    async def start(self, **regs):
        await self.reset()
        self.model = RetransmitTrackerModel(self.qps, self.outstanding, self.tag_width,
                                            **regs)
        for name in ("reorder_guard", "timeout_exp", "retry_linear"):
            if name in regs:
                await self.regs.write_fields("config", **{name: regs[name]})
        if "retry_max" in regs:
            await self.regs.write_fields("config2", retry_max=regs["retry_max"])
        while (await self.regs.read_fields("status"))["busy"]:
            pass

    def _drive(self, prefix, fields, rec):
        for name in fields:
            getattr(self.dut, f"{prefix}_{name}").value = rec[name]

    async def feed(self, events, idle=0.0):
        """Both inputs driven from ``events`` with random idle; an ack never before the sent
        records it names. Returns the handshake log (cycle, order, kind, record)."""
        dut = self.dut
        sents = [e[1] for e in events if e[0] == "sent"]
        acks = [(e[1], e[2]) for e in events if e[0] == "ack"]
        si = ai = cycle = 0
        sd = ad = False
        log = []
        while si < len(sents) or ai < len(acks) or sd or ad:
            if not sd and si < len(sents) and not (idle and random.random() < idle):
                self._drive("sent", self.sent_fields, sents[si])
                sd = True
            if (not ad and ai < len(acks) and acks[ai][1] <= si
                    and not (idle and random.random() < idle)):
                self._drive("ack", self.ack_fields, acks[ai][0])
                ad = True
            dut.sent_valid.value = int(sd)
            dut.ack_valid.value = int(ad)
            await RisingEdge(dut.clk)
            sr, ar = int(dut.sent_ready.value), int(dut.ack_ready.value)
            self.stalls["sent"] += sd and not sr
            self.stalls["ack"] += ad and not ar
            if sd and sr:
                log.append((cycle, 0, "sent", sents[si]))
                si += 1
                sd = False
            if ad and ar:
                log.append((cycle, 1, "ack", acks[ai][0]))
                ai += 1
                ad = False
            cycle += 1
        dut.sent_valid.value = 0
        dut.ack_valid.value = 0
        return log

    async def run_and_check(self, events, idle=0.0):
        base = {name: len(s.records) for name, s in self.sinks.items()}
        log = await self.feed(events, idle)
        want = {name: [] for name in OUTPUTS}
        for _, _, kind, rec in sorted(log, key=lambda e: e[:2]):
            if kind == "sent":
                self.model.sent(rec)
            else:
                out = self.model.ack(rec)
                for name in OUTPUTS:
                    want[name] += out[name]
        for _ in range(20 * len(events) + 2000):
            if all(len(s.records) - base[n] >= len(want[n]) for n, s in self.sinks.items()):
                break
            await RisingEdge(self.dut.clk)
        await self.cycles(20)
        for name, s in self.sinks.items():
            got = s.records[base[name]:]
            for i, (g, w) in enumerate(zip(got, want[name])):
                assert g == w, f"{name} {i}: {g} != model {w}"
            assert len(got) == len(want[name]), \
                f"{name}: {len(got)} records, model {len(want[name])}"
        return log

    async def check_counters(self):
        await self.cycles(4)
        for name, count in self.model.counts.items():
            if name.startswith("scan_"):
                continue
            got = await self.regs.read(name)
            assert got == count, f"counter {name}: {got}, model {count}"


@cocotb.test()
async def matches_the_model_under_closed_loop_traffic(dut):
    tb = TrackerTB(dut)
    guard = random.choice([1, 3, 8])
    await tb.start(reorder_guard=guard)
    n = soak(3000 if long_runs() else 300)
    events = closed_loop(random.Random(random.getrandbits(64)), n,
                         qps=min(tb.qps, 8), outstanding=tb.outstanding,
                         tag_width=tb.tag_width, reorder_guard=guard)
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.1, 0.8)]:
        for s in tb.sinks.values():
            s.set_pause_generator(random_pauses(bp))
        tb.model = RetransmitTrackerModel(tb.qps, tb.outstanding, tb.tag_width,
                                          reorder_guard=guard)
        # Every pass starts each QP afresh: open them again.
        for q in range(min(tb.qps, 8)):
            await tb.regs.write_fields("qp_select", qp=q)
            await tb.regs.write_fields("qp_start", psn=0)
            await tb.regs.write_fields("qp_command", open=1)
            while (await tb.regs.read_fields("status"))["busy"]:
                pass
        await tb.regs.write_fields("control", clear=1)
        await tb.run_and_check(events, idle)
        await tb.check_counters()
    assert tb.model.counts["rtx_hole"] > 0 and tb.model.counts["sack_stale"] > 0
    await tb.cycles(5)


@cocotb.test()
async def one_sack_and_one_sent_record_per_cycle(dut):
    tb = TrackerTB(dut)
    await tb.start()
    qps = min(tb.qps, 4)
    n = 1000 if long_runs() else 100
    nxt = [0] * qps
    events, acks = [], []
    for i in range(n):
        q = random.randrange(qps)
        events.append(("sent", {"qp": q, "psn": nxt[q], "ev": random.randrange(256),
                                "time": 0, "tag": i, "rtx": 0}))
        if nxt[q] >= 1:
            d = dict.fromkeys(ack_desc_fields(), 0)
            d.update(qp=q, cack=nxt[q] - 1, bitmap=1, sack_offset=1, ack_psn_offset=1,
                     mpr=8)
            acks.append(("ack", d, i + 1))
        nxt[q] += 1
    log = await tb.run_and_check(events + acks)
    sc = [c for c, _, k, _ in log if k == "sent"]
    assert sc[-1] - sc[0] + 1 == n
    assert tb.stalls == {"sent": 0, "ack": 0}, tb.stalls
    tb.log.info("measured: %d sent records in %d cycles, %d SACKs, refused cycles %s",
                n, sc[-1] - sc[0] + 1, len(acks), tb.stalls)
    await tb.cycles(5)


@cocotb.test()
async def timeouts_match_the_model(dut):
    tb = TrackerTB(dut)
    # retry_linear 7 keeps the timeout of every PSN independent of the order the scan
    # meets them in (the scan may be mid-visit when ``now`` changes); the backoff and the
    # exhaustion are checked step by step in sim/test_retransmit_tracker.py.
    await tb.start(timeout_exp=3, retry_linear=7, retry_max=25)
    qps = min(tb.qps, 3)
    for s in tb.sinks.values():
        s.set_pause_generator(random_pauses(0.3))
    dut.now.value = 4                   # send times 0 .. 3 are in the past
    events = []
    for q in range(qps):
        for p in range(random.randrange(1, 20)):
            events.append(("sent", {"qp": q, "psn": p, "ev": p, "time": random.randrange(4),
                                    "tag": 1000 * q + p, "rtx": 0}))
    await tb.run_and_check(events)
    pass_cycles = tb.qps * (20 + 3) + 100      # a pass: every QP's outstanding PSNs + 3
    for now in (6, 8, 11, 12, 20, 40, 80):
        base = {name: len(s.records) for name, s in tb.sinks.items()}
        dut.now.value = now
        await tb.cycles(2 * pass_cycles + 100)
        tb.log.info("timer step now=%s: scan visits %s, timeouts %s", dut.now.value,
                    await tb.regs.read("scan_visits"), await tb.regs.read("rtx_timeout"))
        want = tb.model.scan(now)
        for name, s in tb.sinks.items():
            got = sorted(tuple(sorted(r.items())) for r in s.records[base[name]:])
            exp = sorted(tuple(sorted(r.items())) for r in want[name])
            assert got == exp, f"now={now} {name}: {got} != model {exp}"
    assert tb.model.counts["rtx_timeout"] > 0
    await tb.check_counters()
    await tb.cycles(5)
