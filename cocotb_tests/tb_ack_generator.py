"""cocotb testbench of AckGenerator on the exported Verilog.

Registers and QP contexts are written over AXI4-Lite by cocotbext-axi through the project's
RegisterDriver; every frame is compared byte for byte with the packet model
(mrcnic.model.packet), decoded by it with the ICRC checked, and parsed by scapy (BTH
opcode, dest QP, PSN and scapy's own ICRC).
"""

import random

import cocotb
from scapy.contrib.roce import BTH
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from mrcnic import proto
from mrcnic.ack_desc import ACK_DESC, ack_desc_fields
from mrcnic.ack_generator import ACK_REGS, LATENCY
from mrcnic.model import ack_generator as ack_model
from mrcnic.model import packet as pk
from tbutil import TB, BeatCounter, MetaSource, long_runs, random_pauses, soak

FRAME_LEN = {0: 114, 1: 98}          # SACK, NACK: written out here, not taken from the block

# The context table keeps its contents through reset, so from one test to the next of a run.
CONTEXTS = {}


def random_desc(qps, nack=None):
    d = {name: random.getrandbits(width) for name, width in ack_desc_fields().items()}
    d["qp"] = random.randrange(qps)
    if nack is not None:
        d["nack"] = int(nack)
    return d


def random_cfg():
    return {"mac": random.getrandbits(48), "ip": random.getrandbits(128),
            "dport": proto.UDP_DPORT_DEFAULT, "pkey": random.getrandbits(16),
            "dscp": random.getrandbits(6), "ecn": random.getrandbits(2),
            "hop_limit": random.getrandbits(8)}


def random_ctx():
    return {"mac": random.getrandbits(48), "ip": random.getrandbits(128),
            "remote_qp": random.getrandbits(24)}


model_frame = ack_model.frame


def check_with_scapy(frame, d, ctx, cfg):
    s = Ether(frame)
    b = s[BTH]
    assert b.opcode == (0xDD if d["nack"] else 0xDC)
    assert b.dqpn == ctx["remote_qp"] and b.pkey == cfg["pkey"]
    assert b.psn == (d["psn"] if d["nack"] else d["cack"])
    assert b.compute_icrc(b"") == frame[-4:], "scapy's ICRC differs"
    ip, udp = s[IPv6], s[UDP]
    assert ip.fl == d["entropy"] >> 16 and udp.sport == d["entropy"] & 0xFFFF
    assert ip.hlim == cfg["hop_limit"] and ip.tc == cfg["dscp"] << 2 | cfg["ecn"]


class AckTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.B = self.params["data_width"] // 8
        self.qps = self.params["qps"]
        self.sink = self.axis_sink()
        self.desc = MetaSource(dut, "desc", [n for n, _ in ACK_DESC], dut.clk)
        self.axil, self.regs = self.registers(ACK_REGS)
        self.out_beats = BeatCounter(dut.clk, dut.m_axis_tvalid, dut.m_axis_tready)
        self.desc_taken = BeatCounter(dut.clk, dut.desc_valid, dut.desc_ready)
        self.cfg = {"mac": 0, "ip": 0, "dport": proto.UDP_DPORT_DEFAULT,
                    "pkey": proto.PKEY_DEFAULT, "dscp": 0, "ecn": 0, "hop_limit": 64}
        self.contexts = CONTEXTS

    def beats(self, d):
        return -(-FRAME_LEN[d["nack"]] // self.B)

    async def configure(self, cfg):
        r = self.regs
        await r.write_mac("local", cfg["mac"])
        await r.write_ipv6("local", cfg["ip"])
        await r.write_fields("config", udp_dport=cfg["dport"], pkey=cfg["pkey"])
        await r.write_fields("ipv6", dscp=cfg["dscp"], ecn=cfg["ecn"],
                             hop_limit=cfg["hop_limit"])
        while await r.read_field("status", "cfg_pending"):
            pass
        self.cfg = dict(cfg)

    async def set_context(self, qp, ctx):
        r = self.regs
        await r.write("ctx_qp", qp)
        await r.write_mac("ctx", ctx["mac"])
        await r.write_ipv6("ctx", ctx["ip"])
        await r.write("ctx_remote_qp", ctx["remote_qp"])
        await r.write_fields("control", ctx_write=1)
        while await r.read_field("status", "ctx_busy"):
            pass
        if qp < self.qps:
            self.contexts[qp] = dict(ctx)

    def context(self, qp):
        return self.contexts.get(qp, {"mac": 0, "ip": 0, "remote_qp": 0})

    async def run_descs(self, descs):
        """Send ``descs``; check the frame of each one whose QP is in range."""
        for d in descs:
            self.desc.send_nowait(d)
        good = [d for d in descs if d["qp"] < self.qps]
        for i, d in enumerate(good):
            got = bytes((await self.sink.recv()).tdata)
            ctx = self.context(d["qp"])
            want = model_frame(d, ctx, self.cfg)
            assert got == want, f"frame {i} ({'NACK' if d['nack'] else 'SACK'}) differs " \
                                f"from the model"
            pk.decode(got, check_icrc=True, udp_dport=self.cfg["dport"])
            if self.cfg["dport"] == proto.UDP_DPORT_DEFAULT:
                check_with_scapy(got, d, ctx, self.cfg)
        while self.desc.queue:
            await self.cycles(1)
        await self.cycles(3 * LATENCY)
        assert self.sink.empty(), "a frame more than the descriptors asked for"
        return good


@cocotb.test()
async def random_descriptors_under_stalls(dut):
    """Random descriptors and contexts; random pauses on desc, backpressure on m_axis."""
    tb = AckTB(dut)
    await tb.reset()
    await tb.configure(random_cfg())
    for qp in random.sample(range(tb.qps), min(tb.qps, 12)):
        await tb.set_context(qp, random_ctx())
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.6, 0.2)]:
        tb.desc.set_pause_generator(random_pauses(idle))
        tb.sink.set_pause_generator(random_pauses(bp))
        n = soak(200 if long_runs() else 12)
        descs = [random_desc(tb.qps) for _ in range(n)]
        for d in descs[: n // 2]:
            d["qp"] = random.choice(list(tb.contexts))
        await tb.run_descs(descs)
    await tb.cycles(5)


@cocotb.test()
async def back_to_back_at_line_rate(dut):
    """No pauses: ceil(114/B) beats a SACK, ceil(98/B) a NACK, no idle cycle between frames;
    the first beat LATENCY cycles after the first descriptor's handshake."""
    tb = AckTB(dut)
    await tb.reset()
    await tb.set_context(3, random_ctx())
    descs = [random_desc(tb.qps, nack=random.getrandbits(1)) for _ in range(40)]
    for d in descs[::2]:
        d["qp"] = 3
    start_out, start_in = len(tb.out_beats.cycles), len(tb.desc_taken.cycles)
    await tb.run_descs(descs)
    out = tb.out_beats.cycles[start_out:]
    taken = tb.desc_taken.cycles[start_in:]
    beats = sum(tb.beats(d) for d in descs)
    assert len(out) == beats, f"{len(out)} beats, {beats} expected"
    assert out[-1] - out[0] + 1 == beats, f"{beats} beats took {out[-1] - out[0] + 1} cycles"
    assert out[0] - taken[0] == LATENCY, f"latency {out[0] - taken[0]}"
    tb.log.info("measured: %d frames, %d beats in %d cycles, latency %d", len(descs), beats,
                out[-1] - out[0] + 1, out[0] - taken[0])
    await tb.cycles(5)


@cocotb.test()
async def bad_qp_and_counters(dut):
    """A QP index not below qps: no frame, counted; the frames around it are right."""
    tb = AckTB(dut)
    await tb.reset()
    tb.sink.set_pause_generator(random_pauses(0.3))
    assert await tb.regs.read_field("info", "qps") == tb.qps
    await tb.configure(random_cfg())
    await tb.set_context(0, random_ctx())
    await tb.set_context(tb.qps, random_ctx())         # out of range: writes nothing
    descs = []
    for i in range(soak(30)):
        d = random_desc(tb.qps)
        if i % 3 == 1 and tb.qps < 1 << 16:
            d["qp"] = random.randrange(tb.qps, 1 << 16)
        descs.append(d)
    good = await tb.run_descs(descs)
    nacks = sum(d["nack"] for d in good)
    counts = {n: await tb.regs.read(n) for n in ("sacks", "nacks", "bad_qp")}
    assert counts == {"sacks": len(good) - nacks, "nacks": nacks,
                      "bad_qp": len(descs) - len(good)}, counts
    await tb.regs.write_fields("control", clear=1)
    assert [await tb.regs.read(n) for n in ("sacks", "nacks", "bad_qp")] == [0, 0, 0]
    await tb.cycles(5)
