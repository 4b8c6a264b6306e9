"""mrcnic.base.csr.regs: declarations and their errors, the driver, the Markdown table, and the
AXI4-Lite slave under directed, back-pressured, pipelined and random traffic, checked against
a Python model of the register semantics written here independently of the gateware."""

import asyncio
import re

import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from testkit.axil import AxiLiteError, AxiLiteProtocolError, AxiLiteSimMaster, OKAY, SLVERR
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, CsrError, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.host.driver import RegisterDriver
from testkit.simtools import run, seeded


VERSION = 0x4D524301


def demo_map():
    return RegisterMap("demo", [
        Register("id", [Field("version", 32, "ro", reset=VERSION, desc="Block version")],
                 desc="Identification"),                                       # 0x00
        Register("ctrl", [
            Field("enable", 1, "rw", reset=1, desc="Enable the block"),
            Field("mode", 3, "rw", reset=2, desc="Mode | with a pipe"),
            Field("prio", 8, "rw", reset=0x5A, offset=8),
            Field("limit", 16, "rw", reset=0x1234),
        ], desc="Control"),                                                    # 0x04
        Register("cmd", [
            Field("start", 1, "w1p", desc="Start a job"),
            Field("flush", 4, "w1p", offset=8, desc="Flush queue i"),
        ]),                                                                    # 0x08
        Register("status", [
            Field("busy", 1, "ro"),
            Field("count", 16, "ro", offset=16),
        ]),                                                                    # 0x0C
        Register("irq", [
            Field("err", 1, "w1c", desc="Error seen"),
            Field("ovf", 2, "w1c", reset=0b10, offset=4, desc="Overflow, per queue"),
        ]),                                                                    # 0x10
        Register("mixed", [
            Field("thresh", 12, "rw", reset=0x800),
            Field("lvl", 4, "ro"),
            Field("kick", 1, "w1p"),
            Field("seen", 1, "w1c", offset=24),
        ]),                                                                    # 0x14
        Register("scratch", [Field("value", 32, "rw")], offset=0x20),         # holes 0x18, 0x1C
    ])


RESETS = {"id": VERSION, "ctrl": 0x1234_5A05, "cmd": 0, "status": 0, "irq": 0x20,
          "mixed": 0x800, "scratch": 0}


# --- A model of the register semantics, independent of the gateware --------------------------

