"""cocotb testbench of ReorderBuffer on the exported Verilog: random PSN orders within the
window with loss and skips, duplicates, late, out-of-window, bad and too-long packets, under
random pauses and backpressure, checked against mrcnic.model.rx.reorder_buffer; registers read over
AXI4-Lite by cocotbext-axi."""

import random

import cocotb
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiStreamFrame

from mrcnic.model.rx.reorder_buffer import COUNTERS, ReorderModel, random_traffic, wait_for
from mrcnic.base.proto import psn_add
from mrcnic.rx.reorder_buffer import REORDER_REGS
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource, MetaSink


class ReorderTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.B = self.params["data_width"] // 8
        self.depth = self.params["depth"]
        self.max_packet = self.params["max_packet"]
        self.source, self.sink = self.axis_source(), self.axis_sink()
        self.psn_in = MetaSource.cocotb(dut, "s_psn", ["psn"], dut.clk)
        self.skips = MetaSource.cocotb(dut, "skip", ["psn"], dut.clk)
        self.psn_out = MetaSink.cocotb(dut, "m_psn", ["psn"], dut.clk)
        self.axil, self.regs = self.registers(REORDER_REGS)
        self.in_beats = BeatCounter(dut.clk, dut.s_axis_tvalid, dut.s_axis_tready)
        self.out_beats = BeatCounter(dut.clk, dut.m_axis_tvalid, dut.m_axis_tready)
        self.frames = []
        cocotb.start_soon(self._collect())

    async def _collect(self):
        while True:
            self.frames.append(await self.sink.recv())

    def stalls(self, idle, backpressure):
        self.source.set_pause_generator(random_pauses(idle))
        self.psn_in.set_pause_generator(random_pauses(idle))
        self.skips.set_pause_generator(random_pauses(idle))
        self.sink.set_pause_generator(random_pauses(backpressure))
        self.psn_out.set_pause_generator(random_pauses(backpressure / 2))

    async def restart(self, psn):
        """Start a run: counters zeroed, buffer emptied, ``psn`` expected next."""
        await self.regs.write_fields("expected", psn=psn)
        await self.regs.write_fields("control", restart=1, clear=1)
        await self.cycles(2)
        assert await self.regs.read("next_psn") == psn
        assert await self.regs.read("occupancy") == 0

    async def until(self, done, what, limit=20_000):
        """Wait for ``done()``; fail with ``what`` after ``limit`` cycles (a lost packet
        would otherwise hang the test)."""
        for _ in range(limit):
            if done():
                return
            await RisingEdge(self.dut.clk)
        raise AssertionError(f"{what}: nothing after {limit} cycles; {len(self.frames)} "
                             f"packets out, next_psn {await self.regs.read('next_psn'):#x}")

    async def run_items(self, items):
        """Packets and skips in order (see ``random_traffic`` for the waits; its counts start
        with the packets out when this is called)."""
        first = len(self.frames)
        for i, item in enumerate(items):
            if item[0] == "skip":
                sent = self.skips.sent
                self.skips.send_nowait({"psn": item[1]})
                await self.until(lambda: self.skips.sent > sent,
                                 f"item {i}: skip {item[1]:#x} not taken")
                continue
            _, psn, data, bad, _, need = item
            await self.until(lambda: len(self.frames) - first >= need,
                             f"item {i}: packet {psn:#x} waits for {need} packets out")
            self.psn_in.send_nowait({"psn": psn})
            tuser = [0] * (len(data) - 1) + [int(bad)]
            await self.source.send(AxiStreamFrame(data, tuser=tuser))
            await self.source.wait()

    async def check(self, model, first_frame=0, first_record=0):
        want = model.release()
        await self.until(lambda: (len(self.frames) >= first_frame + len(want) and
                                  len(self.psn_out.records) >= first_record + len(want)),
                         f"{len(want)} packets expected since packet {first_frame}")
        got = self.frames[first_frame:]
        assert len(got) == len(want), f"{len(got)} packets out, model {len(want)}"
        for i, (frame, (psn, data)) in enumerate(zip(got, want)):
            assert bytes(frame.tdata) == data, f"packet {i} (PSN {psn:#x}) differs"
            user = frame.tuser if isinstance(frame.tuser, list) else [frame.tuser]
            assert not any(user), f"packet {i}: tuser set"
        recs = [r["psn"] for r in self.psn_out.records[first_record:]]
        assert recs == [p for p, _ in want], "m_psn records out of order"
        await self.cycles(6)
        for name in COUNTERS:
            value = await self.regs.read(name)
            assert value == model.counters[name], f"{name}: {value}, model {model.counters[name]}"
        assert await self.regs.read("next_psn") == model.expected
        assert await self.regs.read("occupancy") == model.occupancy


