"""AckGenerator on Amaranth's simulator: every frame (SACK, NACK, AETH NAK, EV answer) against
mrcnic.model.packet (byte for byte, and decoded with its ICRC checked), beat counts, latency,
bad QPs, registers changed under traffic, scapy as a second reference, and the AETH NAKs read
back by RoceRx."""

import shutil
import struct
import subprocess
import zlib

import pytest
from scapy.contrib.roce import AETH as ScapyAETH
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import UDP as ScapyUDP
from scapy.layers.inet6 import IPv6 as ScapyIPv6
from scapy.layers.l2 import Ether

from mrcnic.base import proto
from mrcnic.base.records import ack_desc_fields, EV_PROBE, NAK
from mrcnic.rx.ack_generator import (ACK_REGS, AETH_NAK, EV_ANSWER, FRAME_LEN, HOP_LIMIT_DEFAULT,
                                     LATENCY, NACK, SACK, VARIABLES, AckGenerator, affine_icrc)
from mrcnic.host.driver import RegisterDriver
from mrcnic.netsim.pcap import write_pcap
from mrcnic.model import packet as pk
from mrcnic.model.rx import ack_generator as ack_model
from testkit import docs_page
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import (command_cases, run, seeded, sibling, soak, start_traffic,
                              until_clear, until_moved)
from testkit.streams import AxisSink, beats_to_frame, gated, handshake_watcher
from testkit.meta import MetaSource

# The random traffic tests: 128 and 256 bits in make soak (every width's beat counts and
# latency are measured in make test by the back-to-back tests).
TRAFFIC_WIDTHS = [64, pytest.param(128, marks=pytest.mark.soak),
                  pytest.param(256, marks=pytest.mark.soak), 512, 2048]
COUNTERS = ("sacks", "nacks", "bad_qp", "naks", "answers")


# --- Stimulus and the reference ------------------------------------------------------------

def random_desc(rng, qps, nack=None):
    """A descriptor with every field random (qp below ``qps``)."""
    d = {name: rng.getrandbits(width) for name, width in ack_desc_fields().items()}
    d["qp"] = rng.randrange(qps)
    if nack is not None:
        d["nack"] = int(nack)
    return d


def random_nak(rng, qps):
    """A nak record (qp below ``qps``): half of them the access error syndrome, the others
    any syndrome."""
    r = {name: rng.getrandbits(f.width) for name, f in NAK}
    r["qp"] = rng.randrange(qps)
    if rng.random() < 0.5:
        r["syndrome"] = proto.AETH_SYNDROME_ACCESS_ERROR
    return r


def random_probe(rng, qps):
    """An EV probe record (qp below ``qps``), every field random."""
    r = {name: rng.getrandbits(f.width) for name, f in EV_PROBE}
    r["qp"] = rng.randrange(qps)
    return r


def random_cfg(rng):
    return {"mac": rng.getrandbits(48), "ip": rng.getrandbits(128),
            "dport": rng.getrandbits(16), "pkey": rng.getrandbits(16),
            "dscp": rng.getrandbits(6), "ecn": rng.getrandbits(2),
            "hop_limit": rng.getrandbits(8), "stev_swap": rng.getrandbits(1)}


def random_ctx(rng):
    return {"mac": rng.getrandbits(48), "ip": rng.getrandbits(128),
            "remote_qp": rng.getrandbits(24)}


def reset_cfg():
    return {"mac": 0, "ip": 0, "dport": proto.UDP_DPORT_DEFAULT, "pkey": proto.PKEY_DEFAULT,
            "dscp": 0, "ecn": 0, "hop_limit": HOP_LIMIT_DEFAULT, "stev_swap": 0}


ZERO_CTX = {"mac": 0, "ip": 0, "remote_qp": 0}


model_frame = ack_model.frame
model_nak_frame = ack_model.nak_frame
model_probe_frame = ack_model.probe_frame
MODEL = {"desc": model_frame, "nak": model_nak_frame, "probe": model_probe_frame}


def model_of(item, ctx, cfg):
    """The model's frame of ``item``: ("desc", descriptor), ("nak", nak record) or
    ("probe", probe record)."""
    src, rec = item
    return MODEL[src](rec, ctx, cfg)


