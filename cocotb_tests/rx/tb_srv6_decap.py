"""cocotb testbench of Srv6Decap on the exported Verilog: frames as the fabric delivers them
(SRv6-encapsulated by the reference model, SRH End done), checked against the model, the
inner frame decoded by the packet model and by scapy."""

import random

import cocotb
from cocotbext.axi import AxiStreamFrame
from cocotb.triggers import RisingEdge
from scapy.layers.l2 import Ether

from mrcnic.model import packet as pk, srv6 as model
from mrcnic.base.proto import EvMode
from mrcnic.rx.srv6_decap import DECAP_REGS
from mrcnic.base.records import DECAP_META
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSink
from testkit.scapy_mrc import BTH

KINDS = [EvMode.PASS, EvMode.SRV6, EvMode.SRV6_SRH]


def delivered(kind, max_payload=300, exact=None):
    rng = random.Random(random.getrandbits(64))
    if exact is None:
        frame = pk.encode(pk.rng_packet(rng, encap="none", max_payload=max_payload))
    else:
        frame = pk.encode(pk.write_packet(0xCA, 1, 2, 0x1000, 7, exact, rng.randbytes(exact)))
    desc = {"mode": int(kind), "ev": rng.getrandbits(256), "entropy": rng.getrandbits(32),
            "outer_src": rng.getrandbits(128), "dscp": rng.getrandbits(6),
            "ecn": rng.getrandbits(2), "hop_limit": rng.getrandbits(8)}
    return model.srh_end(model.encap(frame, desc)[0])


class DecapTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.B = self.params["data_width"] // 8
        self.source, self.sink = self.axis_source(), self.axis_sink()
        self.meta = MetaSink.cocotb(dut, "meta", [n for n, _ in DECAP_META], dut.clk)
        self.axil, self.regs = self.registers(DECAP_REGS)
        self.in_beats = BeatCounter(dut.clk, dut.s_axis_tvalid, dut.s_axis_tready)

    async def run_frames(self, frames, users=None):
        users = users or [0] * len(frames)
        start = len(self.meta.records)
        for frame, user in zip(frames, users):
            await self.source.send(AxiStreamFrame(frame, tuser=user))
        for i, (frame, user) in enumerate(zip(frames, users)):
            got = await self.sink.recv()
            bad = bool(got.tuser[-1] if isinstance(got.tuser, list) else got.tuser)
            want, want_bad, causes, want_meta = model.decap(frame, in_bad=user)
            assert bad == want_bad, f"frame {i}: bad={bad}, model {causes}"
            assert len(got.tdata) == len(want), f"frame {i}: length"
            while len(self.meta.records) <= start + i:
                await RisingEdge(self.dut.clk)
            meta = self.meta.records[start + i]
            assert meta["bad"] == int(want_bad)
            if not want_bad:
                assert bytes(got.tdata) == want, f"frame {i} differs from the model"
                assert meta == want_meta, f"frame {i}: meta {meta} != {want_meta}"
                if want[12:14] != b"\x86\xdd":
                    continue                                 # not RoCEv2: passed as it is
                pk.decode(bytes(got.tdata))                  # ICRC verified
                sc = Ether(bytes(got.tdata))
                assert sc[BTH].icrc == BTH(bytes(sc[BTH])).icrc
                assert bytes(sc) == bytes(got.tdata)


@cocotb.test()
async def strip_under_random_stalls(dut):
    tb = DecapTB(dut)
    await tb.reset()
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.6, 0.2)]:
        tb.source.set_pause_generator(random_pauses(idle))
        tb.sink.set_pause_generator(random_pauses(bp))
        tb.meta.pause = random_pauses(bp / 2)
        n = soak(250 if long_runs() else 15)
        await tb.run_frames([delivered(KINDS[i % 3], random.choice([0, 40, 1500]))
                             for i in range(n)])
    await tb.cycles(5)


@cocotb.test()
async def one_input_beat_per_cycle(dut):
    """Frames back to back, 60 to 9000 bytes: the input never waits."""
    tb = DecapTB(dut)
    await tb.reset()
    lengths = [0, 4, 20, 100, 500, 1500, 4000, 8900, 0, 1, 2] if long_runs() else \
        [0, 4, 20, 1500, 0, 1, 2]
    frames = [delivered(KINDS[i % 3], exact=n) for i, n in enumerate(lengths)]
    frames.insert(1, random.randbytes(60))
    start = len(tb.in_beats.cycles)
    await tb.run_frames(frames)
    c = tb.in_beats.cycles[start:]
    beats = sum(-(-len(f) // tb.B) for f in frames)
    assert len(c) == beats and c[-1] - c[0] + 1 == beats, \
        f"{beats} input beats took {c[-1] - c[0] + 1} cycles"
    tb.log.info("measured: %d frames (%d..%d bytes), %d input beats in %d cycles",
                len(frames), min(map(len, frames)), max(map(len, frames)), beats,
                c[-1] - c[0] + 1)
    await tb.cycles(5)


@cocotb.test()
async def bad_frames_and_counters(dut):
    tb = DecapTB(dut)
    await tb.reset()
    good = delivered(EvMode.SRV6_SRH)
    f = bytearray(delivered(EvMode.SRV6_SRH)); f[54 + 3] = 1
    frames = [bytes(f), good, delivered(EvMode.SRV6)[:70], good,
              delivered(EvMode.SRV6) + b"\0" * 4, good]
    await tb.run_frames(frames, [0, 0, 0, 0, 0, 1])
    counts = {n: await tb.regs.read(n) for n in ("frames", "stripped", "srh", "truncated",
                                                 "length", "in_bad")}
    assert counts == {"frames": 6, "stripped": 6, "srh": 1, "truncated": 1, "length": 1,
                      "in_bad": 1}, counts
    await tb.regs.write_fields("config", srh_any_left=1)
    frames = [bytes(f)]
    got = None
    await tb.source.send(AxiStreamFrame(bytes(f)))
    got = await tb.sink.recv()
    assert not (got.tuser[-1] if isinstance(got.tuser, list) else got.tuser)
    await tb.regs.write_fields("control", clear=1)
    assert await tb.regs.read("frames") == 0
    await tb.cycles(5)
