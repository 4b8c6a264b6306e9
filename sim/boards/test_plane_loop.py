"""PlaneLoop: frames come back whole and in order except those the LFSR loses (the
software twin decides which), a failed plane loses every frame and shows its port down,
credit follows the FIFO's room, and bad parameters are refused."""

import pytest

from mrcnic.boards.plane_loop import PlaneLoop, lfsr16_next
from testkit.simtools import run, seeded, soak
from testkit.streams import AxisSink, AxisSource


def _frames(rng, n, B, max_beats):
    return [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, max_beats * B + 1)))
            for _ in range(n)]


def _expected(frames, loss, seed):
    out, state = [], seed
    for f in frames:
        if state >= loss:
            out.append(f)
        state = lfsr16_next(state)
    return out


@pytest.mark.parametrize("width,loss", [(64, 0), (64, 0x2000), (512, 0x8000), (128, 0xFFFF)])
def test_frames_come_back_but_the_lost_ones(width, loss):
    rng = seeded()
    B = width // 8
    seed = rng.randrange(1, 1 << 16)
    dut = PlaneLoop(width, depth=64, frame_beats=16, seed=seed)
    frames = _frames(rng, soak(60), B, 16)
    want = _expected(frames, loss, seed)
    src = AxisSource(dut.s_axis, frames, rng=rng, idle=0.2)
    sink = AxisSink(dut.m_axis, len(want), rng=rng, backpressure=0.3)
    seen = {}

    async def bench(ctx):
        ctx.set(dut.loss, loss)
        credit_ok = True
        while len(sink.frames) < len(want) or ctx.get(dut.frames) < len(frames):
            level = ctx.get(dut.level)
            credit_ok &= ctx.get(dut.credit) == (level <= 64 - 16)
            await ctx.tick()
        seen.update(frames=ctx.get(dut.frames), lost=ctx.get(dut.lost),
                    failed=ctx.get(dut.failed), up=ctx.get(dut.port_up), credit=credit_ok)

    run(dut, bench, src.run, sink.run)
    assert sink.frames == want
    assert seen == {"frames": len(frames), "lost": len(frames) - len(want), "failed": 0,
                    "up": 1, "credit": True}
    print(f"{width} bits, loss {loss / 65536:.3f}: {len(frames) - len(want)} of "
          f"{len(frames)} lost")


def test_a_failed_plane_loses_everything_and_is_down():
    rng = seeded()
    dut = PlaneLoop(64, depth=32, frame_beats=8, seed=0xACE1)
    frames = _frames(rng, 20, 8, 8)
    src = AxisSource(dut.s_axis, frames, rng=rng, idle=0.3)
    seen = {}

    async def bench(ctx):
        ctx.set(dut.fail, 1)
        ctx.set(dut.m_axis.tready, 1)
        while ctx.get(dut.frames) < len(frames):
            assert not ctx.get(dut.m_axis.tvalid), "a frame left a failed plane"
            assert not ctx.get(dut.port_up)
            await ctx.tick()
        seen.update(failed=ctx.get(dut.failed), lost=ctx.get(dut.lost))

    run(dut, bench, src.run)
    assert seen == {"failed": len(frames), "lost": 0}


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="at least 2 x frame_beats"):
        PlaneLoop(64, depth=10, frame_beats=8)
    with pytest.raises(ValueError, match="non-zero 16-bit"):
        PlaneLoop(64, seed=0)
    with pytest.raises(ValueError, match="frame_beats"):
        PlaneLoop(64, frame_beats=0)
    with pytest.raises(ValueError):
        PlaneLoop(32)
