"""BlockRam: a registered read's word against a reference memory, cycle by cycle, for each
forwarding mode; its ECP5 elaboration (DP16KD with the output register on), as a netlist and
run on the simulator with a model of the primitive written from its pin list; its parameter
checks."""

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Cat, Elaboratable, Fragment, Module, Signal
from amaranth.lib.memory import Memory

from mrcnic.base.bram import BlockRam
from testkit.simtools import run, seeded, soak


def _expected(history, addr, forward):
    """The word at ``addr`` that a read addressed in cycle t gives in t + 2: ``history[k]``
    is the memory after the write at the edge ending cycle k (t - 1, t, t + 1 the last three
    entries)."""
    return history[-3 + forward][addr]


@pytest.mark.parametrize("width,depth", [(1, 2), (64, 64), (37, 100)])
def test_reads_forward_the_writes_they_name(width, depth):
    """Random writes and reads (collisions on purpose: a small address range often), every
    port's word checked two cycles after its address; a read that forwards nothing is
    checked only where no write hit its word at its own edge (undefined there)."""
    _check_random(BlockRam(width, depth, (0, 1, 2, 2)), width, depth)


def _check_random(dut, width, depth):
    """Random traffic on ``dut``'s ports, its words checked against a reference memory."""
    rng = seeded()
    forward = dut.forward
    cycles = soak(600)

    async def tb(ctx):
        mem = [0] * depth
        history = [list(mem)] * 3              # after the edges ending cycles t-3 .. t-1
        pending = []                           # (cycle, port, addr, collided)
        checked = 0
        # Addresses from the whole range, from the first three words (collisions), or from
        # a few words spread over the range (reads of written words, every address bit).
        spread = [rng.randrange(depth) for _ in range(6)]
        for cyc in range(cycles):
            pick = rng.choice((lambda: rng.randrange(depth), lambda: rng.randrange(min(depth, 3)),
                               lambda: rng.choice(spread)))
            w_addr, w_en = pick(), rng.random() < 0.7
            w_data = rng.getrandbits(width)
            addrs = [pick() for _ in forward]
            ctx.set(dut.w_addr, w_addr)
            ctx.set(dut.w_en, w_en)
            ctx.set(dut.w_data, w_data)
            for i, a in enumerate(addrs):
                ctx.set(dut.r_addr[i], a)
            # The words due in this cycle: addressed two cycles ago.
            for due in [p for p in pending if p[0] == cyc - 2]:
                _, i, a, collided = due
                if forward[i] == 0 and collided:
                    continue
                got = ctx.get(dut.r_data[i])
                # history[-1] is after the edge ending cycle cyc - 1 = t + 1.
                want = _expected(history, a, forward[i])
                assert got == want, (cyc, i, a, forward[i], got, want)
                checked += 1
            pending = [p for p in pending if p[0] > cyc - 2]
            for i, a in enumerate(addrs):
                pending.append((cyc, i, a, w_en and w_addr == a))
            await ctx.tick()
            if w_en:
                mem[w_addr] = w_data
            history = history[1:] + [list(mem)]
        assert checked > cycles * (len(forward) - 1)

    run(dut, tb)


def test_ecp5_elaboration_uses_the_output_register():
    """On an ECP5 platform each read port is DP16KD (ceil(width / 36) of them) with both
    output registers on; 513 to 16384 words, the narrowest mode as deep (ceil(width / its
    bits) a port, port B's register on); deeper, or at most 16 words, the generic memory."""
    class Ecp5:
        family = "ecp5"
    ram = BlockRam(64, 512, (2, 0))
    il = rtlil.convert(ram, platform=Ecp5())
    assert il.count("cell \\DP16KD") == 4
    assert il.count('parameter \\REGMODE_B "OUTREG"') == 4
    assert il.count('parameter \\REGMODE_A "OUTREG"') == 4
    deep = rtlil.convert(BlockRam(19, 1024, (0, 1)), platform=Ecp5())
    assert deep.count("cell \\DP16KD") == 4          # 2 x 18 bits a port
    assert deep.count('parameter \\REGMODE_B "OUTREG"') == 4
    assert deep.count("parameter \\DATA_WIDTH_B 18") == 4
    deepest = rtlil.convert(BlockRam(3, 16384, (0,)), platform=Ecp5())
    assert deepest.count("cell \\DP16KD") == 3
    too_deep = rtlil.convert(BlockRam(8, 16385, (0,)), platform=Ecp5())
    assert "DP16KD" not in too_deep
    shallow = rtlil.convert(BlockRam(64, 16, (0,)), platform=Ecp5())
    assert "DP16KD" not in shallow
    generic = Fragment.get(BlockRam(64, 512, (0,)), None)
    assert generic is not None


