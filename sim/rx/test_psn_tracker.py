"""PsnTracker on Amaranth's simulator, matched record for record against the model."""

import random

import pytest
from amaranth.asserts import AnyConst
from amaranth.hdl import Assert, Cat, Const, Module, Signal
from amaranth.lib import wiring

from mrcnic.base import proto
from mrcnic.flow.formal import prove_not_vacuous
from mrcnic.base.records import ACK_DESC, COMPLETION, PKT_IN, VERDICT, Verdict
from mrcnic.host.driver import RegisterDriver
from mrcnic.model import packet as pk
from mrcnic.model.rx.psn_tracker import PsnTrackerModel, random_arrivals
from mrcnic.base.proto import Opcode
from mrcnic.rx.psn_tracker import TRACKER_REGS, PsnTracker
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import (command_cases, offer, run, seeded, soak, start_traffic,
                              until_clear, until_moved)
from testkit.meta import MetaSink, MetaSource


def fields(layout, value):
    return {name: (value >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


def data_packet(qp, psn, opcode=Opcode.WRITE_MIDDLE, **kw):
    rec = dict.fromkeys((name for name, _ in PKT_IN), 0)
    rec.update(qp=qp, psn=psn, opcode=int(opcode), length=1024)
    rec.update(kw)
    return rec


def run_tracker(records, *, qps=4, mpr_max=8, max_wimm_dest=8, sack_every=8, rng=None,
                idle=0.0, backpressure=0.0, setup=None, max_cycles=None, window_chunks=3):
    """Run ``records`` through a PsnTracker; returns (verdicts, acks, completions, source,
    sinks, registers read at the end)."""
    rng = rng or random.Random(0)
    dut = PsnTracker(qps, mpr_max, max_wimm_dest, window_chunks)
    n = len([r for r in records if r is not None])
    model = PsnTrackerModel(qps, mpr_max, max_wimm_dest, sack_every)
    if setup:
        for action, args in setup:
            getattr(model, action)(*args)
    want = [model.packet(r) for r in records if r is not None]
    n_ack = sum(1 for _, a, _ in want if a is not None)
    n_cpl = sum(len(c) for _, _, c in want)
    limit = max_cycles or 40 * n + 2000
    src = MetaSource(dut.pkt, records, rng=rng, idle=idle)
    src.hold = True                     # until the QPs are open
    sinks = {name: MetaSink(getattr(dut, name), count, rng=rng, backpressure=backpressure,
                            max_cycles=limit)
             for name, count in (("verdict", n), ("ack", n_ack), ("cpl", n_cpl))}
    regs_out = {}

    async def driver(ctx):
        master = AxiLiteSimMaster(ctx, dut.s_axil)
        regs = RegisterDriver(TRACKER_REGS, master.read, master.write)
        await regs.write_fields("config", sack_every=sack_every)
        for action, args in setup or ():
            while (await regs.read_fields("status"))["busy"]:
                pass
            await regs.write_fields("qp_select", qp=args[0])
            if action == "open":
                start = args[1] if len(args) > 1 else 0
                mpr = args[2] if len(args) > 2 else 0
                await regs.write_fields("qp_start", psn=start)
                await regs.write_fields("qp_mpr", mpr=mpr)
                await regs.write_fields("qp_command", open=1)
            else:
                await regs.write_fields("qp_command", close=1)
            while (await regs.read_fields("status"))["busy"]:
                pass
        src.hold = False
        while not src.done or not all(len(s.records) == s.count for s in sinks.values()):
            await ctx.tick()
        await ctx.tick().repeat(4)
        for reg in TRACKER_REGS:
            regs_out[reg.name] = await regs.read_fields(reg.name)

    run(dut, driver, src.run, *(s.run for s in sinks.values()))
    got = {name: [fields(layout, v) for v in sinks[name].records]
           for name, layout in (("verdict", VERDICT), ("ack", ACK_DESC), ("cpl", COMPLETION))}
    return want, got, src, sinks, regs_out, model


def check(want, got, model, regs):
    verdicts = [w[0] for w in want]
    acks = [w[1] for w in want if w[1] is not None]
    cpls = [c for w in want for c in w[2]]
    for i, (w, g) in enumerate(zip(verdicts, got["verdict"])):
        assert g == w, f"verdict {i}: {g} != {w}"
    for i, (w, g) in enumerate(zip(acks, got["ack"])):
        assert g == w, f"ack {i}: {g} != {w} (differ: " \
                       f"{ {k: (g[k], w[k]) for k in w if g[k] != w[k]} })"
    assert got["cpl"] == cpls
    for name, count in model.counts.items():
        assert regs[name]["count"] == count, f"counter {name}"


def test_spec_worked_example():
    """PSNs 0..11 sent, 5 and 8 lost: CACK 4, SACK_BASE 5, bitmap 0,1,1,0,1,1,1."""
    recs = [data_packet(0, p, ack_req=int(p == 11)) for p in range(12) if p not in (5, 8)]
    want, got, *_ = run_tracker(recs, qps=1, sack_every=0)
    last = got["ack"][-1]
    assert last["cack"] == 4 and last["sack_offset"] == 1
    assert [last["bitmap"] >> i & 1 for i in range(7)] == [0, 1, 1, 0, 1, 1, 1]
    assert last["ack_psn_offset"] == 7
    frame = pk.encode(pk.sack_packet(0, last["cack"], last["bitmap"],
                                     sack_offset=last["sack_offset"]))
    assert pk.sack_psns(pk.decode(frame).seth) == [6, 7, 9, 10, 11]
    assert got["ack"] == [w[1] for w in want if w[1] is not None]


@pytest.mark.parametrize("qps,mpr_max,wimm,chunks", [
    (4, 8, 8, 3), (1, 1, 2, 3), (5, 2, 3, 3), (3, 16, 4, 3),
    (2, 1, 2, 2), (3, 4, 3, 2)])
def test_matches_the_model_under_loss_reorder_duplication_trimming(qps, mpr_max, wimm, chunks):
    rng = seeded()
    recs = random_arrivals(rng, soak(700), qps=qps, spread=min(60, mpr_max * 128 // 5))
    want, got, src, sinks, regs, model = run_tracker(
        recs, qps=qps, mpr_max=mpr_max, max_wimm_dest=wimm, sack_every=rng.choice([0, 1, 4, 8]),
        rng=rng, idle=0.2, backpressure=0.3, window_chunks=chunks)
    check(want, got, model, regs)
    # Refused completions are never resent by this open-loop traffic, so a small store
    # stalls the window; placement must still be exercised.
    assert model.counts.get("place", 0) > len(recs) // 6


# (At mpr_max 8 each PSN placed ahead is followed by up to a window's worth of fills: make
# soak runs it; the tests' split at either width is checked alone below, in a few seconds.)
@pytest.mark.parametrize("mpr_max", [1, pytest.param(8, marks=pytest.mark.soak)])
def test_psns_far_from_an_advancing_cack(mpr_max):
    """Each packet of one QP right behind one that advances CACK (two cycles apart, so
    that stage F tests it against the CACK the record ahead writes, from the PSN's offset
    split in stage W): PSNs around the window's edges, 2^10, 2^11 and 2^23 away, behind
    advances of a few PSNs and of a run of hundreds."""
    offsets = [0, 1, 2, -1, -2, 127, 128, 129, 383, 384, 511, 512, 513, 1023, 1024, 1025,
               1026, 1407, 1408, 2047, 2048, 2049, -511, -512, -1024, -1025, -2048,
               (1 << 23) - 1, 1 << 23, (1 << 23) + 1, (1 << 23) + 300, (1 << 23) - 300,
               -(1 << 23) + 5, -(1 << 23) + 383]
    recs, p, window = [], 0, mpr_max * 128
    for i, d in enumerate(offsets):
        # Every third, a run for the advance to pass: the PSNs after the packet first.
        run = 40 * mpr_max if i % 3 == 2 else 0
        recs += [data_packet(0, p + k) for k in range(1, 1 + run)]
        recs += [data_packet(0, p), data_packet(0, (p + d) % (1 << 24))]
        cack = p + run
        if cack < p + d <= cack + window:
            # Placed ahead: fill the hole, so that the next packet is at CACK + 1 again.
            recs += [data_packet(0, q) for q in range(cack + 1, p + d)]
            cack = p + d
        p = cack + 1
    want, got, src, sinks, regs, model = run_tracker(recs, qps=1, mpr_max=mpr_max,
                                                     sack_every=4)
    check(want, got, model, regs)
    assert model.counts.get("out_of_window", 0) > len(offsets) // 4
    assert model.counts.get("duplicate", 0) > len(offsets) // 4


def test_psn_wrap_and_qp_commands():
    rng = seeded()
    start = {0: 0xFFFF80, 1: 0xFFFFFF, 2: 5}
    recs = random_arrivals(rng, soak(500), qp_list=[0, 1, 2], qps=4, start=start, spread=30,
                           imm=0.1)
    setup = [("open", (0, 0xFFFF80)), ("open", (1, 0xFFFFFF, 2)), ("open", (2, 5, 1)),
             ("close", (3,))]
    recs += [data_packet(3, 0)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=4, setup=setup, rng=rng,
                                                     idle=0.1, backpressure=0.1)
    check(want, got, model, regs)
    assert got["verdict"][-1]["verdict"] == Verdict.NO_QP
    assert any(v["qp"] == 0 and v["psn"] < 0x1000 and v["verdict"] == Verdict.PLACE
               for v in got["verdict"]), "QP 0 never placed a PSN past the wrap"


def test_bad_commands_are_refused():
    got_regs = {}
    dut = PsnTracker(4, 4, 2)

    async def tb(ctx):
        master = AxiLiteSimMaster(ctx, dut.s_axil)
        regs = RegisterDriver(TRACKER_REGS, master.read, master.write)
        await regs.write_fields("qp_command", close=1)       # during the reset sweep
        got_regs["sweep"] = await regs.read_fields("error")
        await regs.write_fields("error", busy=1)
        while (await regs.read_fields("status"))["busy"]:
            pass
        await regs.write_fields("qp_select", qp=4)
        await regs.write_fields("qp_command", open=1)
        got_regs["a"] = await regs.read_fields("error")
        await regs.write_fields("error", bad_qp=1)
        await regs.write_fields("qp_select", qp=1)
        await regs.write_fields("qp_mpr", mpr=5)
        await regs.write_fields("qp_command", open=1)
        got_regs["b"] = await regs.read_fields("error")
        got_regs["busy"] = await regs.read_fields("status")

    run(dut, tb)
    assert got_regs["a"] == {"bad_qp": 1, "bad_mpr": 0, "busy": 0}
    assert got_regs["b"] == {"bad_qp": 0, "bad_mpr": 1, "busy": 0}
    assert got_regs["busy"]["busy"] == 0
    assert got_regs["sweep"]["busy"] == 1


def test_a_qp_command_while_records_are_in_flight_is_applied():
    """A QP open written while records are in flight (records of four QPs offered every
    cycle, pairs swapped so that completions are held and released), in three cases: the
    outputs always ready, the command written 0 to 5 cycles after the traffic starts; the
    outputs held not ready for 60 cycles from the start, the command 0 to 5 cycles in; and
    held so, the command 20 to 25 cycles in, once the output FIFOs have stopped the issue
    and the queue is full. status.busy clears within a bound in cycles, every record
    accepted gets its verdict, records keep being taken and answered after the command,
    and the QP opened places its start PSN. (The command waits for the queue and the
    stages to empty with the input closed: the stages must keep going meanwhile.)"""
    hold_cycles, bound = 60, 250
    dut = PsnTracker(4, 2, 4)
    st = {"on": False, "stop": False, "ready_at": 0, "cycle": 0, "extra": []}
    taken, outs = [], {"verdict": [], "ack": [], "cpl": []}
    nxt = {q: 0 for q in range(4)}

    def record(q):
        # PSNs of a QP in swapped pairs (1, 0, 3, 2, ...): the first of a pair is held
        # (WRITE-with-immediate), the second advances CACK over both and releases it.
        p = nxt[q]
        nxt[q] += 1
        return data_packet(q, p ^ 1, Opcode.WRITE_ONLY_IMM if p % 4 < 2 else
                           Opcode.WRITE_MIDDLE, ack_req=int(p % 8 == 7), imm=p, tag=p)

    async def source(ctx):
        await offer(ctx, st, dut.pkt, lambda i: record(i % 4), taken, st["extra"])

    async def sinks(ctx):
        ports = [getattr(dut, name) for name in outs]
        while not st["stop"]:
            ready = st["cycle"] >= st["ready_at"]
            for port in ports:
                ctx.set(port.ready, ready)
            sampled = await ctx.tick().sample(*(x for port in ports
                                                 for x in (port.valid, port.payload.as_value())))
            for k, name in enumerate(outs):
                if ready and sampled[2 + 2 * k]:
                    outs[name].append(sampled[3 + 2 * k])
            st["cycle"] += 1

    async def control(ctx):
        master = AxiLiteSimMaster(ctx, dut.s_axil)
        regs = RegisterDriver(TRACKER_REGS, master.read, master.write)
        while (await regs.read_fields("status"))["busy"]:       # the reset sweep
            pass
        await regs.write_fields("qp_select", qp=1)
        await regs.write_fields("qp_mpr", mpr=0)
        for case, hold, lead, phase in command_cases(hold_cycles):
            start = 0x800000 + 0x1000 * phase + 0x100 * case
            await regs.write_fields("qp_start", psn=start)
            await start_traffic(ctx, st, hold, lead + phase)
            t0 = st["cycle"]
            what = f"open {lead + phase} cycles into the traffic, outputs held {hold}"
            await regs.write_fields("qp_command", open=1)
            assert len(taken) > len(outs["verdict"]), f"{what}: no record in flight"
            await until_clear(st, lambda: regs.read_field("status", "busy"), t0, bound,
                              f"{what}: status.busy")
            # The block keeps working: records taken and answered after the command
            # (and after the outputs' release).
            await until_moved(ctx, st, lambda: (len(taken), len(outs["verdict"])), 100,
                              f"{what}: no progress after the command")
            st["on"] = False
            for _ in range(200):
                if len(outs["verdict"]) == len(taken):
                    break
                await ctx.tick()
            assert len(outs["verdict"]) == len(taken), f"{what}: records without a verdict"
            assert (await regs.read_fields("error"))["busy"] == 0
            # The QP opened takes its start PSN.
            st["extra"].append(data_packet(1, start))
            await ctx.tick().repeat(24)
            assert len(outs["verdict"]) == len(taken)
            v = fields(VERDICT, outs["verdict"][-1])
            assert (v["qp"], v["psn"], v["verdict"]) == (1, start, Verdict.PLACE), what
        st["stop"] = True

    run(dut, control, source, sinks)


def test_one_qp_streams_one_packet_every_two_cycles():
    """One QP alone: a record every two cycles (a QP's records are two cycles apart in the
    pipeline), each verdict and SACK at the documented latency."""
    n = 600
    recs = [data_packet(0, p) for p in range(n)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=2)
    check(want, got, model, regs)
    assert src.cycles[-1] - src.cycles[0] <= 2 * (n - 1) + 2
    vc = sinks["verdict"].cycles
    assert vc[-1] - vc[0] == 2 * (n - 1), "one verdict every two cycles"
    latency = vc[0] - src.cycles[0]
    print(f"latency: record accepted to verdict out: {latency} cycles; one QP: "
          f"{n / (vc[-1] - vc[0] + 1):.3f} records per cycle")
    assert latency == PsnTracker.latency
    # The 8th record is SACKed (sack_every), ack_latency - latency cycles after its verdict.
    assert sinks["ack"].cycles[0] - vc[7] == PsnTracker.ack_latency - PsnTracker.latency


@pytest.mark.parametrize("qps", [2, 4])
def test_qps_in_turn_stream_one_packet_per_cycle(qps):
    """Records of QPs in turn (no two in a row of one QP): one record every cycle, in and
    out, with SACKs coalesced every 8th packet of each QP."""
    n = 600
    recs = [data_packet(i % qps, i // qps) for i in range(n)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=qps)
    check(want, got, model, regs)
    assert src.cycles[-1] - src.cycles[0] == n - 1, "bubbles between records"
    vc = sinks["verdict"].cycles
    assert vc[-1] - vc[0] == n - 1
    print(f"{qps} QPs in turn: {n / (vc[-1] - vc[0] + 1):.3f} records per cycle")


def test_random_qps_and_permutations_within_the_window():
    """Throughput with reordering: every PSN of a 1024 window in a random order, on random
    QPs, no idle input. One record a cycle but for a cycle after each record of the QP of
    the record before, and a flush of the stages behind each continuation. Reports packets
    per cycle."""
    rng = seeded()
    recs = []
    base = {q: 0 for q in range(4)}
    for _ in range(soak(2)):
        for q in range(4):
            block = [base[q] + i for i in range(256)]
            rng.shuffle(block)
            recs += [data_packet(q, p) for p in block]
            base[q] += 256
    rng.shuffle(recs)       # QPs interleaved; each QP's PSNs within 1024 of each other
    want, got, src, sinks, regs, model = run_tracker(recs, qps=4, sack_every=16)
    check(want, got, model, regs)
    span = src.cycles[-1] - src.cycles[0] + 1
    rate = len(recs) / span
    repeats = sum(a["qp"] == b["qp"] for a, b in zip(recs, recs[1:]))
    conts = regs["continuations"]["count"]
    print(f"packets per cycle, random permutations on 4 QPs: {rate:.3f} "
          f"({repeats} records of the QP just before, {conts} continuations)")
    assert span <= len(recs) + repeats + 6 * conts + 32


@pytest.mark.parametrize("sack_every", [0, 1, 4, 8, 16])
def test_sacks_per_data_packet_with_coalescing(sack_every):
    """SACK descriptors per placed packet: in PSN order with no A bit, exactly one per
    `sack_every` packets (none with 0); with the same PSNs sprayed (random order within
    blocks of 64), more, since each new hole asks for one (except with `sack_every` 1,
    where every packet has its SACK already). Reports both."""
    n = 256
    rng = seeded()
    figures = {}
    for order in ("in order", "sprayed"):
        psns = list(range(n))
        if order == "sprayed":
            for i in range(0, n, 64):
                block = psns[i:i + 64]
                rng.shuffle(block)
                psns[i:i + 64] = block
        recs = [data_packet(0, p) for p in psns]
        want, got, src, sinks, regs, model = run_tracker(recs, qps=1, sack_every=sack_every)
        check(want, got, model, regs)
        figures[order] = regs["sacks"]["count"] / regs["place"]["count"]
    print(f"SACKs per data packet, sack_every={sack_every}: in order "
          f"{figures['in order']:.3f}, sprayed in blocks of 64 {figures['sprayed']:.3f}")
    assert figures["in order"] == (n // sack_every / n if sack_every else 0)
    if sack_every == 1:
        assert figures["sprayed"] == 1          # every placed packet SACKed either way
    else:
        assert figures["sprayed"] > figures["in order"]


@pytest.mark.parametrize("chunks", [3, 2])
def test_cack_runs_over_a_filled_hole_fast(chunks):
    """PSNs 1..1000 arrive, then 0: CACK jumps by 1001. Measures PSNs per cycle of advance."""
    recs = [data_packet(0, p) for p in range(1, 1001)] + [data_packet(0, 0, ack_req=1)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=1, sack_every=0,
                                                     window_chunks=chunks)
    check(want, got, model, regs)
    assert got["ack"][-1]["cack"] == 1000
    vcycle = sinks["verdict"].cycles[-1]
    acycle = sinks["ack"].cycles[-1]
    # The SACK for PSN 0 comes once the whole run is acknowledged.
    extra = acycle - vcycle
    rate = 1001 / max(1, extra + 1)
    print(f"CACK advance, window of {chunks} chunks: 1001 PSNs, SACK {extra} cycles after "
          f"the verdict "
          f"({regs['continuations']['count']} continuations): {rate:.0f} PSNs per cycle")
    assert rate >= (64 if chunks == 3 else 48)


@pytest.mark.parametrize("mpr_max,chunks", [(1, 3), (2, 3), (4, 3), (1, 2), (2, 2), (4, 2)])
def test_a_full_window_filled_by_its_first_psn(mpr_max, chunks):
    """Every PSN of the window but the first arrives, then the first: CACK runs to the
    window's end and stops there. With a ring shorter than the window read (mpr_max 1 or
    2), the window's later laps alias the packet's own position, which must read "not
    arrived" in the search and in the SACK bitmap. A receive window longer than the
    window read takes continuations."""
    ring = mpr_max * 128
    recs = [data_packet(0, p) for p in range(1, ring)]
    recs += [data_packet(0, 0, ack_req=1), data_packet(0, ring, ack_req=1)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=1, mpr_max=mpr_max,
                                                     sack_every=0, window_chunks=chunks)
    check(want, got, model, regs)
    first, last = got["ack"][-2:]
    assert (first["cack"], first["bitmap"]) == (ring - 1, 0)
    assert (last["cack"], last["bitmap"]) == (ring, 0)


def test_completions_wait_for_cack_and_leave_in_order():
    # Three single-packet messages with immediate, PSNs 1, 2, 3 arrive before 0.
    recs = [data_packet(0, p, Opcode.WRITE_ONLY_IMM, imm=100 + p, tag=p) for p in (3, 1, 2)]
    recs += [data_packet(0, 0, Opcode.WRITE_ONLY_IMM, imm=100, tag=0)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=1)
    check(want, got, model, regs)
    assert [c["psn"] for c in got["cpl"]] == [0, 1, 2, 3]


def test_full_completion_store_refuses_but_never_deadlocks():
    """With 2 completions held (PSNs 2, 3), 4 and 5 are refused; 1, at CACK + 1, is not."""
    recs = [data_packet(0, 0, Opcode.WRITE_ONLY)]
    recs += [data_packet(0, p, Opcode.WRITE_ONLY_IMM, imm=p) for p in range(2, 6)]
    recs += [data_packet(0, 1, Opcode.WRITE_ONLY_IMM, imm=1)]
    want, got, src, sinks, regs, model = run_tracker(recs, qps=1, max_wimm_dest=2)
    check(want, got, model, regs)
    assert [v["verdict"] for v in got["verdict"]] == [
        Verdict.PLACE, Verdict.PLACE, Verdict.PLACE, Verdict.NO_RESOURCE,
        Verdict.NO_RESOURCE, Verdict.PLACE]
    assert [c["psn"] for c in got["cpl"]] == [1, 2, 3]


@pytest.mark.parametrize("kwargs,match", [
    ({"qps": 0}, "qps"), ({"qps": 70000}, "qps"), ({"mpr_max": 3}, "mpr_max"),
    ({"mpr_max": 128}, "mpr_max"), ({"max_wimm_dest": 0}, "max_wimm_dest"),
    ({"window_chunks": 1}, "window_chunks"), ({"window_chunks": 4}, "window_chunks"),
])
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PsnTracker(**kwargs)


class CackNeverPassesAHole(wiring.Component):
    """PsnTracker with the check: whenever stage U writes a QP's context with a CACK at or
    past PSN ``x`` (any constant), a packet with PSN ``x`` has been placed (its PLACE
    decided in stage U, in this cycle or before). The tracker's ``probe`` (set by its
    ``elaborate``) names the signals. With ``claim_unreachable``, it asserts instead that no
    CACK is ever written below 100: that one must fail, which shows the first is not vacuous
    within the depth."""

    def __init__(self, claim_unreachable=False):
        self.dut = PsnTracker(1, 1, 1)
        self.claim_unreachable = claim_unreachable
        super().__init__(self.dut.signature)

    def elaborate(self, platform):
        m = Module()
        dut = self.dut
        m.submodules.dut = dut.elaborate(platform)
        for name in ("pkt", "s_axil"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(dut, name))
        for name in ("verdict", "ack", "cpl"):
            wiring.connect(m, getattr(dut, name), wiring.flipped(getattr(self, name)))
        probe = dut.probe
        x = AnyConst(proto.PSN_BITS)
        placed = Signal()
        placing = probe.place & (probe.place_psn == x)
        with m.If(placing):
            m.d.sync += placed.eq(1)
        # From reset CACK is 2^24 - 1; within the depth it cannot wrap back, so "at or past
        # x" is cack >= x with cack below 2^23.
        write = probe.cack_write & (probe.cack < (1 << 23))
        if self.claim_unreachable:
            m.d.comb += Assert(~(write & (probe.cack < 100)))
        else:
            with m.If(write & (probe.cack >= x)):
                m.d.comb += Assert(placed | placing)
        return m


# Depth 10 (under a minute): reset sweep, then a packet through to its context write. Each
# further cycle costs about four times the last; make soak runs depth 12 (two packets).
@pytest.mark.formal
@pytest.mark.parametrize("depth", [10, pytest.param(12, marks=pytest.mark.soak)])
def test_formal_cack_never_passes_a_psn_that_has_not_arrived(tmp_path, depth):
    prove_not_vacuous(CackNeverPassesAHole, "psn_tracker_cack", depth, tmp_path)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 384])
def test_first_set_finds_the_lowest_set_bit(n):
    from amaranth.sim import Simulator
    from mrcnic.base.gates import first_set
    rng = seeded()
    vec = Signal(n)
    found, index = first_set(vec)
    m = Module()
    f, i = Signal(), Signal(max(1, len(index)))
    m.d.comb += [f.eq(found), i.eq(index)]

    async def tb(ctx):
        for _ in range(300):
            x = rng.getrandbits(n) & rng.getrandbits(n) & rng.getrandbits(n)
            ctx.set(vec, x)
            assert ctx.get(f) == (x != 0)
            if x:
                assert ctx.get(i) == (x & -x).bit_length() - 1

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("bits", [1, 3, 4, 7])
def test_thermometer_matches_a_compare(bits):
    """Stage W's mask of the positions up to the packet's own (at_or_above, two LUT levels)
    against value >= i, for every value."""
    from amaranth.sim import Simulator
    from mrcnic.rx.psn_tracker.logic import at_or_above
    v = Signal(bits)
    m = Module()
    out = Signal(1 << bits)
    m.d.comb += out.eq(at_or_above(m, v, "t"))

    async def tb(ctx):
        for x in range(1 << bits):
            ctx.set(v, x)
            assert ctx.get(out) == (1 << (x + 1)) - 1, x

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("mpr_max,chunks", [(1, 2), (8, 3), (64, 3)])
def test_tests_against_an_advancing_cack_match_the_24_bit_tests(mpr_max, chunks):
    """Stage F's tests of a PSN against the CACK an advancing record writes (its window
    base plus its run, split in R and tested with a few bits in F) and against the CACK
    read (split in W at bit ``_adv_bits``: its high bits subtracted there, the low ones
    taken as the run) give the 24-bit tests' answers: at or before it, in the window above
    it, just after it; the window's size from the offset less the window, worked out
    before the run is known."""
    from types import SimpleNamespace
    from amaranth.sim import Simulator
    rng = seeded()
    dut = PsnTracker(4, mpr_max, 4, chunks)
    dut._MustUse__silence = True               # its helpers are used, not the whole
    st = dut._stage_registers()                # sets the split's width
    M, cbits = dut._adv_bits, dut._cbits
    psn, base = Signal(proto.PSN_BITS), Signal(proto.PSN_BITS)
    run, mpr_m1 = Signal(range(dut.window)), Signal(max(1, cbits))
    f = SimpleNamespace(adv=Signal(st.f.adv.shape()))
    m = Module()
    # (As in W: the offset worked out a stage ahead, less the window taken after.)
    adv = dut._adv_offset(m, "adv", psn, base)
    m.d.comb += [f.adv.eq(adv), f.adv.lw.eq(dut._adv_lw(adv.lo, mpr_m1))]
    got = Signal(3)
    m.d.comb += got.eq(dut._adv_tests(m, f.adv, run))
    # The split at bit M, against a CACK read.
    psn2, cack = Signal(proto.PSN_BITS), Signal(proto.PSN_BITS)
    psn2_m1, hi2_m1, got2 = Signal(proto.PSN_BITS), Signal(proto.PSN_BITS - M), Signal(3)
    adv2 = dut._adv_offset(m, "adv_ram", psn2, Cat(Const(0, M), cack[M:]), psn_m1=psn2_m1,
                           hi_m1=hi2_m1, mpr_m1=mpr_m1)
    m.d.comb += [psn2_m1.eq(psn2 - 1), hi2_m1.eq(psn2[M:] - 1),
                 got2.eq(dut._adv_tests(m, adv2, cack[:M]))]
    mask = (1 << proto.PSN_BITS) - 1

    def want(off, r, mm1):
        dd = (off - r) & mask
        dm = (dd - 1) & mask
        before = dd == 0 or dd >> (proto.PSN_BITS - 1)
        in_win = not before and dm >> (7 + cbits) == 0 and (not cbits or dm >> 7 <= mm1)
        return int(before) | int(in_win) << 1 | int(dm == 0) << 2

    near = [0, 1, 2, 127, 128, 129, (1 << M) - 1, 1 << M, (1 << M) + 1, 1 << 23,
            (1 << 23) - 1, mask, mask - 1]

    async def tb(ctx):
        for _ in range(1500):
            b = rng.getrandbits(proto.PSN_BITS - 7) << 7
            r = rng.randrange(dut.window)
            off = rng.choice([rng.getrandbits(proto.PSN_BITS), r + rng.randrange(-3, 4),
                              r + rng.randrange(-200, 1200), rng.choice(near)]) & mask
            mm1 = rng.randrange(mpr_max)
            ctx.set(psn, (b + off) & mask)
            ctx.set(base, b)
            ctx.set(run, r)
            ctx.set(mpr_m1, mm1)
            assert ctx.get(got) == want(off, r, mm1), (off, r, mm1)
            c = rng.choice([rng.getrandbits(proto.PSN_BITS), b + rng.choice(near),
                            b + rng.randrange(1 << M)]) & mask
            p = (c + rng.choice([rng.getrandbits(proto.PSN_BITS), rng.randrange(-3, 4),
                                 rng.randrange(-200, 1200), rng.choice(near)])) & mask
            ctx.set(psn2, p)
            ctx.set(cack, c)
            low = c & ((1 << M) - 1)
            assert ctx.get(got2) == want((p - (c - low)) & mask, low, mm1), (p, c, mm1)

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()

