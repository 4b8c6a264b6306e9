"""cocotb testbench of RetransmitTracker on the exported Verilog: closed-loop traffic with
loss, reordering, duplication, trimming and stray SACK/NACKs, every retransmit request,
feedback, release and error record matched against the reference model (run afterwards in
the order the block took its inputs), counters read over AXI4-Lite; one record per cycle on
both inputs; timeouts against the model's timer pass; a PSN whose retransmission is pending
not requested again by NACKs and SACK holes, and a full pending table."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from mrcnic.base.records import (
    ack_desc_fields, EV_FEEDBACK, QP_ERROR, RtxCause, release_layout, rtx_layout, sent_layout)
from mrcnic.model.tx.retransmit_tracker import OUTPUTS, RetransmitTrackerModel, closed_loop
from mrcnic.base.proto import NackCode
from mrcnic.tx.retransmit_tracker import RT_REGS
from testkit.tbutil import TB, long_runs, random_pauses, soak
from testkit.meta import MetaSink


class TrackerTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        p = self.params
        self.qps, self.outstanding, self.tag_width = (p["qps"], p["outstanding"],
                                                      p["tag_width"])
        self.pending = p["pending"]
        lays = {"rtx": rtx_layout(self.tag_width), "feedback": EV_FEEDBACK,
                "release": release_layout(self.tag_width), "qp_error": QP_ERROR}
        self.sinks = {name: MetaSink.cocotb(dut, name, [n for n, _ in lay], dut.clk)
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
                                            self.pending, **regs)
        for name in ("reorder_guard", "timeout_exp", "retry_linear"):
            if name in regs:
                await self.regs.write_fields("config", **{name: regs[name]})
        if "retry_max" in regs:
            await self.regs.write_fields("config2", retry_max=regs["retry_max"])
        if "reorder_time" in regs:
            await self.regs.write_fields("config2", reorder_time=regs["reorder_time"])
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
                log.append((cycle, 1, "sent", sents[si]))
                si += 1
                sd = False
            if ad and ar:
                log.append((cycle, 0, "ack", acks[ai][0]))
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
    # lag: the sender resends up to 40 steps late, with more trims and duplicated NACKs,
    # so that NACKs and SACK holes meet pending resends (and fill a small table).
    lag = random.choice([0, 40])
    # rtime: the time guard (send times one tick a step, the timeout out of reach), or none;
    # with it the count guard is 1, so that the time guard decides which holes are lost
    rtime = random.choice([0, 4, 10])
    if rtime:
        guard = 1
    tb.log.info("reorder_guard %d, resend lag %d, pending %d, reorder_time %d", guard, lag,
                tb.pending, rtime)
    timers = {"reorder_time": rtime, "timeout_exp": 24} if rtime else {}
    await tb.start(reorder_guard=guard, **timers)
    # 600 events: every counter the asserts below need shows up (0 of 300 seeds missed one;
    # at 300 events up to 3% did)
    n = soak(3000 if long_runs() else 600)
    events = closed_loop(random.Random(random.getrandbits(64)), n,
                         qps=min(tb.qps, 8), outstanding=tb.outstanding,
                         tag_width=tb.tag_width, reorder_guard=guard, pending=tb.pending,
                         rtx_lag=lag, reorder_time=rtime,
                         **({"trim": 0.05, "ack_dup": 0.1} if lag else {}))
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.1, 0.8)]:
        for s in tb.sinks.values():
            s.set_pause_generator(random_pauses(bp))
        tb.model = RetransmitTrackerModel(tb.qps, tb.outstanding, tb.tag_width, tb.pending,
                                          reorder_guard=guard, **timers)
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
    # With the time guard, a resend taken before the SACK that shows its hole (sent records
    # run ahead of acks here, unlike in the loop that made the traffic) makes the hole
    # young: few or no hole requests, many young holes; the directed tests in
    # sim/tx/test_retransmit_tracker.py show both outcomes.
    c = tb.model.counts
    assert c["sack_stale"] > 0 and c["hole_young" if rtime else "rtx_hole"] > 0, str(c)
    assert (c["hole_young"] > 0) == bool(rtime), str(c)
    await tb.cycles(5)


@cocotb.test()
async def one_sack_and_one_sent_record_per_cycle(dut):
    tb = TrackerTB(dut)
    await tb.start()
    qps = min(tb.qps, 4)
    n = 1000 if long_runs() else 100
    nxt = [0] * qps
    events, acks = [], []
    # The QPs in turn: an ack record right behind one of its own QP waits a cycle (stage K),
    # which sim/tx/test_retransmit_tracker.py measures.
    for i in range(n):
        q = i % qps
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
    # exhaustion are checked step by step in sim/tx/test_retransmit_tracker.py.
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


def _sent(qp, psn, rtx=0):
    return ("sent", {"qp": qp, "psn": psn, "ev": psn & 255, "time": 0, "tag": psn,
                     "rtx": rtx})


def _ack(qp, sent_before, *, nack=0, psn=0, cack=0, bitmap=0, reason=NackCode.TRIMMED):
    d = dict.fromkeys(ack_desc_fields(), 0)
    d.update(qp=qp, nack=nack, psn=psn, cack=cack, bitmap=bitmap, sack_offset=1,
             reason=int(reason), mpr=8)
    return ("ack", d, sent_before)


@cocotb.test()
async def pending_retransmissions_are_requested_once(dut):
    """A NACKed PSN shown as a hole, NACKed again, then resent and NACKed; two NACKs for
    another PSN; then NACKs for ``pending`` more PSNs: the table fills."""
    tb = TrackerTB(dut)
    await tb.start()
    n = 14 + tb.pending
    await tb.run_and_check([_sent(0, p) for p in range(n)] + [
        _ack(0, n, nack=1, psn=5),                          # request
        _ack(0, n, cack=4, bitmap=0b1111110),               # 6..11 acked: hole 5 pending
        _ack(0, n, nack=1, psn=5),                          # pending
        _ack(0, n, nack=1, psn=12, reason=NackCode.NO_PKT_BUFFER),     # request
        _ack(0, n, nack=1, psn=12),                         # pending
    ])
    await tb.run_and_check([_sent(0, 5, rtx=1)])            # resent
    await tb.run_and_check([_ack(0, 0, nack=1, psn=5)])     # the resend trimmed: request
    # Entries now: 5, 12. NACKs for 13, 14, ... fill the table, then go out unremembered.
    extra = [13 + i for i in range(tb.pending)]
    await tb.run_and_check([_ack(0, 0, nack=1, psn=p) for p in extra] +
                           [_ack(0, 0, nack=1, psn=extra[-1])])
    got = [(r["psn"], r["cause"]) for r in tb.sinks["rtx"].records]
    N = RtxCause.NACK
    # The last two of ``extra`` find the table full, and the last one again.
    assert got == [(5, N), (12, N), (5, N)] + [(p, N) for p in extra + extra[-1:]], got
    assert tb.model.counts["rtx_pending_skip"] == 3
    assert tb.model.counts["pending_full"] == 3
    await tb.check_counters()
    await tb.cycles(5)
