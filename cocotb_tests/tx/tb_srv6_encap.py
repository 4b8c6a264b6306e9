"""cocotb testbench of Srv6Encap on the exported Verilog.

Every output frame is checked against the reference model (mrcnic.model.srv6), decoded by the
packet model with its ICRC verified, and parsed by scapy, field by field.
"""

import random

import cocotb
from cocotbext.axi import AxiStreamFrame
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether

from mrcnic.base import proto
from mrcnic.model import packet as pk, srv6 as model
from mrcnic.base.proto import EvMode
from mrcnic.tx.srv6_encap import ENCAP_DESC, ENCAP_REGS, INSERT_LEN
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource


def random_desc(mode):
    return {"mode": int(mode), "ev": random.getrandbits(256),
            "entropy": random.getrandbits(32), "outer_src": random.getrandbits(128),
            "dscp": random.getrandbits(6), "ecn": random.getrandbits(2),
            "hop_limit": random.getrandbits(8)}


def random_frame(max_payload):
    rng = random.Random(random.getrandbits(64))
    return pk.encode(pk.rng_packet(rng, encap="none", max_payload=max_payload))


class EncapTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.B = self.params["data_width"] // 8
        self.source, self.sink = self.axis_source(), self.axis_sink()
        self.desc = MetaSource.cocotb(dut, "desc", [n for n, _ in ENCAP_DESC], dut.clk)
        self.axil, self.regs = self.registers(ENCAP_REGS)
        self.out_beats = BeatCounter(dut.clk, dut.m_axis_tvalid, dut.m_axis_tready)
        self.udp_dport = proto.UDP_DPORT_DEFAULT

    def set_idle_generator(self, gen):
        self.source.set_pause_generator(gen)
        self.desc.set_pause_generator(random_pauses(0.3))

    def set_backpressure_generator(self, gen):
        self.sink.set_pause_generator(gen)

    async def run_frames(self, frames, descs, users=None):
        users = users or [0] * len(frames)
        for frame, desc, user in zip(frames, descs, users):
            self.desc.send_nowait(desc)
            await self.source.send(AxiStreamFrame(frame, tuser=user))
        results = []
        for i, (frame, desc, user) in enumerate(zip(frames, descs, users)):
            got = await self.sink.recv()
            bad = bool(got.tuser[-1] if isinstance(got.tuser, list) else got.tuser)
            want, want_bad, causes = model.encap(frame, desc, in_bad=user,
                                                 udp_dport=self.udp_dport)
            name = EvMode(desc["mode"]).name
            assert bad == want_bad, f"frame {i} ({name}): bad={bad}, model {causes}"
            if not want_bad:
                assert bytes(got.tdata) == want, f"frame {i} ({name}) differs from the model"
                check_with_packet_model_and_scapy(bytes(got.tdata), frame, desc)
            results.append((bytes(got.tdata), bad))
        return results


def check_with_packet_model_and_scapy(got, frame, desc):
    mode = EvMode(desc["mode"])
    if mode == EvMode.PASS:
        assert got == frame
        return
    pkt = pk.decode(got)                           # verifies the ICRC
    port, flow = model.entropy_of(desc)
    sc = Ether(got)
    if mode in (EvMode.SRV6, EvMode.SRV6_SRH):
        outer = sc[IPv6]
        assert int.from_bytes(bytes(outer)[24:40], "big") == desc["ev"] >> 128
        assert int.from_bytes(bytes(outer)[8:24], "big") == desc["outer_src"]
        assert outer.tc == desc["dscp"] << 2 | desc["ecn"]
        assert outer.hlim == desc["hop_limit"] and outer.fl == flow
        assert outer.plen == pkt.ip["payload_length"] + INSERT_LEN[mode]
        if mode == EvMode.SRV6_SRH:
            srh = sc[IPv6ExtHdrSegmentRouting]
            assert outer.nh == 43 and srh.nh == 41 and srh.segleft == 1 and srh.type == 4
            assert int.from_bytes(bytes(srh)[8:24], "big") == desc["ev"] & ((1 << 128) - 1)
        else:
            assert outer.nh == 41
        inner = sc[IPv6].payload if mode == EvMode.SRV6 else sc[IPv6ExtHdrSegmentRouting].payload
    else:
        inner = sc[IPv6]
    assert inner.sport == port and pkt.udp["src_port"] == port
    if mode != EvMode.UDP:
        assert inner.fl == flow == pkt.ip["flow_label"]


