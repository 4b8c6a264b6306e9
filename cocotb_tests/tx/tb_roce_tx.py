"""cocotb testbench of RoceTx on the exported Verilog.

Registers and QP contexts are written over AXI4-Lite by cocotbext-axi through the project's
RegisterDriver; payloads come from cocotbext-axi's AXI-Stream source; every frame is
compared byte for byte with mrcnic.model.tx.roce_tx (the packet model), decoded with its ICRC
checked, and read by scapy (BTH fields and scapy's own ICRC). Probes (opcode 0xDE, no
payload) are mixed into the random descriptors and read back with their PETH.
"""

import random

import cocotb
from cocotbext.axi import AxiStreamFrame
from scapy.layers.l2 import Ether

from mrcnic.base import proto
from mrcnic.model import packet as pk
from mrcnic.model.tx.roce_tx import RoceTxModel
from mrcnic.tx.roce_tx import TX_REGS
from mrcnic.base.records import TX_DESC
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource
from testkit.scapy_mrc import BTH

WRITES = [int(op) for op in proto.Opcode if op.is_write]
COUNTERS = ["frames", "retransmissions", "bad_qp", "bad_opcode", "too_long", "payload"]


PROBE = int(proto.Opcode.PROBE)


def random_desc(qps, max_len=300, probe=False):
    """A random WRITE descriptor, or a probe (length 0; its A, rtx, RETH and ImmDt fields
    random, which the block ignores)."""
    return {"qp": random.randrange(qps), "psn": random.getrandbits(24),
            "opcode": PROBE if probe else random.choice(WRITES),
            "ack_req": random.getrandbits(1),
            "rtx": random.getrandbits(1), "va": random.getrandbits(64),
            "rkey": random.getrandbits(32), "dma_length": random.getrandbits(32),
            "length": 0 if probe else random.randrange(max_len + 1),
            "imm": random.getrandbits(32),
            "rqmsn": random.getrandbits(16), "msn": random.getrandbits(16),
            "entropy": random.getrandbits(32), "ts": random.getrandbits(1),
            "timestamp": random.getrandbits(16)}


def marked_bad(frame):
    """tuser[0] of a received frame's last beat (cocotbext-axi gives an int for a frame of
    one beat, a list otherwise)."""
    u = frame.tuser
    return bool((u[-1] if isinstance(u, list) and u else (u or 0)) & 1)


class TxTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.B = self.params["data_width"] // 8
        self.qps = self.params["qps"]
        self.payload = self.axis_source()
        self.sink = self.axis_sink()
        self.desc = MetaSource.cocotb(dut, "desc", [n for n, _ in TX_DESC], dut.clk)
        self.axil, self.regs = self.registers(TX_REGS)
        self.out_beats = BeatCounter(dut.clk, dut.m_axis_tvalid, dut.m_axis_tready)
        self.desc_taken = BeatCounter(dut.clk, dut.desc_valid, dut.desc_ready)
        self.model = RoceTxModel(self.qps)
        self.probes = 0                  # probe frames checked

    async def configure(self):
        r, regs = self.regs, self.model.regs
        regs.update(local_mac=random.getrandbits(48), local_ip=random.getrandbits(128),
                    pkey=random.getrandbits(16), dscp_data=random.getrandbits(6),
                    dscp_rtx=random.getrandbits(6), ecn=random.getrandbits(2),
                    hop_limit=random.getrandbits(8))
        await r.write_mac("local", regs["local_mac"])
        await r.write_ipv6("local", regs["local_ip"])
        await r.write_fields("config", udp_dport=regs["udp_dport"], pkey=regs["pkey"])
        await r.write_fields("ipv6", dscp_data=regs["dscp_data"], dscp_rtx=regs["dscp_rtx"],
                             ecn=regs["ecn"], hop_limit=regs["hop_limit"])
        for qp in range(self.qps):
            mac, ip, rqp = random.getrandbits(48), random.getrandbits(128), random.getrandbits(24)
            self.model.write_ctx(qp, mac, ip, rqp)
            await r.write("ctx_qp", qp)
            await r.write_mac("ctx", mac)
            await r.write_ipv6("ctx", ip)
            await r.write("ctx_remote_qp", rqp)
            await r.write_fields("control", ctx_write=1)

    async def run_descs(self, descs):
        payloads = [random.randbytes(d["length"]) for d in descs]
        for d, p in zip(descs, payloads):
            self.desc.send_nowait(d)
            if p:
                self.payload.send_nowait(AxiStreamFrame(p))
        for i, (d, p) in enumerate(zip(descs, payloads)):
            got = await self.sink.recv()
            want, causes = self.model.frame(d, p)
            assert not causes and not marked_bad(got), f"frame {i}: {causes}"
            assert bytes(got.tdata) == want, f"frame {i} differs from the model"
            frame = bytes(got.tdata)
            p = pk.decode(frame, check_icrc=True, udp_dport=None)
            if d["opcode"] == PROBE:
                rqp = self.model.ctx.get(d["qp"], (0, 0, 0))[2]
                assert p.peth == {"vendor": 0, "probe_id": d["msn"], "src_id": d["qp"],
                                  "dst_id": rqp & 0xFFFF, "timestamp": d["timestamp"],
                                  "tsr": 0, "type": proto.TSETH_TYPE}, \
                    f"frame {i}: PETH {p.peth}"
                assert (p.bth["ack_req"], p.bth["rtx"], len(frame)) == (0, 0, 94)
                self.probes += 1
            s = Ether(frame)[BTH]
            assert (s.opcode, s.psn) == (d["opcode"], d["psn"])
            assert s.compute_icrc(b"") == frame[-4:], "scapy's ICRC differs"
        while self.desc.queue:
            await self.cycles(1)
        await self.cycles(30)
        assert self.sink.empty(), "a frame more than the descriptors asked for"


