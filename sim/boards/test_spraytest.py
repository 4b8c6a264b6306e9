"""The spray self-test: its generator's frames are the model's (mrcnic.boards.spray_frame), its
checker passes exactly the frames that are right and counts every kind of wrong one, and
the whole top, brought up by its script, sprays over its planes with nothing bad."""

import pytest

from mrcnic.base import proto
from mrcnic.boards import spray_frame as spray
from mrcnic.base.proto import EvMode
from mrcnic.boards.spraytest import (POS_FLOW, POS_QP, POS_SEQ, POS_SPORT, SprayCheck, SprayGen,
                                     SprayTest)
from testkit.simtools import run, seeded, soak
from testkit.streams import AxisSink, AxisSource
from testkit.meta import MetaSource, MetaSink

WIDTHS_PAYLOADS = [(64, 256), (64, 0), (128, 5), (256, 77)]


@pytest.mark.parametrize("width,payload", WIDTHS_PAYLOADS)
def test_generator_frames_are_the_models(width, payload):
    rng = seeded()
    qps = 3
    dut = SprayGen(width, qps, payload)
    rsps = []
    for _ in range(soak(24)):
        e = rng.randrange(256)
        rsps.append({"qp": rng.randrange(qps), "psn": 0, "rtx": 0, "none": int(rng.random() < 0.2),
                     "ev": e, "plane": e % 4, "entropy": rng.getrandbits(32),
                     "expanded": rng.getrandbits(128)})
    made = [r for r in rsps if not r["none"]]
    want = [spray.frame(seq, r["qp"], payload) for seq, r in enumerate(made)]
    src = MetaSource(dut.rsp, rsps, rng=rng, idle=0.3)
    frames = AxisSink(dut.m_axis, len(made), rng=rng, backpressure=0.3)
    descs = MetaSink(dut.desc, len(made), rng=rng, backpressure=0.3)
    planes = MetaSink(dut.plane, len(made), rng=rng, backpressure=0.3)
    seen = {}

    async def bench(ctx):
        ctx.set(dut.run, 1)
        ctx.set(dut.req.ready, 1)
        qps_asked = []
        while len(frames.frames) < len(made) or ctx.get(dut.sent) < len(made):
            if ctx.get(dut.req.valid):
                qps_asked.append(ctx.get(dut.req.payload.qp))
            await ctx.tick()
        seen.update(sent=ctx.get(dut.sent), stalls=ctx.get(dut.stalls), asked=qps_asked[:6])

    run(dut, bench, src.run, frames.run, descs.run, planes.run)
    assert frames.frames == want
    assert seen["sent"] == len(made) and seen["stalls"] == len(rsps) - len(made)
    assert seen["asked"] == [0, 1, 2, 0, 1, 2], "requests go to the QPs in turn"
    for r, d, p in zip(made, descs.records, planes.records):
        got = {"mode": d & 7, "ev": d >> 3 & ((1 << 256) - 1), "entropy": d >> 259 & 0xFFFFFFFF}
        assert got == {"mode": EvMode.SRV6, "ev": r["expanded"] << 128,
                       "entropy": r["entropy"]}
        assert p == r["plane"]
    print(f"{width} bits, {payload} payload bytes: {len(made)} frames, "
          f"{len(rsps) - len(made)} answers without a path")


def _meta(e, bad=0, mode=EvMode.SRV6):
    return {"mode": mode, "dscp": 0, "ecn": 0, "flow_label": 0, "hop_limit": 63,
            "srh": 0, "residue": spray.ev_address(e), "bad": bad}