@cocotb.test()
async def modes_under_random_stalls(dut):
    """Every mode, seeded random idle and backpressure, checked frame by frame."""
    tb = EncapTB(dut)
    await tb.reset()
    modes = list(EvMode)
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.6, 0.2)]:
        tb.set_idle_generator(random_pauses(idle))
        tb.set_backpressure_generator(random_pauses(bp))
        n = soak(250 if long_runs() else 15)
        frames = [random_frame(random.choice([0, 32, 300, 1500])) for _ in range(n)]
        descs = [random_desc(modes[i % len(modes)]) for i in range(n)]
        await tb.run_frames(frames, descs)
    await tb.cycles(5)


@cocotb.test()
async def line_rate_without_gaps(dut):
    """No backpressure: ceil((L+H)/B) beats per frame, no idle cycle between frames, L from
    60 to 9000 bytes."""
    tb = EncapTB(dut)
    await tb.reset()
    for mode in (EvMode.PASS, EvMode.STEV, EvMode.SRV6, EvMode.SRV6_SRH):
        lengths = [0, 4, 20, 100, 500, 1000, 4000, 8900] if long_runs() else [0, 20, 1500]
        frames = [random_frame(0) for _ in range(4)]
        frames += [pk.encode(pk.write_packet(proto.Opcode.WRITE_ONLY, 1, i, 0x1000, 7, n,
                                             bytes(random.randbytes(n))))
                   for i, n in enumerate(lengths)]
        if mode == EvMode.PASS:
            frames.insert(1, random.randbytes(60))     # the shortest Ethernet frame
        descs = [random_desc(mode) for _ in frames]
        start = len(tb.out_beats.cycles)
        await tb.run_frames(frames, descs)
        cycles = tb.out_beats.cycles[start:]
        beats = sum(-(-(len(f) + INSERT_LEN[mode]) // tb.B) for f in frames)
        assert len(cycles) == beats, f"{mode.name}: {len(cycles)} beats, {beats} expected"
        assert cycles[-1] - cycles[0] + 1 == beats, \
            f"{mode.name}: {beats} beats took {cycles[-1] - cycles[0] + 1} cycles"
        tb.log.info("measured %s: %d frames (%d..%d bytes), %d beats in %d cycles",
                    mode.name, len(frames), min(map(len, frames)), max(map(len, frames)),
                    beats, cycles[-1] - cycles[0] + 1)
    await tb.cycles(5)


@cocotb.test()
async def registers_and_bad_frames(dut):
    """Counters per cause; udp_dport and clear through the AXI4-Lite registers."""
    tb = EncapTB(dut)
    await tb.reset()
    tb.set_backpressure_generator(random_pauses(0.3))
    good = random_frame(200)
    short = random_frame(0)[:50]
    longer = random_frame(40) + b"\0" * 16
    frames = [good, short, good, longer, good, good]
    descs = [random_desc(EvMode.SRV6_SRH) for _ in frames]
    users = [0, 0, 0, 0, 1, 0]
    await tb.run_frames(frames, descs, users)
    counts = {n: await tb.regs.read(n) for n in ("frames", "in_bad", "truncated", "length",
                                                 "not_roce")}
    assert counts == {"frames": 6, "in_bad": 1, "truncated": 1, "length": 1, "not_roce": 0}, \
        counts
    assert await tb.regs.read("bytes") == sum(len(f) for f in frames)
    await tb.regs.write_fields("config", udp_dport=4791)      # RoCEv2's: the frames miss it
    tb.udp_dport = 4791
    await tb.run_frames([good, good], [random_desc(EvMode.STEV), random_desc(EvMode.PASS)])
    assert await tb.regs.read("not_roce") == 1
    await tb.regs.write_fields("control", clear=1)
    assert await tb.regs.read("frames") == 0
    await tb.cycles(5)
