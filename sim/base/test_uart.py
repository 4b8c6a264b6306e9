"""UartTx, UartRx and StatusLine: bytes through the line and back (the line decoded
independently in the testbench too), a framing error and an overrun counted, a status
line that reads as its values, and bad parameters refused."""

import pytest
from amaranth.hdl import Module

from mrcnic.base.uart import StatusLine, UartRx, UartTx, divisor_for
from testkit.simtools import run, seeded

DIV = 8


def decode_line(levels, divisor):
    """Bytes from line levels sampled once a cycle (the testbench's own UART)."""
    out, i = [], 0
    while i < len(levels):
        if levels[i] == 0:
            mid = i + divisor // 2
            bits = [levels[mid + divisor * (b + 1)] for b in range(8)]
            stop = levels[mid + 9 * divisor]
            assert stop == 1, f"stop bit low at cycle {mid + 9 * divisor}"
            out.append(sum(b << k for k, b in enumerate(bits)))
            i = mid + 9 * divisor
        else:
            i += 1
    return bytes(out)


def test_bytes_go_through_the_line_and_back():
    rng = seeded()
    data = bytes(rng.getrandbits(8) for _ in range(24))
    m = Module()
    m.submodules.tx, m.submodules.rx = tx, rx = UartTx(DIV), UartRx(DIV)
    m.d.comb += rx.rx.eq(tx.tx)
    got, levels = [], []

    async def bench(ctx):
        queue = list(data)
        for _ in range(12 * DIV * len(data) + 100):
            ctx.set(tx.i.valid, bool(queue) and rng.random() < 0.5)
            if queue:
                ctx.set(tx.i.payload, queue[0])
            ctx.set(rx.o.ready, 1)
            _, _, taken, line, ov, ob = await ctx.tick().sample(
                tx.i.ready, tx.tx, rx.o.valid, rx.o.payload)
            if queue and taken and ctx.get(tx.i.valid):
                queue.pop(0)
            if ov:
                got.append(ob)
            levels.append(line)
        assert ctx.get(rx.errors) == 0 and ctx.get(rx.overruns) == 0

    run(m, bench)
    assert bytes(got) == data
    assert decode_line(levels, DIV) == data


def test_a_framing_error_and_an_overrun_are_counted():
    dut = UartRx(DIV)

    async def send(ctx, byte, stop=1):
        for bit in [0] + [byte >> k & 1 for k in range(8)] + [stop]:
            ctx.set(dut.rx, bit)
            await ctx.tick().repeat(DIV)
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(2 * DIV)

    async def bench(ctx):
        ctx.set(dut.rx, 1)
        ctx.set(dut.o.ready, 0)
        await ctx.tick().repeat(4)
        await send(ctx, 0x5A, stop=0)
        assert ctx.get(dut.errors) == 1 and not ctx.get(dut.o.valid)
        await send(ctx, 0x11)
        await send(ctx, 0x22)                    # the first not taken: overrun
        assert ctx.get(dut.overruns) == 1 and ctx.get(dut.o.payload) == 0x22

    run(dut, bench)


def test_a_status_line_reads_as_its_values():
    dut = StatusLine([("runs", 32), ("err", 16), ("up", 3)], prefix="MRC")
    m = Module()
    tx = UartTx(DIV)
    m.submodules.line, m.submodules.tx = dut, tx
    m.d.comb += [tx.i.payload.eq(dut.o.payload), tx.i.valid.eq(dut.o.valid),
                 dut.o.ready.eq(tx.i.ready)]
    levels = []

    async def bench(ctx):
        ctx.set(dut.v_runs, 0x1234ABCD)
        ctx.set(dut.v_err, 0x00F0)
        ctx.set(dut.v_up, 5)
        ctx.set(dut.trigger, 1)
        await ctx.tick()
        ctx.set(dut.trigger, 0)
        ctx.set(dut.v_runs, 0)                   # latched: the line keeps the old value
        while ctx.get(dut.busy):
            levels.append(ctx.get(tx.tx))
            await ctx.tick()
        for _ in range(12 * DIV):
            levels.append(ctx.get(tx.tx))
            await ctx.tick()

    run(m, bench)
    assert decode_line(levels, DIV) == b"MRC runs=1234ABCD err=00F0 up=5\r\n"


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="divisor"):
        UartTx(2)
    with pytest.raises(ValueError, match="within 2%"):
        divisor_for(300_000)
    assert divisor_for(25_000_000) == 217
    with pytest.raises(ValueError, match="width"):
        StatusLine([("x", 65)])
    with pytest.raises(ValueError, match="name"):
        StatusLine([("not a name", 8)])
