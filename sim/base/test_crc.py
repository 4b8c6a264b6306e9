"""CrcStream on Amaranth's simulator: the ICRC of every frame against zlib and the packet
model, at every width, with stalls, one-beat frames and frames back to back."""

import random
import struct
import zlib

import pytest

from mrcnic.base import proto
from mrcnic.base import crc
from mrcnic.model import packet as pk
from testkit.simtools import run, seeded, soak


def beats_of(frame, B):
    out = []
    for off in range(0, len(frame), B):
        chunk = frame[off:off + B]
        out.append((int.from_bytes(chunk.ljust(B, b"\0"), "little"), (1 << len(chunk)) - 1,
                    off == 0, off + B >= len(frame)))
    return out


def run_stream(width, frames, rng, *, stall=0.0, **kw):
    dut = crc.CrcStream(width, tag_width=16, **kw)
    B = width // 8
    results = []
    cycles = {"in": [], "out": []}

    async def tb(ctx):
        queue = [(i, b) for i, f in enumerate(frames) for b in beats_of(f, B)]
        cycle = 0
        idle_after = 0
        while len(results) < len(frames):
            en = rng.random() >= stall
            ctx.set(dut.en, en)
            if queue and en:
                i, (data, keep, first, last) = queue[0]
                ctx.set(dut.valid, 1)
                ctx.set(dut.data, data)
                ctx.set(dut.keep, keep)
                ctx.set(dut.first, first)
                ctx.set(dut.last, last)
                ctx.set(dut.tag, i)
                if last:
                    cycles["in"].append(cycle)
                queue.pop(0)
            else:
                ctx.set(dut.valid, 0)
            if ctx.get(dut.done):
                results.append((ctx.get(dut.out_tag), ctx.get(dut.crc), ctx.get(dut.residue_ok)))
                cycles["out"].append(cycle)
            await ctx.tick()
            cycle += 1
            idle_after += not queue
            assert idle_after < 100, "CrcStream stopped answering"

    run(dut, tb)
    return dut, results, cycles


def roce_frame(rng, max_payload):
    op = rng.choice(list(proto.Opcode))
    return pk.encode(pk.rng_packet(rng, opcode=op, encap="none", max_payload=max_payload))


@pytest.mark.parametrize("width", [64, 128, 256, 512, 2048])
def test_icrc_of_roce_frames_matches_the_packet_model(width):
    rng = seeded()
    frames = [roce_frame(rng, 200) for _ in range(soak(30))]
    # 30% of the frames carry a wrong ICRC: the residue check must see it.
    sent = [f if rng.random() < 0.7 else f[:-1] + bytes([f[-1] ^ (1 << rng.randrange(8))])
            for f in frames]
    _, results, _ = run_stream(width, sent + [f[:-4] for f in frames], rng, stall=0.2)
    n = len(frames)
    for i, (tag, value, ok) in enumerate(results):
        assert tag == i
        if i < n:
            assert ok == (sent[i] == frames[i]), f"frame {i}: residue_ok {ok}"
        else:
            f = frames[i - n]
            assert value == struct.unpack("<I", f[-4:])[0] == crc.icrc_stream(f[:-4]), \
                f"frame {i - n}: {value:#x}"


@pytest.mark.parametrize("width", [64, 512])
def test_any_lengths_back_to_back_and_latency(width):
    """Frames from just past the Ethernet header to 3 beats plus a byte, no stall: one
    result per frame, each exactly ``latency`` cycles after the frame's last beat."""
    rng = seeded()
    B = width // 8
    frames = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(crc.ICRC_SKIP + 1,
                                                                    3 * B + 2)))
              for _ in range(soak(60))]
    dut, results, cycles = run_stream(width, frames, rng)
    assert [t for t, _, _ in results] == list(range(len(frames)))
    for f, (_, value, _) in zip(frames, results):
        assert value == crc.icrc_stream(f)
    assert [o - i for i, o in zip(cycles["in"], cycles["out"])] == [dut.latency] * len(frames)


def test_plain_crc32_without_skip_or_ones():
    """With skip 0 and no ones the start value is still the ICRC's (8 bytes of ones first)."""
    rng = seeded()
    frames = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 40))) for _ in range(20)]
    _, results, _ = run_stream(64, frames, rng, stall=0.3, skip=0, ones=b"")
    for f, (_, value, _) in zip(frames, results):
        assert value == zlib.crc32(f, zlib.crc32(b"\xff" * 8))


def test_matrix_inverse_and_residue():
    a = crc.zero_bytes_matrix(13)
    ident = crc.mat_mul(crc.mat_inverse(a), a)
    assert ident == [1 << i for i in range(32)]
    rng = random.Random(1)
    for _ in range(20):
        msg = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 50)))
        full = msg + struct.pack("<I", zlib.crc32(msg))
        assert crc.crc32_raw(0xFFFFFFFF, full) == crc.ICRC_RESIDUE


def test_bad_parameters():
    with pytest.raises(ValueError):
        crc.CrcStream(48)
    with pytest.raises(ValueError):
        crc.CrcStream(64, skip=-1)
