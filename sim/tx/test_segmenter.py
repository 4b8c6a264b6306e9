"""TxSegmenter on Amaranth's simulator, against mrcnic.model.tx.segmenter: work requests to
packets, retransmit requests rebuilt (and bad ones refused), releases to send completions,
a full message ring, PSN wrap, throughput and latency."""


import pytest
from amaranth.lib import data

from mrcnic.host.driver import RegisterDriver
from mrcnic.model.tx.segmenter import SegmenterModel
from mrcnic.tx.segmenter import SEG_REGS, TxSegmenter
from mrcnic.base.records import SEG_PKT, WR_DONE
from testkit import docs_page
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import (command_cases, offer, run, seeded, soak, start_traffic,
                              until_clear, until_moved)


def unpack(layout, value):
    view = data.Const(layout, value)
    return {name: int(getattr(view, name)) for name, _ in layout}


class Bench:
    """Drives one TxSegmenter: ``send(port, record)`` from the control testbench, two sinks
    with random backpressure collecting ``pkt`` and ``done`` records."""

    def __init__(self, dut, rng, backpressure):
        self.dut, self.rng, self.bp = dut, rng, backpressure
        self.pkts, self.dones, self.pkt_cycles = [], [], []
        self.stop = False
        self.cycle = 0

    async def send(self, ctx, port, record):
        ctx.set(port.payload, record)
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)

    async def idle(self, ctx, n=40):
        for _ in range(n):
            await ctx.tick()

    async def sinks(self, ctx):
        d = self.dut
        while not self.stop:
            ctx.set(d.pkt.ready, self.rng.random() >= self.bp)
            ctx.set(d.done.ready, self.rng.random() >= self.bp)
            _, _, pv, pr, pp, dv, dr, dp = await ctx.tick().sample(
                d.pkt.valid, d.pkt.ready, d.pkt.payload.as_value(),
                d.done.valid, d.done.ready, d.done.payload.as_value())
            if pv and pr:
                self.pkts.append(unpack(SEG_PKT, pp))
                self.pkt_cycles.append(self.cycle)
            if dv and dr:
                self.dones.append(unpack(WR_DONE, dp))
            self.cycle += 1


async def ready_regs(ctx, dut):
    """The register driver, once the reset sweep is over, with PMTU 256."""
    master = AxiLiteSimMaster(ctx, dut.s_axil)
    regs = RegisterDriver(SEG_REGS, master.read, master.write)
    while await regs.read_field("status", "busy"):
        pass
    await regs.write_fields("config", pmtu_log2=8)
    return regs


def random_wr(rng, qp, max_len):
    return {"qp": qp, "wr_id": rng.getrandbits(16), "va": rng.getrandbits(64),
            "rkey": rng.getrandbits(32), "length": rng.randrange(max_len + 1),
            "imm": rng.getrandbits(32), "with_imm": rng.getrandbits(1)}


