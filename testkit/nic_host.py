"""The host side of a transmit half on Amaranth's simulator, shared by the MrcTx and
MrcNic tests: register bring-up, work requests in, payloads for the payload requests,
send completions and EV events out, the path selector's decisions watched, a cycle count.
A test subclasses :class:`Host` and adds the network side."""

from amaranth.lib import data
from amaranth.sim import Simulator

from mrcnic.base.records import PAYLOAD_REQ, WR_DONE
from mrcnic.tx.path_selector import EVENT
from testkit.streams import frame_to_beats

EVS = [0xFC00_0000_0000_0000_0000_0000_0000_0000 | (0x100 + e) << 80 for e in range(8)]
PMTU_LOG2 = 8


def as_dict(layout, value):
    v = data.Const(layout, value)
    return {name: int(getattr(v, name)) for name, _ in layout}


def random_wrs(rng, n, qps, max_len, min_len=0):
    wrs, va = [], 0x10000
    for i in range(n):
        length = rng.randrange(min_len, max_len + 1)
        wrs.append({"qp": i % qps, "wr_id": i, "va": va, "rkey": 0x1234, "length": length,
                    "imm": rng.getrandbits(32), "with_imm": rng.random() < 0.3})
        va += length + 0x40
    return wrs


class Host:
    """``dut`` has MrcTx's host ports; ``sel`` is its PathSelector (watched). Subclasses
    give ``configure(ctx)`` (bring-up; returns the blocks) and their own background
    ``testbenches``; ``scenario(ctx)`` sends ``wrs`` and waits for their completions."""

    def __init__(self, dut, sel, rng, wrs, *, backpressure=0.1, budget=60_000, planes=4):
        self.dut, self.sel, self.rng, self.wrs = dut, sel, rng, wrs
        self.bp, self.budget, self.planes = backpressure, budget, planes
        self.payload = {(w["qp"], w["wr_id"]): bytes(rng.getrandbits(8)
                                                     for _ in range(w["length"]))
                        for w in wrs}
        self.done, self.events, self.preqs = [], [], []
        self.decisions = []                 # (request cycle, plane) of each EV given
        self.cycle = 0
        self.configured = False
        self.setup = None                   # async setup(blocks), after the bring-up
        self.counters = {}

    async def control(self, ctx):
        full = (1 << self.planes) - 1
        ctx.set(self.dut.port_up, full)
        ctx.set(self.dut.credit, full)
        self.blocks = await self.configure(ctx)
        if self.setup:
            await self.setup(self.blocks)
        self.configured = True
        await self.scenario(ctx)
        self.counters = {n: (await self.blocks["mrc-tx"][0].read_fields(n))["count"]
                         for n in ("packets", "retransmissions", "no_path", "dropped_error",
                                   "qp_errors", "port_down", "announcements", "peer_ports")}

    async def send(self, ctx, wrs):
        dut = self.dut
        for w in wrs:
            ctx.set(dut.wr.payload, w)
            ctx.set(dut.wr.valid, 1)
            await ctx.tick().until(dut.wr.ready)
        ctx.set(dut.wr.valid, 0)

    async def wait(self, ctx, cond, cycles):
        end = self.cycle + cycles
        while not cond() and self.cycle < end:
            await ctx.tick()

    async def scenario(self, ctx):
        await self.send(ctx, self.wrs)
        await self.wait(ctx, lambda: len(self.done) == len(self.wrs), self.budget)

    async def clock(self, ctx):
        while True:
            await ctx.tick()
            self.cycle += 1

    async def host(self, ctx):
        """Take payload requests; send each payload on s_axis, in request order."""
        dut = self.dut
        queue, beats = [], []
        while True:
            ctx.set(dut.preq.ready, self.rng.random() > self.bp)
            if not beats and queue:
                r = queue.pop(0)
                body = self.payload[r["qp"], r["wr_id"]][r["offset"]:r["offset"] + r["length"]]
                assert len(body) == r["length"], f"payload request outside its WR: {r}"
                beats = list(frame_to_beats(body, len(dut.s_axis.tkeep)))
            if beats:
                d, k, last, u = beats[0]
                ctx.set(dut.s_axis.tdata, d)
                ctx.set(dut.s_axis.tkeep, k)
                ctx.set(dut.s_axis.tlast, last)
                ctx.set(dut.s_axis.tuser, u)
            ctx.set(dut.s_axis.tvalid, bool(beats))
            _, _, pv, pr, pay, tr = await ctx.tick().sample(
                dut.preq.valid, dut.preq.ready, dut.preq.payload.as_value(),
                dut.s_axis.tready)
            if pv and pr:
                rec = as_dict(PAYLOAD_REQ, pay)
                queue.append(rec)
                self.preqs.append(rec)
            if beats and tr:
                beats.pop(0)

    async def outputs(self, ctx):
        dut = self.dut
        for port in (dut.done, dut.event):
            ctx.set(port.ready, 1)
        req, rsp = self.sel.req, self.sel.rsp   # the selector's decisions, watched inside
        asked = []
        while True:
            _, _, dv, dp, ev, ep, qv, qr, rv, rr, none, plane = await ctx.tick().sample(
                dut.done.valid, dut.done.payload.as_value(), dut.event.valid,
                dut.event.payload.as_value(), req.valid, req.ready, rsp.valid, rsp.ready,
                rsp.payload.none, rsp.payload.plane)
            if qv and qr:
                asked.append(self.cycle)
            if rv and rr:                       # responses come in request order
                when = asked.pop(0)
                if not none:
                    self.decisions.append((when, plane))
            if dv:
                self.done.append(as_dict(WR_DONE, dp))
            if ev:
                self.events.append(as_dict(EVENT, ep))

    def run(self, *testbenches):
        """Run until ``control`` returns; the rest run in the background."""
        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        sim.add_testbench(self.control)
        for tb in (self.clock, self.host, self.outputs, *testbenches):
            sim.add_testbench(tb, background=True)
        sim.run()
        return self


def check_delivery(loop):
    print(f"{loop.cycle} cycles, {len(loop.sent)} frames, {len(loop.dropped)} lost, "
          f"counters {loop.counters}, {len(loop.events)} events")
    assert len(loop.done) == len(loop.wrs), \
        f"{len(loop.done)} of {len(loop.wrs)} work requests completed in {loop.cycle} cycles"
    for q in range(loop.qps):
        assert [d["wr_id"] for d in loop.done if d["qp"] == q] == \
               [w["wr_id"] for w in loop.wrs if w["qp"] == q], f"QP {q}: completions out of order"
    for w in loop.wrs:
        body = loop.payload[w["qp"], w["wr_id"]]
        got = bytes(loop.memory.get(w["va"] + k, 0) for k in range(len(body)))
        assert all(w["va"] + k in loop.memory for k in range(len(body))), \
            f"WR {w['wr_id']}: bytes missing"
        assert got == body, f"WR {w['wr_id']}: bytes differ"
    assert len(loop.memory) == sum(w["length"] for w in loop.wrs)
