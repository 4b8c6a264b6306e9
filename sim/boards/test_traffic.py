"""TrafficGen and DataChecker around a NIC made of Python: the generator's WRITEs are cut
into PMTU packets whose payloads the generator gives (checked against the pattern), and
placed on random planes in a random order, as a NIC would; completions go back. Runs
follow one another; a duplicate, a corrupted beat and a stray placement are counted."""

import pytest

from mrcnic.boards.traffic import DataChecker, TrafficGen, pattern_bytes
from testkit.simtools import run, seeded

BASE = 0x1_0000_0000


class Nic:
    """The NIC's side of both blocks, one cycle at a time (``step``)."""

    def __init__(self, gen, chk, rng, *, width, planes, pmtu_log2, msg_log2, faults=()):
        self.gen, self.chk, self.rng = gen, chk, rng
        self.B, self.P, self.pmtu = width // 8, planes, 1 << pmtu_log2
        self.msg = 1 << msg_log2
        self.faults = list(faults)              # ("dup" | "corrupt" | "stray") in order
        self.preqs, self.asked, self.beats = [], [], []
        self.pool = []                          # placements ready to go: (record, bytes)
        self.planes = [[] for _ in range(planes)]   # per plane: [record, beats, sent?, key]
        self.left = {}                          # (qp, wr_id) -> packets not yet placed
        self.dones = []
        self.payload_errors = 0
        self.payloads = 0                       # a fault goes with payloads 2, 5, 8, ...

    async def step(self, ctx):
        g, c, rng = self.gen, self.chk, self.rng
        wr_ready = rng.random() < 0.7
        ctx.set(g.wr.ready, wr_ready)
        asking = bool(self.preqs)
        if asking:
            qp, wr_id, off = self.preqs[0]
            ctx.set(g.preq.valid, 1)
            ctx.set(g.preq.payload, {"qp": qp, "wr_id": wr_id, "offset": off,
                                     "length": self.pmtu})
        else:
            ctx.set(g.preq.valid, 0)
        t_ready = rng.random() < 0.8
        ctx.set(g.m_axis.tready, t_ready)
        giving = bool(self.dones)
        if giving:
            ctx.set(g.done.valid, 1)
            ctx.set(g.done.payload, {"qp": self.dones[0][0], "wr_id": self.dones[0][1]})
        else:
            ctx.set(g.done.valid, 0)
        if self.pool and rng.random() < 0.3:           # to a random plane, in random order
            item = self.pool.pop(rng.randrange(len(self.pool)))
            self.planes[rng.randrange(self.P)].append(item)
        for p, q in enumerate(self.planes):
            place, pl = getattr(c, f"place{p}"), getattr(c, f"pl{p}_axis")
            head = q[0] if q else None
            ctx.set(place.valid, bool(head) and not head[2])
            if head and not head[2]:
                ctx.set(place.payload, head[0])
            beat = head[1][0] if head and head[2] and head[1] else None
            ctx.set(pl.tvalid, beat is not None)
            if beat is not None:
                ctx.set(pl.tdata, beat[0])
                ctx.set(pl.tkeep, beat[1])
                ctx.set(pl.tlast, beat[2])
        ports = [g.wr.valid, g.wr.payload, g.preq.ready, g.m_axis.tvalid, g.m_axis.tdata,
                 g.m_axis.tkeep, g.m_axis.tlast, g.done.ready]
        for p in range(self.P):
            ports += [getattr(c, f"place{p}").ready, getattr(c, f"pl{p}_axis").tready]
        _, _, wv, wr, pr, tv, td, tk, tl, dr, *plane_rdy = await ctx.tick().sample(*ports)
        if wv and wr_ready:
            key = (wr.qp, wr.wr_id)
            assert wr.va == BASE + wr.wr_id * self.msg and wr.length == self.msg
            self.left[key] = self.msg // self.pmtu
            self.preqs += [(wr.qp, wr.wr_id, off) for off in range(0, self.msg, self.pmtu)]
        if asking and pr:
            self.asked.append(self.preqs.pop(0))
        if tv and t_ready:
            n = tk.bit_length()
            self.beats.append(td.to_bytes(self.B, "little")[:n])
            if tl:
                qp, wr_id, off = self.asked.pop(0)
                body, self.beats = b"".join(self.beats), []
                va = BASE + wr_id * self.msg + off
                if body != pattern_bytes(va, len(body), ctx.get(g.odd)):
                    self.payload_errors += 1
                self._to_pool(qp, wr_id, va, body)
        if giving and dr:
            self.dones.pop(0)
        for p, q in enumerate(self.planes):
            place_rdy, pl_rdy = plane_rdy[2 * p], plane_rdy[2 * p + 1]
            if q and not q[0][2] and place_rdy:
                q[0][2] = True
                key = q[0][3]                   # a NIC completes a message when its last
                if key is not None:             # record is out, before the data
                    self.left[key] -= 1
                    if not self.left[key]:
                        self.dones.append(key)
            elif q and q[0][2] and q[0][1] and pl_rdy:
                q[0][1].pop(0)
            if q and q[0][2] and not q[0][1]:
                q.pop(0)

    def _to_pool(self, qp, wr_id, va, body):
        B = self.B
        self.payloads += 1
        fault = self.faults.pop(0) if self.faults and self.payloads % 3 == 2 else None
        if fault == "corrupt":
            body = bytes([body[0] ^ 1]) + body[1:]
        beats = [(int.from_bytes(body[i:i + B], "little"), (1 << len(body[i:i + B])) - 1,
                  i + B >= len(body)) for i in range(0, len(body), B)]
        rec = {"qp": qp, "psn": 0, "va": va, "length": len(body), "tag": 0}
        self.pool.append([rec, beats, False, (qp, wr_id)])
        if fault == "dup":
            self.pool.append([dict(rec), list(beats), False, None])
        if fault == "stray":
            self.pool.append([dict(rec, va=va + 8), list(beats), False, None])