@pytest.mark.parametrize("qps,msgs", [(4, 4), (3, 2), (1, 8)])
def test_against_the_model(qps, msgs):
    rng = seeded()
    dut = TxSegmenter(qps, msgs)
    model = SegmenterModel(qps, msgs, pmtu_log2=8)
    bench = Bench(dut, rng, backpressure=0.3)
    want_pkts, want_dones, counters = [], [], {}

    async def control(ctx):
        regs = await ready_regs(ctx, dut)
        start = 0xFFFFFE                           # QP 0 crosses the PSN wrap
        await regs.write("qp_select", 0)
        await regs.write("qp_start", start)
        await regs.write_fields("qp_command", open=1)
        model.open(0, start)
        while await regs.read_field("status", "busy"):
            pass
        for rnd in range(soak(4)):
            # Work requests while their rings have room, with one for a QP out of range.
            for _ in range(rng.randrange(1, 2 * msgs)):
                qp = rng.randrange(qps + (1 if rnd == 1 else 0))
                if model.full(qp):
                    continue
                w = random_wr(rng, qp, 900)
                want_pkts.extend(model.wr(w))
                await bench.send(ctx, dut.wr, w)
            await bench.idle(ctx)
            # Retransmit requests: packets in flight, and bad ones.
            for _ in range(6):
                qp = rng.randrange(qps)
                flight = model.q[qp].flight
                if flight and rng.random() < 0.7:
                    pos, msg = rng.choice(flight)
                    npk = model._npk(msg["length"])
                    k = rng.randrange(npk + (1 if rng.random() < 0.2 else 0))
                    tag = model._tag(pos) ^ (rng.choice([0, 0, 0, 1 << 8]))
                    r = {"qp": qp, "psn": (msg["psn"] + k) & 0xFFFFFF, "tag": tag,
                         "ev": rng.getrandbits(8), "cause": rng.getrandbits(2)}
                else:
                    r = {"qp": rng.randrange(qps + 1), "psn": rng.getrandbits(24),
                         "tag": rng.getrandbits(12), "ev": rng.getrandbits(8), "cause": 0}
                p = model.rtx(r)
                if p is not None:
                    want_pkts.append(p)
                await bench.send(ctx, dut.rtx, r)
            await bench.idle(ctx)
            # Releases: up to a random PSN of a message in flight (often mid-message).
            for qp in range(qps):
                flight = model.q[qp].flight
                if flight:
                    _, msg = rng.choice(flight)
                    last = (msg["psn"] + rng.randrange(model._npk(msg["length"]))) & 0xFFFFFF
                    rel = {"qp": qp, "first": 0, "last": last, "tag": 0}
                    want_dones.extend(model.release(rel))
                    await bench.send(ctx, dut.release, rel)
            await bench.send(ctx, dut.release, {"qp": qps, "first": 0, "last": 0, "tag": 0})
            model.release({"qp": qps, "last": 0})
            await bench.idle(ctx)
        for name in model.counters:
            counters[name] = await regs.read(name)
        bench.stop = True

    run(dut, control, bench.sinks)
    got_new = [p for p in bench.pkts if not p["rtx"]]
    got_rtx = [p for p in bench.pkts if p["rtx"]]
    assert got_new == [p for p in want_pkts if not p["rtx"]]
    assert got_rtx == [p for p in want_pkts if p["rtx"]]
    assert bench.dones == want_dones
    assert counters == model.counters


def test_full_ring_waits_and_one_packet_a_cycle():
    """A QP with ``msgs`` messages in flight holds the next WR until a release; a WR of 8
    packets leaves one packet a cycle, the first 5 cycles after its handshake."""
    rng = seeded()
    dut = TxSegmenter(2, 2)
    bench = Bench(dut, rng, backpressure=0.0)
    seen = {}

    async def control(ctx):
        await ready_regs(ctx, dut)
        w = random_wr(rng, 1, 0)
        w["length"] = 8 * 256
        ctx.set(dut.wr.payload, w)
        ctx.set(dut.wr.valid, 1)
        await ctx.tick().until(dut.wr.ready)
        seen["wr_cycle"] = bench.cycle - 1
        ctx.set(dut.wr.valid, 0)
        await bench.idle(ctx, 20)
        seen["first"] = list(bench.pkt_cycles)
        await bench.send(ctx, dut.wr, random_wr(rng, 1, 100))
        # The third WR finds the ring full: it must wait.
        ctx.set(dut.wr.payload, random_wr(rng, 1, 100))
        ctx.set(dut.wr.valid, 1)
        for _ in range(30):
            await ctx.tick()
            assert not ctx.get(dut.wr.ready) or not ctx.get(dut.wr.valid) or \
                len(bench.pkts) < 9, "a WR taken with the ring full"
        assert len(bench.pkts) == 9
        await bench.send(ctx, dut.release, {"qp": 1, "first": 0, "last": 7, "tag": 0})
        await ctx.tick().until(dut.wr.ready)
        ctx.set(dut.wr.valid, 0)
        await bench.idle(ctx, 20)
        bench.stop = True

    run(dut, control, bench.sinks)
    first = seen["first"]
    assert len(first) == 8 and first[-1] - first[0] == 7, f"packets at cycles {first}"
    assert first[0] - seen["wr_cycle"] == 5
    assert len(bench.pkts) == 10 and bench.dones[0]["qp"] == 1


