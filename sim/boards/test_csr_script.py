"""CsrScript and its recorder: a script played against a slave that stalls at random,
recording refusals, and a recorded bring-up played on the real MrcTx, whose registers
then read back as a bring-up run directly leaves them."""

import pytest
from amaranth.hdl import Module, Mux
from amaranth.lib import wiring

from mrcnic.host.bringup import TxConfig, bring_up_tx, find_blocks
from mrcnic.base.csr import AxiLiteSignature, CsrError
from mrcnic.boards.csr_script import OP_POLL, OP_WRITE, CsrScript, ScriptRecorder, record
from mrcnic.nic import MrcNic
from mrcnic.tx.mrc_tx import MRC_TX_REGS, MrcTx
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import run, seeded


class Slave:
    """An AXI4-Lite slave in the testbench: words in a dict, random stalls on every
    channel; a word at a poll address reads non-zero ``busy[addr]`` times first;
    addresses in ``bad`` answer SLVERR."""

    def __init__(self, port, rng, busy=None, bad=()):
        self.port, self.rng = port, rng
        self.words, self.busy, self.bad = {}, dict(busy or {}), set(bad)
        self.log = []                            # ("w", addr, data) / ("r", addr, data)
        self.stop = False                        # set by the testbench when it is done

    def _stall(self):
        return self.rng.random() < 0.4

    async def run(self, ctx):
        p = self.port
        while not self.stop:
            ctx.set(p.awready, 0)
            ctx.set(p.wready, 0)
            ctx.set(p.arready, 0)
            if ctx.get(p.awvalid) and ctx.get(p.wvalid) and not self._stall():
                ctx.set(p.awready, 1)
                ctx.set(p.wready, 1)
                addr, data = ctx.get(p.awaddr), ctx.get(p.wdata)
                await ctx.tick()
                ctx.set(p.awready, 0)
                ctx.set(p.wready, 0)
                self.words[addr] = data
                self.log.append(("w", addr, data))
                await self._respond(ctx, p.bvalid, p.bready, p.bresp, addr)
            elif ctx.get(p.arvalid) and not self._stall():
                ctx.set(p.arready, 1)
                addr = ctx.get(p.araddr)
                await ctx.tick()
                ctx.set(p.arready, 0)
                left = self.busy.get(addr, 0)
                data = 0xFFFF_FFFF if left else self.words.get(addr, 0)
                self.busy[addr] = max(0, left - 1)
                self.log.append(("r", addr, data))
                ctx.set(p.rdata, data)
                await self._respond(ctx, p.rvalid, p.rready, p.rresp, addr)
            else:
                await ctx.tick()

    async def _respond(self, ctx, valid, ready, resp, addr):
        while self._stall():
            await ctx.tick()
        ctx.set(resp, 2 if addr in self.bad else 0)
        ctx.set(valid, 1)
        while True:
            _, _, r = await ctx.tick().sample(ready)
            if r:
                break
        ctx.set(valid, 0)


def _play(ops, aw, rng, busy=None, bad=()):
    dut = CsrScript(ops, aw)
    slave = Slave(dut.m_axil, rng, busy, bad)
    out = {}

    async def watch(ctx):
        for cycle in range(20 * len(ops) + 200):
            if ctx.get(dut.done):
                break
            await ctx.tick()
        out["done"], out["error"], out["cycles"] = ctx.get(dut.done), ctx.get(dut.error), cycle
        slave.stop = True

    run(dut, watch, slave.run)
    return out, slave.log


def test_a_script_plays_in_order_through_stalls():
    rng = seeded()
    ops, busy = [], {}
    for _ in range(40):
        if rng.random() < 0.25:                  # polls: words never written, busy a while
            addr = 4 * rng.randrange(64, 72)
            ops.append((OP_POLL, addr, 1 << rng.randrange(32)))
            busy[addr] = busy.get(addr, 0) + rng.randrange(4)
        else:
            ops.append((OP_WRITE, 4 * rng.randrange(64), rng.getrandbits(32)))
    out, log = _play(ops, 9, rng, busy)
    assert out["done"] and not out["error"]
    # The writes in order; each poll reads until its word is clear (the busy count)
    want, left = [], dict(busy)
    for op, addr, word in ops:
        if op == OP_WRITE:
            want.append(("w", addr, word))
        else:
            want += [("r", addr)] * (left.get(addr, 0) + 1)
            left[addr] = 0
    assert [e[:2] if e[0] == "r" else e for e in log] == want
    print(f"{len(ops)} operations, {len(log)} transactions in {out['cycles']} cycles")


def test_an_error_response_is_flagged_and_the_script_goes_on():
    rng = seeded()
    ops = [(OP_WRITE, 0, 1), (OP_POLL, 4, 1), (OP_WRITE, 8, 2)]
    out, log = _play(ops, 4, rng, busy={4: 1000}, bad={4})
    assert out["done"] and out["error"]
    assert log[0] == ("w", 0, 1) and log[-1] == ("w", 8, 2)
    assert sum(1 for e in log if e[0] == "r") == 1      # an error is never polled again