@cocotb.test()
async def random_packets_under_stalls(dut):
    """Random descriptors and payloads; random pauses on desc and payload, backpressure."""
    tb = TxTB(dut)
    await tb.reset()
    await tb.configure()
    for idle, bp in [(0.0, 0.0), (0.3, 0.5), (0.6, 0.2)]:
        tb.desc.set_pause_generator(random_pauses(idle))
        tb.payload.set_pause_generator(random_pauses(idle))
        tb.sink.set_pause_generator(random_pauses(bp))
        count = soak(150 if long_runs() else 12)
        # every fourth descriptor a probe: a fixed share, whatever the seed
        await tb.run_descs([random_desc(tb.qps, probe=i % 4 == 1) for i in range(count)])
    counts = {n: await tb.regs.read(n) for n in COUNTERS}
    assert counts["bad_qp"] == counts["bad_opcode"] == counts["payload"] == 0, counts
    assert counts["too_long"] == 0 and tb.probes > 0, (counts, tb.probes)
    tb.log.info("%d probes among the frames", tb.probes)
    await tb.cycles(5)


@cocotb.test()
async def back_to_back_at_line_rate(dut):
    """No pauses: ceil(len/B) beats a frame, no idle cycle between frames."""
    tb = TxTB(dut)
    await tb.reset()
    await tb.configure()             # the context table keeps what the last test wrote
    descs = [random_desc(tb.qps, max_len=1000, probe=i % 4 == 1) for i in range(soak(30))]
    start = len(tb.out_beats.cycles)
    await tb.run_descs(descs)
    out = tb.out_beats.cycles[start:]
    B = tb.B
    beats = sum(-(-(len(tb.model.frame(d, bytes(d["length"]))[0])) // B) for d in descs)
    assert len(out) == beats, f"{len(out)} beats, {beats} expected"
    assert out[-1] - out[0] + 1 == beats, f"{beats} beats took {out[-1] - out[0] + 1} cycles"
    tb.log.info("measured: %d frames, %d beats in %d cycles", len(descs), beats,
                out[-1] - out[0] + 1)
    await tb.cycles(5)


@cocotb.test()
async def bad_input_is_marked_and_counted(dut):
    """A QP out of range, a non-WRITE opcode, a short and a long payload, a payload marked
    bad, a probe with a length (no payload frame sent for it): each frame leaves with tuser
    set, is counted, and the next frame is right."""
    tb = TxTB(dut)
    await tb.reset()
    await tb.configure()
    await tb.regs.write_fields("control", clear=1)
    tb.sink.set_pause_generator(random_pauses(0.3))
    cases = ["qp", "opcode", "short", "long", "tuser", "probe_length"]
    for case in cases:
        d = random_desc(tb.qps, max_len=120)
        d["length"] = random.randrange(9, 120)
        pay = random.randbytes(d["length"])
        user = 0
        if case == "qp":
            d["qp"] = tb.qps + random.randrange(4)
        elif case == "opcode":
            d["opcode"] = int(proto.Opcode.SACK)
        elif case == "short":
            pay = pay[:d["length"] - random.randrange(1, 9)]
        elif case == "long":
            pay = pay + random.randbytes(random.randrange(1, 20))
        elif case == "tuser":
            user = 1
        else:
            d["opcode"] = PROBE
        good = random_desc(tb.qps, max_len=60)
        good_pay = random.randbytes(good["length"])
        tb.desc.send_nowait(d)
        if case != "probe_length":          # a probe takes no payload frame
            tb.payload.send_nowait(AxiStreamFrame(pay, tuser=user))
        tb.desc.send_nowait(good)
        if good_pay:
            tb.payload.send_nowait(AxiStreamFrame(good_pay))
        bad_frame = await tb.sink.recv()
        assert marked_bad(bad_frame), f"{case}: not marked bad"
        if case == "probe_length":
            want, causes = tb.model.frame(d, b"")
            assert causes == {"too_long"} and bytes(bad_frame.tdata) == want
        got = await tb.sink.recv()
        want, _ = tb.model.frame(good, good_pay)
        assert bytes(got.tdata) == want and not marked_bad(got), f"after {case}"
    counts = {n: await tb.regs.read(n) for n in COUNTERS}
    assert counts["frames"] == 2 * len(cases)
    assert (counts["bad_qp"], counts["bad_opcode"], counts["payload"],
            counts["too_long"]) == (1, 1, 3, 1), counts
    await tb.cycles(5)
