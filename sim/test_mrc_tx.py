"""MrcTx on Amaranth's simulator, in a closed loop with a peer made of models: work
requests go in; the frames on the plane ports are decoded (ICRC checked), checked against
the EV each carries (outer SRv6 destination = the EV's address, plane = EV mod planes),
some are lost, and the rest go to the PSN tracker's model, whose SACKs and NACKs come back
on ``ack``. Every work request completes, every byte arrives once at its address, every
retransmission carries rtx and the retransmit DSCP."""

import random

import pytest
from amaranth.lib import data

from mrcnic import proto
from mrcnic.ack_desc import ACK_DESC
from mrcnic.bringup import TxConfig, bring_up_tx
from mrcnic.model import packet as pk
from mrcnic.model.psn_tracker import PsnTrackerModel
from mrcnic.mrc_tx import PAYLOAD_REQ, MrcTx
from mrcnic.path_selector import EVENT
from mrcnic.tx_segmenter import WR_DONE
from axil import AxiLiteSimMaster
from simtools import run, seeded
from streams import AxisSink, frame_to_beats

PLANES = 4
EVS = [0xFC00_0000_0000_0000_0000_0000_0000_0000 | (0x100 + e) << 80 for e in range(8)]
PMTU_LOG2 = 8


def as_dict(layout, value):
    v = data.Const(layout, value)
    return {name: int(getattr(v, name)) for name, _ in layout}


class Loop:
    """The DUT with its host (payloads for ``preq``), its wire (one sink per plane) and the
    peer (decode, lose, the PSN tracker's model, SACK/NACK back on ``ack``)."""

    def __init__(self, rng, wrs, *, loss=0.0, qps=2, backpressure=0.1, delay=(20, 80),
                 budget=60_000, lose=None, ports=None, setup=None):
        self.rng, self.wrs, self.loss, self.lose = rng, wrs, loss, lose
        self.dut = MrcTx(PLANES, 64, qps, 8, len(EVS), 1, 128, 128)
        self.qps, self.bp, self.delay, self.budget = qps, backpressure, delay, budget
        self.payload = {(w["qp"], w["wr_id"]): bytes(rng.getrandbits(8)
                                                     for _ in range(w["length"]))
                        for w in wrs}
        self.sinks = [AxisSink(getattr(self.dut, f"m{p}_axis"), 10 ** 9, rng=rng,
                               backpressure=backpressure, max_cycles=10 ** 9)
                      for p in range(PLANES)]
        self.peer = PsnTrackerModel(qps=qps, mpr_max=8, sack_every=4)
        self.memory, self.frames, self.dropped, self.sent = {}, [], [], []
        self.done, self.events, self.preqs = [], [], []
        self.cycle = 0
        self.configured = False
        self.ports, self.setup = ports, setup          # ports(cycle) -> (up, credit) masks
        self.arrivals = []                             # (cycle off the wire, plane)
        self.decisions = []                 # (request cycle, plane) of each EV given

    async def control(self, ctx):
        master = AxiLiteSimMaster(ctx, self.dut.s_axil)
        cfg = TxConfig(local_mac=0x02_00_00_00_00_01, local_ip=0xFD00 << 112 | 1,
                       peer_mac=0x02_00_00_00_00_02, peer_ip=0xFD00 << 112 | 2,
                       outer_src=0xFC00_0000_0001 << 80, evs=EVS,
                       remote_qps=list(range(self.qps)), pmtu_log2=PMTU_LOG2,
                       tick_cycles=16, timeout_exp=6, reorder_guard=3)
        self.blocks = await bring_up_tx(master.read, master.write, cfg)
        if self.setup:
            await self.setup(self.blocks)
        self.configured = True
        await self.scenario(ctx)
        self.counters = {n: (await self.blocks["mrc-tx"][0].read_fields(n))["count"]
                         for n in ("packets", "retransmissions", "no_path", "dropped_error",
                                   "qp_errors")}

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
        req, rsp = dut.sel.req, dut.sel.rsp     # the selector's decisions, watched inside
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

    def arrive(self, plane, frame):
        """One frame off the wire: checked, then lost or given to the peer."""
        pkt = pk.decode(frame, check_icrc=True)
        ev = pk.stev_ev(pkt)
        assert pkt.outer is not None and pkt.outer["dst"] == EVS[ev], "outer dst is not the EV"
        assert ev % PLANES == plane, f"EV {ev} left on plane {plane}"
        rtx = pkt.bth["rtx"]
        assert pkt.outer["dscp"] == (proto.DSCP_RTX if rtx else proto.DSCP_DATA)
        self.frames.append((self.cycle, plane, ev, pkt))
        qp, psn = pkt.bth["dest_qp"], pkt.bth["psn"]
        lost = self.lose(qp, psn, rtx) if self.lose else self.rng.random() < self.loss
        if self.ports and not self.ports(self.cycle)[0] >> plane & 1:
            lost = True                                 # the plane's port is down
        if lost:
            self.dropped.append((qp, psn, ev))
            return None
        verdict, desc, _ = self.peer.packet({
            "qp": qp, "psn": psn, "opcode": pkt.bth["opcode"], "ack_req": pkt.bth["ack_req"],
            "rtx": rtx, "ce": 0, "trimmed": 0, "lasthop": 0, "length": len(pkt.payload),
            "entropy": ev, "timestamp": 0, "imm": (pkt.immdt or {}).get("imm", 0), "tag": 0})
        if verdict["verdict"] == 0:                     # PLACE
            for k, b in enumerate(pkt.payload):
                addr = pkt.reth["va"] + k
                assert addr not in self.memory, f"byte at {addr:#x} written twice"
                self.memory[addr] = b
        return desc

    async def peer_side(self, ctx):
        dut = self.dut
        seen = [0] * PLANES
        pending, acks = [], []                          # (due cycle, plane, frame)
        while True:
            for p, sink in enumerate(self.sinks):
                while seen[p] < len(sink.frames):
                    frame = sink.frames[seen[p]]
                    self.arrivals.append((self.cycle, p))
                    pkt = pk.decode(frame, check_icrc=False)
                    self.sent.append((pkt, pk.stev_ev(pkt)))
                    pending.append((self.cycle + self.rng.randint(*self.delay), p, frame))
                    seen[p] += 1
            for item in [x for x in pending if x[0] <= self.cycle]:
                pending.remove(item)
                desc = self.arrive(item[1], item[2])
                if desc is not None:
                    acks.append(desc)
            if self.ports:
                up, credit = self.ports(self.cycle)
                ctx.set(dut.port_up, up)
                ctx.set(dut.credit, credit)
            ctx.set(dut.ack.valid, bool(acks))
            if acks:
                ctx.set(dut.ack.payload, acks[0])
            _, _, ready = await ctx.tick().sample(dut.ack.ready)
            if acks and ready:
                acks.pop(0)


