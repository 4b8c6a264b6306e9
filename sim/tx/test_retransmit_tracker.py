"""RetransmitTracker on Amaranth's simulator, matched event for event against the model."""

import random

import pytest

from mrcnic.base.records import (
    ack_desc_fields, EV_FEEDBACK, FeedbackKind, QP_ERROR, ErrorCause, RtxCause, release_layout,
    rtx_layout)
from mrcnic.host.driver import RegisterDriver
from mrcnic.model.tx.retransmit_tracker import OUTPUTS, RetransmitTrackerModel, closed_loop
from mrcnic.base.proto import NackCode, SackMode, psn_add
from mrcnic.tx.retransmit_tracker import RT_REGS, RetransmitTracker
from testkit import docs_page
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import run, seeded, soak


async def configured(ctx, dut, regs):
    """A register driver on ``dut``, ``regs`` ({register: fields}) written, the reset sweep
    over."""
    bus = AxiLiteSimMaster(ctx, dut.s_axil)
    drv = RegisterDriver(RT_REGS, bus.read, bus.write)
    for reg, vals in regs.items():
        await drv.write_fields(reg, **vals)
    while (await drv.read_fields("status"))["busy"]:
        pass
    return drv


def sample_outputs(ctx, dut, lay, got):
    """Append each output's record (ready held high) to ``got[name]``; True if any."""
    any_ = False
    for name in OUTPUTS:
        port = getattr(dut, name)
        if ctx.get(port.valid):
            got[name].append(fields(lay[name], ctx.get(port.payload.as_value())))
            any_ = True
    return any_


