"""Srv6Encap on Amaranth's simulator, frame for frame against mrcnic.model.srv6."""

import random

import pytest

from mrcnic.model import packet as pk, srv6 as model
from mrcnic.base.proto import EvMode
from mrcnic.tx.srv6_encap import INSERT_LEN, Srv6Encap
from testkit.simtools import run, seeded, soak
from testkit.frames import MODES, random_desc, random_frame
from testkit.streams import AxisSink, AxisSource
from testkit.meta import MetaSource

def run_encap(width, frames, descs, *, users=None, rng=None, idle=0.0, backpressure=0.0):
    dut = Srv6Encap(width)
    rng = rng or random.Random(0)
    src = AxisSource(dut.s_axis, frames, rng=rng, idle=idle, users=users)
    dsrc = MetaSource(dut.desc, descs, rng=rng, idle=idle)
    sink = AxisSink(dut.m_axis, len(frames), rng=rng, backpressure=backpressure,
                    max_cycles=200_000)
    run(dut, src.run, dsrc.run, sink.run)
    return sink


def check_against_model(frames, descs, sink, users=None):
    users = users or [0] * len(frames)
    for i, (frame, desc, got, bad) in enumerate(zip(frames, descs, sink.frames, sink.users)):
        want, want_bad, causes = model.encap(frame, desc, in_bad=users[i])
        assert bad == want_bad, f"frame {i} mode {EvMode(desc['mode']).name}: bad {bad}, " \
                                f"model {want_bad} ({causes})"
        if not want_bad:
            assert got == want, f"frame {i} mode {EvMode(desc['mode']).name} differs"
        else:
            assert len(got) == len(want), f"frame {i}: bad frame length {len(got)}"


@pytest.mark.parametrize("width", [64, 128, 256, 512, 2048])
def test_every_mode_matches_the_model_and_the_packet_model(width):
    rng = seeded()
    count = soak(60 if width < 2048 else 25)
    frames = [random_frame(rng) for _ in range(count)]
    descs = [random_desc(rng, MODES[i % len(MODES)]) for i in range(count)]
    sink = run_encap(width, frames, descs, rng=rng, idle=0.2, backpressure=0.3)
    check_against_model(frames, descs, sink)
    # Independent check of the good frames: decode with the packet model, ICRC verified.
    for frame, desc, got in zip(frames, descs, sink.frames):
        pkt = pk.decode(got)                     # raises on a wrong ICRC
        port, flow = model.entropy_of(desc)
        mode = EvMode(desc["mode"])
        if mode == EvMode.PASS:
            assert got == frame
            continue
        assert pkt.udp["src_port"] == port
        if mode != EvMode.UDP:
            assert pkt.ip["flow_label"] == flow
        if mode in (EvMode.SRV6, EvMode.SRV6_SRH):
            assert pkt.outer["dst"] == desc["ev"] >> 128
            assert pkt.outer["src"] == desc["outer_src"]
            assert (pkt.outer["dscp"], pkt.outer["ecn"], pkt.outer["hop_limit"]) == \
                (desc["dscp"], desc["ecn"], desc["hop_limit"])
            assert (pkt.srh is not None) == (mode == EvMode.SRV6_SRH)
            if pkt.srh:
                assert pkt.srh["segments"] == [desc["ev"] & ((1 << 128) - 1)]
            inner = pk.decapsulate(got)
            assert len(inner) == len(frame)


@pytest.mark.parametrize("width", [64, 128, 512, 2048])
@pytest.mark.parametrize("mode", [EvMode.PASS, EvMode.STEV, EvMode.SRV6, EvMode.SRV6_SRH])
def test_back_to_back_frames_have_no_idle_cycle(width, mode):
    """Without backpressure, the output carries ceil((L+H)/B) beats a frame, no gaps."""
    rng = seeded()
    B = width // 8
    frames = [random_frame(rng, max_payload=rng.choice([0, 40, 200, 1500])) for _ in range(12)]
    descs = [random_desc(rng, mode) for _ in frames]
    sink = run_encap(width, frames, descs)
    check_against_model(frames, descs, sink)
    H = INSERT_LEN[mode]
    beats = sum(-(-(len(f) + H) // B) for f in frames)
    c = sink.beat_cycles
    # The source's first beat is taken at cycle 0 (registered ready, out of reset).
    assert c[0] == Srv6Encap(width).latency, f"first beat out at cycle {c[0]}"
    assert len(c) == beats
    assert c[-1] - c[0] + 1 == beats, f"{beats} beats took {c[-1] - c[0] + 1} cycles"


@pytest.mark.parametrize("width", [64, 512])
def test_bad_frames_are_marked_and_the_next_is_clean(width):
    rng = seeded()
    good = [random_frame(rng) for _ in range(6)]
    cases = []
    f = bytearray(random_frame(rng)); f[12] = 0x08; cases.append(("not_roce", bytes(f)))
    f = bytearray(random_frame(rng)); f[57] ^= 1; cases.append(("not_roce", bytes(f)))
    cases.append(("truncated", random_frame(rng)[:60]))
    cases.append(("truncated", random_frame(rng)[:30]))
    f = random_frame(rng); cases.append(("length", f + b"\0" * 8))
    f = random_frame(rng, max_payload=100); cases.append(("length", f[:-8]))
    frames, descs, users, expect = [], [], [], []
    for cause, bad_frame in cases:
        for fr, bad in ((bad_frame, True), (rng.choice(good), False)):
            frames.append(fr)
            descs.append(random_desc(rng, rng.choice(MODES[1:])))
            users.append(0)
            expect.append(cause if bad else None)
    frames.append(rng.choice(good)); descs.append(random_desc(rng, EvMode.PASS))
    users.append(1); expect.append("in_bad")
    sink = run_encap(width, frames, descs, users=users, rng=rng, idle=0.1, backpressure=0.2)
    check_against_model(frames, descs, sink, users)
    for i, cause in enumerate(expect):
        assert bool(sink.users[i]) == (cause is not None), f"frame {i} ({cause})"


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        Srv6Encap(96)
    with pytest.raises(ValueError, match="outside 64..2048"):
        Srv6Encap(32)
    with pytest.raises(ValueError, match="whole number of bytes"):
        Srv6Encap(100)