@cocotb.test(timeout_time=20, timeout_unit="ms")
async def random_orders_under_stalls(dut):
    tb = ReorderTB(dut)
    await tb.reset()
    rng = random.Random(random.getrandbits(64))
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.6, 0.2)]:
        tb.stalls(idle, bp)
        start = rng.choice([0xFFFFF0, 0x7FFFF8, rng.randrange(1 << 24)])
        await tb.restart(start)
        model = ReorderModel(tb.depth, tb.max_packet, start)
        items = random_traffic(rng, model, soak(300 if long_runs() else 40),
                               beat_bytes=tb.B)
        first_frame, first_record = len(tb.frames), len(tb.psn_out.records)
        await tb.run_items(items)
        await tb.check(model, first_frame, first_record)
        tb.log.info("idle %.1f, backpressure %.1f: %s", idle, bp, model.counters)
    await tb.cycles(10)


@cocotb.test(timeout_time=5, timeout_unit="ms")
async def held_packets_leave_back_to_back(dut):
    """depth packets of 1 to 3 beats, all but the expected one first (in reverse order):
    once it arrives they all leave at one beat a cycle, no idle cycle between packets; the
    first leaves 4 cycles after the expected packet's last beat went in."""
    tb = ReorderTB(dut)
    await tb.reset()
    rng = random.Random(random.getrandbits(64))
    start = 0xFFFFFF - tb.depth // 2
    await tb.restart(start)
    model = ReorderModel(tb.depth, tb.max_packet, start)
    items = []
    for off in list(range(tb.depth - 1, 0, -1)) + [0]:
        psn = psn_add(start, off)
        data = rng.randbytes(rng.randint(1, min(3 * tb.B, tb.max_packet)))
        items.append(("packet", psn, data, False, model.packet(psn, data), 0))
    beats = sum(-(-len(it[2]) // tb.B) for it in items)
    in_beats = tb.in_beats
    mark = len(tb.out_beats.cycles)
    await tb.run_items(items)
    await tb.check(model)
    c = tb.out_beats.cycles[mark:]
    assert len(c) == beats and c[-1] - c[0] + 1 == beats, \
        f"{beats} beats left in {c[-1] - c[0] + 1} cycles"
    assert c[0] - in_beats.cycles[-1] == 4, "latency"
    tb.log.info("measured: %d packets, %d beats left in %d cycles; latency %d cycles",
                tb.depth, beats, c[-1] - c[0] + 1, c[0] - in_beats.cycles[-1])
    await tb.cycles(10)


@cocotb.test(timeout_time=5, timeout_unit="ms")
async def skips_bad_packets_and_registers(dut):
    tb = ReorderTB(dut)
    await tb.reset()
    rng = random.Random(random.getrandbits(64))
    tb.stalls(0.2, 0.3)
    start = 0xFFFFFE
    await tb.restart(start)
    model = ReorderModel(tb.depth, tb.max_packet, start)
    items = []

    def pkt(off, n, bad=False):
        psn, data = psn_add(start, off), rng.randbytes(n)
        need = wait_for(model, psn, n, bad)
        items.append(("packet", psn, data, bad, model.packet(psn, data, bad), need))

    def skip(off):
        psn = psn_add(start, off)
        items.append(("skip", psn, model.skip(psn)))

    pkt(2, 3 * tb.B)
    skip(1)                                     # ignored: start is expected
    skip(0)
    pkt(0, 7)                                   # late: duplicate
    pkt(1, tb.max_packet + 1)                   # too long
    pkt(1, tb.B, bad=True)                      # bad
    pkt(1, tb.max_packet)                       # 1 and 2 leave
    pkt(tb.depth + 3, 5)                        # out of window
    pkt(2, 9)                                   # duplicate
    pkt(4, 11)                                  # held
    await tb.run_items(items)
    assert model.counters == {"packets_in": 8, "released": 2, "duplicates": 2,
                              "out_of_window": 1, "too_long": 1, "bad": 1, "skipped": 1,
                              "skip_ignored": 1}
    await tb.check(model)
    assert model.occupancy == 1
    await tb.regs.write_fields("control", clear=1)
    assert await tb.regs.read("packets_in") == 0
    await tb.cycles(10)