class Model:
    """Bit-level register semantics (AXI4-Lite slave with rw/ro/w1p/w1c fields)."""

    def __init__(self, regmap):
        self.regmap = regmap
        self.by_word = {r.offset // 4: r for r in regmap}
        self.state = {(r.name, f.name): f.reset for r in regmap for f in r.fields.values()
                      if f.access in ("rw", "w1c")}
        self.inputs = {(r.name, f.name): f.reset for r in regmap for f in r.fields.values()
                       if f.access == "ro"}
        self.pulses = {(r.name, f.name, b): 0 for r in regmap for f in r.fields.values()
                       if f.access == "w1p" for b in range(f.width)}

    def read(self, addr):
        r = self.by_word.get((addr % 64) // 4)
        if r is None:
            return 0, SLVERR
        word = 0
        for f in r.fields.values():
            v = self.state.get((r.name, f.name), self.inputs.get((r.name, f.name), 0))
            word |= v << f.offset
        return word, OKAY

    def write(self, addr, data, strb):
        r = self.by_word.get((addr % 64) // 4)
        if r is None:
            return SLVERR
        enabled = sum(0xFF << 8 * i for i in range(4) if strb >> i & 1)
        for f in r.fields.values():
            key = (r.name, f.name)
            ones = (data >> f.offset) & (enabled >> f.offset) & ((1 << f.width) - 1)
            en = (enabled >> f.offset) & ((1 << f.width) - 1)
            if f.access == "rw":
                self.state[key] = (self.state[key] & ~en) | ones
            elif f.access == "w1c":
                self.state[key] &= ~ones
            elif f.access == "w1p":
                for b in range(f.width):
                    self.pulses[(r.name, f.name, b)] += ones >> b & 1
        return OKAY


def pulse_monitor(dut, counts):
    """A process that counts, per w1p bit, the cycles its output was high."""
    sigs = [(r.name, f.name, dut.fields[r.name][f.name], f.width) for r in dut.regmap
            for f in r.fields.values() if f.access == "w1p"]

    async def process(ctx):
        async for _, _, *values in ctx.tick().sample(*(s for _, _, s, _ in sigs)):
            for (reg, field, _, width), v in zip(sigs, values):
                for b in range(width):
                    counts[(reg, field, b)] = counts.get((reg, field, b), 0) + (v >> b & 1)
    return process


def bench(body, *, rng=None, pulses=None):
    """Run ``body(ctx, dut, bus, drv)`` against a fresh CsrBlock of the demo map."""
    dut = CsrBlock(demo_map())

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil, rng=rng)
        drv = RegisterDriver(dut.regmap, bus.read, bus.write)
        await body(ctx, dut, bus, drv)
        await ctx.tick().repeat(3)          # let the pulse monitor see the last cycles
    run(dut, tb, processes=[pulse_monitor(dut, pulses)] if pulses is not None else [])
    return dut


# --- Declarations ------------------------------------------------------------------------------

def test_layout_and_offsets():
    m = demo_map()
    assert [m.offset(r.name) for r in m] == [0, 4, 8, 12, 16, 20, 32]
    assert m.addr_width == 6
    ctrl = m["ctrl"]
    assert [(f.name, f.offset, f.width) for f in ctrl.fields.values()] == [
        ("enable", 0, 1), ("mode", 1, 3), ("prio", 8, 8), ("limit", 16, 16)]
    assert {r.name: r.reset for r in m} == RESETS
    assert ctrl.pack(mode=5, limit=0xBEEF) == 0xBEEF_000A
    assert ctrl.unpack(0xBEEF_7F0B) == {"enable": 1, "mode": 5, "prio": 0x7F, "limit": 0xBEEF}
    # The minimum address width: 2 + ceil(log2(n)) for a packed map.
    for n, width in [(1, 2), (2, 3), (3, 4), (4, 4), (5, 5), (16, 6), (17, 7)]:
        regs = [Register(f"r{i}", [Field("x", 1, "rw")]) for i in range(n)]
        assert RegisterMap("m", regs).addr_width == width, n
    assert RegisterMap("m", [Register("a", [Field("x", 1, "rw")])], data_width=64).addr_width == 3
    # A Field object can be reused: each register places its own copy.
    f = Field("x", 4, "rw")
    a, b = Register("a", [Field("y", 3, "rw"), f]), Register("b", [f])
    assert (a.fields["x"].offset, b.fields["x"].offset, f.offset) == (3, 0, None)


def test_a_copy_with_other_reset_values():
    m = demo_map()
    c = m.with_resets({"ctrl": {"prio": 0x11, "mode": 2}})
    assert c["ctrl"].unpack(c["ctrl"].reset) == {**m["ctrl"].unpack(m["ctrl"].reset),
                                                 "prio": 0x11, "mode": 2}
    # Everything else as it was, and the map it came from unchanged.
    assert {r.name: r.reset for r in c if r.name != "ctrl"} == \
        {n: v for n, v in RESETS.items() if n != "ctrl"}
    assert [(r.name, m.offset(r.name), [(f.name, f.offset, f.width, f.access)
                                        for f in r.fields.values()]) for r in m] == \
        [(r.name, c.offset(r.name), [(f.name, f.offset, f.width, f.access)
                                     for f in r.fields.values()]) for r in c]
    assert {r.name: r.reset for r in m} == RESETS
    with pytest.raises(CsrError, match="has no field 'nope'"):
        m.with_resets({"ctrl": {"nope": 1}})
    with pytest.raises(CsrError, match="has no register 'nope'"):
        m.with_resets({"nope": {"x": 1}})
    with pytest.raises(CsrError, match="does not fit"):
        m.with_resets({"ctrl": {"mode": 8}})


def rf(*fields, **kw):
    return Register("r", list(fields), **kw)


@pytest.mark.parametrize("build, message", [
    (lambda: Field("1x", 1, "rw"), "field name '1x' is not a Python identifier"),
    (lambda: Field("class", 1, "rw"), "field name 'class' is not a Python identifier"),
    (lambda: Field("x", 0, "rw"), "field 'x': width 0 must be an integer >= 1"),
    (lambda: Field("x", 1, "wo"), "field 'x': access 'wo' is not one of rw, ro, w1p, w1c"),
    (lambda: Field("x", 4, "rw", reset=16), "field 'x': reset 16 does not fit 4 bit(s)"),
    (lambda: Field("x", 4, "rw", reset=-1), "field 'x': reset -1 does not fit 4 bit(s)"),
    (lambda: Field("x", 1, "w1p", reset=1), "field 'x': a w1p field is a pulse and resets "
                                            "to 0, not 0x1"),
    (lambda: Field("x", 1, "rw", offset=-2), "field 'x': bit offset -2 must be an integer >= 0"),
    (lambda: Register("r-1", [Field("x", 1, "rw")]),
     "register name 'r-1' is not a Python identifier"),
    (lambda: Register("r", []), "register 'r' has no fields"),
    (lambda: Register("r", ["x"]), "register 'r': 'x' is not a Field"),
    (lambda: rf(Field("x", 1, "rw"), offset=-4),
     "register 'r': offset -4 must be an integer >= 0"),
    (lambda: rf(Field("x", 1, "rw"), Field("x", 1, "ro")),
     "register 'r': name 'x' is used twice"),
    (lambda: rf(Field("e", 1, "w1c"), Field("e_set", 1, "ro")),
     "register 'r': name 'e_set' is used twice (the set input of w1c field 'e')"),
    (lambda: rf(Field("e_set", 1, "ro"), Field("e", 1, "w1c")),
     "register 'r': name 'e_set' is used twice (the set input of w1c field 'e')"),
    (lambda: rf(Field("a", 4, "rw"), Field("b", 2, "rw", offset=2)),
     "register 'r': field 'b' (bits 3:2) overlaps field 'a' (bits 3:0)"),
    (lambda: RegisterMap("m", [rf(Field("a", 30, "rw"), Field("b", 3, "rw"))]),
     "regmap 'm': register 'r' field 'b' (bits 32:30) does not fit 32 bits"),
    (lambda: RegisterMap("m", [rf(Field("a", 1, "rw", offset=32))]),
     "regmap 'm': register 'r' field 'a' (bits 32) does not fit 32 bits"),
    (lambda: RegisterMap("m", []), "regmap 'm' has no registers"),
    (lambda: RegisterMap("m m", [rf(Field("a", 1, "rw"))]),
     "register map name 'm m' is not a Python identifier"),
    (lambda: RegisterMap("m", [rf(Field("a", 1, "rw"))], data_width=16),
     "regmap 'm': data_width must be 32 or 64, not 16"),
    (lambda: RegisterMap("m", [Field("a", 1, "rw")]), "regmap 'm': .* is not a Register"),
    (lambda: RegisterMap("m", [rf(Field("a", 1, "rw")), rf(Field("b", 1, "rw"))]),
     "regmap 'm': register name 'r' is used twice"),
    (lambda: RegisterMap("m", [rf(Field("a", 1, "rw"), offset=6)]),
     "regmap 'm': register 'r' offset 0x6 is not a multiple of 4"),
    (lambda: RegisterMap("m", [rf(Field("a", 1, "rw"), offset=4)], data_width=64),
     "regmap 'm': register 'r' offset 0x4 is not a multiple of 8"),
    (lambda: RegisterMap("m", [Register("a", [Field("x", 1, "rw")], offset=8),
                               Register("b", [Field("x", 1, "rw")]),
                               Register("c", [Field("x", 1, "rw")], offset=8)]),
     "regmap 'm': register 'c' at 0x8 overlaps register 'a'"),
    (lambda: demo_map()["nope"], "regmap 'demo' has no register 'nope'"),
    (lambda: demo_map().offset("nope"), "regmap 'demo' has no register 'nope'"),
    (lambda: demo_map()["ctrl"].field("nope"), "register 'ctrl' has no field 'nope'"),
    (lambda: demo_map()["ctrl"].pack(mode=8),
     "register 'ctrl': value 8 does not fit the 3-bit field 'mode'"),
    (lambda: AxiLiteSignature(8, 16), "AXI4-Lite data_width must be 32 or 64, not 16"),
    (lambda: AxiLiteSignature(0), "addr_width must be a positive integer, not 0"),
    (lambda: CsrBlock("demo"), "CsrBlock needs a RegisterMap, not 'demo'"),
])
def test_errors(build, message):
    with pytest.raises(CsrError, match=f"^{message if '.*' in message else re.escape(message)}$"):
        build()
    assert issubclass(CsrError, ValueError)


def test_markdown():
    md = demo_map().markdown()
    print(md)
    lines = md.splitlines()
    assert lines[0] == "**demo**: 7 registers, 32-bit AXI4-Lite, addr_width 6"
    rows = [line for line in lines if line.startswith("| ")][1:]      # after the header row
    assert len(rows) == 7 + 16
    for name, offset in [("id", 0), ("ctrl", 4), ("cmd", 8), ("status", 12), ("irq", 16),
                         ("mixed", 20), ("scratch", 32)]:
        assert f"| 0x{offset:02x} | `{name}` | | | | 0x{RESETS[name]:08x} |" in md, name
    assert "| | | `prio` | 15:8 | rw | 0x5a | |" in md
    assert "| | | `enable` | 0 | rw | 0x1 | Enable the block |" in md
    assert "| | | `mode` | 3:1 | rw | 0x2 | Mode \\| with a pipe |" in md
    assert "| | | `ovf` | 5:4 | w1c | 0x2 | Overflow, per queue |" in md
    assert "| | | `seen` | 24 | w1c | 0x0 | |" in md


# --- Driver over a pure-Python bus ---------------------------------------------------------------

def test_driver_semantics():
    m = demo_map()
    mem = {r.offset: r.reset for r in m}
    log = []

    async def read(addr):
        log.append(("r", addr))
        return mem[addr]

    async def write(addr, value):
        log.append(("w", addr, value))
        mem[addr] = value

    drv = RegisterDriver(m, read, write, base=0x1000)
    mem = {0x1000 + k: v for k, v in mem.items()}

    async def body():
        assert await drv.read("ctrl") == RESETS["ctrl"]
        assert await drv.read_field("ctrl", "prio") == 0x5A
        assert await drv.read_fields("irq") == {"err": 0, "ovf": 2}
        log.clear()
        # rw fields not named keep their value; w1c/w1p fields not named are written 0.
        mem[0x1014] = 0x0100_0ABC | 0x5 << 12
        await drv.write_fields("mixed", kick=1)
        assert log == [("r", 0x1014), ("w", 0x1014, 0x0000_0ABC | 1 << 16)]
        log.clear()
        # No rw field to keep: no read.
        await drv.write_fields("irq", ovf=1)
        assert log == [("w", 0x1010, 0x10)]
        log.clear()
        await drv.write_fields("ctrl", enable=0, mode=7, prio=1, limit=2)
        assert log == [("w", 0x1004, 0x0002_010E)]
        for call, message in [
            (drv.read("nope"), "regmap 'demo' has no register 'nope'"),
            (drv.read_field("ctrl", "nope"), "register 'ctrl' has no field 'nope'"),
            (drv.write_fields("ctrl", nope=1), "register 'ctrl' has no field 'nope'"),
            (drv.write_fields("status", busy=1), "register 'status': field 'busy' is ro, "
                                                 "not writable"),
            (drv.write_fields("ctrl", mode=9), "register 'ctrl': value 9 does not fit the "
                                               "3-bit field 'mode'"),
            (drv.write("ctrl", 1 << 32), "register 'ctrl': value 4294967296 does not fit "
                                         "32 bits"),
            (drv.write("ctrl", -1), "register 'ctrl': value -1 does not fit 32 bits"),
        ]:
            log.clear()
            with pytest.raises(CsrError, match=f"^{re.escape(message)}$"):
                await call
            assert log == [], message           # a bad call never touches the bus

    asyncio.run(body())


# --- Gateware, directed ------------------------------------------------------------------------

def test_reset_values_and_driver():
    async def body(ctx, dut, bus, drv):
        for r in dut.regmap:
            assert await drv.read(r.name) == RESETS[r.name], r.name
        assert ctx.get(dut.f.ctrl.prio) == 0x5A and ctx.get(dut.f.irq.ovf) == 0b10
        await drv.write("scratch", 0xDEADBEEF)
        assert await drv.read("scratch") == 0xDEADBEEF
        await drv.write_fields("ctrl", mode=5, limit=0xBEEF)
        assert await drv.read_fields("ctrl") == {"enable": 1, "mode": 5, "prio": 0x5A,
                                                 "limit": 0xBEEF}
        assert (ctx.get(dut.f.ctrl.enable), ctx.get(dut.f.ctrl.mode),
                ctx.get(dut.fields["ctrl"]["limit"])) == (1, 5, 0xBEEF)
        # ro: whatever the gateware drives, sampled at the read.
        ctx.set(dut.f.status.busy, 1)
        ctx.set(dut.f.status.count, 0xABCD)
        assert await drv.read("status") == 0xABCD_0001
        assert await drv.read_field("status", "count") == 0xABCD
        # Writes to ro fields change nothing and are not errors.
        await drv.write("status", 0)
        await drv.write("id", 0)
        assert await drv.read("status") == 0xABCD_0001
        assert await drv.read("id") == VERSION
        # w1p reads 0, even right after being written.
        await drv.write("cmd", 0xF01)
        assert await drv.read("cmd") == 0
    bench(body)


def test_wstrb():
    async def body(ctx, dut, bus, drv):
        await bus.write(0x20, 0x11223344)
        for strb, expect in [(0b0001, 0x112233AA), (0b0010, 0x1122BBAA), (0b0100, 0x11CCBBAA),
                             (0b1000, 0xDDCCBBAA), (0b0000, 0xDDCCBBAA), (0b0101, 0xDD00BB00)]:
            value = {0b0101: 0}.get(strb, 0xDDCCBBAA)
            await bus.write(0x20, value, strb)
            assert await bus.read(0x20) == expect, bin(strb)
        # A field spanning bytes: only the enabled byte of ctrl.limit changes.
        await bus.write(0x04, 0xFFFF_FFFF, 0b1000)
        assert ctx.get(dut.f.ctrl.limit) == 0xFF34 and ctx.get(dut.f.ctrl.prio) == 0x5A
        # w1p and w1c bits in a disabled byte neither pulse nor clear.
        ctx.set(dut.f.irq.err_set, 1)
        await ctx.tick()
        ctx.set(dut.f.irq.err_set, 0)
        await bus.write(0x10, 0xFFFF_FFFF, 0b1110)
        await bus.write(0x08, 0xFFFF_FFFF, 0b1101)
        assert await drv.read_fields("irq") == {"err": 1, "ovf": 2}
        await bus.write(0x10, 0x01, 0b0001)
        assert await drv.read_fields("irq") == {"err": 0, "ovf": 2}
    pulses = {}
    bench(body, pulses=pulses)
    assert sum(pulses.values()) == 1 and pulses[("cmd", "start", 0)] == 1


def test_unmapped_slverr():
    async def body(ctx, dut, bus, drv):
        await bus.write(0x20, 0x5555AAAA)
        before = [await bus.read(r.offset) for r in dut.regmap]
        for addr in [0x18, 0x1C, 0x24, 0x3C, 0x1B]:
            assert await bus.write_resp(addr, 0xFFFFFFFF) == SLVERR
            assert await bus.read_resp(addr) == (0, SLVERR)
            with pytest.raises(AxiLiteError, match=f"write at {addr:#x}: SLVERR"):
                await bus.write(addr, 1)
            with pytest.raises(AxiLiteError, match=f"read at {addr:#x}: SLVERR"):
                await bus.read(addr)
        assert [await bus.read(r.offset) for r in dut.regmap] == before
        # Unaligned addresses use the aligned word.
        await bus.write(0x23, 0x01020304)
        assert await bus.read(0x21) == 0x01020304
        assert await bus.read_resp(0x05) == (RESETS["ctrl"], OKAY)
    pulses = {}
    bench(body, pulses=pulses)
    assert sum(pulses.values()) == 0


@pytest.mark.parametrize("aw_delay, w_delay", [(0, 0), (0, 3), (3, 0), (1, 5), (6, 1)])
def test_aw_w_order(aw_delay, w_delay):
    async def body(ctx, dut, bus, drv):
        for i in range(4):
            await bus.write(0x20, 0x1000 + i, aw_delay=aw_delay, w_delay=w_delay, b_delay=i)
            assert ctx.get(dut.f.scratch.value) == 0x1000 + i
            assert await bus.read(0x20, ar_delay=aw_delay, r_delay=w_delay) == 0x1000 + i
        # B comes exactly two cycles after the cycle in which the later of AW and W is
        # accepted: the delay, that cycle, the stage's cycle, then B's (taken at once).
        start = bus.cycles
        await bus.write(0x20, 7, aw_delay=aw_delay, w_delay=w_delay, b_delay=0)
        assert bus.cycles - start == max(aw_delay, w_delay) + 3
    bench(body)


def test_parked_channel_waits():
    """AW (or W) alone waits in its stage, its ready still high; a second one fills the
    skid and drops the ready; nothing is written until the other channel comes, then both
    writes are performed, in order, on consecutive edges."""
    async def body(ctx, dut, bus, drv):
        p = dut.s_axil
        for first, second in [("aw", "w"), ("w", "aw")]:
            ctx.set(p.bready, 1)
            ctx.set(p.wstrb, 0xF)
            for i in range(2):              # two of the first channel, back to back
                ctx.set(p.awaddr, 0x20)
                ctx.set(p.wdata, 0xC0FFEE + i)
                assert ctx.get(getattr(p, f"{first}ready")), (first, i)
                ctx.set(getattr(p, f"{first}valid"), 1)
                await ctx.tick()
            ctx.set(getattr(p, f"{first}valid"), 0)
            for _ in range(5):
                assert not ctx.get(getattr(p, f"{first}ready"))     # stage and skid full
                assert ctx.get(getattr(p, f"{second}ready"))
                assert not ctx.get(p.bvalid)
                await ctx.tick()
            assert ctx.get(dut.f.scratch.value) == 0
            seen = []
            for i in range(2):              # then two of the second, back to back
                ctx.set(p.awaddr, 0x20)
                ctx.set(p.wdata, 0xC0FFEE + i)
                ctx.set(getattr(p, f"{second}valid"), 1)
                await ctx.tick()
                seen.append((ctx.get(p.bvalid), ctx.get(dut.f.scratch.value)))
            ctx.set(getattr(p, f"{second}valid"), 0)
            for _ in range(3):
                await ctx.tick()
                seen.append((ctx.get(p.bvalid), ctx.get(dut.f.scratch.value)))
            # Performed on the edges after the second channel's two handshakes: B and the
            # new value two cycles after each handshake's cycle.
            assert seen == [(0, 0), (1, 0xC0FFEE), (1, 0xC0FFEF), (0, 0xC0FFEF),
                            (0, 0xC0FFEF)], (first, seen)
            assert ctx.get(p.awready) and ctx.get(p.wready)
            await drv.write("scratch", 0)
    bench(body)


def offer_write(ctx, p, addr, data):
    """Put a full-word write on AW and W at once, by hand, to watch the cycles around it."""
    ctx.set(p.awaddr, addr)
    ctx.set(p.wdata, data)
    ctx.set(p.wstrb, 0xF)
    ctx.set(p.awvalid, 1)
    ctx.set(p.wvalid, 1)


def test_w1p_pulses_one_cycle():
    async def body(ctx, dut, bus, drv):
        seen = []
        p = dut.s_axil
        # Watch the pulse cycle by cycle around one write.
        offer_write(ctx, p, 0x08, 0x501)
        for _ in range(5):
            seen.append((ctx.get(p.bvalid), ctx.get(dut.f.cmd.start), ctx.get(dut.f.cmd.flush)))
            await ctx.tick()
            ctx.set(p.awvalid, 0)
            ctx.set(p.wvalid, 0)
            ctx.set(p.bready, 1)
        # Pulse and bvalid rise in the same cycle, two cycles after the handshake's.
        assert seen == [(0, 0, 0), (0, 0, 0), (1, 1, 0b0101), (0, 0, 0), (0, 0, 0)]
        await drv.write_fields("cmd", flush=0b1000)
        await drv.write_fields("mixed", kick=1)
        await drv.write_fields("mixed", thresh=3)        # kick unnamed: written 0, no pulse
        await drv.write("cmd", 0)
    pulses = {}
    bench(body, pulses=pulses)
    assert pulses == {("cmd", "start", 0): 1, ("cmd", "flush", 0): 1, ("cmd", "flush", 1): 0,
                      ("cmd", "flush", 2): 1, ("cmd", "flush", 3): 1, ("mixed", "kick", 0): 1}


def test_w1c_set_clear():
    async def body(ctx, dut, bus, drv):
        f = dut.f.irq
        assert await drv.read_fields("irq") == {"err": 0, "ovf": 0b10}
        await drv.write_fields("irq", ovf=0b10)
        assert await drv.read_fields("irq") == {"err": 0, "ovf": 0}
        ctx.set(f.err_set, 1)
        ctx.set(f.ovf_set, 0b01)
        await ctx.tick()
        ctx.set(f.err_set, 0)
        ctx.set(f.ovf_set, 0)
        assert (ctx.get(f.err), ctx.get(f.ovf)) == (1, 0b01)
        # Sticky: stays set with no set input.
        await ctx.tick().repeat(5)
        assert await drv.read_fields("irq") == {"err": 1, "ovf": 0b01}
        # Writing 0 clears nothing; writing 1 clears only that bit.
        await drv.write("irq", 0)
        assert await drv.read("irq") == 0x11
        await drv.write_fields("irq", err=1)
        assert await drv.read("irq") == 0x10
        # A set on the clearing edge (the one after the handshake's) wins: the event is
        # not lost.
        p = dut.s_axil
        offer_write(ctx, p, 0x10, 0x10)
        ctx.set(p.bready, 1)
        await ctx.tick()
        ctx.set(p.awvalid, 0)
        ctx.set(p.wvalid, 0)
        ctx.set(f.ovf_set, 0b01)
        await ctx.tick()
        ctx.set(f.ovf_set, 0)
        assert ctx.get(p.bvalid) and ctx.get(f.ovf) == 0b01
        await ctx.tick()
        # Without the set, the same write clears it.
        offer_write(ctx, p, 0x10, 0x10)
        await ctx.tick()
        ctx.set(p.awvalid, 0)
        ctx.set(p.wvalid, 0)
        await ctx.tick()
        assert ctx.get(p.bvalid) and ctx.get(f.ovf) == 0
        await ctx.tick()
        # A read-modify-write of the mixed register never clears its w1c bit.
        ctx.set(dut.f.mixed.seen_set, 1)
        await ctx.tick()
        ctx.set(dut.f.mixed.seen_set, 0)
        await drv.write_fields("mixed", thresh=0x123)
        assert await drv.read_fields("mixed") == {"thresh": 0x123, "lvl": 0, "kick": 0,
                                                  "seen": 1}
    bench(body)


def test_response_backpressure():
    """B and R held by bready/rready low for random stretches: each answered exactly once,
    held stable (the master checks), with the right value."""
    rng = seeded()

    async def body(ctx, dut, bus, drv):
        for i in range(60):
            value = rng.getrandbits(32)
            await bus.write(0x20, value, b_delay=rng.randint(0, 8))
            assert await bus.read(0x20, r_delay=rng.randint(0, 8)) == value
            addr = rng.choice([0x18, 0x3C])
            assert await bus.write_resp(addr, value, b_delay=rng.randint(1, 5)) == SLVERR
            assert await bus.read_resp(addr, r_delay=rng.randint(1, 5)) == (0, SLVERR)
        p = dut.s_axil
        await ctx.tick().repeat(3)
        assert not ctx.get(p.bvalid) and not ctx.get(p.rvalid)    # nothing duplicated
    bench(body)


def test_no_combinational_paths():
    """No output (AXI or field) changes when only inputs change: readies, responses and
    fields all come from flip-flops, in every state random traffic reaches."""
    rng = seeded()
    dut = CsrBlock(demo_map())
    p = dut.s_axil
    fields = [(f.access, dut.fields[r.name][f.name])
              for r in dut.regmap for f in r.fields.values()]
    inputs = [p.awaddr, p.awprot, p.awvalid, p.wdata, p.wstrb, p.wvalid, p.bready, p.araddr,
              p.arprot, p.arvalid, p.rready]
    inputs += [s for a, s in fields if a == "ro"]
    inputs += [dut.fields[r.name][f.name + "_set"] for r in dut.regmap
               for f in r.fields.values() if f.access == "w1c"]
    outputs = [p.awready, p.wready, p.bvalid, p.bresp, p.arready, p.rdata, p.rresp, p.rvalid]
    outputs += [s for a, s in fields if a != "ro"]
    states = set()

    async def tb(ctx):
        for _ in range(300):
            ref = [ctx.get(s) for s in outputs]
            for _ in range(8):
                for s in inputs:
                    ctx.set(s, rng.getrandbits(len(s)))
                assert [ctx.get(s) for s in outputs] == ref
            # Bias the addresses toward mapped registers so that writes land.
            ctx.set(p.awaddr, rng.choice([0x04, 0x08, 0x10, 0x14, 0x20, 0x18]))
            ctx.set(p.araddr, rng.choice([0x00, 0x0C, 0x14, 0x1C]))
            states.add((ctx.get(p.awready), ctx.get(p.wready), ctx.get(p.bvalid),
                        ctx.get(p.arready), ctx.get(p.rvalid)))
            await ctx.tick()
    run(dut, tb)
    assert len(states) >= 12, states          # parked AW/W/AR and held B/R were all visited


# --- Gateware, pipelined traffic (a master that does not wait for responses) --------------------

def stream_writer(dut, writes, rng=None, p_valid=1.0, p_ready=1.0, log=None, final=None):
    """Issue ``writes`` [(addr, data, strb, expected_resp)] with AW and W independent; check
    each B, in order, exactly once. ``log`` gets (cycle, event) pairs for timing checks;
    ``final(ctx)`` runs after the last B."""
    p = dut.s_axil
    n = len(writes)

    async def tb(ctx):
        aw_i = w_i = b_i = cycle = 0
        aw_v = w_v = False
        held = None
        while b_i < n:
            draw = (lambda prob: rng.random() < prob) if rng else (lambda prob: True)
            aw_v = aw_v or (aw_i < n and draw(p_valid))     # valid holds until accepted
            w_v = w_v or (w_i < n and draw(p_valid))
            bready = draw(p_ready)
            if aw_v:
                ctx.set(p.awaddr, writes[aw_i][0])
            if w_v:
                ctx.set(p.wdata, writes[w_i][1])
                ctx.set(p.wstrb, writes[w_i][2])
            ctx.set(p.awvalid, aw_v)
            ctx.set(p.wvalid, w_v)
            ctx.set(p.bready, bready)
            aw_hs = aw_v and ctx.get(p.awready)
            w_hs = w_v and ctx.get(p.wready)
            bvalid, bresp = ctx.get(p.bvalid), ctx.get(p.bresp)
            if bvalid:
                assert b_i < min(aw_i, w_i), f"B {b_i} without a request"
            if held is not None:
                assert bvalid and bresp == held, "B changed while held"
            await ctx.tick()
            if log is not None:
                log.extend((cycle, e) for e, hit in
                           [("aw", aw_hs), ("w", w_hs), ("b", bvalid and bready)] if hit)
            cycle += 1
            assert cycle < 50 * n + 100, "write stream hung"
            if aw_hs:
                aw_i, aw_v = aw_i + 1, False
            if w_hs:
                w_i, w_v = w_i + 1, False
            held = None
            if bvalid and bready:
                assert bresp == writes[b_i][3], f"B {b_i}: resp {bresp}"
                b_i += 1
            elif bvalid:
                held = bresp
        ctx.set(p.awvalid, 0)
        ctx.set(p.wvalid, 0)
        ctx.set(p.bready, 0)
        await ctx.tick().repeat(2)
        assert not ctx.get(p.bvalid), "a duplicated B"
        if final is not None:
            await final(ctx)
    return tb


def stream_reader(dut, reads, rng=None, p_valid=1.0, p_ready=1.0, log=None):
    """Issue ``reads`` [(addr, expected_data, expected_resp)]; check each R in order."""
    p = dut.s_axil
    n = len(reads)

    async def tb(ctx):
        ar_i = r_i = cycle = 0
        ar_v = False
        held = None
        while r_i < n:
            draw = (lambda prob: rng.random() < prob) if rng else (lambda prob: True)
            ar_v = ar_v or (ar_i < n and draw(p_valid))
            rready = draw(p_ready)
            if ar_v:
                ctx.set(p.araddr, reads[ar_i][0])
            ctx.set(p.arvalid, ar_v)
            ctx.set(p.rready, rready)
            ar_hs = ar_v and ctx.get(p.arready)
            rvalid = ctx.get(p.rvalid)
            got = (ctx.get(p.rdata), ctx.get(p.rresp))
            if rvalid:
                assert r_i < ar_i, f"R {r_i} without a request"
            if held is not None:
                assert rvalid and got == held, "R changed while held"
            await ctx.tick()
            if log is not None:
                log.extend((cycle, e) for e, hit in [("ar", ar_hs), ("r", rvalid and rready)]
                           if hit)
            cycle += 1
            assert cycle < 50 * n + 100, "read stream hung"
            if ar_hs:
                ar_i, ar_v = ar_i + 1, False
            held = None
            if rvalid and rready:
                assert got == reads[r_i][1:], f"R {r_i} ({reads[r_i][0]:#x}): {got}"
                r_i += 1
            elif rvalid:
                held = got
        ctx.set(p.arvalid, 0)
        ctx.set(p.rready, 0)
        await ctx.tick().repeat(2)
        assert not ctx.get(p.rvalid), "a duplicated R"
    return tb


def test_throughput_and_latency():
    """Back-to-back writes and reads at the same time, ready always high: one of each per
    cycle, B and R two cycles after the handshake's. Then the rate of a master that waits
    for each response (the simulator adapter): one transaction per 3 cycles."""
    n = 64
    dut = CsrBlock(demo_map())
    writes = [(0x20, 0x1000 + i, 0xF, OKAY) if i % 2 else (0x08, 1, 0xF, OKAY)
              for i in range(n)]
    reads = [(0x00, VERSION, OKAY) if i % 2 else (0x18, 0, SLVERR) for i in range(n)]
    wlog, rlog = [], []
    pulses = {}
    run(dut, stream_writer(dut, writes, log=wlog), stream_reader(dut, reads, log=rlog),
        processes=[pulse_monitor(dut, pulses)])

    def cycles(log, event):
        return [c for c, e in log if e == event]
    for log, req, resp in [(wlog, "aw", "b"), (wlog, "w", "b"), (rlog, "ar", "r")]:
        hs, done = cycles(log, req), cycles(log, resp)
        assert len(hs) == len(done) == n
        assert hs == list(range(hs[0], hs[0] + n)), f"{req}: not one per cycle"
        assert [d - h for h, d in zip(hs, done)] == [2] * n, f"{resp}: latency"
    # Cycles per transaction: the cycles from the first response to the last, over n.
    measured = {"write": (cycles(wlog, "b")[-1] - cycles(wlog, "b")[0] + 1) / n,
                "read": (cycles(rlog, "r")[-1] - cycles(rlog, "r")[0] + 1) / n}
    print(f"streaming cycles per transaction: {measured}")
    assert measured == {"write": 1.0, "read": 1.0}
    assert pulses[("cmd", "start", 0)] == n // 2

    rates = {}

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil)
        start = bus.cycles
        for i in range(n):
            await bus.write(0x20, i)
        rates["write"] = (bus.cycles - start) / n
        start = bus.cycles
        for i in range(n):
            assert await bus.read(0x20) == n - 1
        rates["read"] = (bus.cycles - start) / n
    run(dut, tb)
    print(f"wait-for-response cycles per transaction: {rates}")
    assert rates == {"write": 3.0, "read": 3.0}


def test_stream_random_handshakes():
    """A pipelined master with random valid and ready, writes and reads at once: no response
    lost, duplicated, reordered or altered (the reads target registers the writes leave)."""
    rng = seeded()
    dut = CsrBlock(demo_map())
    writes, last, kicks = [], None, 0
    for _ in range(300):
        addr = rng.choice([0x20, 0x20, 0x14, 0x18, 0x3C])
        data, strb = rng.getrandbits(32), 0xF
        resp = OKAY if addr in (0x20, 0x14) else SLVERR
        if addr == 0x20:
            last = data
        if addr == 0x14:
            kicks += data >> 16 & 1
        writes.append((addr, data, strb, resp))
    reads = [rng.choice([(0x00, VERSION, OKAY), (0x10, 0x20, OKAY), (0x1C, 0, SLVERR)])
             for _ in range(300)]
    async def final(ctx):
        assert ctx.get(dut.f.scratch.value) == last
    pulses = {}
    for p_valid, p_ready in [(0.3, 0.3), (0.9, 0.2), (0.2, 0.9), (0.7, 0.7)]:
        run(dut, stream_writer(dut, writes, rng, p_valid, p_ready, final=final),
            stream_reader(dut, reads, rng, p_valid, p_ready),
            processes=[pulse_monitor(dut, pulses)])
    assert pulses[("mixed", "kick", 0)] == 4 * kicks


def _maps_for_reads():
    """Maps of several shapes: the demo map (4 index bits, holes), 23 packed registers of
    mixed fields (5 index bits, the odd pair), one register (no index bit) and 64-bit
    data."""
    kinds = ["rw", "ro", "w1c", "w1p"]
    mixed = RegisterMap("mixed23", [
        Register(f"r{i}", [Field("a", 1 + (7 * i) % 20, kinds[i % 4]),
                           Field("b", 3, kinds[(i + 1) % 4], offset=28)])
        for i in range(23)])
    one = RegisterMap("one", [Register("x", [Field("v", 32, "ro")])])
    wide = RegisterMap("wide", [
        Register("a", [Field("lo", 40, "rw", reset=0x12_3456_789A), Field("go", 1, "w1p")]),
        Register("b", [Field("v", 64, "ro")], offset=0x10),
        Register("c", [Field("e", 3, "w1c", reset=5)]),
    ], data_width=64)
    return [demo_map(), mixed, one, wide]


def test_random_read_backpressure():
    """Pipelined reads of every register, of holes and of unaligned addresses, with random
    AR valid and R ready, against the expected words (rw set by writes first, ro inputs and
    w1c bits set by the test, w1p 0, holes SLVERR 0): each R in order, exactly once, held
    stable while rready is low, and nothing hangs (``stream_reader`` checks)."""
    rng = seeded()
    for regmap in _maps_for_reads():
        dut = CsrBlock(regmap)
        word = regmap.word_bytes
        values = {}                     # (register, field) -> value the read must return
        for r in regmap:
            for f in r.fields.values():
                values[(r.name, f.name)] = {"w1p": 0}.get(f.access, rng.getrandbits(f.width))

        def expect(addr):
            hit = [r for r in regmap if r.offset == addr - addr % word]
            if not hit:
                return 0, SLVERR
            return sum(values[(hit[0].name, f.name)] << f.offset
                       for f in hit[0].fields.values()), OKAY

        span = 1 << regmap.addr_width
        addrs = [r.offset + rng.randrange(word) for r in regmap] + list(range(0, span, word))
        reads = [(a, *expect(a)) for a in (rng.choice(addrs) for _ in range(200))]

        async def setup(ctx):
            bus = AxiLiteSimMaster(ctx, dut.s_axil)
            for r in regmap:            # rw values written, w1c bits cleared, then set
                fs = r.fields.values()
                await bus.write(r.offset, sum(
                    (values[(r.name, f.name)] if f.access == "rw" else (1 << f.width) - 1)
                    << f.offset for f in fs if f.access in ("rw", "w1c")))
                for f in fs:
                    v = values[(r.name, f.name)]
                    if f.access == "ro":
                        ctx.set(dut.fields[r.name][f.name], v)
                    elif f.access == "w1c":
                        ctx.set(dut.fields[r.name][f.name + "_set"], v)
                await ctx.tick()
                for f in fs:
                    if f.access == "w1c":
                        ctx.set(dut.fields[r.name][f.name + "_set"], 0)
            for r in regmap:            # the values landed
                for f in r.fields.values():
                    if f.access in ("rw", "w1c"):
                        assert ctx.get(dut.fields[r.name][f.name]) == values[(r.name, f.name)]
            for p_valid, p_ready in [(0.5, 0.5), (0.9, 0.2), (0.3, 0.9), (1.0, 1.0),
                                     (1.0, 0.5)]:
                await stream_reader(dut, reads, rng, p_valid, p_ready)(ctx)
        run(dut, setup)


def test_read_sample_edge_and_write_order():
    """An ro input is sampled on the edge the read is performed: with R free, the edge after
    the AR handshake (R returns the input's value in the cycle after the handshake's); with
    R held, the edge that empties R. A read accepted in the same cycle as a write's later
    of AW and W returns the old value, one accepted a cycle later the new one."""
    dut = CsrBlock(demo_map())
    p = dut.s_axil

    async def counter(ctx):             # status.count = cycle number, changing every cycle
        n = 0
        while True:
            ctx.set(dut.f.status.count, n & 0xFFFF)
            await ctx.tick()
            n += 1

    async def tb(ctx):
        def cycle():                    # the counter's value in this cycle
            return ctx.get(dut.f.status.count)

        # R free: AR accepted in cycle c, the value of cycle c + 1.
        await ctx.tick().repeat(5)
        ctx.set(p.araddr, 0x0C)
        ctx.set(p.arvalid, 1)
        ctx.set(p.rready, 1)
        c = cycle()
        await ctx.tick()
        ctx.set(p.arvalid, 0)
        await ctx.tick()
        assert ctx.get(p.rvalid) and ctx.get(p.rdata) >> 16 == c + 1
        await ctx.tick()
        # R held by a first read: the second, accepted next, waits in the AR stage and is
        # sampled on the edge that empties R.
        ctx.set(p.rready, 0)
        ctx.set(p.arvalid, 1)
        await ctx.tick().repeat(2)          # two reads accepted
        ctx.set(p.arvalid, 0)
        await ctx.tick().repeat(4)
        assert ctx.get(p.rvalid)
        ctx.set(p.rready, 1)
        c = cycle()                         # R emptied on this cycle's edge
        await ctx.tick()
        assert ctx.get(p.rvalid) and ctx.get(p.rdata) >> 16 == c
        await ctx.tick()
        assert not ctx.get(p.rvalid)

        # A write and reads of scratch: AR with AW and W, then AR one cycle later.
        ctx.set(p.bready, 1)
        offer_write(ctx, p, 0x20, 0xBEEF)
        ctx.set(p.araddr, 0x20)
        ctx.set(p.arvalid, 1)
        got = []
        for _ in range(5):
            await ctx.tick()
            ctx.set(p.awvalid, 0)
            ctx.set(p.wvalid, 0)
            if ctx.get(p.rvalid):
                got.append(ctx.get(p.rdata))
        ctx.set(p.arvalid, 0)
        assert got[:2] == [0, 0xBEEF], got

    run(dut, tb, processes=[counter])


# --- Gateware, random against the model ----------------------------------------------------------

def test_random_against_model():
    rng = seeded()
    regmap = demo_map()
    model = Model(regmap)
    ro_inputs = [(r.name, f) for r in regmap for f in r.fields.values() if f.access == "ro"
                 and r.name != "id"]
    w1c = [(r.name, f) for r in regmap for f in r.fields.values() if f.access == "w1c"]
    pulses = {}
    counts = {"read": 0, "write": 0, "slverr": 0}

    def random_addr():
        # Mostly registers (any byte of the word), sometimes anywhere, holes included.
        if rng.random() < 0.75:
            return rng.choice(list(regmap)).offset + rng.randrange(4)
        return rng.randrange(1 << regmap.addr_width)

    async def body(ctx, dut, bus, drv):
        for _ in range(1000):
            action = rng.random()
            if action < 0.1:           # the gateware changes an ro input
                reg, f = rng.choice(ro_inputs)
                value = rng.getrandbits(f.width)
                ctx.set(dut.fields[reg][f.name], value)
                model.inputs[(reg, f.name)] = value
            elif action < 0.2:         # the gateware raises a w1c bit
                reg, f = rng.choice(w1c)
                bits = rng.getrandbits(f.width)
                ctx.set(dut.fields[reg][f.name + "_set"], bits)
                await ctx.tick()
                ctx.set(dut.fields[reg][f.name + "_set"], 0)
                model.state[(reg, f.name)] |= bits
            elif action < 0.6:
                addr = random_addr()
                data = rng.getrandbits(32)
                strb = rng.choice([0xF, 0xF, rng.getrandbits(4)])
                expect = model.write(addr, data, strb)
                assert await bus.write_resp(addr, data, strb) == expect, hex(addr)
                counts["write"] += 1
                counts["slverr"] += expect == SLVERR
            else:
                addr = random_addr()
                assert await bus.read_resp(addr) == model.read(addr), hex(addr)
                counts["read"] += 1
        for r in regmap:                # end state, field by field through the driver
            assert await drv.read(r.name) == model.read(r.offset)[0], r.name
    bench(body, rng=rng, pulses=pulses)
    print(counts)
    # About 1 write in 10 finds no register (mean ~50): a bound far below it, so that the
    # check says "the error path ran", not "this seed drew its usual share".
    assert counts["read"] > 250 and counts["write"] > 250 and counts["slverr"] > 20
    assert pulses == model.pulses
    assert sum(pulses.values()) > 20


# --- Integration --------------------------------------------------------------------------------

class _Counter(Elaboratable):
    """A parent that counts while ctrl.enable, reports the count as ro, raises irq.err when
    the count passes scratch, and restarts on cmd.start."""

    def __init__(self):
        self.csr = CsrBlock(demo_map())

    def elaborate(self, platform):
        m = Module()
        m.submodules.csr = csr = self.csr
        count = Signal(16)
        with m.If(csr.f.cmd.start):
            m.d.sync += count.eq(0)
        with m.Elif(csr.f.ctrl.enable):
            m.d.sync += count.eq(count + 1)
        m.d.comb += [
            csr.fields["status"]["count"].eq(count),
            csr.fields["status"]["busy"].eq(csr.f.ctrl.enable),
            csr.f.irq.err_set.eq(count == csr.f.scratch.value),
        ]
        return m


def test_parent_drives_fields():
    top = _Counter()

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, top.csr.s_axil)
        drv = RegisterDriver(top.csr.regmap, bus.read, bus.write)
        await drv.write_fields("ctrl", enable=0)
        await drv.write_fields("irq", err=1, ovf=3)
        await drv.write("scratch", 30)
        await drv.write_fields("cmd", start=1)
        frozen = await drv.read_fields("status")
        assert frozen == {"busy": 0, "count": 0}
        await drv.write_fields("ctrl", enable=1)
        await ctx.tick().repeat(40)
        status = await drv.read_fields("status")
        assert status["busy"] == 1 and 40 < status["count"] < 50
        assert await drv.read_field("irq", "err") == 1

    run(top, tb)


