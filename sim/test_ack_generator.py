"""AckGenerator on Amaranth's simulator: every frame against mrcnic.model.packet (byte for
byte, and decoded with its ICRC checked), beat counts, latency, bad QPs, registers changed
under traffic, and scapy as a second reference."""

import shutil
import struct
import subprocess

import pytest
from amaranth.hdl import Module, Signal
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import UDP as ScapyUDP
from scapy.layers.inet6 import IPv6 as ScapyIPv6
from scapy.layers.l2 import Ether

from mrcnic import proto
from mrcnic.proto import BTH, CC_STATE, ETH, IPV6, NETH, SETH, UDP
from mrcnic.ack_desc import ack_desc_fields
from mrcnic.ack_generator import (ACK_REGS, FRAME_LEN, HOP_LIMIT_DEFAULT, LATENCY, VARIABLES,
                                  AckGenerator, affine_icrc)
from mrcnic.csr import RegisterDriver
from mrcnic.pcap import write_pcap
from mrcnic.model import ack_generator as ack_model
from mrcnic.model import packet as pk
from axil import AxiLiteSimMaster
from simtools import run, seeded, soak
from streams import AxisSink, MetaSource, gated, handshake_watcher

WIDTHS = [64, 128, 256, 512, 2048]


# --- Stimulus and the reference ------------------------------------------------------------

def random_desc(rng, qps, nack=None):
    """A descriptor with every field random (qp below ``qps``)."""
    d = {name: rng.getrandbits(width) for name, width in ack_desc_fields().items()}
    d["qp"] = rng.randrange(qps)
    if nack is not None:
        d["nack"] = int(nack)
    return d


def random_cfg(rng):
    return {"mac": rng.getrandbits(48), "ip": rng.getrandbits(128),
            "dport": rng.getrandbits(16), "pkey": rng.getrandbits(16),
            "dscp": rng.getrandbits(6), "ecn": rng.getrandbits(2),
            "hop_limit": rng.getrandbits(8)}


def random_ctx(rng):
    return {"mac": rng.getrandbits(48), "ip": rng.getrandbits(128),
            "remote_qp": rng.getrandbits(24)}


def reset_cfg():
    return {"mac": 0, "ip": 0, "dport": proto.UDP_DPORT_DEFAULT, "pkey": proto.PKEY_DEFAULT,
            "dscp": 0, "ecn": 0, "hop_limit": HOP_LIMIT_DEFAULT}


ZERO_CTX = {"mac": 0, "ip": 0, "remote_qp": 0}


model_frame = ack_model.frame


async def write_cfg(regs, cfg, wait=True):
    """Write the registers of ``cfg``; with ``wait``, until frames use them."""
    await regs.write_mac("local", cfg["mac"])
    await regs.write_ipv6("local", cfg["ip"])
    await regs.write_fields("config", udp_dport=cfg["dport"], pkey=cfg["pkey"])
    await regs.write_fields("ipv6", dscp=cfg["dscp"], ecn=cfg["ecn"],
                            hop_limit=cfg["hop_limit"])
    while wait and await regs.read_field("status", "cfg_pending"):
        pass


async def write_ctx(regs, qp, ctx):
    """Write the context of ``qp`` and wait until it is in the table."""
    await regs.write("ctx_qp", qp)
    await regs.write_mac("ctx", ctx["mac"])
    await regs.write_ipv6("ctx", ctx["ip"])
    await regs.write("ctx_remote_qp", ctx["remote_qp"])
    await regs.write_fields("control", ctx_write=1)
    while await regs.read_field("status", "ctx_busy"):
        pass


def driver(ctx, dut, rng=None):
    master = AxiLiteSimMaster(ctx, dut.s_axil, rng=rng)
    return RegisterDriver(ACK_REGS, master.read, master.write)


