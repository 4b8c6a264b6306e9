"""cocotb testbench of AckGenerator on the exported Verilog.

Registers and QP contexts are written over AXI4-Lite by cocotbext-axi through the project's
RegisterDriver; descriptors (``desc``), AETH NAK records (``nak``) and EV probe records
(``probe``) are driven at once, each with its own random pauses; every frame is compared byte
for byte with the packet model (mrcnic.model.packet), in the order the block took the
records, decoded by it with the ICRC checked, and parsed by scapy (BTH opcode, dest QP, PSN,
scapy's own ICRC, the AETH).
"""

import random

import cocotb
from scapy.contrib.roce import AETH
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from mrcnic.base import proto
from mrcnic.base.records import ACK_DESC, EV_PROBE, ack_desc_fields, NAK
from mrcnic.rx.ack_generator import ACK_REGS, LATENCY
from mrcnic.model import packet as pk
from mrcnic.model.rx import ack_generator as ack_model
from testkit.tbutil import TB, BeatCounter, long_runs, random_pauses, soak
from testkit.meta import MetaSource
from testkit.scapy_mrc import BTH

# SACK, NACK, AETH NAK, EV answer: written out here, not taken from the block.
FRAME_LEN = {0: 114, 1: 98, 2: 82, 3: 114}
KIND_NAMES = ("SACK", "NACK", "AETH NAK", "EV answer")

COUNTERS = ("sacks", "nacks", "bad_qp", "naks", "answers")

# The context table keeps its contents through reset, so from one test to the next of a run.
CONTEXTS = {}


def random_desc(qps, nack=None):
    d = {name: random.getrandbits(width) for name, width in ack_desc_fields().items()}
    d["qp"] = random.randrange(qps)
    if nack is not None:
        d["nack"] = int(nack)
    return d


def with_bad_qps(records, qps, phase):
    """Every third record from index ``phase`` gets a QP out of range (none when ``qps``
    covers every QP number)."""
    if qps < 1 << 16:
        for r in records[phase::3]:
            r["qp"] = random.randrange(qps, 1 << 16)
    return records


def random_nak(qps):
    r = {name: random.getrandbits(f.width) for name, f in NAK}
    r["qp"] = random.randrange(qps)
    if random.random() < 0.5:
        r["syndrome"] = proto.AETH_SYNDROME_ACCESS_ERROR
    return r


def random_probe(qps):
    r = {name: random.getrandbits(f.width) for name, f in EV_PROBE}
    r["qp"] = random.randrange(qps)
    return r


def random_cfg():
    return {"mac": random.getrandbits(48), "ip": random.getrandbits(128),
            "dport": proto.UDP_DPORT_DEFAULT, "pkey": random.getrandbits(16),
            "dscp": random.getrandbits(6), "ecn": random.getrandbits(2),
            "hop_limit": random.getrandbits(8), "stev_swap": random.getrandbits(1)}


def random_ctx():
    return {"mac": random.getrandbits(48), "ip": random.getrandbits(128),
            "remote_qp": random.getrandbits(24)}


model_frame = ack_model.frame


def kind(item):
    src, rec = item
    return {"nak": 2, "probe": 3}.get(src, rec.get("nack"))


MODEL = {"desc": model_frame, "nak": ack_model.nak_frame, "probe": ack_model.probe_frame}


def check_nak_with_scapy(frame, r, ctx, cfg):
    s = Ether(frame)
    b = s[BTH]
    assert b.opcode == 0xD1 and b.dqpn == ctx["remote_qp"] and b.psn == r["psn"]
    assert b.compute_icrc(b"") == frame[-4:], "scapy's ICRC differs"
    aeth = AETH(bytes(b.payload)[:4])       # scapy binds AETH to IB opcodes, not 0xD1
    assert (aeth.syndrome, aeth.msn) == (r["syndrome"], 0)
    assert s[IPv6].fl == 0 and s[UDP].sport == 0


def check_answer_with_scapy(frame, r, ctx, cfg):
    s = Ether(frame)
    b = s[BTH]
    assert b.opcode == 0xD9 and b.dqpn == proto.ENDPOINT_QP and b.psn == r["psn"]
    assert b.compute_icrc(b"") == frame[-4:], "scapy's ICRC differs"
    sport, flow = proto.stev_split(r["entropy"], cfg["stev_swap"])
    assert s[IPv6].fl == flow and s[UDP].sport == sport