def test_verilog_export():
    text = verilog.convert(CsrBlock(demo_map()), name="demo_csr")
    for port in ["s_axil__awaddr", "s_axil__rdata", "s_axil__bresp"]:
        assert re.search(rf"\b{port}\b", text), port
    assert "input [5:0] s_axil__awaddr" in text


def test_data_width_64():
    regmap = RegisterMap("wide", [
        Register("a", [Field("lo", 40, "rw", reset=0x12_3456_789A), Field("go", 1, "w1p")]),
        Register("b", [Field("v", 64, "ro", reset=0x0123_4567_89AB_CDEF)], offset=0x10),
    ], data_width=64)
    dut = CsrBlock(regmap)
    assert regmap.addr_width == 5 and len(dut.s_axil.wstrb) == 8

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(regmap, bus.read, bus.write)
        assert await drv.read("a") == 0x12_3456_789A
        assert await drv.read("b") == 0x0123_4567_89AB_CDEF
        await bus.write(0x04, 0xFFFF_FFFF_FFFF_FFFF, strb=0b1001_0000)   # byte 4 of lo, byte 7
        assert await drv.read_fields("a") == {"lo": 0xFF_3456_789A, "go": 0}
        await drv.write_fields("a", go=1)
        assert ctx.get(dut.f.a.lo) == 0xFF_3456_789A
        assert await bus.read_resp(0x08) == (0, SLVERR)
        await ctx.tick()
    pulses = {}
    run(dut, tb, processes=[pulse_monitor(dut, pulses)])
    assert pulses == {("a", "go", 0): 1}