def run_loop(loop):
    """Run ``loop`` (a :class:`Loop`); its background parts run until control returns."""
    from amaranth.sim import Simulator
    sim = Simulator(loop.dut)
    sim.add_clock(1e-8)
    full = (1 << PLANES) - 1

    async def control(ctx):
        ctx.set(loop.dut.port_up, full)
        ctx.set(loop.dut.credit, full)
        await loop.control(ctx)

    sim.add_testbench(control)
    for tb in (loop.clock, loop.host, loop.outputs, loop.peer_side,
               *[s.run for s in loop.sinks]):
        sim.add_testbench(tb, background=True)
    sim.run()
    return loop


def random_wrs(rng, n, qps, max_len):
    wrs, va = [], 0x10000
    for i in range(n):
        length = rng.randrange(max_len + 1)
        wrs.append({"qp": i % qps, "wr_id": i, "va": va, "rkey": 0x1234, "length": length,
                    "imm": rng.getrandbits(32), "with_imm": rng.random() < 0.3})
        va += length + 0x40
    return wrs


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


@pytest.mark.soak
def test_work_requests_complete_with_no_loss():
    rng = seeded()
    wrs = random_wrs(rng, 10, 2, 3 * (1 << PMTU_LOG2) + 7)
    loop = run_loop(Loop(rng, wrs))
    check_delivery(loop)
    assert loop.counters["retransmissions"] == 0 and not loop.dropped
    assert {p for _, p in loop.arrivals} == set(range(PLANES))


def check_avoid(loop):
    """A retransmission never uses the EV of the transmission before it (the one that
    failed), in the order the frames left."""
    last_ev = {}
    for pkt, ev in loop.sent:
        key = pkt.bth["dest_qp"], pkt.bth["psn"]
        if pkt.bth["rtx"]:
            assert key in last_ev, f"{key} retransmitted before it was sent"
            assert ev != last_ev[key], f"{key} retransmitted on the EV that failed ({ev})"
        last_ev[key] = ev


