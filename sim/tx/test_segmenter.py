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
from testkit.simtools import run, seeded, soak


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


def test_parameters_are_checked():
    for bad in [dict(qps=0), dict(msgs=3), dict(msgs=1), dict(msgs=512)]:
        with pytest.raises(ValueError):
            TxSegmenter(**{"qps": 4, "msgs": 4, **bad})


def test_docs_page_has_the_register_table():
    page = docs_page("blocks", "tx-segmenter.md")
    assert SEG_REGS.markdown() in page.read_text()