def test_forwarded_port():
    """A parent that exposes the block's port as its own, through wiring.connect."""
    class Parent(wiring.Component):
        s_axil: In(AxiLiteSignature(demo_map().addr_width))

        def __init__(self):
            super().__init__()
            self.csr = CsrBlock(demo_map())

        def elaborate(self, platform):
            m = Module()
            m.submodules.csr = self.csr
            wiring.connect(m, wiring.flipped(self.s_axil), self.csr.s_axil)
            return m

    top = Parent()

    async def tb(ctx):
        bus = AxiLiteSimMaster(ctx, top.s_axil)
        drv = RegisterDriver(top.csr.regmap, bus.read, bus.write)
        await drv.write("scratch", 0x600D)
        assert ctx.get(top.csr.f.scratch.value) == 0x600D
        assert await drv.read("id") == VERSION
    run(top, tb)


class _BadSlave(wiring.Component):
    """Breaks AXI on purpose, to show that the master's checks can fail."""
    s_axil: In(AxiLiteSignature(4))

    def __init__(self, fault):
        self.fault = fault
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        p = self.s_axil
        m.d.comb += [p.awready.eq(1), p.wready.eq(1), p.arready.eq(1)]
        answered = Signal()
        m.d.sync += answered.eq(p.arvalid)     # "silent" never shows it
        if self.fault == "early_b":
            m.d.comb += p.bvalid.eq(1)
        elif self.fault == "dropped_r":
            m.d.comb += p.rvalid.eq(answered)  # for one cycle, whatever rready does
        return m


