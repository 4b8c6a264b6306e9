"""Skid buffers and stream signatures on Amaranth's simulator."""

import pytest
from amaranth.lib import data

from mrcnic.base.stream import (
    AxiStreamSignature, MetaArbiter, MetaSkidBuffer, SkidBuffer, meta_stream)
from testkit.simtools import run, seeded, soak
from testkit.streams import AxisSink, AxisSource
from testkit.meta import MetaSource, MetaSink


def random_frames(rng, count, max_len):
    return [rng.randbytes(rng.randint(1, max_len)) for _ in range(count)]


@pytest.mark.parametrize("width", [8, 64, 512, 2048])
def test_one_beat_per_cycle_without_backpressure(width):
    """With an always-ready sink and a never-idle source, every cycle moves a beat."""
    dut = SkidBuffer(width)
    rng = seeded()
    frames = random_frames(rng, 40, 6 * width // 8)
    src, sink = AxisSource(dut.s_axis, frames), AxisSink(dut.m_axis, len(frames))
    run(dut, src.run, sink.run)
    assert sink.frames == frames
    beats = len(sink.beat_cycles)
    assert beats == sum(-(-len(f) // (width // 8)) for f in frames)
    # First beat leaves 1 cycle after entering (latency 1); then no bubble at all.
    assert sink.beat_cycles[0] == 1
    assert sink.beat_cycles[-1] - sink.beat_cycles[0] == beats - 1


@pytest.mark.parametrize("width", [64, 512, 2048])
@pytest.mark.parametrize("idle,backpressure", [(0.0, 0.5), (0.3, 0.0), (0.3, 0.7), (0.8, 0.2)])
def test_random_stalls_lose_and_duplicate_nothing(width, idle, backpressure):
    dut = SkidBuffer(width, user_width=3)
    rng = seeded()
    frames = random_frames(rng, soak(60), 4 * width // 8)
    users = [rng.randrange(8) for _ in frames]
    src = AxisSource(dut.s_axis, frames, rng=rng, idle=idle, users=users)
    sink = AxisSink(dut.m_axis, len(frames), rng=rng, backpressure=backpressure)
    run(dut, src.run, sink.run)
    assert sink.frames == frames
    assert sink.users == users


def test_ready_is_registered():
    """s_axis.tready must not follow m_axis.tready combinationally."""
    dut = SkidBuffer(64)

    async def tb(ctx):
        ctx.set(dut.m_axis.tready, 1)
        ctx.set(dut.s_axis.tvalid, 1)
        for _ in range(3):
            await ctx.tick()
        assert ctx.get(dut.s_axis.tready) == 1
        # Sink stalls: ready towards the source may only fall after a clock edge.
        ctx.set(dut.m_axis.tready, 0)
        assert ctx.get(dut.s_axis.tready) == 1
        await ctx.tick()
        assert ctx.get(dut.s_axis.tready) == 0     # the skid entry took one beat
        ctx.set(dut.m_axis.tready, 1)
        assert ctx.get(dut.s_axis.tready) == 0
        assert ctx.get(dut.m_axis.tvalid) == 1
        await ctx.tick()
        assert ctx.get(dut.s_axis.tready) == 1

    run(dut, tb)


def test_meta_skid_buffer_records_in_order():
    layout = data.StructLayout({"qp": 6, "psn": 24, "flag": 1})
    dut = MetaSkidBuffer(layout)
    rng = seeded()
    recs = [{"qp": rng.randrange(64), "psn": rng.randrange(1 << 24), "flag": rng.randrange(2)}
            for _ in range(soak(300))]
    src = MetaSource(dut.i, recs, rng=rng, idle=0.3)
    sink = MetaSink(dut.o, len(recs), rng=rng, backpressure=0.4)
    run(dut, src.run, sink.run)
    got = [layout.const(r).as_value().value for r in recs]
    assert [int(r) for r in sink.records] == got


def test_bad_parameters_are_refused_with_reasons():
    with pytest.raises(ValueError, match="whole number of bytes"):
        SkidBuffer(60)
    with pytest.raises(ValueError, match="outside"):
        SkidBuffer(8192)
    with pytest.raises(ValueError, match="user_width"):
        SkidBuffer(64, user_width=0)
    with pytest.raises(TypeError, match="StructLayout"):
        meta_stream(12)


def test_signature_equality():
    assert AxiStreamSignature(64) == AxiStreamSignature(64)
    assert AxiStreamSignature(64) != AxiStreamSignature(128)
    assert AxiStreamSignature(64).members["tkeep"].shape == 8


# --- MetaArbiter ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 8])
def test_meta_arbiter_merges_every_record_in_order_per_input(n):
    rng = seeded()
    layout = data.StructLayout({"a": 16, "b": 5})
    dut = MetaArbiter(layout, n)
    records = [[{"a": rng.getrandbits(16), "b": k} for _ in range(soak(40))] for k in range(n)]
    srcs = [MetaSource(dut.i[k], records[k], rng=rng, idle=0.4) for k in range(n)]
    total = sum(len(r) for r in records)
    sink = MetaSink(dut.o, total, rng=rng, backpressure=0.3)
    run(dut, *[s.run for s in srcs], sink.run)
    got = [data.Const(dut.o.payload.shape(), v) for v in sink.records]
    for k in range(n):
        mine = [{"a": int(g.a), "b": int(g.b)} for g in got if int(g.src) == k]
        assert mine == records[k], f"input {k}: records lost, added or reordered"


def test_meta_arbiter_round_robin_at_one_record_a_cycle():
    n = 4
    layout = data.StructLayout({"a": 8})
    dut = MetaArbiter(layout, n)
    srcs = [MetaSource(dut.i[k], [{"a": i} for i in range(20)]) for k in range(n)]
    sink = MetaSink(dut.o, 4 * 20)
    run(dut, *[s.run for s in srcs], sink.run)
    got = [int(data.Const(dut.o.payload.shape(), v).src) for v in sink.records]
    assert got == [k % n for k in range(4 * 20)], "not round robin"
    c = sink.cycles
    assert c[-1] - c[0] + 1 == len(c), "an idle cycle while every input had records"


def test_meta_arbiter_parameters():
    for n in (1, 17):
        with pytest.raises(ValueError):
            MetaArbiter({"a": 1}, n)