def _cases(rng, plane, planes, qps, ev_count, payload, n):
    """(frame, meta record, user bit, expected good) for ``n`` frames on ``plane``: about
    half right, the others wrong in one way each (the kinds are counted)."""
    out, kinds = [], {}
    seq = last_good = rng.randrange(1 << 31)
    seen_good = False
    n_frame = spray.frame_len(payload)
    evs = [e for e in range(ev_count) if e % planes == plane]
    for _ in range(n):
        seq += rng.randrange(1, 4)
        qp, e = rng.randrange(qps), rng.choice(evs)
        kind = rng.choice(["good"] * 8 + ["byte", "icrc", "short", "long", "sport", "flow",
                                          "plane", "address", "meta_bad", "pass", "qp", "order",
                                          "user", "seq"])
        this = last_good - rng.randrange(3) if kind == "order" else seq
        frame = bytearray(spray.frame(this, qp, payload, entropy=proto.srv6_entropy(e)))
        meta, user = _meta(e), 0
        if kind == "byte":
            # (Not seq's top byte without a payload: only the payload repeats it, and a
            # frame whose seq jumps ahead is as right as any.)
            unseen = (POS_SPORT, POS_SPORT + 1, POS_QP, POS_QP + 1, POS_QP + 2) + (
                (POS_SEQ,) if payload == 0 else ())
            pos = rng.choice([k for k in range(n_frame - proto.ICRC_LEN) if k not in unseen])
            frame[pos] ^= 1 << rng.randrange(8)
        elif kind == "icrc":
            frame[-1 - rng.randrange(4)] ^= 0x5A          # not checked: still good
        elif kind == "short":
            frame = frame[:-rng.randrange(1, 9)]
        elif kind == "long":
            frame += bytes(rng.randrange(1, 20))
        elif kind == "sport":
            frame[POS_SPORT + 1] ^= 0x80
        elif kind == "flow":
            frame[POS_FLOW + rng.randrange(2)] ^= 1 << rng.randrange(8)
        elif kind == "plane":
            meta = _meta((e + 1) % ev_count)
        elif kind == "address":
            meta["residue"] ^= 1 << rng.randrange(128)
        elif kind == "meta_bad":
            meta["bad"] = 1
        elif kind == "pass":
            meta["mode"] = EvMode.PASS
        elif kind == "qp":
            frame[POS_QP + 2] = qps + rng.randrange(256 - qps)
        elif kind == "user":
            user = 1
        elif kind == "seq":
            # the low 3 bytes, which the PSN repeats (the top one only the payload shows)
            frame[POS_SEQ + 1 + rng.randrange(3)] ^= 1 << rng.randrange(8)
        # the first good frame on a plane sets its order (none to be below before it)
        good = kind in ("good", "icrc") or (kind == "order" and not seen_good)
        if good:
            last_good, seen_good = this, True
        kinds[kind] = kinds.get(kind, 0) + 1
        out.append((bytes(frame), meta, user, good, kind))
    return out, kinds


@pytest.mark.parametrize("width,payload", WIDTHS_PAYLOADS)
def test_checker_passes_the_right_frames_and_counts_the_wrong(width, payload):
    rng = seeded()
    planes, plane, qps, ev_count = 4, 1, 2, 16
    dut = SprayCheck(width, plane, planes, qps, ev_count, payload)
    cases, kinds = _cases(rng, plane, planes, qps, ev_count, payload, soak(60))
    src = AxisSource(dut.s_axis, [c[0] for c in cases], users=[c[2] for c in cases], rng=rng,
                     idle=0.2)
    meta = MetaSource(dut.meta, [c[1] for c in cases], rng=rng, idle=0.4)
    verdicts = []

    async def bench(ctx):
        good = bad = 0
        while len(verdicts) < len(cases):
            await ctx.tick()
            g, b = ctx.get(dut.good), ctx.get(dut.bad)
            assert g + b <= good + bad + 1
            if (g, b) != (good, bad):
                verdicts.append(g > good)
                good, bad = g, b

    run(dut, bench, src.run, meta.run)
    wrong = [(k, c[3]) for k, (c, v) in enumerate(zip(cases, verdicts)) if c[3] != v]
    assert not wrong, f"frames judged wrongly (index, should be good): {wrong}, kinds " \
        f"{[cases[k][4] for k, _ in wrong]}"
    good = sum(c[3] for c in cases)
    print(f"{width} bits, {payload} payload bytes: {good} good, {len(cases) - good} bad: {kinds}")


def test_the_top_sprays_with_nothing_bad():
    """The whole top with a fast UART: the script loads the selector, frames flow, every
    one checked good; paused by the ``p`` command, the traffic stops and sent = good."""
    dut = SprayTest(planes=2, clk_hz=1_000_000, baud=250_000, report_hz=20)
    seen = {}

    async def bench(ctx):
        cycles = 0
        while ctx.get(dut.good) < 40:
            assert cycles < 20_000, (ctx.get(dut.up), ctx.get(dut.sent), ctx.get(dut.good))
            assert not ctx.get(dut.bad)
            await ctx.tick()
            cycles += 1
        seen.update(cycles=cycles, up=ctx.get(dut.up))
        for bit in [0] + [ord("p") >> k & 1 for k in range(8)] + [1]:     # pause
            ctx.set(dut.rx, bit)
            await ctx.tick().repeat(dut.divisor)
        await ctx.tick().repeat(600)          # the frames decided before it drain
        sent = ctx.get(dut.sent)
        await ctx.tick().repeat(300)
        seen.update(sent=sent, still=ctx.get(dut.sent), good=ctx.get(dut.good),
                    bad=ctx.get(dut.bad))

    run(dut, bench)
    assert seen["up"]
    assert seen["still"] == seen["sent"] == seen["good"] and not seen["bad"], seen
    print(f"40 good frames after {seen['cycles']} cycles (bring-up included); paused at "
          f"{seen['sent']} sent, all good")


def test_bad_parameters_are_refused():
    for kwargs in [{"planes": 3}, {"data_width": 32}, {"data_width": 512}, {"qps": 0},
                   {"qps": 17}, {"ev_count": 6}, {"ev_count": 1}, {"payload": -1},
                   {"payload": 5000}]:
        with pytest.raises(ValueError):
            SprayTest(**kwargs)
    with pytest.raises(ValueError, match="report"):
        SprayTest(report_hz=1000)