def fields(layout, value):
    return {name: (value >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


def layouts(tag_width):
    return {"rtx": rtx_layout(tag_width), "feedback": EV_FEEDBACK,
            "release": release_layout(tag_width), "qp_error": QP_ERROR}


def sent(qp, psn, ev=0, time=0, tag=None, rtx=0):
    return {"qp": qp, "psn": psn, "ev": ev, "time": time,
            "tag": psn if tag is None else tag, "rtx": rtx}


def sack(qp, cack, bitmap=0, *, offset=1, trig=0, m=0, mpr=8, pr=0, entropy=0):
    d = dict.fromkeys(ack_desc_fields(), 0)
    d.update(qp=qp, cack=cack, bitmap=bitmap, sack_offset=offset & 0xFFFF,
             ack_psn_offset=trig & 0xFFFF, m=m, mpr=mpr, pr=pr, entropy=entropy)
    return d


def nack(qp, psn, reason=NackCode.TRIMMED, entropy=0):
    d = dict.fromkeys(ack_desc_fields(), 0)
    d.update(qp=qp, nack=1, psn=psn, reason=int(reason), entropy=entropy)
    return d


class Collector:
    """Takes an output stream with seeded random backpressure until ``stop``; checks that
    valid and payload hold until ready."""

    def __init__(self, port, layout, rng, backpressure):
        self.port, self.layout, self.rng, self.bp = port, layout, rng, backpressure
        self.records = []
        self.stop = False

    async def run(self, ctx):
        held = None
        while not self.stop:
            ready = not (self.bp and self.rng.random() < self.bp)
            ctx.set(self.port.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(self.port.valid,
                                                            self.port.payload.as_value())
            if held is not None:
                assert valid and payload == held, "output changed or dropped before ready"
            if valid and ready:
                self.records.append(fields(self.layout, payload))
                held = None
            elif valid:
                held = payload


def run_events(events, *, qps=4, outstanding=128, tag_width=32, pending=16, regs=None,
               rng=None, idle=0.0, backpressure=0.0, opens=(), quiet=300):
    """Feed ``events`` (``("sent", rec)``, ``("ack", desc, sent_before)``) with random idle
    on both inputs, an ack never before the sent records it depends on. Returns the model's
    and the block's outputs, the cycle log of handshakes and the counters."""
    rng = rng or random.Random(0)
    regs = regs or {}
    dut = RetransmitTracker(qps, outstanding, tag_width, pending)
    sents = [e[1] for e in events if e[0] == "sent"]
    acks = [(e[1], e[2]) for e in events if e[0] == "ack"]
    cols = {name: Collector(getattr(dut, name), lay, rng, backpressure)
            for name, lay in layouts(tag_width).items()}
    log, counters = [], {}
    stalls = {"sent": 0, "ack": 0}

    async def driver(ctx):
        drv = await configured(ctx, dut, regs)
        for qp, start in opens:
            await drv.write_fields("qp_select", qp=qp)
            await drv.write_fields("qp_start", psn=start)
            await drv.write_fields("qp_command", open=1)
            while (await drv.read_fields("status"))["busy"]:
                pass
        si = ai = 0
        sv = av = False
        cycle = 0
        shown = {"sv": None, "av": None, "s": None, "a": None}

        def show(key, port, value):
            # Each ctx.set settles the design: only set what changes.
            if shown[key] != value:
                ctx.set(port, value)
                shown[key] = value

        while si < len(sents) or ai < len(acks):
            if not sv:
                sv = si < len(sents) and not (idle and rng.random() < idle)
            if not av:
                av = (ai < len(acks) and acks[ai][1] <= si
                      and not (idle and rng.random() < idle))
            if sv:
                show("s", dut.sent.payload, sents[si])
            if av:
                show("a", dut.ack.payload, acks[ai][0])
            show("sv", dut.sent.valid, sv)
            show("av", dut.ack.valid, av)
            _, _, sr, ar = await ctx.tick().sample(dut.sent.ready, dut.ack.ready)
            stalls["sent"] += sv and not sr
            stalls["ack"] += av and not ar
            if sv and sr:
                log.append((cycle, 1, "sent", si))
                si += 1
                sv = False
            if av and ar:
                log.append((cycle, 0, "ack", ai))
                ai += 1
                av = False
            cycle += 1
        ctx.set(dut.sent.valid, 0)
        ctx.set(dut.ack.valid, 0)
        await ctx.tick().repeat(quiet)
        for name in RT_REGS:
            if "count" in name.fields:
                counters[name.name] = await drv.read(name.name)
        for c in cols.values():
            c.stop = True

    run(dut, driver, *(c.run for c in cols.values()))

    model = RetransmitTrackerModel(qps, outstanding, tag_width, pending,
                                   **{k: v for vals in regs.values() for k, v in vals.items()})
    for qp, start in opens:
        model.open(qp, start)
    want = {name: [] for name in OUTPUTS}
    for _, _, kind, i in sorted(log):
        if kind == "sent":
            model.sent(sents[i])
        else:
            out = model.ack(acks[i][0])
            for name in OUTPUTS:
                want[name] += out[name]
    got = {name: c.records for name, c in cols.items()}
    run_events.stalls = stalls
    return want, got, log, counters, model


def check(want, got, counters, model):
    for name in OUTPUTS:
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            assert g == w, f"{name} {i}: {g} != model {w}"
        assert len(got[name]) == len(want[name]), \
            f"{name}: {len(got[name])} records, model {len(want[name])}"
    for name, count in model.counts.items():
        if name.startswith("scan_"):        # timing of the scan: not modelled
            continue
        assert counters[name] == count, f"counter {name}: {counters[name]} != model {count}"


def test_sacks_with_any_base_offset_match_the_model():
    """SACKs whose bitmap starts anywhere around CACK (sack_offset from -80 to 80): the
    bits at or before CACK say nothing, the others are applied, against the model; a few
    name a trigger PSN before the QP's first (never sent since its open)."""
    rng = seeded()
    ev, n, cack = [], 0, -1
    for _ in range(150):
        for _ in range(rng.randrange(4)):
            ev.append(("sent", sent(0, n, ev=n & 0xFF, tag=n)))
            n += 1
        if n == 0:
            continue
        cack = min(n - 1, cack + rng.randrange(3))
        off = rng.randrange(-80, 81)
        bits = rng.getrandbits(64) & rng.getrandbits(64)
        if rng.random() < 0.8:               # mostly no bit for an unsent PSN
            room = n - (cack + off)
            bits &= (1 << max(0, min(64, room))) - 1
        # The trigger (the PSN whose arrival made the SACK): mostly a PSN sent; sometimes
        # one before the first (no record of it: no feedback, whatever its ring slot holds).
        trig = rng.randrange(max(-2, -cack - (3 if rng.random() < 0.2 else 0)),
                             min(2, n - 1 - cack) + 1)
        ev.append(("ack", sack(0, cack & 0xFFFFFF, bits, offset=off, trig=trig),
                   len([e for e in ev if e[0] == "sent"])))
    want, got, log, counters, model = run_events(ev, qps=2, rng=rng, idle=0.3)
    check(want, got, counters, model)
    assert counters["sacks"] > 20 and counters["sack_duplicate"] > 0


def test_a_trigger_psn_before_the_qps_first_gives_no_feedback():
    """A QP opened at PSN 200: a SACK whose trigger PSN is 199 (within outstanding of the
    next PSN, never sent since the open; its ring slot holds no record of this open) gives
    no feedback, and one whose trigger is 200 does."""
    ev = [("sent", sent(0, 200 + p, ev=7 + p)) for p in range(10)]
    ev += [("ack", sack(0, 203, 0b1, trig=-4, m=SackMode.SKIP_ONCE), 10),
           ("ack", sack(0, 205, 0b1, trig=200 - 205, m=SackMode.SKIP_ONCE), 10)]
    want, got, log, counters, model = run_events(ev, qps=2, opens=[(0, 200)])
    check(want, got, counters, model)
    assert [f["ev"] for f in got["feedback"]] == [7]


def test_directed_sack_release_feedback_holes_and_nacks():
    ev = [("sent", sent(0, p, ev=10 + p, tag=1000 + p)) for p in range(12)]
    ev += [
        # PSNs 0..11 sent, 5 and 8 lost: CACK 4, SACK_BASE 5, bitmap 0,1,1,0,1,1,1.
        ("ack", sack(0, 4, 0b1110110, trig=7 - 4, m=SackMode.SKIP_ONCE), 12),
        ("ack", sack(0, 4, 0b1110110, trig=7 - 4), 12),                 # duplicate
        ("ack", sack(0, 2, 0b1, trig=0), 12),                           # stale
        ("ack", sack(0, 4, 1 << 20, trig=0), 12),                       # unsent PSN 25
        ("ack", sack(0, 30, 0, trig=0), 12),                            # unsent CACK
        ("ack", sack(7, 4, 0), 12),                                     # unknown QP
        ("ack", nack(0, 3), 12),                                        # acked PSN
        ("ack", nack(0, 6), 12),                                        # SACKed PSN
        ("ack", nack(0, 40), 12),                                       # unsent
        ("ack", nack(0, 5, 0x33), 12),                                  # unknown reason
        ("ack", nack(0, 8, NackCode.NO_PKT_BUFFER), 12),                # resource: 8 pending
        ("ack", sack(0, 11, 0, trig=0, m=SackMode.ALWAYS_SKIP), 12),    # all acked
        ("ack", nack(1, 0, NackCode.UNEXPECTED_EVENT), 12),             # QP 1 to error
        ("sent", sent(1, 0)),                                           # ignored
    ]
    want, got, log, counters, model = run_events(ev, qps=2)
    check(want, got, counters, model)
    # hi = 11 after the first SACK; with reorder_guard 3, PSNs up to 8 can be holes: 5, 8.
    # The NACK for 8 comes before 8 is resent: feedback, no second request.
    assert [(r["psn"], r["cause"]) for r in got["rtx"]] == [
        (5, RtxCause.HOLE), (8, RtxCause.HOLE)]
    assert counters["rtx_pending_skip"] == 1 and counters["nacks"] == 1
    assert got["rtx"][0]["tag"] == 1005 and got["rtx"][0]["ev"] == 15
    assert got["release"] == [{"qp": 0, "first": 0, "last": 4, "tag": 1004},
                              {"qp": 0, "first": 5, "last": 11, "tag": 1011}]
    assert [(f["ev"], f["kind"]) for f in got["feedback"]] == [
        (17, FeedbackKind.SKIP_ONCE), (18, FeedbackKind.RESOURCE),
        (21, FeedbackKind.ALWAYS_SKIP)]
    assert got["qp_error"] == [{"qp": 1, "cause": ErrorCause.NACK_FATAL}]
    assert counters["sack_duplicate"] == 1 and counters["sack_stale"] == 1
    assert counters["sack_unsent"] == 2 and counters["no_qp"] == 1
    assert counters["nack_acked"] == 2 and counters["nack_unsent"] == 1
    assert counters["nack_unknown"] == 1


@pytest.mark.parametrize("qps,outstanding,guard,pending,lag,rtime", [
    (4, 128, 3, 16, 0, 0), (2, 256, 1, 16, 0, 0), (4, 128, 3, 16, 40, 0), (2, 256, 2, 4, 40, 0),
    (4, 128, 1, 16, 40, 8), (2, 128, 1, 4, 40, 5)])
def test_matches_the_model_under_loss_reorder_duplication_trimming(qps, outstanding, guard,
                                                                   pending, lag, rtime):
    """``lag``: the sender resends each request up to that many steps late, and more
    packets are trimmed and more NACKs duplicated, so SACKs and NACKs meet pending resends;
    ``pending`` 4 fills the table. ``rtime``: the time guard (``reorder_time``, send
    times one tick a step; the timeout set out of reach): holes younger than it wait. With
    it the count guard is 1, so that the time guard decides (at 3, this channel's reordering
    is often all within the count guard: no hole is ever young)."""
    rng = seeded()
    channel = {"trim": 0.05, "ack_dup": 0.1} if lag else {}
    regs = {"config": {"reorder_guard": guard}}
    if rtime:
        regs = {"config": {"reorder_guard": guard, "timeout_exp": 24},
                "config2": {"reorder_time": rtime}}
    # The traffic must exercise what it is for. With the time guard, a resend taken before
    # the SACK that shows its hole (sent records run ahead of acks here) makes the hole
    # young: hole requests may not happen at all.
    wanted = ["sacks", "sack_duplicate", "releases", "rtx_nack", "sent_rtx",
              "hole_young" if rtime else "rtx_hole"]
    wanted += ["rtx_pending_skip"] * bool(lag) + ["pending_full"] * (pending < 16)
    # A batch of random traffic that misses one of them (about one seed in 40 has no
    # pending skip) is followed by another: every batch is checked against the model.
    for batch in range(3):
        events = closed_loop(random.Random(rng.getrandbits(64)), soak(700), qps=qps,
                             outstanding=outstanding, reorder_guard=guard, pending=pending,
                             rtx_lag=lag, reorder_time=rtime, **channel)
        want, got, log, counters, model = run_events(
            events, qps=qps, outstanding=outstanding, pending=pending, regs=regs, rng=rng,
            idle=0.2, backpressure=0.3)
        check(want, got, counters, model)
        assert rtime or not model.counts["hole_young"]      # no young hole without the guard
        missing = [name for name in wanted if not model.counts[name]]
        if not missing:
            break
        print(f"batch {batch}: no {', '.join(missing)}; another batch")
    assert not missing, f"no {', '.join(missing)} in three batches"
    if model.counts["pending_full"] == 0:
        no_second_request(events, log, qps, outstanding, pending, guard, rtime)


def no_second_request(events, log, qps, outstanding, pending, guard, rtime=0):
    """Replaying the run: no hole or NACK request names a (QP, PSN) already requested,
    unless a retransmission of it was recorded (or CACK passed it) in between."""
    sents = [e[1] for e in events if e[0] == "sent"]
    acks = [e[1] for e in events if e[0] == "ack"]
    model = RetransmitTrackerModel(qps, outstanding, 32, pending, reorder_guard=guard,
                                   reorder_time=rtime)
    asked = set()
    for _, _, kind, i in sorted(log):
        if kind == "sent":
            model.sent(sents[i])
            if sents[i]["rtx"]:
                asked.discard((sents[i]["qp"], sents[i]["psn"]))
            continue
        out = model.ack(acks[i])
        q = acks[i]["qp"]
        if q < qps:
            asked = {(qq, p) for qq, p in asked if qq != q or not model.acked(q, p)}
        for r in out["rtx"]:
            key = (r["qp"], r["psn"])
            assert key not in asked, f"{key} requested again before its resend"
            asked.add(key)
    assert sum(model.counts[name] for name in ("no_qp", "nack_acked", "sack_stale",
                                               "sack_unsent", "nack_unknown")) > 0


def run_script(steps, *, qps=2, outstanding=128, pending=16, regs=None):
    """Steps one at a time, each given time to finish, every output always ready:
    ``("sent", rec)``, ``("ack", desc)``, ``("open", qp, start)``, ``("now", ticks)``
    (then a full timer pass). The model runs the same steps. Returns the block's and the
    model's outputs, the counters and the model."""
    dut = RetransmitTracker(qps, outstanding, 32, pending)
    regs = regs or {}
    model = RetransmitTrackerModel(qps, outstanding, 32, pending,
                                   **{k: v for vals in regs.values() for k, v in vals.items()})
    lay = layouts(32)
    got = {name: [] for name in OUTPUTS}
    want = {name: [] for name in OUTPUTS}
    counters = {}

    async def tb(ctx):
        drv = await configured(ctx, dut, regs)
        for name in OUTPUTS:
            ctx.set(getattr(dut, name).ready, 1)

        async def wait(cycles):
            for _ in range(cycles):
                await ctx.tick()
                sample_outputs(ctx, dut, lay, got)

        for step in steps:
            if step[0] in ("sent", "ack"):
                port = getattr(dut, step[0])
                ctx.set(port.payload, step[1])
                ctx.set(port.valid, 1)
                # The outputs are sampled while the input waits too (the hole engine's
                # requests of the step before hold the ack input).
                while True:
                    taken = ctx.get(port.ready)
                    await ctx.tick()
                    sample_outputs(ctx, dut, lay, got)
                    if taken:
                        break
                ctx.set(port.valid, 0)
                out = getattr(model, step[0])(step[1])
                await wait(8)
            elif step[0] == "open":
                await drv.write_fields("qp_select", qp=step[1])
                await drv.write_fields("qp_start", psn=step[2])
                await drv.write_fields("qp_command", open=1)
                while (await drv.read_fields("status"))["busy"]:
                    pass
                model.open(step[1], step[2])
                out = None
            else:
                # The scan may be anywhere in its pass when the time changes: the requests
                # of one step are compared in the model's order (QP, then PSN).
                marks = {name: len(got[name]) for name in OUTPUTS}
                ctx.set(dut.now, step[1])
                await wait(2 * qps * (outstanding + 5) + 50)
                out = model.scan(step[1])
                for name in OUTPUTS:
                    got[name][marks[name]:] = sorted(got[name][marks[name]:], key=scan_order)
                    out[name] = sorted(out[name], key=scan_order)
            for name in OUTPUTS:
                want[name] += (out or {}).get(name, [])
        await wait(20)
        for name in RT_REGS:
            if "count" in name.fields:
                counters[name.name] = await drv.read(name.name)

    run(dut, tb)
    return want, got, counters, model


def scan_order(record):
    """A record's place in a timer pass: by QP, then PSN (or EV, for feedback)."""
    return (record["qp"], record.get("psn", 0), record.get("ev", 0))


def requests(got):
    return [(r["qp"], r["psn"], r["cause"]) for r in got["rtx"]]


def test_a_pending_retransmission_is_not_requested_again():
    """A NACKed PSN that a SACK then shows as a hole past the reorder guard is requested
    once, until its retransmission is recorded; then a NACK (QP 0) or a first hole (QP 1)
    requests it again. Two NACKs for one PSN: one request."""
    N, H = RtxCause.NACK, RtxCause.HOLE
    steps = [("sent", sent(q, p, ev=p)) for q in range(2) for p in range(14)]
    steps += [
        ("ack", nack(0, 5)),                                 # request
        ("ack", sack(0, 4, 0b1111110)),                      # 6..11: hole 5 pending
        ("ack", nack(0, 5)),                                 # still pending
        ("sent", sent(0, 5, ev=99, rtx=1)),                  # resent
        ("ack", nack(0, 5)),                                 # the resend trimmed: request
        ("ack", nack(0, 12, NackCode.NO_PKT_BUFFER)),        # two NACKs for PSN 12: one
        ("ack", nack(0, 12)),
        ("ack", nack(1, 5)),                                 # request
        ("sent", sent(1, 5, ev=98, rtx=1)),                  # resent
        ("ack", sack(1, 4, 0b1111110)),                      # hole 5: request
    ]
    want, got, counters, model = run_script(steps)
    check(want, got, counters, model)
    assert requests(got) == [(0, 5, N), (0, 5, N), (0, 12, N), (1, 5, N), (1, 5, H)]
    assert got["rtx"][1]["ev"] == 99 and got["rtx"][4]["ev"] == 98
    assert counters["rtx_pending_skip"] == 3 and counters["pending_full"] == 0
    # Skipped NACKs still report the EV (feedback), and count as NACKs.
    assert counters["nacks"] == 6 and counters["rtx_nack"] == 4
    assert len([f for f in got["feedback"] if f["kind"] != FeedbackKind.ACKED]) == 6


def test_an_open_while_sacks_are_in_flight_is_applied():
    """An open written while a SACK is in stage E or W (the ack input offered every cycle,
    the command written 0 to 5 cycles after it starts) waits for them and is applied; the
    QP opened then takes its start PSN. (Stages E and W once waited for the command, which
    waited for them: the tracker hung.)"""
    dut = RetransmitTracker(2, 128, 32, 16)
    got = {"sent_new": None}

    async def tb(ctx):
        drv = await configured(ctx, dut, {})
        for name in OUTPUTS:
            ctx.set(getattr(dut, name).ready, 1)
        for p in range(10):
            ctx.set(dut.sent.payload, sent(0, p))
            ctx.set(dut.sent.valid, 1)
            await ctx.tick().until(dut.sent.ready)
        ctx.set(dut.sent.valid, 0)
        for phase in range(6):
            ctx.set(dut.ack.payload, sack(0, phase + 1))
            ctx.set(dut.ack.valid, 1)
            await ctx.tick().repeat(phase + 1)
            await drv.write_fields("qp_select", qp=1)
            await drv.write_fields("qp_start", psn=100 * phase)
            await drv.write_fields("qp_command", open=1)
            ctx.set(dut.ack.valid, 0)
            for _ in range(20):
                if not (await drv.read_fields("status"))["busy"]:
                    break
            else:
                raise AssertionError(f"the open written {phase + 1} cycles in never applied")
            ctx.set(dut.sent.payload, sent(1, 100 * phase))
            ctx.set(dut.sent.valid, 1)
            await ctx.tick().until(dut.sent.ready)
            ctx.set(dut.sent.valid, 0)
            await ctx.tick().repeat(4)
        got["sent_new"] = await drv.read("sent_new")

    run(dut, tb)
    assert got["sent_new"] == 10 + 6


def test_pending_table_full_open_and_error():
    """``pending=1``: a second request goes out but is not remembered (``pending_full``);
    an open or an error of a QP frees its entries, CACK passing a PSN frees its entry."""
    N = RtxCause.NACK
    steps = [("sent", sent(q, p)) for q in range(2) for p in range(10)]
    steps += [
        ("ack", nack(0, 4)),                 # remembered
        ("ack", nack(1, 4)),                 # full: out, not remembered
        ("ack", nack(1, 4)),                 # out again, full again
        ("ack", nack(0, 4)),                 # skipped
        ("open", 0, 0),                      # frees QP 0's entry
        ("ack", nack(1, 4)),                 # remembered
        ("ack", nack(1, 4)),                 # skipped
        ("ack", nack(1, 0, NackCode.UNEXPECTED_EVENT)),     # QP 1 to error: freed
        *[("sent", sent(0, p)) for p in range(10)],
        ("ack", nack(0, 4)),                 # remembered
        ("ack", nack(0, 4)),                 # skipped
        ("ack", sack(0, 4)),                 # CACK passes 4: freed
        ("ack", nack(0, 6)),                 # remembered
        ("ack", nack(0, 7)),                 # full
    ]
    want, got, counters, model = run_script(steps, pending=1)
    check(want, got, counters, model)
    assert requests(got) == [(0, 4, N), (1, 4, N), (1, 4, N), (1, 4, N), (0, 4, N),
                             (0, 6, N), (0, 7, N)]
    assert counters["pending_full"] == 3 and counters["rtx_pending_skip"] == 3
    assert model.pending == {(0, 6)}


def test_timeout_requests_are_pending_too():
    """A timeout's request is remembered: a NACK for the PSN before its resend is skipped,
    after it requests. A PSN whose resend is pending does not time out (PENDING_RULE); once
    the resend is taken it times out from the resend's send time."""
    T, N = RtxCause.TIMEOUT, RtxCause.NACK
    steps = [("sent", sent(0, p, time=0)) for p in range(3)]
    steps += [
        ("ack", nack(0, 2)),                 # request, pending
        ("now", 200),                        # timeouts of 0 and 1; 2 is pending: none
        ("ack", nack(0, 1)),                 # skipped
        ("sent", sent(0, 1, time=200, rtx=1)),
        ("ack", nack(0, 1)),                 # request
        ("sent", sent(0, 2, time=200, rtx=1)),
        ("now", 400),                        # 0 and 1 pending; 2 times out from its resend
    ]
    want, got, counters, model = run_script(steps, qps=1)
    check(want, got, counters, model)
    assert requests(got) == [(0, 2, N), (0, 0, T), (0, 1, T), (0, 1, N), (0, 2, T)]
    assert counters["rtx_pending_skip"] == 1 and counters["rtx_timeout"] == 3
    assert model.pending == {(0, 0), (0, 1), (0, 2)}


@pytest.mark.parametrize("rtime", [0, 3])
def test_time_guard(rtime):
    """TIME_RULE: PSN 3 is NACKed and resent (at 120); PSN 5 is lost. A SACK triggered by
    PSN 8 (sent at 108) shows holes 3 and 5. With reorder_time 3, hole 5 (sent at 105) is
    old enough and requested, hole 3 (resent after the trigger) is not: it becomes the
    mark, so the next SACK (trigger 9, sent at 109) judges it again, still too young;
    hole 5 is then pending. Without the guard, hole 3 is requested again at once."""
    H, N = RtxCause.HOLE, RtxCause.NACK
    steps = [("now", 130)] + [("sent", sent(0, p, time=100 + p)) for p in range(10)]
    steps += [
        ("ack", nack(0, 3)),
        ("sent", sent(0, 3, time=120, rtx=1)),
        ("ack", sack(0, 2, 0b111010, trig=8 - 2)),        # 4, 6, 7, 8 (base 3)
        ("ack", sack(0, 2, 0b1111010, trig=9 - 2)),       # and 9
    ]
    regs = {"config": {"reorder_guard": 1}, "config2": {"reorder_time": rtime}}
    want, got, counters, model = run_script(steps, qps=1, regs=regs)
    check(want, got, counters, model)
    if rtime:
        assert requests(got) == [(0, 3, N), (0, 5, H)]
        assert counters["hole_young"] == 2 and counters["rtx_pending_skip"] == 1
        assert model.q[0].mark == 3
    else:
        assert requests(got) == [(0, 3, N), (0, 3, H), (0, 5, H)]
        assert counters["hole_young"] == 0 and counters["rtx_pending_skip"] == 0


def test_register_table_in_the_docs():
    page = docs_page("blocks", "retransmit-tracker.md")
    assert RT_REGS.markdown() in page.read_text()


def test_psn_wrap():
    rng = seeded()
    starts = {0: 0xFFFFF8, 1: 0xFFFFFF}
    events = closed_loop(random.Random(rng.getrandbits(64)), soak(400), qps=2)
    # Shift every PSN of the traffic by the QP's start.
    shifted = []
    for e in events:
        if e[0] == "sent":
            r = dict(e[1])
            r["psn"] = psn_add(r["psn"], starts[r["qp"]])
            shifted.append(("sent", r))
        else:
            d = dict(e[1])
            if d["qp"] in starts:
                d["cack"] = psn_add(d["cack"], starts[d["qp"]])
                d["psn"] = psn_add(d["psn"], starts[d["qp"]])
            shifted.append(("ack", d, e[2]))
    want, got, log, counters, model = run_events(shifted, qps=2, opens=starts.items(),
                                                 rng=rng, idle=0.1, backpressure=0.2)
    check(want, got, counters, model)
    # Some release crossed the wrap (a QP whose CACK stays behind a loss for the whole run
    # may not: so any QP's counts).
    assert any(r["last"] < 0x1000 for r in got["release"])


def run_throughput(n, qps=4, in_turn=False):
    """Sent records on random QPs (or the QPs in turn), and in-order SACKs (no holes: each
    acknowledges one more PSN, with the bit of the next set) as soon as the PSNs they name
    are sent: both inputs valid every cycle. Returns the cycles of each input's
    handshakes."""
    rng = seeded()
    nxt = [0] * qps
    events, acks = [], []
    for i in range(n):
        q = i % qps if in_turn else rng.randrange(qps)
        events.append(("sent", sent(q, nxt[q], ev=rng.randrange(256))))
        if nxt[q] >= 1:
            acks.append(("ack", sack(q, nxt[q] - 1, 0b1, trig=1), i + 1))
        nxt[q] += 1
    want, got, log, counters, model = run_events(events + acks, qps=qps, outstanding=1024,
                                                 rng=rng)
    check(want, got, counters, model)
    assert model.counts["releases"] == len(acks)
    sc = [c for c, _, k, _ in log if k == "sent"]
    ac = [c for c, _, k, _ in log if k == "ack"]
    return sc, ac, run_events.stalls


def test_one_sack_and_one_sent_record_per_cycle():
    """Both inputs offered a record every cycle they have one, the QPs in turn: neither is
    ever refused, so each takes one record per cycle (an ack waits only for the sent record
    it names)."""
    sc, ac, stalls = run_throughput(400, in_turn=True)
    assert sc[-1] - sc[0] + 1 == len(sc), "bubbles between sent records"
    overlap = [c for c in ac if c <= sc[-1]]
    print(f"measured: {len(sc)} sent records in {sc[-1] - sc[0] + 1} cycles, {len(ac)} "
          f"SACKs ({len(overlap)} of them while sent records flowed), cycles an input was "
          f"refused: {stalls}")
    assert stalls == {"sent": 0, "ack": 0}
    assert len(overlap) > 0.9 * len(sc)


def test_random_qps_rate():
    """The same on random QPs: a SACK right behind one of its QP waits a cycle in stage E
    (stage K writes the QP's mark), and holds the sent records of that QP meanwhile."""
    sc, ac, stalls = run_throughput(400)
    span_s, span_a = sc[-1] - sc[0] + 1, ac[-1] - ac[0] + 1
    print(f"measured, 4 QPs at random: {len(sc)} sent records in {span_s} cycles, {len(ac)} "
          f"SACKs in {span_a} cycles, cycles an input was refused: {stalls}")
    assert len(sc) >= 0.75 * span_s and len(ac) >= 0.7 * span_a


def test_one_qp_back_to_back():
    """Every record on one QP: a sent record and a SACK of that QP offered every cycle.
    A SACK waits in stage E while stage K writes its QP's mark, and the sent records of the
    QP wait with it; stage E's CACK is forwarded to the sent path. The guarantee: one
    record every two cycles on each input."""
    sc, ac, stalls = run_throughput(300, qps=1)
    span_s = sc[-1] - sc[0] + 1
    span_a = ac[-1] - ac[0] + 1
    print(f"measured, one QP: {len(sc)} sent records in {span_s} cycles, {len(ac)} SACKs in "
          f"{span_a} cycles, cycles an input was refused: {stalls}")
    assert 2 * len(sc) >= span_s and 2 * len(ac) >= span_a


def test_nack_to_request_latency_and_hole_engine_rate():
    dut = RetransmitTracker(2, 128)
    result = {}

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(RT_REGS, bus.read, bus.write)
        while (await drv.read_fields("status"))["busy"]:
            pass
        for name in ("rtx", "feedback", "release", "qp_error"):
            ctx.set(getattr(dut, name).ready, 1)
        for p in range(100):
            ctx.set(dut.sent.payload, sent(0, p, ev=p))
            ctx.set(dut.sent.valid, 1)
            await ctx.tick()
        ctx.set(dut.sent.valid, 0)
        ctx.set(dut.ack.payload, nack(0, 90))      # past the holes below: not pending there
        ctx.set(dut.ack.valid, 1)
        await ctx.tick()
        ctx.set(dut.ack.valid, 0)
        cycles = 1
        while not ctx.get(dut.rtx.valid):
            await ctx.tick()
            cycles += 1
        result["nack"] = cycles
        assert ctx.get(dut.rtx.payload.psn) == 90
        await ctx.tick().repeat(4)
        # A SACK with CACK 9 and PSNs 11, 13, ..., 73 acknowledged: hi = 73, so with the
        # guard of 3 the holes 10, 12, ..., 70 (31 of them) are requested.
        bitmap = sum(1 << i for i in range(1, 64, 2))
        ctx.set(dut.ack.payload, sack(0, 9, bitmap))
        ctx.set(dut.ack.valid, 1)
        await ctx.tick()
        # The next ack record (a NACK on QP 1, which has sent nothing: ignored) is applied
        # (stage W goes, the probe "applied") once the hole engine is done with the SACK's
        # holes.
        ctx.set(dut.ack.payload, nack(1, 5))
        psns, first, last, k = [], None, None, 1
        applied = []
        while k < 200:
            taken = ctx.get(dut.ack.valid) and ctx.get(dut.ack.ready)
            if ctx.get(dut.probe["applied"]):
                applied.append(k)
            if ctx.get(dut.release.valid) and "release" not in result:
                result["release"] = k
            if ctx.get(dut.feedback.valid) and "feedback" not in result:
                result["feedback"] = k
            if ctx.get(dut.rtx.valid):
                psns.append(ctx.get(dut.rtx.payload.psn))
                first = first or k
                last = k
            await ctx.tick()
            if taken:
                ctx.set(dut.ack.valid, 0)
            k += 1
        result["holes"] = (psns, first, last)
        result["applied"] = applied

    run(dut, tb)
    print(f"measured: NACK accepted to its retransmit request valid: {result['nack']} "
          f"cycles")
    assert result["nack"] == RetransmitTracker.nack_latency
    print(f"measured: SACK accepted to its release record valid: {result['release']} cycles")
    assert result["release"] == RetransmitTracker.sack_latency
    print(f"measured: SACK accepted to its feedback record valid: {result['feedback']} cycles")
    assert result["feedback"] == RetransmitTracker.feedback_latency
    psns, first, last = result["holes"]
    assert psns == list(range(10, 71, 2)), psns
    print(f"measured: {len(psns)} hole requests in {last - first + 1} cycles, the first "
          f"{first} cycles after the SACK; the SACK and the next ack record applied "
          f"{result['applied']} cycles after the SACK")
    assert last - first + 1 == len(psns)
    assert first == RetransmitTracker.hole_latency
    sack_w, next_w = result["applied"]
    assert next_w - sack_w == len(psns) + RetransmitTracker.hole_pause


def test_timeouts_backoff_and_retry_exhaustion():
    qps, O = 2, 128
    dut = RetransmitTracker(qps, O)
    t, lin, rmax = 2, 1, 2
    model = RetransmitTrackerModel(qps, O, timeout_exp=t, retry_linear=lin, retry_max=rmax)
    lay = layouts(32)
    steps = []

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(RT_REGS, bus.read, bus.write)
        await drv.write_fields("config", timeout_exp=t, retry_linear=lin)
        await drv.write_fields("config2", retry_max=rmax)
        while (await drv.read_fields("status"))["busy"]:
            pass
        for name in OUTPUTS:
            ctx.set(getattr(dut, name).ready, 1)

        async def feed(port, rec, model_fn):
            ctx.set(port.payload, rec)
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
            return model_fn(rec)

        async def settle(now, cycles=2 * qps * (O + 5) + 50):
            ctx.set(dut.now, now)
            got = {name: [] for name in OUTPUTS}
            first = None
            for k in range(cycles):
                await ctx.tick()
                if sample_outputs(ctx, dut, lay, got) and first is None:
                    first = k
            want = model.scan(now)
            return got, want, first

        for p in range(10):
            await feed(dut.sent, sent(0, p, ev=p, time=0), model.sent)
        for p in range(5):
            await feed(dut.sent, sent(1, p, ev=100 + p, time=0), model.sent)
        out = await feed(dut.ack, sack(0, 3, 0b0110, trig=0), model.ack)   # 5, 6 SACKed
        await ctx.tick().repeat(5)
        for now, resend in [(3, None), (4, None), (5, None), (6, 4), (9, None), (10, None),
                            (11, 4), (18, None), (19, None)]:
            if resend is not None:
                await feed(dut.sent, sent(0, resend, ev=77, time=now, rtx=1), model.sent)
            steps.append((now,) + await settle(now))

    run(dut, tb)
    key = lambda r: tuple(sorted(r.items()))
    for now, got, want, first in steps:
        for name in OUTPUTS:
            assert sorted(map(key, got[name])) == sorted(map(key, want[name])), \
                f"now={now} {name}: {got[name]} != model {want[name]}"
            # In scan order: ascending from where the pass stood when ``now`` moved on,
            # round to CACK + 1 (one rotation of the ascending list).
            for q in range(qps):
                ps = [r["psn"] for r in got["rtx"] if r["qp"] == q]
                k = next((i for i in range(1, len(ps)) if ps[i] < ps[i - 1]), 0)
                assert ps[k:] + ps[:k] == sorted(ps), ps
    by_now = {now: (got, first) for now, got, _, first in steps}
    assert by_now[3][0]["rtx"] == [] and by_now[5][0]["rtx"] == []
    assert sorted(r["psn"] for r in by_now[4][0]["rtx"] if r["qp"] == 0) == [4, 7, 8, 9]
    assert all(r["cause"] == RtxCause.TIMEOUT for r in by_now[4][0]["rtx"])
    assert [r["psn"] for r in by_now[9][0]["rtx"]] == []       # resent at 6, times out 10
    assert [r["psn"] for r in by_now[10][0]["rtx"]] == [4]
    # Resent at 11 after two timeouts of the oldest PSN: backoff doubles to 8 ticks, and
    # the third timeout exhausts retry_max = 2.
    assert by_now[18][0]["rtx"] == [] and by_now[18][0]["qp_error"] == []
    assert by_now[19][0]["qp_error"] == [{"qp": 0, "cause": ErrorCause.RETRIES}]
    assert by_now[19][0]["rtx"] == []
    bound = qps * (O + 5)
    print(f"measured: timeout seen {by_now[4][1]} cycles after it expired "
          f"(bound one pass: {bound} cycles for {qps} QPs x {O})")
    assert by_now[4][1] <= bound


# The first PSN: 0, and one where the PSNs outstanding wrap the low 8 bits and the 24.
@pytest.mark.parametrize("start", [0, (1 << 24) - 70])
def test_send_credit_window_ring_and_cwnd(start):
    qps, O = 2, 128
    mask = (1 << 24) - 1
    dut = RetransmitTracker(qps, O)
    seen = []

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(RT_REGS, bus.read, bus.write)
        await drv.write_fields("config2", initial_mpr=1)
        await drv.write_fields("config", pmtu_log2=10)
        await drv.write_fields("qp_select", qp=0)
        await drv.write_fields("qp_start", psn=start)
        await drv.write_fields("qp_command", open=1)
        while (await drv.read_fields("status"))["busy"]:
            pass

        async def credit(q):
            ctx.set(dut.credit_qp, q)
            await ctx.tick()
            return ctx.get(dut.credit_ready)

        # MPR 1: 128 PSNs, PSN 0..127 may go, 128 may not.
        for p in range(128):
            assert await credit(0), f"psn {p}"
            ctx.set(dut.sent.payload, sent(0, (start + p) & mask))
            ctx.set(dut.sent.valid, 1)
            await ctx.tick()
            ctx.set(dut.sent.valid, 0)
        seen.append(await credit(0))
        # A SACK with MPR 2 and CACK 9: 138 may go, but the ring holds 128: 128 + 10.
        ctx.set(dut.ack.payload, sack(0, (start + 9) & mask, 0, mpr=2))
        ctx.set(dut.ack.valid, 1)
        await ctx.tick()
        ctx.set(dut.ack.valid, 0)
        await ctx.tick().repeat(3)
        seen.append(await credit(0))
        # cwnd 4 KiB at PMTU 1 KiB: at most 4 PSNs in flight; 118 are.
        ctx.set(dut.cwnd.payload.qp, 0)
        ctx.set(dut.cwnd.payload.cwnd, 4096)
        ctx.set(dut.cwnd.valid, 1)
        await ctx.tick()
        ctx.set(dut.cwnd.valid, 0)
        seen.append(await credit(0))
        ctx.set(dut.cwnd.payload.cwnd, 1 << 20)
        ctx.set(dut.cwnd.valid, 1)
        await ctx.tick()
        ctx.set(dut.cwnd.valid, 0)
        seen.append(await credit(0))
        seen.append(await credit(1))
        seen.append(await credit(5))
        seen.append(await drv.read("sent_over_credit"))

    run(dut, tb)
    assert seen == [0, 1, 0, 1, 1, 0, 0]


def test_scan_pass_time():
    """Two QPs with 100 and 60 PSNs outstanding, no timeouts due: QP visits per cycle of the
    timer scan, so the time one pass over every outstanding PSN takes."""
    qps, O = 2, 128
    dut = RetransmitTracker(qps, O)
    got = {}

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(RT_REGS, bus.read, bus.write)
        while (await drv.read_fields("status"))["busy"]:
            pass
        ctx.set(dut.sent.valid, 1)
        for q, n in ((0, 100), (1, 60)):
            for p in range(n):
                ctx.set(dut.sent.payload, sent(q, p))
                await ctx.tick()
        ctx.set(dut.sent.valid, 0)
        # The cycles between the ends of visits (the probe of the timer's decision to end
        # one), over four passes, after one to settle.
        ends = []
        for k in range(6 * 200):
            if ctx.get(dut.probe["scan_end"]):
                ends.append(k)
            await ctx.tick()
        got["passes"] = [b - a for a, b in zip(ends[2::2], ends[4::2])]
        got["visits"] = (await drv.read("scan_visits"))

    run(dut, tb)
    bound = (100 + 5) + (60 + 5)
    print(f"measured: one timer pass over 2 QPs with 160 PSNs outstanding: {got['passes']} "
          f"cycles (bound sum of (outstanding + 5) = {bound})")
    assert got["passes"] and all(p <= bound for p in got["passes"])
    assert got["visits"] >= len(got["passes"]) * 2


@pytest.mark.parametrize("kwargs,match", [
    ({"qps": 0}, "qps"), ({"qps": 70000}, "qps"), ({"outstanding": 64}, "outstanding"),
    ({"outstanding": 1000}, "outstanding"), ({"tag_width": 0}, "tag_width"),
    ({"pending": 0}, "pending must be 1 .. 64, not 0"), ({"pending": 65}, "pending"),
    ({"pending": 4.0}, "pending"),
])
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RetransmitTracker(**kwargs)


@pytest.mark.soak
def test_long_closed_loop_soak():
    rng = seeded()
    events = closed_loop(random.Random(rng.getrandbits(64)), soak(20000), qps=4,
                         outstanding=128, loss=0.05, trim=0.03)
    want, got, log, counters, model = run_events(events, qps=4, rng=rng, idle=0.3,
                                                 backpressure=0.4)
    check(want, got, counters, model)