def test_an_open_while_operations_are_in_flight_is_applied():
    """qp_command.open written while work requests, retransmit requests and releases are
    in flight (a WR offered every cycle, a release for every packet that leaves and a
    retransmit request for every eighth), in three cases: pkt and done always ready, the
    open written 0 to 5 cycles after the traffic starts; both held not ready for 60 cycles
    from the start, the open 0 to 5 cycles in; and held so, the open 20 to 25 cycles in,
    with the packet FIFO full and the operation under way waiting on it (the open is taken
    in IDLE only). status.busy clears within a bound in cycles, work requests keep being
    taken and cut after the open, and the QP opened sends from its start PSN."""
    hold_cycles, bound = 60, 150
    rng = seeded()
    dut = TxSegmenter(4, 8)
    st = {"on": False, "stop": False, "ready_at": 0, "cycle": 0}
    queues = {"wr": [], "rel": [], "rtx": []}
    got = {"wr": [], "pkts": [], "done": 0}

    def wr(i):
        return dict(random_wr(rng, i % 4, 600), wr_id=i & 0xFFFF)

    async def wrs(ctx):
        await offer(ctx, st, dut.wr, wr, got["wr"], queues["wr"])

    def feeder(port, name):
        async def feed(ctx):
            r = None
            while not st["stop"]:
                if r is None and queues[name]:
                    r = queues[name].pop(0)
                ctx.set(port.valid, r is not None)
                if r is not None:
                    ctx.set(port.payload, r)
                _, _, ready = await ctx.tick().sample(port.ready)
                if r is not None and ready:
                    r = None
            ctx.set(port.valid, 0)
        return feed

    async def sinks(ctx):
        while not st["stop"]:
            ready = st["cycle"] >= st["ready_at"]
            ctx.set(dut.pkt.ready, ready)
            ctx.set(dut.done.ready, ready)
            _, _, pv, pp, dv = await ctx.tick().sample(
                dut.pkt.valid, dut.pkt.payload.as_value(), dut.done.valid)
            if ready and pv:
                p = unpack(SEG_PKT, pp)
                got["pkts"].append(p)
                if not p["rtx"]:
                    queues["rel"].append({"qp": p["qp"], "first": 0, "last": p["psn"],
                                          "tag": 0})
                    if len(got["pkts"]) % 8 == 0:
                        queues["rtx"].append({"qp": p["qp"], "psn": p["psn"],
                                              "tag": p["tag"], "ev": 1, "cause": 0})
            got["done"] += ready and dv
            st["cycle"] += 1

    async def control(ctx):
        regs = await ready_regs(ctx, dut)
        await regs.write_fields("qp_select", qp=1)
        for case, hold, lead, phase in command_cases(hold_cycles):
            start = 0x800000 + 0x1000 * phase + 0x100 * case
            await regs.write_fields("qp_start", psn=start)
            await start_traffic(ctx, st, hold, lead + phase)
            t0, n0 = st["cycle"], len(got["pkts"])
            what = f"open {lead + phase} cycles into the traffic, outputs held {hold}"
            await regs.write_fields("qp_command", open=1)
            assert got["wr"], f"{what}: no work request in flight"
            await until_clear(st, lambda: regs.read_field("status", "busy"), t0, bound + hold,
                              f"{what}: status.busy")
            # The block keeps working (after the outputs' release, too).
            await until_moved(ctx, st, lambda: (len(got["wr"]), len(got["pkts"]), got["done"]),
                              150, f"{what}: no progress after the open")
            st["on"] = False
            await ctx.tick().repeat(60)
            # The QP opened sends its next message from its start PSN (this one, if no
            # work request of it came after the open).
            queues["wr"].append(random_wr(rng, 1, 600))
            await ctx.tick().repeat(30)
            psns = [p["psn"] for p in got["pkts"][n0:] if p["qp"] == 1 and not p["rtx"]]
            assert start in psns, f"{what}: QP 1 never sent from {start:#x}"
            got["wr"].clear()
        st["stop"] = True

    run(dut, control, wrs, feeder(dut.release, "rel"), feeder(dut.rtx, "rtx"), sinks)


def test_parameters_are_checked():
    for bad in [dict(qps=0), dict(msgs=3), dict(msgs=1), dict(msgs=512)]:
        with pytest.raises(ValueError):
            TxSegmenter(**{"qps": 4, "msgs": 4, **bad})


def test_docs_page_has_the_register_table():
    page = docs_page("blocks", "tx-segmenter.md")
    assert SEG_REGS.markdown() in page.read_text()