def check_frames(got, want):
    assert len(got) == len(want), f"{len(got)} frames, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            diff = next(k for k in range(min(len(g), len(w))) if g[k] != w[k]) \
                if len(g) == len(w) else "length"
            raise AssertionError(f"frame {i}: {len(g)} bytes, expected {len(w)}; first "
                                 f"difference at byte {diff}")
        pkt = pk.decode(g, check_icrc=True, udp_dport=None)
        assert pkt.icrc == struct.unpack("<I", g[-4:])[0]


def run_traffic(width, descs, *, qps=64, cfg=None, contexts=None, rng=None, idle=0.0,
                backpressure=0.0, during=None, sink_count=None):
    """Configure (``cfg``, ``contexts`` = {qp: ctx}) over AXI4-Lite, then send ``descs``;
    ``during(regs)`` runs in parallel with the traffic. Returns (sink, cycles of the desc
    handshakes, counter values read at the end)."""
    dut = AckGenerator(width, qps)
    src = MetaSource(dut.desc, descs, rng=rng, idle=idle)
    n = len(descs) if sink_count is None else sink_count
    sink = AxisSink(dut.m_axis, n, rng=rng, backpressure=backpressure, max_cycles=300_000)
    handshakes, counters = [], {}
    done = []

    async def control(ctx):
        regs = driver(ctx, dut, rng)
        if cfg is not None:
            await write_cfg(regs, cfg)
        for qp, c in (contexts or {}).items():
            await write_ctx(regs, qp, c)
        started.append(True)
        if during is not None:
            await during(regs)
        while not done:
            await ctx.tick()
        # Nothing more: every descriptor taken, and no frame beyond those expected.
        for _ in range(3 * LATENCY):
            assert not ctx.get(dut.m_axis.tvalid), "a frame more than expected"
            await ctx.tick()
        assert src_done, "descriptors left that the block never took"
        for name in ("sacks", "nacks", "bad_qp"):
            counters[name] = await regs.read(name)

    started, src_done = [], []

    async def sinker(ctx):
        await sink.run(ctx)
        done.append(True)

    run(dut, control, gated(started, src.run, src_done), sinker,
        handshake_watcher(dut.desc, handshakes, done))
    return sink, handshakes, counters


# --- Tests ---------------------------------------------------------------------------------

def test_icrc_is_an_affine_map_of_the_fields():
    """The decomposition the gateware uses, against the packet model's ICRC."""
    rng = seeded()
    assert HOP_LIMIT_DEFAULT == pk.DEFAULT_HOP_LIMIT
    for i in range(200):
        d = random_desc(rng, 1 << 16)
        cfg, ctx = random_cfg(rng), random_ctx(rng)
        frame = model_frame(d, ctx, cfg)
        assert len(frame) == FRAME_LEN[d["nack"]]
        v = {n: d[n] for n in VARIABLES if n in d}
        v.update(src_ip=cfg["ip"], dst_ip=ctx["ip"], dport=cfg["dport"], pkey=cfg["pkey"],
                 dest_qp=ctx["remote_qp"], dst_id=ctx["remote_qp"] & 0xFFFF)
        assert affine_icrc(d["nack"], **v) == struct.unpack("<I", frame[-4:])[0], i
    # A field the decomposition left out would show here: flip one bit of each.
    v = {n: 0 for n in VARIABLES}
    for nack in (0, 1):
        base = affine_icrc(nack, **v)
        changed = [n for n in VARIABLES if affine_icrc(nack, **{**v, n: 1}) != base]
        unused = {0: {"psn", "reason"}, 1: {"cack", "m", "pr", "ack_psn_offset", "mpr",
                                             "sack_offset", "bitmap", "ooo_count",
                                             "rcvd_bytes"}}[nack]
        assert set(changed) == set(VARIABLES) - unused


