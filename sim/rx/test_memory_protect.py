"""MemoryProtect on Amaranth's simulator against mrcnic.model.rx.memory_protect, record for
record and counter for counter: random record streams against random region tables (every
cause, every range edge), table writes during traffic, QP errors set and cleared, bad
register input, throughput and latency, parameter checks."""

import sys

import pytest

from mrcnic.base import proto
from mrcnic.host.driver import RegisterDriver
from mrcnic.rx.memory_protect import MP_COUNTERS, MP_OUT, MP_REGS, MemoryProtect, table_op
from mrcnic.model.rx.memory_protect import (CAUSES, MemoryProtectModel, apply_op,
                                         random_records, random_setup)
from mrcnic.base.records import NAK, RX_PKT
from testkit import docs_page
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import (command_cases, offer, run, seeded, soak, start_traffic,
                              until_clear, until_moved)

# The search that places table writes between records recurses once per optional placement.
sys.setrecursionlimit(20000)


def pack(layout, d):
    return layout.const(d).as_value().value


def unpack(layout, v):
    return {name: (v >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


# Steps of the search for a placement of the table writes, per record. Measured over 30
# seeds of test_table_writes_during_traffic: from 1 to 2700 per record (a mismatch found deep
# sends the search back through many placements that all fit up to there); 500 was too few
# for some seeds.
SEARCH_BUDGET = 6000


class Bench:
    """Phases of (ops before, records, ops during the records); between phases the block
    drains. Every record's output and every NAK are checked against the model, with each
    op during traffic placed between two records (found by search within the window the
    bus timing allows); then the counters, the error bits and the error register."""

    def __init__(self, phases, *, rng, idle=0.0, backpressure=0.0, nak_backpressure=None,
                 **params):
        self.dut = MemoryProtect(**params)
        self.params = params
        self.phases = phases
        self.rng, self.idle, self.bp = rng, idle, backpressure
        self.nak_bp = backpressure if nak_backpressure is None else nak_backpressure
        self.records = [r for _, recs, _ in phases for r in recs]
        self.outs, self.naks = [], []
        self.in_cycles, self.out_cycles, self.nak_cycles = [], [], []
        self.windows = []            # (op, lo, hi): op takes effect before record lo..hi
        self.go = []                 # phase k may start sending
        self.sent = 0
        self.done = False
        self.counters, self.qp_errors, self.error_reg, self.info = {}, [], {}, {}

    async def source(self, ctx):
        p, rng = self.dut.pkt, self.rng
        for k, (_, recs, _) in enumerate(self.phases):
            while len(self.go) <= k:
                await ctx.tick()
            for rec in recs:
                while self.idle and rng.random() < self.idle:
                    ctx.set(p.valid, 0)
                    await ctx.tick()
                ctx.set(p.payload.as_value(), pack(RX_PKT, rec))
                ctx.set(p.valid, 1)
                await ctx.tick().until(p.ready)
                self.sent += 1
            ctx.set(p.valid, 0)

    async def sink(self, ctx):
        dut, rng = self.dut, self.rng
        held = {}
        cycle = 0
        while not self.done:
            ro = not (self.bp and rng.random() < self.bp)
            rn = not (self.nak_bp and rng.random() < self.nak_bp)
            ctx.set(dut.out.ready, ro)
            ctx.set(dut.nak.ready, rn)
            v = (await ctx.tick().sample(
                dut.pkt.valid, dut.pkt.ready, dut.out.valid, dut.out.payload.as_value(),
                dut.nak.valid, dut.nak.payload.as_value()))[2:]
            if v[0] and v[1]:
                self.in_cycles.append(cycle)
            for key, valid, payload, ready, layout, dest, cycles in (
                    ("out", v[2], v[3], ro, MP_OUT, self.outs, self.out_cycles),
                    ("nak", v[4], v[5], rn, NAK, self.naks, self.nak_cycles)):
                if valid:
                    if key in held and held[key] != payload:
                        raise AssertionError(f"cycle {cycle}: {key} changed before ready")
                    held[key] = payload
                if valid and ready:
                    del held[key]
                    dest.append(unpack(layout, payload))
                    cycles.append(cycle)
            cycle += 1
            if cycle > 200_000:
                raise AssertionError("no end after 200000 cycles")
        ctx.set(dut.out.ready, 0)
        ctx.set(dut.nak.ready, 0)

    async def wait_drained(self, ctx, count):
        quiet = 0
        while len(self.outs) < count or quiet < 30:
            quiet = quiet + 1 if len(self.outs) >= count else 0
            await ctx.tick()

    async def control(self, ctx):
        axil = AxiLiteSimMaster(ctx, self.dut.s_axil)
        drv = RegisterDriver(MP_REGS, axil.read, axil.write)
        rng, total = self.rng, 0
        for k, (before, recs, during) in enumerate(self.phases):
            for op in before:
                await table_op(drv, op)
                self.windows.append((op, total, total))
            self.go.append(True)
            for op in during:
                for _ in range(rng.randrange(0, 12)):
                    await ctx.tick()
                lo = max(0, len(self.outs) - 1)
                await table_op(drv, op)
                self.windows.append((op, lo, min(total + len(recs), len(self.in_cycles) + 1)))
            total += len(recs)
            await self.wait_drained(ctx, total)
            await self.between(ctx, drv, k)
        self.counters = {n: await drv.read(n) for n in MP_COUNTERS}
        self.error_reg = await drv.read_fields("error")
        self.info = await drv.read_fields("info")
        for q in range(self.dut.qps):
            await drv.write_fields("qp_select", qp=q)
            self.qp_errors.append((await drv.read_fields("qp_status"))["error"])
        self.done = True

    async def between(self, ctx, drv, k):
        """Called when phase ``k`` has drained (tests override it)."""

    def run(self):
        run(self.dut, self.source, self.sink, self.control)
        return self

    def check(self):
        """Outputs, NAKs, counters and error bits against the model; returns the model."""
        assert len(self.outs) == len(self.records), \
            f"{len(self.outs)} records out, {len(self.records)} in"
        self.steps, self.failed = 0, set()
        model = self._explain(MemoryProtectModel(self.dut.regions, self.dut.qps), 0, 0, 0)
        if model is None:       # say what differs under the first placement that fits
            self.steps, self.failed = 0, set()
            self.final_ok = lambda m: True
            model = self._explain(MemoryProtectModel(self.dut.regions, self.dut.qps), 0, 0, 0)
        assert model is not None, "no placement of the table writes explains the outputs"
        for name in MP_COUNTERS:
            assert self.counters[name] == model.counts[name], \
                f"counter {name}: {self.counters[name]}, model {model.counts[name]}"
        assert self.qp_errors == [int(e) for e in model.error]
        assert self.error_reg == {"bad_region": int(model.errors["bad_region"]),
                                  "bad_qp": int(model.errors["bad_qp"]), "busy": 0}
        assert self.info == {"regions": self.dut.regions, "qps": self.dut.qps}
        return model

    def _explain(self, model, i, j, k):
        """The model after records i.. and ops j.. (k NAKs matched so far), or None when
        no placement of each op between two records, inside its window, in order, gives
        exactly the outputs seen. Depth first: an op that may still wait is first tried
        after the record."""
        windows = self.windows
        while True:
            while j < len(windows) and windows[j][1] <= i:
                op, _, hi = windows[j]
                if hi > i and i < len(self.records):
                    # The state a placement leaves: the tables follow from j, the rest is
                    # the error bits and the counters. A state already found to fail
                    # fails again.
                    key = (i, j, k, tuple(model.error), tuple(model.counts.values()))
                    if key not in self.failed:
                        later = model.copy()
                        k2 = self._record(later, i, k)
                        if k2 is not None:
                            found = self._explain(later, i + 1, j, k2)
                            if found is not None:
                                return found
                        self.failed.add(key)
                apply_op(model, op)
                j += 1
            if i == len(self.records):
                done = k == len(self.naks) and j == len(windows)
                return model if done and self.final_ok(model) else None
            k = self._record(model, i, k)
            if k is None:
                return None
            i += 1

    def final_ok(self, model):
        """The state read at the end (counters, error bits) is the model's: part of what
        a placement of the table writes must explain (the outputs do not show causes)."""
        return (all(self.counters[n] == model.counts[n] for n in MP_COUNTERS) and
                self.qp_errors == [int(e) for e in model.error])

    def _record(self, model, i, k):
        """Record i through ``model``: the NAK count after it, or None on a mismatch."""
        self.steps += 1
        if self.steps > SEARCH_BUDGET * len(self.records) + 20_000:
            raise AssertionError("the outputs are not explained by any placement of the "
                                 "table writes tried (search budget spent)")
        out, nak = model.record(self.records[i])
        if out != self.outs[i]:
            return None
        if nak is not None:
            if k >= len(self.naks) or self.naks[k] != nak:
                return None
            k += 1
        return k


def phases_with_clears(rng, model, setup, n_phases, per_phase, during=()):
    """Phases of random records; each phase starts by clearing the error bits the model
    says the previous one set (so that checks keep running instead of every QP ending up in
    error)."""
    for op in setup:
        apply_op(model, op)
    phases = []
    for k in range(n_phases):
        before = list(setup) if k == 0 else [("clear_error", q) for q in range(model.qps)
                                             if model.error[q]]
        if k:
            for op in before:
                apply_op(model, op)
        recs = random_records(rng, model, per_phase)
        model.records(recs)
        phases.append((before, recs, list(during[k]) if during else []))
    return phases


# --- Tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [{}, {"regions": 4, "qps": 8}, {"regions": 1, "qps": 1}],
                         ids=["default", "small", "one"])
def test_random_streams_match_the_model(params):
    rng = seeded()
    regions, qps = params.get("regions", 16), params.get("qps", 64)
    model = MemoryProtectModel(regions, qps)
    setup = random_setup(rng, regions, qps)
    # Short phases for few QPs: each phase starts with every error bit cleared.
    per_phase = min(60, 4 + 2 * qps)
    phases = phases_with_clears(rng, model, setup, soak(600 // per_phase), per_phase)
    b = Bench(phases, rng=rng, idle=0.3, backpressure=0.3, **params).run()
    m = b.check()
    c = m.counts
    print({n: c[n] for n in MP_COUNTERS})
    assert c["qp_in_error"] > 0 and c["naks"] > 0 and c["denied"] < c["records"]
    if params == {}:
        assert all(c[cause] > 0 for cause in CAUSES), c


def test_every_cause_and_edge_directed():
    """Each check at its edges, one QP per case so that no error bit hides the next."""
    rng = seeded()
    top = 1 << 64
    setup = [("pd", q, 1) for q in range(64)] + [("pd", 63, 2)] + [
        ("region", 0, 0x100, 0x1000, 0x100, 1, 1),            # 0x1000 .. 0x1100
        ("region", 1, 0x200, top - 0x10, 0x10, 1, 1),         # the last 16 bytes
        ("region", 2, 0x300, 0x5000, 0x100, 0, 1),            # read-only
        ("region", 3, 0x400, 0x8000, 0, 1, 1),                # length 0
        ("region", 4, 0x500, top - 0x10, 0x100, 1, 1),        # reaches past 2^64
        ("region", 5, 0x100, 0x0, top - 1, 1, 1),             # same R_Key, higher index
        ("region", 6, 0x600, 0x9000, 0x100, 1, 1), ("invalidate", 6),
    ]
    cases = [  # (rkey, va, length, qp offset, deny)
        (0x100, 0x1000, 0x100, 0), (0x100, 0x1000, 0, 0), (0x100, 0x1100, 0, 0),
        (0x100, 0x1001, 0x100, 1), (0x100, 0xFFF, 1, 1), (0x100, 0x1101, 0, 1),
        (0x200, top - 0x10, 0x10, 0), (0x200, top - 0x10, 0x11, 1),
        (0x200, top - 1, 2, 1), (0x500, top - 0x10, 0x10, 0), (0x500, top - 8, 0x10, 1),
        (0x300, 0x5000, 4, 1), (0x400, 0x8000, 0, 0), (0x400, 0x8000, 1, 1),
        (0x600, 0x9000, 4, 1), (0x999, 0, 0, 1),
    ]
    recs = []
    for q, (rkey, va, length, deny) in enumerate(cases):
        recs.append({"qp": q, "psn": q, "opcode": 0xC6 + q % 6, "trimmed": 0, "va": va,
                     "rkey": rkey, "length": length, "slot": 1, "tag": q})
    recs.append({"qp": 63, "psn": 99, "opcode": 0xCA, "va": 0x1000, "rkey": 0x100,
                 "length": 4})                                   # other domain
    recs.append({"qp": 63, "psn": 100, "opcode": 0xDE})           # probe, QP in error
    recs.append({"qp": 1, "psn": 101, "opcode": 0xCA, "trimmed": 1})  # trimmed, QP 1 ok
    recs.append({"qp": 64, "psn": 102, "opcode": 0xCA, "rkey": 0x999})  # QP >= qps
    full = [dict(dict.fromkeys((n for n, _ in RX_PKT), 0), **r) for r in recs]
    b = Bench([(setup, full, [])], rng=rng).run()
    m = b.check()
    got = [o["deny"] for o in b.outs]
    assert got[:len(cases)] == [c[3] for c in cases]
    assert got[len(cases):] == [1, 1, 0, 0]
    assert [n["qp"] for n in b.naks] == [q for q, c in enumerate(cases) if c[3]] + [63]
    assert all(n["syndrome"] == proto.AETH_SYNDROME_ACCESS_ERROR for n in b.naks)
    assert {c: m.counts[c] for c in CAUSES} == {"unknown_rkey": 2, "pd_mismatch": 1,
                                                "read_only": 1, "out_of_range": 7}
    assert m.counts["qp_in_error"] == 1


def test_table_writes_during_traffic():
    """Regions rewritten and invalidated, domains changed and error bits cleared while
    records flow: every record is explained by the tables before or after each write, in
    order (a write never lands halfway through a record)."""
    rng = seeded()
    regions, qps = 8, 16
    model = MemoryProtectModel(regions, qps)
    setup = random_setup(rng, regions, qps, pds=(1, 2))
    for op in setup:
        apply_op(model, op)
    phases = []
    for k in range(soak(6)):
        recs = random_records(rng, model, 100, foreign=0.02)
        during = []
        for _ in range(10):
            x = rng.random()
            if x < 0.4:
                i = rng.randrange(regions)
                e = model.table[i] or {"rkey": rng.getrandbits(32), "base": 0, "length": 0,
                                       "pd": 1}
                # The same R_Key (fields change under it), another entry's, or a new one:
                # a record caught between its R_Key compare and its field select would
                # show as a mix of two entries.
                others = [o["rkey"] for o in model.table if o is not None]
                rkey = rng.choice([e["rkey"], e["rkey"], rng.choice(others or [0]),
                                   rng.getrandbits(32)])
                other = model.table[rng.randrange(regions)] or e
                during.append(("region", i, rkey, rng.choice([e["base"], other["base"]]),
                               e["length"] + rng.choice([0, 16, -1 if e["length"] else 0]),
                               rng.getrandbits(1), rng.choice([1, 2])))
            elif x < 0.55:
                during.append(("invalidate", rng.randrange(regions)))
            elif x < 0.75:
                during.append(("pd", rng.randrange(qps), rng.choice([1, 2])))
            else:
                during.append(("clear_error", rng.randrange(qps)))
        before = [("clear_error", q) for q in range(qps)] if k else setup
        phases.append((before, recs, during))
    b = Bench(phases, rng=rng, idle=0.2, backpressure=0.2, regions=regions, qps=qps).run()
    b.check()


def test_qp_error_set_read_and_cleared():
    """A violation puts the QP in error (qp_status shows it, later records of the QP are
    denied without a NAK, other QPs untouched); clear_error brings it back."""
    rng = seeded()
    setup = [("pd", 3, 5), ("pd", 4, 5), ("region", 0, 0xAB, 0x1000, 0x1000, 1, 5)]
    good = {"opcode": 0xCA, "rkey": 0xAB, "va": 0x1800, "length": 64}
    bad = {"opcode": 0xCA, "rkey": 0xAB, "va": 0x1FF0, "length": 64}

    def rec(qp, psn, **kw):
        return dict(dict.fromkeys((n for n, _ in RX_PKT), 0), qp=qp, psn=psn, **kw)
    p1 = [rec(3, 1, **good), rec(3, 2, **bad), rec(3, 3, **good), rec(4, 4, **good),
          rec(3, 5, **bad), rec(3, 6, opcode=0xDE)]
    p2 = [rec(3, 7, **good), rec(4, 8, **good)]
    errors_mid = []

    class ErrorBench(Bench):
        async def between(self, ctx, drv, k):
            if k == 0:          # QP 3 in error, QP 4 not
                for q in (3, 4):
                    await drv.write_fields("qp_select", qp=q)
                    errors_mid.append((await drv.read_fields("qp_status"))["error"])
    b = ErrorBench([(setup, p1, []), ([("clear_error", 3)], p2, [])], rng=rng, qps=8,
                   regions=2).run()
    b.check()
    assert errors_mid == [1, 0]
    assert [o["deny"] for o in b.outs] == [0, 1, 1, 0, 1, 1, 0, 0]
    assert [n["psn"] for n in b.naks] == [2]
    assert b.counters["qp_in_error"] == 3 and b.qp_errors == [0] * 8


def test_bad_register_input_is_refused():
    """A region entry >= regions and a QP >= qps set the error bits and write nothing."""
    rng = seeded()
    regions, qps = 4, 8
    setup = [("pd", 1, 7), ("region", 0, 0x11, 0x100, 0x100, 1, 7),
             ("region", 4, 0x22, 0x0, 1 << 40, 1, 0),        # refused: entry 4
             ("invalidate", 200),                             # refused
             ("pd", 8, 0), ("pd", 65535, 0), ("clear_error", 9)]   # refused: QP >= 8
    def rec(qp, rkey, va):
        return dict(dict.fromkeys((n for n, _ in RX_PKT), 0), qp=qp, opcode=0xCA,
                    rkey=rkey, va=va, length=8)
    recs = [rec(1, 0x11, 0x100), rec(0, 0x22, 0x10), rec(1, 0x11, 0x1F8)]
    b = Bench([(setup, recs, [])], rng=rng, regions=regions, qps=qps).run()
    m = b.check()
    assert m.errors == {"bad_region": True, "bad_qp": True}
    assert [o["deny"] for o in b.outs] == [0, 1, 0]        # 0x22 never became a region


def test_nak_backpressure_stalls_never_drops():
    """nak held not ready for long stretches while every record violates: the input waits,
    no NAK is lost, nothing deadlocks."""
    rng = seeded()
    qps = 64
    setup = [("region", 0, 0x1, 0, 0x100, 1, 0)]
    recs = [dict(dict.fromkeys((n for n, _ in RX_PKT), 0), qp=q, psn=q, opcode=0xCA,
                 rkey=0x2, tag=q) for q in range(qps)]
    b = Bench([(setup, recs, [])], rng=rng, backpressure=0.0, nak_backpressure=0.9).run()
    b.check()
    assert len(b.naks) == qps


def test_throughput_and_latency():
    """No idle, no backpressure: one record a cycle over a mix that includes violations;
    the latency the docstring states."""
    rng = seeded()
    model = MemoryProtectModel(16, 64)
    setup = random_setup(rng, 16, 64)
    for op in setup:
        apply_op(model, op)
    recs = random_records(rng, model, 200)
    b = Bench([(setup, recs, [])], rng=rng).run()
    m = b.check()
    c = b.in_cycles
    assert m.counts["naks"] > 0
    assert len(c) == len(recs) and c[-1] - c[0] + 1 == len(recs), \
        f"{len(recs)} records took {c[-1] - c[0] + 1} cycles"
    lat = b.out_cycles[0] - b.in_cycles[0]
    print(f"{len(recs)} records in {c[-1] - c[0] + 1} cycles; latency {lat} cycles; "
          f"{m.counts['naks']} NAKs")
    assert lat == MemoryProtect.latency
    assert all(o - i == lat for i, o in zip(b.in_cycles, b.out_cycles))


@pytest.mark.parametrize("params, message", [
    ({"regions": 0}, "regions = 0 is outside 1..256"),
    ({"regions": 257}, "regions = 257 is outside 1..256"),
    ({"qps": 0}, "qps = 0 is outside 1..1024"),
    ({"qps": 1025}, "qps = 1025 is outside 1..1024"),
])
def test_refuses_bad_parameters(params, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        MemoryProtect(**params)


def test_refuses_non_int_parameters():
    with pytest.raises(TypeError, match="regions must be an int"):
        MemoryProtect(regions=4.0)


def test_docs_register_table_is_the_register_map():
    page = docs_page("blocks", "memory-protect.md")
    assert MP_REGS.markdown() in page.read_text()


def test_command_waits_for_a_stalled_pipeline():
    """out held not ready: the pipeline stops with a record between the R_Key compare and
    the field select, so a region command waits (status.busy), a second one is refused
    (error.busy) and writes nothing; once out is read the first one is applied, and the
    held record still saw the old table."""
    dut = MemoryProtect(regions=4, qps=8)
    rec = dict(dict.fromkeys((n for n, _ in RX_PKT), 0), qp=1, opcode=0xCA, rkey=0x7,
               va=0x100, length=4)
    seen = {}

    async def tb(ctx):
        axil = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(MP_REGS, axil.read, axil.write)
        await table_op(drv, ("region", 0, 0x7, 0x100, 0x100, 1, 0))
        ctx.set(dut.out.ready, 0)
        ctx.set(dut.pkt.payload.as_value(), pack(RX_PKT, rec))
        ctx.set(dut.pkt.valid, 1)
        for _ in range(40):                 # FIFO, stage B, X and the skid buffer fill up
            await ctx.tick()
        # Make region 0 read-only and then try to invalidate it while busy.
        await drv.write_fields("region_attr", writable=0, pd=0)
        await drv.write_fields("region_command", write=1)
        seen["busy"] = (await drv.read_fields("status"))["busy"]
        await drv.write_fields("region_command", invalidate=1)
        seen["error"] = await drv.read_fields("error")
        ctx.set(dut.pkt.valid, 0)
        ctx.set(dut.out.ready, 1)
        outs = []
        for _ in range(60):
            _, _, valid, payload = await ctx.tick().sample(dut.out.valid,
                                                            dut.out.payload.as_value())
            if valid:
                outs.append(unpack(MP_OUT, payload)["deny"])
        seen["outs"] = outs
        seen["after"] = (await drv.read_fields("status"))["busy"]
        # The write was applied (read-only), the refused invalidate was not (R_Key known).
        ctx.set(dut.pkt.payload.as_value(), pack(RX_PKT, dict(rec, qp=2)))
        ctx.set(dut.pkt.valid, 1)
        await ctx.tick().until(dut.pkt.ready)
        ctx.set(dut.pkt.valid, 0)
        for _ in range(8):
            await ctx.tick()
        seen["read_only"] = await drv.read("read_only")
        seen["unknown"] = await drv.read("unknown_rkey")

    run(dut, tb)
    assert seen["busy"] == 1
    assert seen["error"] == {"bad_region": 0, "bad_qp": 0, "busy": 1}
    assert seen["after"] == 0
    outs = seen["outs"]
    # Records taken before the write are passed (old table: writable); the first record
    # after it is denied (read-only) and puts QP 1 in error, the rest are qp_in_error.
    k = outs.index(1)
    assert k >= 1 + 8 and all(outs[k:])          # the FIFO's 8 and stage B, at least
    assert seen["read_only"] == 2 and seen["unknown"] == 0


def test_table_commands_while_records_are_in_flight_are_applied():
    """A region write or a set_pd written while records are in flight (one offered every
    cycle, every fourth a violation of a QP not in error, so that NAKs come too), in three
    cases: out and nak always ready, the command written 0 to 5 cycles after the traffic
    starts; both held not ready for 60 cycles from the start, the command 0 to 5 cycles
    in; and held so, the command 20 to 25 cycles in, with the pipeline stopped by the full
    FIFOs. status.busy clears within a bound in cycles, every record taken leaves on out,
    records keep being taken after the command, and the command took effect."""
    hold_cycles, bound = 60, 150
    dut = MemoryProtect(regions=4, qps=64)
    st = {"on": False, "stop": False, "ready_at": 0, "cycle": 0, "extra": [], "k": 0,
          "used": {4}}
    taken, outs, naks = [], [], []

    def rec(qp, rkey, **kw):
        return dict(dict.fromkeys((n for n, _ in RX_PKT), 0), qp=qp, opcode=0xCA,
                    rkey=rkey, va=0x100, length=4, **kw)

    def record(i):
        # QPs 0 .. 3 write to region 0 (passed); every fourth record writes to an unknown
        # R_Key on a QP 8 .. 63 in turn (a NAK, the QP in error until cleared).
        if i % 4 == 3:
            st["k"] += 1
            st["used"].add(8 + st["k"] % 56)
            return rec(8 + st["k"] % 56, 0xBAD, psn=i & 0xFFFFFF)
        return rec(i % 4, 0x7, psn=i & 0xFFFFFF)

    async def source(ctx):
        await offer(ctx, st, dut.pkt, record, taken, st["extra"])

    async def sink(ctx):
        while not st["stop"]:
            ready = st["cycle"] >= st["ready_at"]
            ctx.set(dut.out.ready, ready)
            ctx.set(dut.nak.ready, ready)
            _, _, ov, op, nv, np_ = await ctx.tick().sample(
                dut.out.valid, dut.out.payload.as_value(), dut.nak.valid,
                dut.nak.payload.as_value())
            if ready and ov:
                outs.append(unpack(MP_OUT, op))
            if ready and nv:
                naks.append(unpack(NAK, np_))
            st["cycle"] += 1

    async def control(ctx):
        axil = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(MP_REGS, axil.read, axil.write)
        await table_op(drv, ("region", 0, 0x7, 0x100, 0x100, 1, 0))
        for case, hold, lead, phase in command_cases(hold_cycles):
            # Staged before the traffic: only the strobe comes during it.
            rkey, pd = 0x100 + 8 * case + phase, phase // 2 % 2
            if phase % 2 == 0:
                await drv.write_fields("region_select", entry=1)
                await drv.write_fields("region_rkey", rkey=rkey)
                await drv.write_fields("region_base_lo", base=0x100)
                await drv.write_fields("region_length_lo", length=0x100)
                await drv.write_fields("region_attr", writable=1, pd=0)
            else:
                await drv.write_fields("qp_select", qp=4)
                await drv.write_fields("qp_pd", pd=pd)
            await start_traffic(ctx, st, hold, lead + phase)
            t0 = st["cycle"]
            what = f"command {lead + phase} cycles into the traffic, outputs held {hold}"
            if phase % 2 == 0:
                await drv.write_fields("region_command", write=1)
            else:
                await drv.write_fields("qp_command", set_pd=1)
            assert len(taken) > len(outs), f"{what}: no record in flight"
            await until_clear(st, lambda: drv.read_field("status", "busy"), t0, bound + hold,
                              f"{what}: status.busy")
            # The block keeps working: records taken and passed on after the command
            # (and after the outputs' release).
            await until_moved(ctx, st, lambda: (len(taken), len(outs)), 100,
                              f"{what}: no progress after the command")
            st["on"] = False
            for _ in range(100):
                if len(outs) == len(taken):
                    break
                await ctx.tick()
            assert len(outs) == len(taken), f"{what}: records taken and never out"
            assert (await drv.read_fields("error"))["busy"] == 0
            # The command took effect: the new region is known, QP 4 has its domain.
            st["extra"].append(rec(0, rkey) if phase % 2 == 0 else rec(4, 0x7))
            await ctx.tick().repeat(16)
            assert len(outs) == len(taken)
            want = 0 if phase % 2 == 0 else pd
            assert outs[-1]["deny"] == want, what
            for q in sorted(st["used"]):
                await drv.write_fields("qp_select", qp=q)
                await drv.write_fields("qp_command", clear_error=1)
            st["used"] = {4}
        st["stop"] = True

    run(dut, control, source, sink)
    assert len(naks) >= 18 and all(n["qp"] >= 8 or n["qp"] == 4 for n in naks)
