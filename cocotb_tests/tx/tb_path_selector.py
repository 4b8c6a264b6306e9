"""cocotb testbench of PathSelector on the exported Verilog: profiles configured and EVs
expanded over AXI4-Lite as software would, random requests on random QPs (retransmissions
with an EV to avoid) and random feedback at once, under random idle and backpressure;
every response (EV, plane, entropy, expanded EV) and event matched against the reference
model, counters read back. Then one QP streaming: decisions per cycle and plane shares."""

import random

import cocotb

from mrcnic.base.records import EV_FEEDBACK, REQUEST, probe_layout, response_layout
from mrcnic.model import ev as evm
from mrcnic.model.tx.path_selector import PathSelectorModel, random_feedback
from mrcnic.tx.path_selector import COUNTERS, EVENT, SELECTOR_REGS
from mrcnic.base.proto import EvMode
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource, MetaSink


def profiles_for(ev_bits):
    """(EvProfile, explicit) per profile slot the bench configures."""
    stev = evm.EvProfile(evm.EvFormatProfile(EvMode.STEV, (16, 16)),
                         (evm.EvField(16, 0x1000, 0, 15, 0x0F0F),
                          evm.EvField(16, 0x2000, 0, 15, 0x0F0F)))
    udp = evm.EvProfile(evm.EvFormatProfile(EvMode.UDP, (8, 8)),
                        (evm.EvField(8, 0xC0, 0, 7, 0x07), evm.EvField(8, 0, 0, 7, 0x70)))
    out = [stev, udp]
    if ev_bits >= 128:
        fmt = evm.EvFormatProfile(EvMode.SRV6 if ev_bits == 128 else EvMode.SRV6_SRH,
                                  (32, 16, 16, 16, 32))
        out.append(evm.EvProfile(fmt, (evm.EvField(32, 0xFC000000),
                                       evm.EvField(16, 0x0100, 0, 15, 0x000F),
                                       evm.EvField(16, 0x0200, 0, 15, 0x00F0),
                                       evm.EvField(16, 0xE000)), evm.GENERATED))
    return out


class SelectorTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        p = self.params
        self.qps, self.n, self.planes = p["qps"], p["ev_count"], p["planes"]
        self.nprof, self.ev_bits = p["profiles"], p["ev_bits"]
        self.req = MetaSource.cocotb(dut, "req", [n for n, _ in REQUEST], dut.clk)
        self.fb = MetaSource.cocotb(dut, "fb", [n for n, _ in EV_FEEDBACK], dut.clk)
        self.rsp = MetaSink.cocotb(dut, "rsp", [n for n, _ in response_layout(self.ev_bits)],
                                   dut.clk)
        self.event = MetaSink.cocotb(dut, "event", [n for n, _ in EVENT], dut.clk)
        self.probe = MetaSink.cocotb(dut, "probe", [n for n, _ in probe_layout(self.ev_bits)],
                              dut.clk)
        self.axil, self.regs = self.registers(SELECTOR_REGS)
        self.req_hs = BeatCounter(dut.clk, dut.req_valid, dut.req_ready)
        self.fb_hs = BeatCounter(dut.clk, dut.fb_valid, dut.fb_ready)
        self.full = (1 << self.planes) - 1
        dut.port_up.value = self.full
        dut.credit.value = self.full
        self.model = None

    async def wait_idle(self):
        while (await self.regs.read_fields("status"))["busy"]:
            pass

    async def command(self, what, **kw):
        await self.regs.write_fields("command", **kw)
        await self.wait_idle()
        err = await self.regs.read_fields("error")
        assert not any(err.values()), f"{what}: {kw} refused: {err}"

    async def start(self, min_active=0, active=None):
        await self.reset()
        self.model = PathSelectorModel(self.qps, self.n, self.planes, self.nprof,
                                       self.ev_bits, ev_min_active=min_active)
        regs = self.regs
        await regs.write_fields("ev_min_active", count=min_active)
        profs = profiles_for(self.ev_bits)[:self.nprof]
        for p, prof in enumerate(profs):
            fmt = prof.format
            act = self.n if active is None or p else active
            await regs.write_fields("select", profile=p)
            await regs.write_fields("profile_cfg", mode=int(fmt.mode),
                                    format_fields=len(fmt.widths), ev_fields=len(prof.fields),
                                    generated=int(prof.mode == evm.GENERATED), active=act)
            await self.command(f"profile {p}", write_profile=1)
            for i, fw in enumerate(fmt.widths):
                has = i < len(prof.fields)
                f = prof.fields[i] if has else evm.EvField(1)
                await regs.write_fields("select", profile=p, field=i)
                await regs.write_fields("field_widths", format_width=fw,
                                        width=f.width if has else 0)
                for name, v in (("field_init", f.init_val), ("field_mask", f.mask),
                                ("field_min", f.min_val), ("field_max", f.max_val)):
                    await regs.write_fields(name, value=v if has else 0)
                await self.command(f"profile {p} field {i}", write_field=1)
            self.model.configure_profile(p, prof, act)
            if prof.mode == evm.GENERATED:
                await regs.write_fields("command", generate=1)
                await self.wait_idle()
                count = self.model.generate(p)
                assert (await regs.read_fields("status"))["generated"] == count
            else:
                for e in range(self.n):
                    raw = bytes(random.randrange(256) for _ in range(32))
                    await regs.write_fields("select", profile=p, ev=e)
                    for i in range(8):
                        await regs.write_fields(f"raw{i}", value=int.from_bytes(
                            raw[4 * i:4 * i + 4], "big"))
                    await regs.write_fields("command", write_ev=1)
                    await self.wait_idle()
                    self.model.load_ev(p, e, raw)
        err = await regs.read_fields("error")
        assert not any(err.values()), f"configuration refused: {err}"
        for q in range(self.qps):
            seed = random.randrange(self.n)
            await regs.write_fields("select_qp", qp=q)
            await regs.write_fields("qp_cfg", profile=q % len(profs), seed=seed)
            await regs.write_fields("command", write_qp=1)
            self.model.set_qp(q, q % len(profs), seed)

    async def run(self, requests, feedback=()):
        """Send both lists, wait for every response; returns (responses, model responses,
        request handshake cycles)."""
        r0, f0 = len(self.req_hs.cycles), len(self.fb_hs.cycles)
        base = len(self.rsp.records)
        e0 = len(self.event.records)
        for r in requests:
            self.req.send_nowait(r)
        for f in feedback:
            self.fb.send_nowait(f)
        for _ in range(20 * (len(requests) + len(feedback)) + 2000):
            if (len(self.rsp.records) - base >= len(requests)
                    and self.fb.sent >= len(feedback) + f0 and not self.fb.queue):
                break
            await self.cycles(1)
        await self.cycles(10)
        acc = list(zip(self.req_hs.cycles[r0:], requests))
        accf = list(zip(self.fb_hs.cycles[f0:], feedback))
        assert len(acc) == len(requests) and len(accf) == len(feedback)
        want = self.model.run(acc, accf, lambda c: self.full)
        got = self.rsp.records[base:]
        assert len(got) == len(want), f"{len(got)} responses, model {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"response {i}: {g} != model {w}"
        return got, acc

    async def check_counters(self):
        await self.cycles(4)
        for name in COUNTERS:
            if name in self.model.counts or name in ("requests", "feedback", "decisions"):
                got = await self.regs.read(name)
                assert got == self.model.counts.get(name, 0), \
                    f"counter {name}: {got}, model {self.model.counts.get(name, 0)}"


