"""Srv6Decap on Amaranth's simulator against mrcnic.model.srv6.decap, and encap -> decap."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring

from mrcnic.base import proto
from mrcnic.model import packet as pk, srv6 as model
from mrcnic.base.proto import EvMode
from mrcnic.tx.srv6_encap import Srv6Encap
from mrcnic.host.driver import RegisterDriver
from mrcnic.rx.srv6_decap import DECAP_REGS, Srv6Decap
from mrcnic.base.records import DECAP_META
from testkit.axil import AxiLiteSimMaster
from testkit.frames import random_desc, random_frame
from testkit.simtools import run, seeded, soak
from testkit.streams import AxisSink, AxisSource
from testkit.meta import MetaSource, MetaSink


def encapsulated(rng, kind):
    """A frame as it reaches the receiver: encapsulated, then through the fabric, whose last
    SRv6 switch did the SRH End step (segment into the address, segments left 0)."""
    frame = random_frame(rng)
    desc = random_desc(rng, kind)
    return model.srh_end(model.encap(frame, desc)[0])


def run_decap(width, frames, *, users=None, rng=None, idle=0.0, backpressure=0.0):
    dut = Srv6Decap(width)
    rng = rng or random.Random(0)
    src = AxisSource(dut.s_axis, frames, rng=rng, idle=idle, users=users)
    sink = AxisSink(dut.m_axis, len(frames), rng=rng, backpressure=backpressure,
                    max_cycles=200_000)
    meta = MetaSink(dut.meta, len(frames), rng=rng, backpressure=backpressure,
                    max_cycles=200_000)
    run(dut, src.run, sink.run, meta.run)
    return sink, meta, src


def check(frames, sink, meta, users=None):
    users = users or [0] * len(frames)
    for i, frame in enumerate(frames):
        want, want_bad, causes, want_meta = model.decap(frame, in_bad=users[i])
        rec = {name: (meta.records[i] >> f.offset) & ((1 << f.width) - 1)
               for name, f in DECAP_META}
        assert bool(sink.users[i]) == want_bad, f"frame {i}: bad={sink.users[i]}, {causes}"
        assert rec["bad"] == int(want_bad), f"frame {i}: meta.bad"
        assert len(sink.frames[i]) == len(want), f"frame {i}: length"
        if not want_bad:
            assert sink.frames[i] == want, f"frame {i} differs"
            assert rec == want_meta, f"frame {i}: meta {rec} != {want_meta}"


@pytest.mark.parametrize("width", [64, 128, 256, 512, 2048])
def test_strips_and_reports_like_the_model(width):
    rng = seeded()
    kinds = [EvMode.PASS, EvMode.SRV6, EvMode.SRV6_SRH]
    n = soak(45 if width < 2048 else 20)
    frames = [encapsulated(rng, kinds[i % 3]) for i in range(n)]
    sink, meta, _ = run_decap(width, frames, rng=rng, idle=0.2, backpressure=0.3)
    check(frames, sink, meta)
    for f, got in zip(frames, sink.frames):
        pk.decode(got)          # the inner frame is a valid RoCEv2 frame, ICRC included


@pytest.mark.parametrize("width", [64, 128, 512, 2048])
def test_one_input_beat_per_cycle(width):
    """Frames back to back without stalls: the input never waits."""
    rng = seeded()
    kinds = [EvMode.PASS, EvMode.SRV6, EvMode.SRV6_SRH]
    frames = [encapsulated(rng, kinds[i % 3]) for i in range(24)]
    dut = Srv6Decap(width)
    src = AxisSource(dut.s_axis, frames)
    sink = AxisSink(dut.m_axis, len(frames))
    meta = MetaSink(dut.meta, len(frames))
    accepted = []

    async def watch(ctx):
        cycle = 0
        while len(sink.frames) < len(frames):
            _, _, v, r = await ctx.tick().sample(dut.s_axis.tvalid, dut.s_axis.tready)
            if v and r:
                accepted.append(cycle)
            cycle += 1

    run(dut, src.run, sink.run, meta.run, watch)
    check(frames, sink, meta)
    B = width // 8
    beats = sum(-(-len(f) // B) for f in frames)
    assert len(accepted) == beats
    assert accepted[-1] - accepted[0] + 1 == beats, \
        f"{beats} input beats took {accepted[-1] - accepted[0] + 1} cycles"
    out = sum(-(-len(f) // B) for f in sink.frames)
    assert len(sink.beat_cycles) == out
    # The first frame is PASS and longer than a beat: its first beat leaves after `latency`.
    assert sink.beat_cycles[0] - accepted[0] == Srv6Decap(width).latency or len(frames[0]) <= B


@pytest.mark.parametrize("width", [64, 512])
def test_bad_frames(width):
    rng = seeded()
    good = [encapsulated(rng, EvMode.SRV6_SRH) for _ in range(4)]
    cases = []
    f = bytearray(encapsulated(rng, EvMode.SRV6)); f[14] = 0x40; cases.append(bytes(f))
    f = bytearray(encapsulated(rng, EvMode.SRV6_SRH)); f[54 + 3] = 1; cases.append(bytes(f))
    f = bytearray(encapsulated(rng, EvMode.SRV6_SRH)); f[54 + 2] = 3; cases.append(bytes(f))
    f = bytearray(encapsulated(rng, EvMode.SRV6)); f[54] = 0x45; cases.append(bytes(f))
    cases.append(encapsulated(rng, EvMode.SRV6)[:70])      # ends inside the inner header
    cases.append(encapsulated(rng, EvMode.SRV6)[:40])      # ends inside the outer header
    cases.append(encapsulated(rng, EvMode.SRV6) + b"\0" * 4)
    cases.append(encapsulated(rng, EvMode.PASS) + bytes(9300))     # longer than max_frame
    cases.append(b"\x01" + rng.randbytes(9280))                     # max_frame + 1 bytes
    frames, users = [], []
    for c in cases:
        frames += [c, rng.choice(good)]
        users += [0, 0]
    frames.append(rng.choice(good)); users.append(1)
    frames.append(b"\x01" + rng.randbytes(9279)); users.append(0)   # exactly max_frame: good
    sink, meta, _ = run_decap(width, frames, users=users, rng=rng, idle=0.1,
                              backpressure=0.2)
    check(frames, sink, meta, users)
    assert [bool(u) for u in sink.users] == [True, False] * len(cases) + [True, False]


class EncapDecap(wiring.Component):
    def __init__(self, width):
        self.enc, self.dec = Srv6Encap(width), Srv6Decap(width)
        super().__init__({"s_axis": wiring.In(self.enc.s_axis.signature.flip()),
                          "desc": wiring.In(self.enc.desc.signature.flip()),
                          "m_axis": wiring.Out(self.dec.m_axis.signature),
                          "meta": wiring.Out(self.dec.meta.signature),
                          "dec_axil": wiring.In(self.dec.s_axil.signature.flip())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.enc, m.submodules.dec = self.enc, self.dec
        wiring.connect(m, wiring.flipped(self.s_axis), self.enc.s_axis)
        wiring.connect(m, wiring.flipped(self.desc), self.enc.desc)
        wiring.connect(m, self.enc.m_axis, self.dec.s_axis)
        wiring.connect(m, self.dec.m_axis, wiring.flipped(self.m_axis))
        wiring.connect(m, self.dec.meta, wiring.flipped(self.meta))
        wiring.connect(m, wiring.flipped(self.dec_axil), self.dec.s_axil)
        return m


@pytest.mark.parametrize("width", [64, 256, 1024])
def test_encap_then_decap_returns_the_frame(width):
    """Bit for bit, when the frame already carries the entropy the descriptor writes."""
    rng = seeded()
    frames, descs = [], []
    for i in range(soak(30)):
        pkt = pk.rng_packet(rng, encap="none")
        pkt.ip["flow_label"] &= 0xFFFF
        pkt.icrc = None
        frame = pk.encode(pk.finalize(pkt))
        desc = random_desc(rng, [EvMode.PASS, EvMode.SRV6, EvMode.SRV6_SRH][i % 3])
        desc["entropy"] = proto.stev_join(pkt.udp["src_port"], pkt.ip["flow_label"])
        frames.append(frame)
        descs.append(desc)
    dut = EncapDecap(width)
    src = AxisSource(dut.s_axis, frames, rng=rng, idle=0.2)
    dsrc = MetaSource(dut.desc, descs, rng=rng)
    sink = AxisSink(dut.m_axis, len(frames), rng=rng, backpressure=0.2, max_cycles=200_000)
    meta = MetaSink(dut.meta, len(frames))

    async def configure(ctx):
        # No switch between them: the SRH arrives with segments left 1.
        regs = RegisterDriver(DECAP_REGS, AxiLiteSimMaster(ctx, dut.dec_axil).read,
                              AxiLiteSimMaster(ctx, dut.dec_axil).write)
        await regs.write_fields("config", srh_any_left=1)
        await src.run(ctx)

    run(dut, configure, dsrc.run, sink.run, meta.run)
    assert sink.frames == frames
    assert not any(sink.users)