def kind_of(item):
    src, rec = item
    if src == "probe":
        return EV_ANSWER
    return AETH_NAK if src == "nak" else (NACK if rec["nack"] else SACK)


def spec_icrc(frame):
    """The ICRC by the rule of spec 2.1, written out here with zlib: 8 bytes of ones, the
    inner IPv6 header with traffic class, flow label and hop limit all ones, UDP with its
    checksum all ones, BTH with byte 4 all ones, then the rest up to the ICRC."""
    b = bytearray(frame[14:-4])
    b[0], b[1], b[2], b[3], b[7] = 0x6F, 0xFF, 0xFF, 0xFF, 0xFF
    b[46:48] = b"\xff\xff"
    b[52] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(b)).to_bytes(4, "little")


async def write_cfg(regs, cfg, wait=True):
    """Write the registers of ``cfg``; with ``wait``, until frames use them."""
    await regs.write_mac("local", cfg["mac"])
    await regs.write_ipv6("local", cfg["ip"])
    await regs.write_fields("config", udp_dport=cfg["dport"], pkey=cfg["pkey"])
    await regs.write_fields("ipv6", dscp=cfg["dscp"], ecn=cfg["ecn"],
                            hop_limit=cfg["hop_limit"], stev_swap=cfg["stev_swap"])
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


def run_traffic(width, descs, *, naks=(), probes=(), qps=64, cfg=None, contexts=None,
                rng=None, idle=0.0, backpressure=0.0, during=None, sink_count=None):
    """Configure (``cfg``, ``contexts`` = {qp: ctx}) over AXI4-Lite, then send ``descs`` on
    ``desc``, ``naks`` on ``nak`` and ``probes`` on ``probe`` at once; ``during(regs)`` runs
    in parallel with the traffic. Returns (sink, cycles of the desc handshakes, counter
    values read at the end, every record as ("desc" | "nak" | "probe", record) in the order
    of the handshakes, which is the order of the frames); ``sink.taken`` lists (cycle,
    source, record) in that order."""
    dut = AckGenerator(width, qps)
    inputs = {"desc": descs, "nak": naks, "probe": probes}
    sources = [MetaSource(getattr(dut, name), recs, rng=rng, idle=idle)
               for name, recs in inputs.items()]
    n = sum(map(len, inputs.values())) if sink_count is None else sink_count
    sink = AxisSink(dut.m_axis, n, rng=rng, backpressure=backpressure, max_cycles=300_000)
    handshakes = {name: [] for name in inputs}
    counters = {}
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
        assert len(src_done) == len(inputs), "records left that the block never took"
        for name in COUNTERS:
            counters[name] = await regs.read(name)

    started, src_done = [], []

    async def sinker(ctx):
        await sink.run(ctx)
        done.append(True)

    run(dut, control, *(gated(started, src.run, src_done) for src in sources), sinker,
        *(handshake_watcher(getattr(dut, name), handshakes[name], done) for name in inputs))
    cycles = [c for name in inputs for c in handshakes[name]]
    assert len(set(cycles)) == len(cycles), "two records taken in one cycle"
    sink.taken = sorted([(c, name, rec) for name, recs in inputs.items()
                         for c, rec in zip(handshakes[name], recs)], key=lambda x: x[0])
    return sink, handshakes["desc"], counters, [(src_, rec) for _, src_, rec in sink.taken]


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
                 dest_qp=ctx["remote_qp"], dst_id=ctx["remote_qp"] & 0xFFFF,
                 sport=proto.stev_split(d["entropy"], cfg["stev_swap"])[0])
        assert affine_icrc(d["nack"], **v) == struct.unpack("<I", frame[-4:])[0], i
        # The AETH NAK of a nak record, with the same context and registers (the entropy
        # given is ignored: an AETH NAK carries none).
        r = random_nak(rng, 1 << 16)
        frame = model_nak_frame(r, ctx, cfg)
        assert len(frame) == FRAME_LEN[AETH_NAK] == 82
        v.update(psn=r["psn"], syndrome=r["syndrome"])
        assert affine_icrc(AETH_NAK, **v) == struct.unpack("<I", frame[-4:])[0], i
        assert spec_icrc(frame) == frame[-4:]
        # The EV answer of a probe record: its own PSN, QP ids, timestamp and STEV.
        r = random_probe(rng, 1 << 16)
        frame = model_probe_frame(r, ctx, cfg)
        assert len(frame) == FRAME_LEN[EV_ANSWER] == 114
        v.update({n: r[n] for n in ("psn", "qp", "peer_id", "timestamp")},
                 sport=proto.stev_split(r["entropy"], cfg["stev_swap"])[0])
        assert affine_icrc(EV_ANSWER, **v) == struct.unpack("<I", frame[-4:])[0], i
        assert spec_icrc(frame) == frame[-4:]
    # A field the decomposition left out would show here: flip one bit of each.
    v = {n: 0 for n in VARIABLES}
    for kind in (SACK, NACK, AETH_NAK, EV_ANSWER):
        base = affine_icrc(kind, **v)
        changed = [n for n in VARIABLES if affine_icrc(kind, **{**v, n: 1}) != base]
        unused = {SACK: {"psn", "reason", "syndrome", "peer_id"},
                  NACK: {"cack", "m", "pr", "ack_psn_offset", "mpr", "sack_offset", "bitmap",
                         "ooo_count", "rcvd_bytes", "syndrome", "peer_id"},
                  AETH_NAK: set(VARIABLES) - {"src_ip", "dst_ip", "dport", "pkey", "dest_qp",
                                              "psn", "syndrome"},
                  EV_ANSWER: set(VARIABLES) - {"src_ip", "dst_ip", "dport", "pkey", "sport",
                                               "psn", "qp", "peer_id", "timestamp"}}[kind]
        assert set(changed) == set(VARIABLES) - unused