@cocotb.test()
async def matches_the_model_under_random_traffic(dut):
    tb = SelectorTB(dut)
    await tb.start(min_active=tb.n * 3 // 4, active=tb.n * 3 // 4)
    rng = random.Random(random.getrandbits(64))
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.1, 0.8)]:
        tb.req.set_pause_generator(random_pauses(idle))
        tb.fb.set_pause_generator(random_pauses(idle))
        tb.rsp.set_pause_generator(random_pauses(bp))
        n = soak(1500 if long_runs() else 150)
        reqs = []
        for i in range(n):
            qp = rng.randrange(tb.qps + 1) if rng.random() < 0.02 else rng.randrange(tb.qps)
            rtx = int(rng.random() < 0.2)
            reqs.append({"qp": qp, "psn": i, "rtx": rtx, "avoid": rng.randrange(tb.n)})
        fbs = [f for f in random_feedback(rng, tb.n, tb.qps, n // 3) if f is not None]
        got, acc = await tb.run(reqs, fbs)
        for (_, r), g in zip(acc, got):
            if r["rtx"] and not g["none"]:
                assert g["ev"] != r["avoid"]
        assert sum(1 for g in got if not g["none"]) > n // 3
    assert tb.event.records == tb.model.events
    await tb.check_counters()
    await tb.cycles(5)


@cocotb.test()
async def one_qp_streams_one_decision_per_cycle_planes_equal(dut):
    tb = SelectorTB(dut)
    await tb.start()
    n = soak(10000 if long_runs() else 400)
    for label, qps in (("one QP", [0]), ("random QPs", list(range(tb.qps)))):
        reqs = [{"qp": random.choice(qps), "psn": i, "rtx": 0, "avoid": 0} for i in range(n)]
        got, acc = await tb.run(reqs)
        span = acc[-1][0] - acc[0][0] + 1
        tb.log.info("measured: %d decisions, %s, in %d cycles: %.3f per cycle", n, label,
                    span, n / span)
        assert span == n
        assert not any(g["none"] for g in got)
        if label == "one QP":
            shares = [sum(1 for g in got if g["plane"] == p) / n for p in range(tb.planes)]
            tb.log.info("measured: plane shares over %d packets of one QP: %s", n,
                        " ".join(f"{s:.4f}" for s in shares))
            assert max(shares) - min(shares) <= 0.05 / tb.planes + 2 * tb.n / n / tb.planes
    await tb.cycles(5)