def test_loss_a_port_down_and_a_plane_without_credit():
    """5% random loss; plane 3 without credit for 200 cycles; then plane 1's port down for
    good. Every WR completes, intact; retransmissions avoid the EV that failed; nothing is
    sent on plane 3 without credit; on plane 1 only what had passed the path selector."""
    rng = seeded()
    wrs = random_wrs(rng, 12, 2, 4 * (1 << PMTU_LOG2))
    box = {}

    def ports(cycle):
        t = box.get("t")
        down = t is not None and cycle >= t
        no_credit = t is not None and t - 300 <= cycle < t - 100
        return 0b1111 & ~(0b0010 if down else 0), 0b1111 & ~(0b1000 if no_credit else 0)

    loop = Loop(rng, wrs, ports=ports, loss=0.05)

    async def setup(blocks):
        box["t"] = loop.cycle + 600          # traffic starts after the bring-up
    loop.setup = setup
    run_loop(loop)
    check_delivery(loop)
    check_avoid(loop)
    assert loop.dropped and loop.counters["retransmissions"] >= len(loop.dropped)
    t = box["t"]
    # The port inputs are registered once and checked again at the selector's last stage
    # (4 cycles after the request): no request from 2 cycles before a port went down or
    # lost its credit gets its plane.
    late = [c for c, p in loop.decisions if p == 1 and c >= t - 2]
    assert not late, f"decisions for plane 1 after its port went down: {late}"
    starved = [c for c, p in loop.decisions if p == 3 and t - 302 <= c < t - 104]
    assert not starved, f"decisions for plane 3 while it had no credit: {starved}"
    # Frames decided before still leave on plane 1: at most the packets between the
    # selector and the wire (the descriptor FIFO and RoceTx).
    wire = [c for c, p in loop.arrivals if p == 1 and c >= t]
    assert len(wire) <= 10, f"{len(wire)} frames on plane 1 after its port went down"
    last = max((c for c, p in loop.decisions if p == 1), default=t)
    print(f"port down at {t}: last request given plane 1 {last - t} cycles after, "
          f"{len(wire)} frames on its wire after, the last {max(wire, default=t) - t} after")
    assert any(p == 1 for c, p in loop.arrivals if c < t), "plane 1 never used before"


def test_a_qp_whose_retries_run_out_is_dropped_and_the_others_complete():
    rng = seeded()
    wrs = random_wrs(rng, 4, 2, 2 * (1 << PMTU_LOG2))
    later = [{**w, "wr_id": 100 + w["wr_id"], "va": w["va"] + 0x8000}
             for w in random_wrs(rng, 2, 2, 2 * (1 << PMTU_LOG2))]
    # Everything QP 1 sends is lost: its retries run out and it goes to error.
    loop = Loop(rng, wrs + later, lose=lambda qp, psn, rtx: qp == 1)
    box = {}

    async def setup(blocks):
        trk = blocks["retransmit-tracker"][0]
        await trk.write_fields("config2", retry_max=1)
        await trk.write_fields("config", retry_linear=1, timeout_exp=4)

    async def scenario(ctx):
        await loop.send(ctx, wrs)
        await loop.wait(ctx, lambda: ctx.get(loop.dut.trk.qp_error.valid), 20_000)
        box["error_at"] = loop.cycle
        await loop.send(ctx, later)                 # QP 0: completes; QP 1: dropped
        await loop.wait(ctx, lambda: sum(d["qp"] == 0 for d in loop.done) == 3, 10_000)
        await loop.wait(ctx, lambda: False, 300)
    loop.setup, loop.scenario = setup, scenario
    run_loop(loop)
    assert "error_at" in box and loop.counters["qp_errors"] == 1
    assert [d["wr_id"] for d in loop.done if d["qp"] == 0] == \
        [w["wr_id"] for w in wrs + later if w["qp"] == 0]
    assert not [d for d in loop.done if d["qp"] == 1]
    n_later = sum(max(1, -(-w["length"] >> PMTU_LOG2)) for w in later if w["qp"] == 1)
    assert loop.counters["dropped_error"] == n_later
    late = [c for c, p in loop.arrivals if c > box["error_at"] + 50]
    qp1_late = [pkt for pkt, _ in loop.sent[len(loop.sent) - len(late):]
                if pkt.bth["dest_qp"] == 1]
    assert not qp1_late, "QP 1 sent after its error"