@pytest.mark.parametrize("width", WIDTHS)
def test_frames_match_the_model(width):
    """Random descriptors, random contexts and registers, random idle and backpressure."""
    rng = seeded()
    qps = 16
    cfg = random_cfg(rng)
    contexts = {qp: random_ctx(rng) for qp in rng.sample(range(qps), 6)}
    n = soak(80 if width < 512 else 120)
    descs = [random_desc(rng, qps) for _ in range(n)]
    for d in descs[: n // 2]:
        d["qp"] = rng.choice(list(contexts))     # mostly QPs whose context was written
    sink, _, counters = run_traffic(width, descs, qps=qps, cfg=cfg, contexts=contexts,
                                    rng=rng, idle=0.3, backpressure=0.3)
    want = [model_frame(d, contexts.get(d["qp"], ZERO_CTX), cfg) for d in descs]
    check_frames(sink.frames, want)
    assert not any(sink.users)
    nacks = sum(d["nack"] for d in descs)
    assert counters == {"sacks": n - nacks, "nacks": nacks, "bad_qp": 0}


@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024, 2048])
def test_back_to_back_beats_and_latency(width):
    """Descriptors always there, sink always ready: exactly ceil(L/B) beats a frame, no
    idle cycle between frames, and the first beat LATENCY cycles after the handshake."""
    rng = seeded()
    B = width // 8
    descs = [random_desc(rng, 64, nack=rng.getrandbits(1)) for _ in range(24)]
    descs[0]["nack"], descs[1]["nack"] = 0, 1
    sink, handshakes, _ = run_traffic(width, descs, rng=rng)
    check_frames(sink.frames, [model_frame(d, ZERO_CTX, reset_cfg()) for d in descs])
    gen = AckGenerator(width)
    assert gen.beats == {0: -(-114 // B), 1: -(-98 // B)}
    c = sink.beat_cycles
    assert len(c) == sum(gen.beats[d["nack"]] for d in descs)
    assert c[-1] - c[0] + 1 == len(c), f"{len(c)} beats took {c[-1] - c[0] + 1} cycles"
    assert c[0] - handshakes[0] == LATENCY, f"latency {c[0] - handshakes[0]}"
    nacks = sum(d["nack"] for d in descs)
    print(f"measured at {width} bits: {len(descs) - nacks} SACK + {nacks} NACK, {len(c)} "
          f"beats in {c[-1] - c[0] + 1} cycles, latency {c[0] - handshakes[0]}")


@pytest.mark.parametrize("width", [64, 2048])
def test_latency_of_a_lone_descriptor(width):
    """Spaced-out descriptors: each frame's first beat comes LATENCY cycles after its
    descriptor's handshake."""
    rng = seeded()
    descs = [random_desc(rng, 64) for _ in range(6)]
    dut = AckGenerator(width)
    sink = AxisSink(dut.m_axis, len(descs))
    starts, firsts = [], []

    async def source(ctx):
        for d in descs:
            for _ in range(25):
                await ctx.tick()
            ctx.set(dut.desc.payload, d)
            ctx.set(dut.desc.valid, 1)
            await ctx.tick().until(dut.desc.ready)
            ctx.set(dut.desc.valid, 0)

    async def watch(ctx):
        cycle, first = 0, True
        while len(firsts) < len(descs):
            _, _, v, r, tv, tr, tl = await ctx.tick().sample(
                dut.desc.valid, dut.desc.ready, dut.m_axis.tvalid, dut.m_axis.tready,
                dut.m_axis.tlast)
            if v and r:
                starts.append(cycle)
            if tv and tr:
                if first:
                    firsts.append(cycle)
                first = bool(tl)
            cycle += 1

    run(dut, source, sink.run, watch)
    check_frames(sink.frames, [model_frame(d, ZERO_CTX, reset_cfg()) for d in descs])
    assert [f - s for s, f in zip(starts, firsts)] == [LATENCY] * len(descs)


@pytest.mark.parametrize("width,qps", [(64, 5), (512, 5), (2048, 1)])
def test_bad_qp_is_dropped_and_counted(width, qps):
    """Descriptors for QP qps and above give no frame, count in bad_qp, and the frames
    around them are right; a context write to a QP out of range changes nothing."""
    rng = seeded()
    contexts = {qp: random_ctx(rng) for qp in range(qps)}
    descs, good = [], []
    for i in range(soak(40)):
        d = random_desc(rng, qps)
        if i % 3 == 1:
            d["qp"] = rng.choice([qps, 8, 13, 0xFFFF, rng.randrange(qps, 1 << 16)])
        else:
            good.append(d)
        descs.append(d)

    # QP 8 and 13 alias QP 0 and 5 (0 and 1 when qps = 1) in the table's address: their
    # writes must be refused.
    cfg = random_cfg(rng)
    sink, _, counters = run_traffic(
        width, descs, qps=qps, cfg=cfg,
        contexts={**contexts, 8: random_ctx(rng), 13: random_ctx(rng)},
        rng=rng, idle=0.2, backpressure=0.3, sink_count=len(good))
    check_frames(sink.frames, [model_frame(d, contexts[d["qp"]], cfg) for d in good])
    nacks = sum(d["nack"] for d in good)
    assert counters == {"sacks": len(good) - nacks, "nacks": nacks,
                        "bad_qp": len(descs) - len(good)}


def test_counters_clear_and_info():
    rng = seeded()
    descs = [random_desc(rng, 7) for _ in range(5)] + [dict(random_desc(rng, 7), qp=9)]
    seen = {}
    dut = AckGenerator(64, 7)
    sink = AxisSink(dut.m_axis, 5)

    async def control(ctx):
        regs = driver(ctx, dut)
        assert await regs.read_field("info", "qps") == 7
        await MetaSource(dut.desc, descs).run(ctx)
        while len(sink.frames) < 5:
            await ctx.tick()
        for _ in range(8):
            await ctx.tick()
        seen["before"] = [await regs.read(n) for n in ("sacks", "nacks", "bad_qp")]
        await regs.write_fields("control", clear=1)
        seen["after"] = [await regs.read(n) for n in ("sacks", "nacks", "bad_qp")]

    run(dut, control, sink.run)
    nacks = sum(d["nack"] for d in descs[:5])
    assert seen["before"] == [5 - nacks, nacks, 1]
    assert seen["after"] == [0, 0, 0]


@pytest.mark.parametrize("width", [64, 2048])
def test_registers_written_under_traffic(width):
    """Registers and a context rewritten while frames flow: every frame is one whole
    configuration (old or new, never a mix; its ICRC right), and once a frame uses the new
    one, every later frame does."""
    rng = seeded()
    qps = 4
    cfg_a, cfg_b = random_cfg(rng), random_cfg(rng)
    ctx_a, ctx_b = random_ctx(rng), random_ctx(rng)
    contexts = {qp: random_ctx(rng) for qp in range(qps)}
    contexts[1] = ctx_a
    n = soak(600 if width == 2048 else 150)
    descs = [random_desc(rng, qps) for _ in range(n)]

    async def during(regs):
        for _ in range(20):
            await regs.read("sacks")            # let traffic start
        await write_cfg(regs, cfg_b, wait=False)
        await write_ctx(regs, 1, ctx_b)

    sink, _, _ = run_traffic(width, descs, qps=qps, cfg=cfg_a, contexts=contexts, rng=rng,
                             during=during)
    # Registers: local MAC first, hop limit last; the new set is complete only after the
    # last write, so a frame may show a prefix of the writes. Check against the ordered
    # sequence of partial configurations instead of just old/new.
    steps = [cfg_a]
    for key in ("mac", "ip", ("dport", "pkey"), ("dscp", "ecn", "hop_limit")):
        keys = key if isinstance(key, tuple) else (key,)
        if key == "ip":
            for i in range(4):
                mask = ((1 << 32) - 1) << (96 - 32 * i)
                prev = dict(steps[-1])
                prev["ip"] = (prev["ip"] & ~mask) | (cfg_b["ip"] & mask)
                steps.append(prev)
            continue
        if key == "mac":
            for mask in (((1 << 16) - 1) << 32, (1 << 32) - 1):
                prev = dict(steps[-1])
                prev["mac"] = (prev["mac"] & ~mask) | (cfg_b["mac"] & mask)
                steps.append(prev)
            continue
        prev = dict(steps[-1])
        prev.update({k: cfg_b[k] for k in keys})
        steps.append(prev)
    assert steps[-1] == cfg_b
    at, ctx1_new, used = 0, False, set()
    for i, (d, got) in enumerate(zip(descs, sink.frames)):
        pk.decode(got, check_icrc=True, udp_dport=None)
        ctxs = [contexts[d["qp"]]] if d["qp"] != 1 else ([ctx_b] if ctx1_new else [ctx_a, ctx_b])
        match = [(s, c) for s in range(at, len(steps)) for c in range(len(ctxs))
                 if model_frame(d, ctxs[c], steps[s]) == got]
        assert match, f"frame {i} matches no configuration at or after step {at}"
        at = match[0][0]
        used.add(at)
        if d["qp"] == 1 and ctxs[match[0][1]] is ctx_b:
            ctx1_new = True
    assert at == len(steps) - 1 and 0 in used, "the run did not span the register writes"
    assert ctx1_new


def test_context_write_protocol():
    """ctx_busy from the strobe until the entry is in the table; a second strobe meanwhile
    is ignored and flags ctx_dropped (w1c); cfg_pending until frames use new registers."""
    rng = seeded()
    dut = AckGenerator(64, 4)
    ctx_a, ctx_b = random_ctx(rng), random_ctx(rng)
    cfg = random_cfg(rng)
    descs = [dict(random_desc(rng, 4), qp=2) for _ in range(2)]
    sink = AxisSink(dut.m_axis, len(descs))
    seen = {}
    cycle = [0]

    async def clock(ctx):
        while True:
            await ctx.tick()
            cycle[0] += 1

    async def control(ctx):
        regs = driver(ctx, dut)
        await write_ctx(regs, 2, ctx_a)
        # A context changed in part and written; a second ctx_write while the engine works
        # on it is refused.
        for name, value in [("ctx_qp", 2), ("ctx_mac_hi", ctx_b["mac"] >> 32),
                            ("ctx_remote_qp", ctx_b["remote_qp"])]:
            await regs.write(name, value)
        await regs.write_fields("control", ctx_write=1)
        start = cycle[0]
        seen["busy_at_once"] = await regs.read_field("status", "ctx_busy")
        await regs.write("ctx_ip3", ctx_b["ip"] & 0xFFFFFFFF)     # for the refused write
        await regs.write_fields("control", ctx_write=1)
        seen["dropped"] = await regs.read_field("status", "ctx_dropped")
        while await regs.read_field("status", "ctx_busy"):
            pass
        seen["busy_cycles"] = cycle[0] - start
        await regs.write_fields("status", ctx_dropped=1)
        seen["dropped_after_clear"] = await regs.read_field("status", "ctx_dropped")
        await write_cfg(regs, cfg, wait=False)
        start = cycle[0]
        seen["pending"] = await regs.read_field("status", "cfg_pending")
        while await regs.read_field("status", "cfg_pending"):
            pass
        seen["pending_cycles"] = cycle[0] - start
        await MetaSource(dut.desc, descs).run(ctx)

    run(dut, control, sink.run, processes=[clock])
    assert seen["busy_at_once"] == 1 and seen["dropped"] == 1
    assert seen["dropped_after_clear"] == 0
    assert 73 <= seen["busy_cycles"] <= 80, seen["busy_cycles"]
    assert seen["pending"] == 1 and seen["pending_cycles"] <= 2 * 89 + 10, seen
    ctx_ab = dict(ctx_a, mac=(ctx_b["mac"] >> 32) << 32 | ctx_a["mac"] & 0xFFFFFFFF,
                  remote_qp=ctx_b["remote_qp"])
    check_frames(sink.frames, [model_frame(d, ctx_ab, cfg) for d in descs])


def test_scapy_reads_the_frames():
    """A few frames through scapy: BTH opcode, dest QP, PSN, and its own ICRC."""
    rng = seeded()
    cfg = random_cfg(rng)
    cfg["dport"] = 4791                   # scapy binds BTH to the RoCEv2 port
    contexts = {qp: random_ctx(rng) for qp in range(4)}
    descs = [random_desc(rng, 4, nack=i % 2) for i in range(8)]
    sink, _, _ = run_traffic(256, descs, qps=4, cfg=cfg, contexts=contexts, rng=rng,
                             idle=0.2, backpressure=0.2)
    for d, got in zip(descs, sink.frames):
        s = Ether(got)
        b = s[ScapyBTH]
        assert b.opcode == (0xDD if d["nack"] else 0xDC)
        assert b.dqpn == contexts[d["qp"]]["remote_qp"]
        assert b.psn == (d["psn"] if d["nack"] else d["cack"])
        assert b.compute_icrc(b"") == got[-4:]
        ip, udp = s[ScapyIPv6], s[ScapyUDP]
        assert (ip.hlim, ip.tc, ip.fl) == (cfg["hop_limit"], cfg["dscp"] << 2 | cfg["ecn"],
                                           d["entropy"] >> 16)
        assert udp.sport == d["entropy"] & 0xFFFF and udp.len == len(got) - 54


@pytest.mark.skipif(shutil.which("tshark") is None,
                    reason="tshark not installed (make tools installs it as root)")
def test_tshark_reads_the_frames(tmp_path):
    """The frames the block sends, as a pcap through tshark: Ethernet, IPv6, UDP to the RoCEv2
    port, and the BTH (opcode 0xDC / 0xDD, destination QP, PSN) decoded by Wireshark's own
    InfiniBand dissector."""
    rng = seeded()
    cfg = random_cfg(rng)
    cfg["dport"] = 4791                   # Wireshark's RoCEv2 port
    contexts = {qp: random_ctx(rng) for qp in range(4)}
    descs = [random_desc(rng, 4, nack=i % 2) for i in range(8)]
    sink, _, _ = run_traffic(256, descs, qps=4, cfg=cfg, contexts=contexts, rng=rng,
                             idle=0.2, backpressure=0.2)
    pcap = tmp_path / "ack.pcap"
    write_pcap(pcap, [(1000 * i, f) for i, f in enumerate(sink.frames)])
    fields = ["frame.len", "ipv6.nxt", "udp.srcport", "udp.dstport", "infiniband.bth.opcode",
              "infiniband.bth.destqp", "infiniband.bth.psn"]
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-E", "separator=,",
                          *sum((["-e", f] for f in fields), [])],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split(",") for line in out.strip().splitlines()]
    assert len(rows) == len(descs)
    for d, got, row in zip(descs, sink.frames, rows):
        want = [len(got), 17, d["entropy"] & 0xFFFF, 4791, 0xDD if d["nack"] else 0xDC,
                contexts[d["qp"]]["remote_qp"], d["psn"] if d["nack"] else d["cack"]]
        assert [int(x, 0) for x in row] == want, (row, want)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        AckGenerator(96)
    with pytest.raises(ValueError, match="outside 64..2048"):
        AckGenerator(32)
    with pytest.raises(ValueError, match="outside 64..2048"):
        AckGenerator(4096)
    with pytest.raises(ValueError, match=r"qps = 0 is outside 1\.\.65536"):
        AckGenerator(64, 0)
    with pytest.raises(ValueError, match=r"qps = 65537 is outside 1\.\.65536"):
        AckGenerator(64, 65537)
    with pytest.raises(TypeError, match="qps must be an int"):
        AckGenerator(64, 8.0)
    with pytest.raises(TypeError, match="qps must be an int"):
        AckGenerator(64, True)
    assert AckGenerator(64, 1).qps == 1 and AckGenerator(2048, 65536).qps == 65536