@pytest.mark.parametrize("width,planes,faults", [
    (64, 2, ()), (128, 1, ()), (512, 4, ()), (64, 3, ("dup", "corrupt", "stray"))])
def test_runs_follow_one_another_and_faults_are_counted(width, planes, faults):
    rng = seeded()
    pmtu_log2, msg_log2, msgs = 8, 10, 3
    gen = TrafficGen(width, qps=2, msg_log2=msg_log2, msgs=msgs, pmtu_log2=pmtu_log2,
                     base=BASE)
    chk = DataChecker(width, planes, msg_log2=msg_log2, msgs=msgs, pmtu_log2=pmtu_log2,
                      base=BASE)
    from amaranth.hdl import Module
    top = Module()
    top.submodules.gen, top.submodules.chk = gen, chk
    top.d.comb += [chk.odd.eq(gen.odd), gen.run_ok.eq(chk.run_ok)]
    nic = Nic(gen, chk, rng, width=width, planes=planes, pmtu_log2=pmtu_log2,
              msg_log2=msg_log2, faults=faults)
    out = {}

    async def bench(ctx):
        ctx.set(gen.start, 1)
        for cycle in range(30_000):
            await nic.step(ctx)
            if ctx.get(gen.runs) >= 3:
                break
        out.update({n: ctx.get(getattr(chk, n)) for n in
                    ("bytes", "bad_data", "duplicates", "strays")},
                   runs=ctx.get(gen.runs), completions=ctx.get(gen.completions), cycle=cycle)

    run(top, bench)
    chunks = msgs << (msg_log2 - pmtu_log2)
    assert nic.payload_errors == 0, "payloads not the pattern"
    assert out["runs"] >= 3, out
    assert out["completions"] >= 3 * msgs
    want = {"bad_data": 0, "duplicates": 0, "strays": 0}
    for f in faults:
        want[{"dup": "duplicates", "corrupt": "bad_data", "stray": "strays"}[f]] += 1
        if f == "stray":                      # its bytes are not those of its address
            want["bad_data"] += (1 << pmtu_log2) // (width // 8)
    assert not nic.faults and {k: out[k] for k in want} == want, out
    assert out["bytes"] >= 3 * chunks * (1 << pmtu_log2)
    print(f"{width} bits, {planes} planes: {out['runs']} runs in {out['cycle']} cycles, {out}")



def test_the_checker_forgets_the_run_before_a_reset():
    """Every chunk of run 0 placed, a reset, every chunk placed again: the chunk bitmap
    (a memory, which a reset leaves as it was) is cleared before the checker is ready, so
    the second run sees no duplicate."""
    from amaranth.hdl import ClockDomain, Module
    pmtu_log2, msg_log2, msgs = 8, 9, 2
    chk = DataChecker(64, 1, msg_log2=msg_log2, msgs=msgs, pmtu_log2=pmtu_log2, base=BASE)
    top = Module()
    top.domains.sync = sync = ClockDomain("sync")      # its reset driven by the bench
    top.submodules.chk = chk
    chunks = msgs << (msg_log2 - pmtu_log2)
    out = []

    async def place_all(ctx):
        place, pl = chk.place0, chk.pl0_axis
        for k in range(chunks):
            va = BASE + (k << pmtu_log2)
            ctx.set(place.valid, 1)
            ctx.set(place.payload, {"qp": 0, "psn": k, "va": va, "length": 1 << pmtu_log2,
                                    "tag": 0})
            await ctx.tick().until(place.ready)
            ctx.set(place.valid, 0)
            body = pattern_bytes(va, 1 << pmtu_log2, 0)
            for i in range(0, len(body), 8):
                ctx.set(pl.tvalid, 1)
                ctx.set(pl.tdata, int.from_bytes(body[i:i + 8], "little"))
                ctx.set(pl.tkeep, 0xFF)
                ctx.set(pl.tlast, i + 8 >= len(body))
                await ctx.tick().until(pl.tready)
            ctx.set(pl.tvalid, 0)
        await ctx.tick().repeat(4)

    async def bench(ctx):
        await ctx.tick().until(chk.ready)
        await place_all(ctx)
        out.append((ctx.get(chk.run_ok), ctx.get(chk.duplicates)))
        ctx.set(sync.rst, 1)
        await ctx.tick()
        ctx.set(sync.rst, 0)
        assert not ctx.get(chk.ready)
        await ctx.tick().until(chk.ready)
        await place_all(ctx)
        out.append((ctx.get(chk.run_ok), ctx.get(chk.duplicates), ctx.get(chk.bad_data)))

    run(top, bench)
    assert out == [(1, 0), (1, 0, 0)]
