"""cocotb testbench of TxSegmenter on the exported Verilog: work requests, retransmit
requests (good and bad) and releases under random pauses, packets and completions checked
against mrcnic.model.tx.segmenter, counters read through cocotbext-axi."""

import random

import cocotb

from mrcnic.model.tx.segmenter import SegmenterModel
from mrcnic.base.records import release_layout, rtx_layout, SEG_PKT, WR, WR_DONE
from mrcnic.tx.segmenter import SEG_REGS
from testkit.tbutil import TB, long_runs, random_pauses, soak
from testkit.meta import MetaSource, MetaSink


def fields(layout):
    return [n for n, _ in layout]


@cocotb.test()
async def random_operations_under_pauses(dut):
    tb = TB(dut)
    qps, msgs = tb.params["qps"], tb.params["msgs"]
    wr = MetaSource.cocotb(dut, "wr", fields(WR), dut.clk)
    rtx = MetaSource.cocotb(dut, "rtx", fields(rtx_layout(32)), dut.clk)
    rel = MetaSource.cocotb(dut, "release", fields(release_layout(32)), dut.clk)
    pkts = MetaSink.cocotb(dut, "pkt", fields(SEG_PKT), dut.clk)
    dones = MetaSink.cocotb(dut, "done", fields(WR_DONE), dut.clk)
    for s in (wr, rtx, rel, pkts, dones):
        s.set_pause_generator(random_pauses(0.3))
    _, regs = tb.registers(SEG_REGS)
    await tb.reset()
    while await regs.read_field("status", "busy"):
        pass
    await regs.write_fields("config", pmtu_log2=8)
    model = SegmenterModel(qps, msgs, pmtu_log2=8)
    want_new, want_rtx, want_done = [], [], []

    async def drain(source, sink, count):
        # Until the source is empty and the sink holds ``count`` records (the block serves
        # one operation at a time behind 2-deep skid buffers, so a fixed wait is not enough:
        # a release retiring 4 messages takes 12 cycles, and pauses add more); then 40 more
        # cycles for a record that should not come.
        for _ in range(20000):
            if not source.queue and len(sink.records) >= count():
                break
            await tb.cycles(1)
        else:
            raise AssertionError(f"{len(sink.records)} of {count()} records after 20000 cycles")
        await tb.cycles(40)

    for _ in range(soak(20 if long_runs() else 6)):
        for _ in range(random.randrange(1, 12)):
            qp = random.randrange(min(qps, 6))
            if model.full(qp):
                continue
            w = {"qp": qp, "wr_id": random.getrandbits(16), "va": random.getrandbits(64),
                 "rkey": random.getrandbits(32), "length": random.randrange(1200),
                 "imm": random.getrandbits(32), "with_imm": random.getrandbits(1)}
            want_new.extend(model.wr(w))
            wr.send_nowait(w)
        await drain(wr, pkts, lambda: len(want_new) + len(want_rtx))
        for _ in range(6):
            qp = random.randrange(min(qps, 6))
            flight = model.q[qp].flight
            if flight:
                pos, msg = random.choice(flight)
                k = random.randrange(model._npk(msg["length"]) + 1)
                r = {"qp": qp, "psn": (msg["psn"] + k) & 0xFFFFFF, "tag": model._tag(pos),
                     "ev": random.getrandbits(8), "cause": 1}
            else:
                r = {"qp": qp, "psn": random.getrandbits(24), "tag": random.getrandbits(10),
                     "ev": 0, "cause": 0}
            p = model.rtx(r)
            if p is not None:
                want_rtx.append(p)
            rtx.send_nowait(r)
        await drain(rtx, pkts, lambda: len(want_new) + len(want_rtx))
        for qp in range(min(qps, 6)):
            flight = model.q[qp].flight
            if flight:
                _, msg = random.choice(flight)
                r = {"qp": qp, "first": 0, "tag": 0,
                     "last": (msg["psn"] + random.randrange(model._npk(msg["length"])))
                     & 0xFFFFFF}
                want_done.extend(model.release(r))
                rel.send_nowait(r)
        await drain(rel, dones, lambda: len(want_done))
    got = pkts.records
    assert [p for p in got if not p["rtx"]] == want_new
    assert [p for p in got if p["rtx"]] == want_rtx
    got_done = dones.records
    first = next((i for i, (a, b) in enumerate(zip(got_done, want_done)) if a != b),
                 min(len(got_done), len(want_done)))
    assert got_done == want_done, (f"completions differ from #{first}: got "
                                   f"{got_done[first:first + 4]}, want {want_done[first:first + 4]}"
                                   f" ({len(got_done)} got, {len(want_done)} wanted)")
    for name, value in model.counters.items():
        assert await regs.read(name) == value, name
    tb.log.info("%d packets, %d retransmissions, %d completions checked", len(want_new),
                len(want_rtx), len(want_done))
    await tb.cycles(5)