def random_inputs(rng, qps, written, n):
    """Random registers, contexts for ``written`` random QPs of ``qps``, ``n`` random
    descriptors: ``(cfg, contexts, descs)``."""
    cfg = random_cfg(rng)
    contexts = {qp: random_ctx(rng) for qp in rng.sample(range(qps), written)}
    return cfg, contexts, [random_desc(rng, qps) for _ in range(n)]


@pytest.mark.parametrize("width", TRAFFIC_WIDTHS)
def test_frames_match_the_model(width):
    """Random descriptors, random contexts and registers, random idle and backpressure."""
    rng = seeded()
    qps = 16
    n = soak(80 if width < 512 else 120)
    cfg, contexts, descs = random_inputs(rng, qps, 6, n)
    for d in descs[: n // 2]:
        d["qp"] = rng.choice(list(contexts))     # mostly QPs whose context was written
    sink, _, counters, _ = run_traffic(width, descs, qps=qps, cfg=cfg, contexts=contexts,
                                       rng=rng, idle=0.3, backpressure=0.3)
    want = [model_frame(d, contexts.get(d["qp"], ZERO_CTX), cfg) for d in descs]
    check_frames(sink.frames, want)
    assert not any(sink.users)
    nacks = sum(d["nack"] for d in descs)
    assert counters == {"sacks": n - nacks, "nacks": nacks, "bad_qp": 0, "naks": 0,
                        "answers": 0}


def check_mixed(sink, order, contexts, cfg, qps):
    """The frames against the model, in handshake order; records of a QP out of range give
    none. Returns the frame count of each kind."""
    good = [it for it in order if it[1]["qp"] < qps]
    check_frames(sink.frames, [model_of(it, contexts.get(it[1]["qp"], ZERO_CTX), cfg)
                               for it in good])
    for it, got in zip(good, sink.frames):
        assert spec_icrc(got) == got[-4:]
        if it[0] == "nak":
            pkt = pk.decode(got, check_icrc=True, udp_dport=None)
            r = it[1]
            assert pkt.opcode == proto.Opcode.ACK and pkt.bth["psn"] == r["psn"]
            assert pkt.aeth == {"syndrome": r["syndrome"], "msn": 0}
            assert pkt.udp["src_port"] == 0 and pkt.ip["flow_label"] == 0
        if it[0] == "probe":
            pkt = pk.decode(got, check_icrc=True, udp_dport=None)
            r = it[1]
            assert pkt.opcode == proto.Opcode.EP_RESPONSE and pkt.bth["psn"] == r["psn"]
            assert pkt.bth["dest_qp"] == proto.ENDPOINT_QP
            assert pk.endpoint_response(pkt) == {"op": proto.EP_EV_PROBE, "src_id": r["qp"],
                                                 "dst_id": r["peer_id"],
                                                 "timestamp": r["timestamp"]}
            assert proto.stev_join(pkt.udp["src_port"], pkt.ip["flow_label"],
                                cfg["stev_swap"]) == r["entropy"]
    return {k: sum(kind_of(it) == k for it in good) for k in (SACK, NACK, AETH_NAK, EV_ANSWER)}


@pytest.mark.parametrize("width", TRAFFIC_WIDTHS)
def test_naks_probes_and_descriptors_mixed(width):
    """nak records, probe records and descriptors at once, random idle on each and
    backpressure on the output, some nak and probe records for a QP out of range: every
    frame equal to the model's, in the order the records were taken (never two in a
    cycle), bad ones dropped and counted."""
    rng = seeded()
    qps = 12
    n = soak(60 if width < 512 else 80)
    cfg, contexts, descs = random_inputs(rng, qps, 8, n)
    naks = [random_nak(rng, qps) for _ in range(n // 2)]
    probes = [random_probe(rng, qps) for _ in range(n // 3)]
    for r in naks[::5] + probes[::4]:
        r["qp"] = rng.randrange(qps, 1 << 16)
    bad = {src: sum(r["qp"] >= qps for r in recs) for src, recs in (("nak", naks),
                                                                      ("probe", probes))}
    sink, _, counters, order = run_traffic(
        width, descs, naks=naks, probes=probes, qps=qps, cfg=cfg, contexts=contexts, rng=rng,
        idle=0.4, backpressure=0.3,
        sink_count=len(descs) + len(naks) + len(probes) - sum(bad.values()))
    got = check_mixed(sink, order, contexts, cfg, qps)
    assert not any(sink.users)
    assert got[AETH_NAK] == len(naks) - bad["nak"]
    assert got[EV_ANSWER] == len(probes) - bad["probe"]
    assert counters == {"sacks": got[SACK], "nacks": got[NACK], "bad_qp": sum(bad.values()),
                        "naks": got[AETH_NAK], "answers": got[EV_ANSWER]}
    kinds = [kind_of(it) for it in order]
    for k in (AETH_NAK, EV_ANSWER):
        assert any(a == k and b != k for a, b in zip(kinds, kinds[1:])), \
            "the run did not interleave the kinds"


@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024, 2048])
def test_naks_first_back_to_back(width):
    """Every input always valid: every nak record is taken before any probe record, and
    those before any descriptor, the frames follow each other with no idle cycle
    (ceil(82/B) beats an AETH NAK, ceil(114/B) an EV answer), and the first AETH NAK's first
    beat comes LATENCY cycles after its handshake."""
    rng = seeded()
    B = width // 8
    descs = [random_desc(rng, 64) for _ in range(8)]
    naks = [random_nak(rng, 64) for _ in range(12)]
    probes = [random_probe(rng, 64) for _ in range(5)]
    sink, _, counters, order = run_traffic(width, descs, naks=naks, probes=probes, rng=rng)
    assert [src for src, _ in order] == \
        ["nak"] * len(naks) + ["probe"] * len(probes) + ["desc"] * len(descs)
    check_mixed(sink, order, {}, reset_cfg(), 64)
    gen = AckGenerator(width)
    assert gen.beats[AETH_NAK] == -(-82 // B) and gen.beats[EV_ANSWER] == -(-114 // B)
    c = sink.beat_cycles
    assert len(c) == sum(gen.beats[kind_of(it)] for it in order)
    assert c[-1] - c[0] + 1 == len(c), f"{len(c)} beats took {c[-1] - c[0] + 1} cycles"
    assert counters["naks"] == len(naks) and counters["answers"] == len(probes)
    latency = c[0] - sink.taken[0][0]
    assert latency == LATENCY, f"latency {latency}"
    print(f"measured at {width} bits: {len(naks)} AETH NAK + {len(probes)} EV answer + "
          f"{len(descs)} SACK/NACK, "
          f"{len(c)} beats in {c[-1] - c[0] + 1} cycles, latency {latency}")


@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024, 2048])
def test_back_to_back_beats_and_latency(width):
    """Descriptors always there, sink always ready: exactly ceil(L/B) beats a frame, no
    idle cycle between frames, and the first beat LATENCY cycles after the handshake."""
    rng = seeded()
    B = width // 8
    descs = [random_desc(rng, 64, nack=rng.getrandbits(1)) for _ in range(24)]
    descs[0]["nack"], descs[1]["nack"] = 0, 1
    sink, handshakes, _, _ = run_traffic(width, descs, rng=rng)
    check_frames(sink.frames, [model_frame(d, ZERO_CTX, reset_cfg()) for d in descs])
    gen = AckGenerator(width)
    assert gen.beats == {SACK: -(-114 // B), NACK: -(-98 // B), AETH_NAK: -(-82 // B),
                         EV_ANSWER: -(-114 // B)}
    c = sink.beat_cycles
    assert len(c) == sum(gen.beats[d["nack"]] for d in descs)
    assert c[-1] - c[0] + 1 == len(c), f"{len(c)} beats took {c[-1] - c[0] + 1} cycles"
    assert c[0] - handshakes[0] == LATENCY, f"latency {c[0] - handshakes[0]}"
    nacks = sum(d["nack"] for d in descs)
    print(f"measured at {width} bits: {len(descs) - nacks} SACK + {nacks} NACK, {len(c)} "
          f"beats in {c[-1] - c[0] + 1} cycles, latency {c[0] - handshakes[0]}")


@pytest.mark.parametrize("width", [64, 2048])
@pytest.mark.parametrize("src", ["desc", "nak", "probe"])
def test_latency_of_a_lone_descriptor(width, src):
    """Spaced-out records on one input: each frame's first beat comes LATENCY cycles after
    its record's handshake (``docs/blocks/ack-generator.md`` quotes this measurement)."""
    rng = seeded()
    if src == "nak":
        descs = [("nak", random_nak(rng, 64)) for _ in range(6)]
    elif src == "probe":
        descs = [("probe", random_probe(rng, 64)) for _ in range(6)]
    else:
        descs = [("desc", random_desc(rng, 64)) for _ in range(6)]
    dut = AckGenerator(width)
    port = getattr(dut, src)
    sink = AxisSink(dut.m_axis, len(descs))
    starts, firsts = [], []

    async def source(ctx):
        for _, d in descs:
            for _ in range(25):
                await ctx.tick()
            ctx.set(port.payload, d)
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)

    async def watch(ctx):
        cycle, first = 0, True
        while len(firsts) < len(descs):
            _, _, v, r, tv, tr, tl = await ctx.tick().sample(
                port.valid, port.ready, dut.m_axis.tvalid, dut.m_axis.tready,
                dut.m_axis.tlast)
            if v and r:
                starts.append(cycle)
            if tv and tr:
                if first:
                    firsts.append(cycle)
                first = bool(tl)
            cycle += 1

    run(dut, source, sink.run, watch)
    check_frames(sink.frames, [model_of(d, ZERO_CTX, reset_cfg()) for d in descs])
    latencies = [f - s for s, f in zip(starts, firsts)]
    print(f"measured at {width} bits, {src}: latency {latencies}")
    assert latencies == [LATENCY] * len(descs)


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
    sink, _, counters, _ = run_traffic(
        width, descs, qps=qps, cfg=cfg,
        contexts={**contexts, 8: random_ctx(rng), 13: random_ctx(rng)},
        rng=rng, idle=0.2, backpressure=0.3, sink_count=len(good))
    check_frames(sink.frames, [model_frame(d, contexts[d["qp"]], cfg) for d in good])
    nacks = sum(d["nack"] for d in good)
    assert counters == {"sacks": len(good) - nacks, "nacks": nacks,
                        "bad_qp": len(descs) - len(good), "naks": 0, "answers": 0}


def test_counters_clear_and_info():
    rng = seeded()
    descs = [random_desc(rng, 7) for _ in range(5)] + [dict(random_desc(rng, 7), qp=9)]
    naks = [random_nak(rng, 7) for _ in range(3)] + [dict(random_nak(rng, 7), qp=7)]
    probes = [random_probe(rng, 7) for _ in range(2)] + [dict(random_probe(rng, 7), qp=8)]
    seen = {}
    dut = AckGenerator(64, 7)
    sink = AxisSink(dut.m_axis, 10)

    async def control(ctx):
        regs = driver(ctx, dut)
        assert await regs.read_field("info", "qps") == 7
        await MetaSource(dut.desc, descs).run(ctx)
        await MetaSource(dut.nak, naks).run(ctx)
        await MetaSource(dut.probe, probes).run(ctx)
        while len(sink.frames) < 10:
            await ctx.tick()
        for _ in range(8):
            await ctx.tick()
        seen["before"] = [await regs.read(n) for n in COUNTERS]
        await regs.write_fields("control", clear=1)
        seen["after"] = [await regs.read(n) for n in COUNTERS]

    run(dut, control, sink.run)
    nacks = sum(d["nack"] for d in descs[:5])
    assert seen["before"] == [5 - nacks, nacks, 3, 3, 2]
    assert seen["after"] == [0, 0, 0, 0, 0]


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

    sink, _, _, _ = run_traffic(width, descs, qps=qps, cfg=cfg_a, contexts=contexts, rng=rng,
                                during=during)
    # Registers: local MAC first, hop limit last; the new set is complete only after the
    # last write, so a frame may show a prefix of the writes. Check against the ordered
    # sequence of partial configurations instead of just old/new.
    steps = [cfg_a]
    for key in ("mac", "ip", ("dport", "pkey"), ("dscp", "ecn", "hop_limit", "stev_swap")):
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


def test_a_context_write_while_records_are_in_flight_is_applied():
    """ctx_write (and a P_Key write) while records are in flight (a descriptor offered
    every cycle, a nak record every eighth cycle), in three cases: m_axis always ready, the
    strobe written 0 to 5 cycles after the traffic starts; m_axis held not ready for 60
    cycles from the start, the strobe 0 to 5 cycles in; and held so, the strobe 20 to 25
    cycles in, with the pipeline stopped behind the frame held. ctx_busy and cfg_pending
    clear within a bound in cycles, every record taken gives its frame, records keep being
    taken after the write, and the next frame of the QP is the model's with the new
    context and P_Key."""
    hold_cycles, bound = 60, 250
    rng = seeded()
    qps, width = 4, 256
    dut = AckGenerator(width, qps)
    st = {"on": False, "stop": False, "ready_at": 0, "cycle": 0, "extra": []}
    got = {"desc": [], "nak": [], "frames": []}

    def feeder(port, name, every):
        async def feed(ctx):
            r = None
            while not st["stop"]:
                if r is None and name == "desc" and st["extra"]:
                    r = st["extra"].pop(0)
                elif r is None and st["on"] and st["cycle"] % every == 0:
                    r = random_desc(rng, qps) if name == "desc" else random_nak(rng, qps)
                ctx.set(port.valid, r is not None)
                if r is not None:
                    ctx.set(port.payload, r)
                _, _, ready = await ctx.tick().sample(port.ready)
                if r is not None and ready:
                    got[name].append(r)
                    r = None
            ctx.set(port.valid, 0)
        return feed

    async def sink(ctx):
        p, beats = dut.m_axis, []
        while not st["stop"]:
            ready = st["cycle"] >= st["ready_at"]
            ctx.set(p.tready, ready)
            _, _, valid, data, keep, last = await ctx.tick().sample(
                p.tvalid, p.tdata, p.tkeep, p.tlast)
            if valid and ready:
                beats.append((data, keep, last, 0))
                if last:
                    got["frames"].append(beats_to_frame(beats, len(p.tkeep)))
                    beats = []
            st["cycle"] += 1

    async def control(ctx):
        regs = driver(ctx, dut)
        cfg = random_cfg(rng)
        await write_cfg(regs, cfg)
        for _, hold, lead, phase in command_cases(hold_cycles):
            # Staged before the traffic: only the strobe and one register write come
            # during it.
            qp, c = phase % qps, random_ctx(rng)
            await regs.write("ctx_qp", qp)
            await regs.write_mac("ctx", c["mac"])
            await regs.write_ipv6("ctx", c["ip"])
            await regs.write("ctx_remote_qp", c["remote_qp"])
            cfg = dict(cfg, pkey=rng.getrandbits(16))
            await start_traffic(ctx, st, hold, lead + phase)
            t0 = st["cycle"]
            what = f"ctx_write {lead + phase} cycles into the traffic, m_axis held {hold}"
            await regs.write_fields("control", ctx_write=1)
            assert len(got["desc"]) + len(got["nak"]) > len(got["frames"]), \
                f"{what}: no record in flight"
            await regs.write_fields("config", udp_dport=cfg["dport"], pkey=cfg["pkey"])
            await until_clear(st, lambda: regs.read_field("status", "ctx_busy"), t0, bound,
                              f"{what}: ctx_busy")
            await until_clear(st, lambda: regs.read_field("status", "cfg_pending"), t0, bound,
                              f"{what}: cfg_pending")
            assert (await regs.read_fields("status"))["ctx_dropped"] == 0
            # The block keeps working (after m_axis's release, too).
            await until_moved(ctx, st, lambda: (len(got["desc"]), len(got["frames"])), 100,
                              f"{what}: no progress after the write")
            st["on"] = False
            await ctx.tick().repeat(30)
            assert len(got["frames"]) == len(got["desc"]) + len(got["nak"]), \
                f"{what}: records taken without a frame"
            # The QP's next frame: the new context and P_Key.
            d = random_desc(rng, qps)
            d["qp"] = qp
            st["extra"].append(d)
            await ctx.tick().repeat(20)
            assert got["frames"][-1] == model_frame(d, c, cfg), what
        st["stop"] = True

    run(dut, control, feeder(dut.desc, "desc", 1), feeder(dut.nak, "nak", 8), sink)


def test_scapy_reads_the_frames():
    """A few frames through scapy: BTH opcode, dest QP, PSN, and its own ICRC."""
    rng = seeded()
    cfg = random_cfg(rng)
    cfg["dport"] = 4791                   # scapy binds BTH to the RoCEv2 port
    contexts = {qp: random_ctx(rng) for qp in range(4)}
    descs = [random_desc(rng, 4, nack=i % 2) for i in range(8)]
    sink, _, _, _ = run_traffic(256, descs, qps=4, cfg=cfg, contexts=contexts, rng=rng,
                                idle=0.2, backpressure=0.2)
    for d, got in zip(descs, sink.frames):
        s = Ether(got)
        b = s[ScapyBTH]
        assert b.opcode == (0xDD if d["nack"] else 0xDC)
        assert b.dqpn == contexts[d["qp"]]["remote_qp"]
        assert b.psn == (d["psn"] if d["nack"] else d["cack"])
        assert b.compute_icrc(b"") == got[-4:]
        ip, udp = s[ScapyIPv6], s[ScapyUDP]
        sport, flow = proto.stev_split(d["entropy"], cfg["stev_swap"])
        assert (ip.hlim, ip.tc, ip.fl) == (cfg["hop_limit"], cfg["dscp"] << 2 | cfg["ecn"],
                                           flow)
        assert udp.sport == sport and udp.len == len(got) - 54


def test_scapy_reads_the_nak_frames():
    """AETH NAKs through scapy: BTH opcode 0xD1, dest QP, PSN, scapy's own ICRC, and the
    AETH (scapy binds its AETH to the InfiniBand opcode, not to 0xD1: parsed from the BTH's
    payload)."""
    rng = seeded()
    cfg = random_cfg(rng)
    cfg["dport"] = 4791
    contexts = {qp: random_ctx(rng) for qp in range(4)}
    naks = [random_nak(rng, 4) for _ in range(8)]
    sink, _, _, _ = run_traffic(256, [], naks=naks, qps=4, cfg=cfg, contexts=contexts,
                                rng=rng, idle=0.2, backpressure=0.2)
    for r, got in zip(naks, sink.frames):
        s = Ether(got)
        b = s[ScapyBTH]
        assert b.opcode == 0xD1 and b.dqpn == contexts[r["qp"]]["remote_qp"]
        assert b.psn == r["psn"] and b.pkey == cfg["pkey"]
        assert b.compute_icrc(b"") == got[-4:] == spec_icrc(got)
        aeth = ScapyAETH(bytes(b.payload)[:4])
        assert (aeth.syndrome, aeth.msn) == (r["syndrome"], 0)
        ip, udp = s[ScapyIPv6], s[ScapyUDP]
        assert (ip.hlim, ip.tc, ip.fl) == (cfg["hop_limit"], cfg["dscp"] << 2 | cfg["ecn"], 0)
        assert udp.sport == 0 and udp.len == len(got) - 54 == 28


@pytest.mark.parametrize("width", [64, 512])
def test_roce_rx_reads_the_naks(width):
    """Round trip: the AETH NAKs the block sends, fed to RoceRx (the gateware, through
    sim/rx/test_roce_rx.py's runner, and its model) at the peer, come out as nak records with
    the remote QP, the PSN and the syndrome."""
    from mrcnic.model.rx import roce_rx as rx_model
    Run = sibling("rx/test_roce_rx").Run

    rng = seeded()
    cfg = random_cfg(rng)
    cfg["dport"] = proto.UDP_DPORT_DEFAULT
    # The control DSCP: a random one may be a trimming DSCP, which RoceRx reads as a
    # trimmed packet (and refuses on an ACK).
    cfg["dscp"] = proto.DSCP_CONTROL
    contexts = {qp: random_ctx(rng) for qp in range(4)}
    naks = [random_nak(rng, 4) for _ in range(10)]
    naks[0]["syndrome"] = proto.AETH_SYNDROME_ACCESS_ERROR
    sink, _, _, _ = run_traffic(width, [], naks=naks, qps=4, cfg=cfg, contexts=contexts,
                                rng=rng)
    # A syndrome of 0 is an ACK, not a NAK, at the peer.
    want = [{"qp": contexts[r["qp"]]["remote_qp"] & 0xFFFF, "psn": r["psn"],
             "syndrome": r["syndrome"]} for r in naks if r["syndrome"]]
    meta = rx_model.meta_of()
    results = [rx_model.receive(f, meta) for f in sink.frames]
    assert [r.nak for r in results if r.nak is not None] == want
    assert all(r.kind in ("nak", "ack") for r in results)
    rx = Run(width, [(f, meta, 0) for f in sink.frames], rng=rng, idle=0.2,
             backpressure=0.2).run()
    rx.check()
    assert rx.naks == want


@pytest.mark.skipif(shutil.which("tshark") is None,
                    reason="tshark not installed (make tools installs it as root)")
def test_tshark_reads_the_frames(tmp_path):
    """The frames the block sends, as a pcap through tshark: Ethernet, IPv6, UDP to the RoCEv2
    port, and the BTH (opcode 0xDC / 0xDD / 0xD1, destination QP, PSN) decoded by Wireshark's own
    InfiniBand dissector."""
    rng = seeded()
    cfg = random_cfg(rng)
    cfg["dport"] = 4791                   # Wireshark's RoCEv2 port
    contexts = {qp: random_ctx(rng) for qp in range(4)}
    descs = [random_desc(rng, 4, nack=i % 2) for i in range(8)]
    for d in descs:
        # The echoed entropy is the frame's UDP source port, and Wireshark decodes a UDP frame
        # by its lower port: a well-known one (664, say) would hide the BTH from it (either
        # half may be the port: cfg["stev_swap"]).
        d["entropy"] |= 0xC000C000
    naks = [random_nak(rng, 4) for _ in range(4)]
    sink, _, _, order = run_traffic(256, descs, naks=naks, qps=4, cfg=cfg, contexts=contexts,
                                    rng=rng, idle=0.2, backpressure=0.2)
    pcap = tmp_path / "ack.pcap"
    write_pcap(pcap, [(1000 * i, f) for i, f in enumerate(sink.frames)])
    fields = ["frame.len", "ipv6.nxt", "udp.srcport", "udp.dstport", "infiniband.bth.opcode",
              "infiniband.bth.destqp", "infiniband.bth.psn"]
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-E", "separator=,",
                          *sum((["-e", f] for f in fields), [])],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split(",") for line in out.strip().splitlines()]
    assert len(rows) == len(descs) + len(naks)
    for (src, d), got, row in zip(order, sink.frames, rows):
        if src == "nak":
            want = [len(got), 17, 0, 4791, 0xD1, contexts[d["qp"]]["remote_qp"], d["psn"]]
        else:
            want = [len(got), 17, proto.stev_split(d["entropy"], cfg["stev_swap"])[0], 4791,
                    0xDD if d["nack"] else 0xDC,
                    contexts[d["qp"]]["remote_qp"], d["psn"] if d["nack"] else d["cack"]]
        assert [int(x, 0) for x in row] == want, (row, want)


def test_docs_register_table_is_the_register_map():
    page = docs_page("blocks", "ack-generator.md")
    assert ACK_REGS.markdown() in page.read_text()


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