def check_with_scapy(frame, d, ctx, cfg):
    s = Ether(frame)
    b = s[BTH]
    assert b.opcode == (0xDD if d["nack"] else 0xDC)
    assert b.dqpn == ctx["remote_qp"] and b.pkey == cfg["pkey"]
    assert b.psn == (d["psn"] if d["nack"] else d["cack"])
    assert b.compute_icrc(b"") == frame[-4:], "scapy's ICRC differs"
    ip, udp = s[IPv6], s[UDP]
    sport, flow = proto.stev_split(d["entropy"], cfg["stev_swap"])
    assert ip.fl == flow and udp.sport == sport
    assert ip.hlim == cfg["hop_limit"] and ip.tc == cfg["dscp"] << 2 | cfg["ecn"]


class AckTB(TB):
    def __init__(self, dut):
        super().__init__(dut)
        self.B = self.params["data_width"] // 8
        self.qps = self.params["qps"]
        self.sink = self.axis_sink()
        self.desc = MetaSource.cocotb(dut, "desc", [n for n, _ in ACK_DESC], dut.clk)
        self.nak = MetaSource.cocotb(dut, "nak", [n for n, _ in NAK], dut.clk)
        self.probe = MetaSource.cocotb(dut, "probe", [n for n, _ in EV_PROBE], dut.clk)
        self.axil, self.regs = self.registers(ACK_REGS)
        self.out_beats = BeatCounter(dut.clk, dut.m_axis_tvalid, dut.m_axis_tready)
        self.desc_taken = BeatCounter(dut.clk, dut.desc_valid, dut.desc_ready)
        self.nak_taken = BeatCounter(dut.clk, dut.nak_valid, dut.nak_ready)
        self.probe_taken = BeatCounter(dut.clk, dut.probe_valid, dut.probe_ready)
        self.cfg = {"mac": 0, "ip": 0, "dport": proto.UDP_DPORT_DEFAULT,
                    "pkey": proto.PKEY_DEFAULT, "dscp": 0, "ecn": 0, "hop_limit": 64,
                    "stev_swap": 0}
        self.contexts = CONTEXTS

    def beats(self, item):
        return -(-FRAME_LEN[kind(item)] // self.B)

    async def configure(self, cfg):
        r = self.regs
        await r.write_mac("local", cfg["mac"])
        await r.write_ipv6("local", cfg["ip"])
        await r.write_fields("config", udp_dport=cfg["dport"], pkey=cfg["pkey"])
        await r.write_fields("ipv6", dscp=cfg["dscp"], ecn=cfg["ecn"],
                             hop_limit=cfg["hop_limit"], stev_swap=cfg["stev_swap"])
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

    async def run_records(self, descs, naks=(), probes=()):
        """Send ``descs`` on desc, ``naks`` on nak and ``probes`` on probe at once; check the
        frame of each record whose QP is in range, in the order the block took them (at
        most one a cycle). Returns those records as ("desc" | "nak" | "probe", record), in
        that order."""
        inputs = {"desc": (self.desc, self.desc_taken, descs),
                  "nak": (self.nak, self.nak_taken, naks),
                  "probe": (self.probe, self.probe_taken, probes)}
        starts = {name: len(taken.cycles) for name, (_, taken, _) in inputs.items()}
        for src, _, recs in inputs.values():
            for r in recs:
                src.send_nowait(r)
        n_good = sum(x["qp"] < self.qps for x in [*descs, *naks, *probes])
        frames = [bytes((await self.sink.recv()).tdata) for _ in range(n_good)]
        while any(src.queue for src, _, _ in inputs.values()):
            await self.cycles(1)
        await self.cycles(3 * LATENCY)
        assert self.sink.empty(), "a frame more than the records asked for"
        taken = []
        for name, (_, counter, recs) in inputs.items():
            cycles = counter.cycles[starts[name]:starts[name] + len(recs)]
            assert len(cycles) == len(recs)
            taken += [(c, name, r) for c, r in zip(cycles, recs)]
        assert len({c for c, _, _ in taken}) == len(taken), "two records taken in one cycle"
        order = [(src, rec) for _, src, rec in sorted(taken, key=lambda x: x[0])]
        good = [it for it in order if it[1]["qp"] < self.qps]
        check = {"desc": check_with_scapy, "nak": check_nak_with_scapy,
                 "probe": check_answer_with_scapy}
        for i, ((src, rec), got) in enumerate(zip(good, frames)):
            ctx = self.context(rec["qp"])
            want = MODEL[src](rec, ctx, self.cfg)
            name = KIND_NAMES[kind((src, rec))]
            assert got == want, f"frame {i} ({name}) differs from the model"
            pk.decode(got, check_icrc=True, udp_dport=self.cfg["dport"])
            if self.cfg["dport"] == proto.UDP_DPORT_DEFAULT:
                check[src](got, rec, ctx, self.cfg)
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
        tb.nak.set_pause_generator(random_pauses(min(0.9, 2 * idle + 0.3)))
        tb.probe.set_pause_generator(random_pauses(min(0.9, 2 * idle + 0.2)))
        tb.sink.set_pause_generator(random_pauses(bp))
        n = soak(200 if long_runs() else 12)
        descs = [random_desc(tb.qps) for _ in range(n)]
        naks = [random_nak(tb.qps) for _ in range(max(2, n // 3))]
        probes = [random_probe(tb.qps) for _ in range(max(2, n // 3))]
        for d in descs[: n // 2] + naks[: len(naks) // 2] + probes[: len(probes) // 2]:
            d["qp"] = random.choice(list(tb.contexts))
        await tb.run_records(descs, naks, probes)
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
    await tb.run_records(descs)
    out = tb.out_beats.cycles[start_out:]
    taken = tb.desc_taken.cycles[start_in:]
    beats = sum(tb.beats(("desc", d)) for d in descs)
    assert len(out) == beats, f"{len(out)} beats, {beats} expected"
    assert out[-1] - out[0] + 1 == beats, f"{beats} beats took {out[-1] - out[0] + 1} cycles"
    assert out[0] - taken[0] == LATENCY, f"latency {out[0] - taken[0]}"
    tb.log.info("measured: %d frames, %d beats in %d cycles, latency %d", len(descs), beats,
                out[-1] - out[0] + 1, out[0] - taken[0])
    await tb.cycles(5)


@cocotb.test()
async def naks_first_at_line_rate(dut):
    """nak records, probe records and descriptors queued at once, no pauses: every nak
    record is taken before any probe record and those before any descriptor, ceil(82/B)
    beats an AETH NAK, ceil(114/B) an EV answer, no idle cycle between frames, and the
    first AETH NAK's first beat LATENCY cycles after its handshake."""
    tb = AckTB(dut)
    await tb.reset()
    await tb.set_context(3, random_ctx())
    naks = [random_nak(tb.qps) for _ in range(16)]
    descs = [random_desc(tb.qps) for _ in range(8)]
    probes = [random_probe(tb.qps) for _ in range(6)]
    for r in naks[::2] + probes[::2]:
        r["qp"] = 3
    start_out, start_in = len(tb.out_beats.cycles), len(tb.nak_taken.cycles)
    order = await tb.run_records(descs, naks, probes)
    assert [src for src, _ in order] == \
        ["nak"] * len(naks) + ["probe"] * len(probes) + ["desc"] * len(descs)
    out = tb.out_beats.cycles[start_out:]
    taken = tb.nak_taken.cycles[start_in:]
    beats = sum(tb.beats(it) for it in order)
    assert len(out) == beats, f"{len(out)} beats, {beats} expected"
    assert out[-1] - out[0] + 1 == beats, f"{beats} beats took {out[-1] - out[0] + 1} cycles"
    assert out[0] - taken[0] == LATENCY, f"latency {out[0] - taken[0]}"
    tb.log.info("measured: %d AETH NAK + %d EV answer + %d SACK/NACK, %d beats in %d cycles, "
                "latency %d", len(naks), len(probes), len(descs), beats,
                out[-1] - out[0] + 1, out[0] - taken[0])
    await tb.cycles(5)


@cocotb.test()
async def bad_qp_and_counters(dut):
    """A QP index not below qps, on desc, nak or probe: no frame, counted; the frames around
    it are right."""
    tb = AckTB(dut)
    await tb.reset()
    tb.sink.set_pause_generator(random_pauses(0.3))
    assert await tb.regs.read_field("info", "qps") == tb.qps
    await tb.configure(random_cfg())
    await tb.set_context(0, random_ctx())
    await tb.set_context(tb.qps, random_ctx())         # out of range: writes nothing
    descs = with_bad_qps([random_desc(tb.qps) for _ in range(soak(30))], tb.qps, 1)
    naks = with_bad_qps([random_nak(tb.qps) for _ in range(soak(12))], tb.qps, 2)
    probes = with_bad_qps([random_probe(tb.qps) for _ in range(soak(9))], tb.qps, 0)
    good = await tb.run_records(descs, naks, probes)
    kinds = [kind(it) for it in good]
    counts = {n: await tb.regs.read(n) for n in COUNTERS}
    assert counts == {"sacks": kinds.count(0), "nacks": kinds.count(1),
                      "bad_qp": len(descs) + len(naks) + len(probes) - len(good),
                      "naks": kinds.count(2), "answers": kinds.count(3)}, counts
    await tb.regs.write_fields("control", clear=1)
    assert [await tb.regs.read(n) for n in COUNTERS] == [0] * len(COUNTERS)
    await tb.cycles(5)