@pytest.mark.parametrize("fault, call, message", [
    ("early_b", lambda bus: bus.write(0, 1, aw_delay=2), "bvalid before AW and W"),
    ("dropped_r", lambda bus: bus.read(0, r_delay=3), "R valid dropped before ready"),
    ("silent", lambda bus: bus.write(0, 1), "no response in 20 cycles"),
])
def test_master_checks(fault, call, message):
    dut = _BadSlave(fault)

    async def tb(ctx):
        with pytest.raises(AxiLiteProtocolError, match=message):
            await call(AxiLiteSimMaster(ctx, dut.s_axil, timeout=20))
    run(dut, tb)


# --- Event counters at each counter width ------------------------------------------------------

class _Counted(Elaboratable):
    """Two counters (a 1-bit event and a 12-bit increment) behind a register map."""

    MAP = RegisterMap("counted", [
        Register("control", [Field("clear", 1, "w1p")]),
        Register("ones", [Field("count", 32, "ro")]),
        Register("steps", [Field("count", 32, "ro")]),
    ])

    def __init__(self, width):
        self.width = width
        self.csr = CsrBlock(self.MAP)
        self.events = Signal(data.StructLayout({"ones": 1, "steps": 12}))

    def elaborate(self, platform):
        m = Module()
        m.submodules.csr = self.csr
        f = self.csr.fields
        event_counters(m, f, self.events, ["ones", "steps"], f["control"]["clear"],
                       width=self.width)
        return m


@pytest.mark.parametrize("width", [32, 16, 0])
def test_event_counters_count_wrap_and_can_be_left_out(width):
    """Counts against a Python sum: 32 bits hold 30 x 4000 + 3, 16 bits wrap, 0 reads 0."""
    dut = _Counted(width)
    f = dut.csr.fields
    seen = {}

    async def tb(ctx):
        for i in range(30):
            ctx.set(dut.events, {"ones": i % 2, "steps": 4000 + (i == 0) * 3})
            await ctx.tick()
        ctx.set(dut.events, {"ones": 0, "steps": 0})
        await ctx.tick().repeat(3)
        seen["ones"], seen["steps"] = ctx.get(f["ones"]["count"]), ctx.get(f["steps"]["count"])

    run(dut, tb)
    want = {"ones": 15, "steps": 30 * 4000 + 3}
    mask = (1 << width) - 1
    assert seen == {k: v & mask for k, v in want.items()}


@pytest.mark.parametrize("width", [8, 24, 64, True, "32"])
def test_other_counter_widths_are_refused(width):
    with pytest.raises(ValueError, match="counter_width"):
        check_counter_width(width)