@pytest.mark.parametrize("args,message", [
    ((0, 8), "width must be 1 or more, not 0"),
    ((8, 1), "depth must be 2 or more, not 1"),
    ((8, 8, (3,)), r"forward must be one or more of \(0, 1, 2\), not \(3,\)"),
    ((8, 8, ()), r"forward must be one or more of \(0, 1, 2\), not \(\)"),
])
def test_parameters_are_checked(args, message):
    with pytest.raises(ValueError, match=message):
        BlockRam(*args)


class _Dp16kdModel(Elaboratable):
    """DP16KD as ``BlockRam`` uses it, for the simulator, written from the primitive's pin
    list, not from BlockRam's code. The 36-bit mode: port A writing (address on pins 5 to
    13, its four 9-bit bytes enabled by pins 0 to 3), port B reading (address on pins 5 to
    13), the word in DOA (bits 0 to 17) and DOB (18 to 35) from the output registers. The
    narrower modes (18, 9, 4, 2 or 1 bits; 1024 .. 16384 words): port A writing when WEA
    (in the 18-bit mode its two 9-bit bytes enabled by pins 0 and 1), the word on DIA from
    bit 0, the address on the pins from 4, 3, 2, 1 or 0 up to 13 (both ports); port B
    reading, the word on DOB from port B's output register. Two cycles from address to
    word."""

    _NARROW = {18: (1024, 4), 9: (2048, 3), 4: (4096, 2), 2: (8192, 1), 1: (16384, 0)}

    def __init__(self, ports):
        self.ports = ports

    def elaborate(self, platform):
        p = self.ports
        bits = p["p_DATA_WIDTH_A"]
        assert p["p_DATA_WIDTH_B"] == bits and p["p_REGMODE_B"] == "OUTREG"
        m = Module()
        if bits == 36:
            assert p["p_REGMODE_A"] == "OUTREG"
            depth, low, gran = 512, 5, 9
            data_in = Cat(*(p[f"i_DIA{k}"] for k in range(18)),
                          *(p[f"i_DIB{k}"] for k in range(18)))
            enables = Cat(*(p[f"i_ADA{k}"] & p["i_WEA"] & p["i_CEA"] for k in range(4)))
        else:
            depth, low = self._NARROW[bits]
            gran = 9 if bits == 18 else bits
            data_in = Cat(*(p[f"i_DIA{k}"] for k in range(bits)))
            write = p["i_WEA"] & p["i_CEA"]
            enables = (Cat(p["i_ADA0"] & write, p["i_ADA1"] & write) if bits == 18 else
                       write)
        m.submodules.mem = mem = Memory(shape=bits, depth=depth, init=[])
        w, r = mem.write_port(granularity=gran), mem.read_port()
        m.d.comb += [
            w.addr.eq(Cat(*(p[f"i_ADA{k}"] for k in range(low, 14)))),
            w.data.eq(data_in), w.en.eq(enables),
            r.addr.eq(Cat(*(p[f"i_ADB{k}"] for k in range(low, 14)))),
        ]
        outreg = Signal(bits)
        m.d.sync += outreg.eq(r.data)
        if bits == 36:
            m.d.comb += [*(p[f"o_DOA{k}"].eq(outreg[k]) for k in range(18)),
                         *(p[f"o_DOB{k}"].eq(outreg[18 + k]) for k in range(18))]
        else:
            m.d.comb += [p[f"o_DOB{k}"].eq(outreg[k]) for k in range(bits)]
        return m


class _Ecp5:
    family = "ecp5"


class _ModelledBlockRam(BlockRam):
    """BlockRam elaborated as on ECP5, the primitive replaced by :class:`_Dp16kdModel`."""

    @staticmethod
    def _dp16kd(**ports):
        return _Dp16kdModel(ports)

    def elaborate(self, platform):
        return super().elaborate(_Ecp5())


@pytest.mark.parametrize("width,depth", [(36, 512), (64, 512), (73, 512), (19, 1024),
                                         (36, 1000), (10, 2048), (5, 4096), (3, 8192),
                                         (2, 16384)])
def test_ecp5_wiring_reads_the_words_written(width, depth):
    """The ECP5 elaboration's pins (tiles of the mode's bits, addresses, byte enables,
    outputs) on a model of the primitive: the same words, cycle for cycle, as the
    reference memory."""
    _check_random(_ModelledBlockRam(width, depth, (0, 1, 2)), width, depth)