def test_bad_scripts_are_refused():
    with pytest.raises(CsrError, match="unknown script operation"):
        CsrScript([(7, 0, 0)], 8)
    with pytest.raises(CsrError, match="word aligned"):
        CsrScript([(OP_WRITE, 2, 0)], 8)
    with pytest.raises(CsrError, match="does not fit"):
        CsrScript([(OP_WRITE, 256, 0)], 8)
    with pytest.raises(CsrError, match="wider than 32"):
        CsrScript([(OP_WRITE, 0, 1 << 32)], 8)


def _tx_config():
    return TxConfig(local_mac=0x02_00_00_00_00_01, local_ip=0xFD00 << 112 | 1,
                    peer_mac=0x02_00_00_00_00_02, peer_ip=0xFD00 << 112 | 2,
                    outer_src=0xFC00 << 112 | 7, evs=[0xFC01 << 112 | e for e in range(8)],
                    remote_qps=[5, 6], pmtu_log2=10, probe_interval=1000)


def test_the_recorder_refuses_what_a_script_cannot_know():
    nic = MrcNic(planes=2, qps=2, ev_count=8)
    buses = nic.csr_buses()

    async def bring_up(read, write):
        await bring_up_tx(read, write, _tx_config())
    with pytest.raises(CsrError, match="mrc-tx.info"):
        record(buses, bring_up)                      # info (qps) not given
    with pytest.raises(CsrError, match="not on the buses"):
        ScriptRecorder(buses, ro={("nothing", "info"): 0})
    rec = ScriptRecorder(buses)
    with pytest.raises(CsrError, match="directory"):
        rec.write(0, 1).send(None)
    with pytest.raises(CsrError, match="no register"):
        rec.write(0x7FFF_FFFC, 1).send(None)


class _Bench(wiring.Component):
    """``dut``'s register port driven by a CsrScript while ``sel`` is 0, by ``t_axil``
    (the testbench's master) once it is 1."""

    def __init__(self, dut, ops):
        self.dut = dut
        self.script = CsrScript(ops, dut.bus.addr_width)
        super().__init__({"t_axil": wiring.In(AxiLiteSignature(dut.bus.addr_width)),
                          "sel": wiring.In(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut, m.submodules.script = self.dut, self.script
        s, t, d = self.script.m_axil, self.t_axil, self.dut.s_axil
        for name, member in d.signature.members.items():
            port = getattr(d, name)
            if member.flow == wiring.In:        # master to slave
                m.d.comb += port.eq(Mux(self.sel, getattr(t, name), getattr(s, name)))
            else:
                m.d.comb += [getattr(t, name).eq(Mux(self.sel, port, 0)),
                             getattr(s, name).eq(Mux(self.sel, 0, port))]
        return m


def test_a_recorded_bring_up_leaves_the_registers_as_a_direct_one():
    """bring_up_tx recorded for MrcTx (2 planes, 2 QPs, 8 EVs), played on it by CsrScript;
    then every rw register of the MrcTx's blocks reads back the value a bring-up run
    directly through the bus leaves (the other run)."""
    cfg = _tx_config()

    def tx():
        return MrcTx(2, 64, 2, 4, 8, 1, 128, 128)

    ro = {("mrc-tx", "info"): MRC_TX_REGS["info"].pack(planes=2, qps=2),
          ("path-selector", "error"): 0}

    async def bring_up(read, write):
        await bring_up_tx(read, write, cfg)
    ops = record([(0, tx().bus)], bring_up, ro)
    assert sum(op == OP_POLL for op, _, _ in ops) >= 3 and len(ops) > 100

    def snapshot(use_script):
        bench = _Bench(tx(), ops)
        values = {}

        async def testbench(ctx):
            master = AxiLiteSimMaster(ctx, bench.t_axil)
            if use_script:
                for _ in range(40 * len(ops)):
                    if ctx.get(bench.script.done):
                        break
                    await ctx.tick()
                assert ctx.get(bench.script.done) and not ctx.get(bench.script.error)
                ctx.set(bench.sel, 1)
                await ctx.tick()
            else:
                ctx.set(bench.sel, 1)
                await bring_up_tx(master.read, master.write, cfg)
            for name, drivers in (await find_blocks(master.read, master.write)).items():
                for i, drv in enumerate(drivers):
                    for reg in drv.regmap.registers.values():
                        fields = reg.fields.values() if isinstance(reg.fields, dict) \
                            else reg.fields
                        if all(f.access == "rw" for f in fields):
                            values[name, i, reg.name] = await drv.read(reg.name)
        run(bench, testbench)
        return values

    want = snapshot(use_script=False)
    got = snapshot(use_script=True)
    assert got == want
    assert want["mrc-tx", 0, "tick"] == cfg.tick_cycles
    assert want["path-selector", 0, "probe_interval"] == cfg.probe_interval
