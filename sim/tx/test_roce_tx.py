"""RoceTx on Amaranth's simulator: frames byte for byte against the packet model (through
mrcnic.model.tx.roce_tx), at several widths, with idle and backpressure; throughput, latency;
payload frames that disagree with their descriptor."""


import pytest

from mrcnic.host.driver import RegisterDriver
from mrcnic.model import packet as pk
from mrcnic.model.rx import roce_rx as rx_model
from mrcnic.model.tx.roce_tx import RoceTxModel
from mrcnic.base import proto
from mrcnic.base.proto import Opcode
from mrcnic.tx.roce_tx import TX_REGS, RoceTx
from testkit import docs_page
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import run, seeded, soak
from testkit.streams import AxisSink, AxisSource, gated, handshake_watcher
from testkit.meta import MetaSource

WRITES = [op for op in Opcode if op.is_write]


def random_desc(rng, qps, *, max_len=300, opcode=None):
    """A random descriptor: a random WRITE unless ``opcode`` is given; a probe has length 0
    and random A, rtx and RETH fields, which the block must ignore."""
    if opcode is None:
        opcode = rng.choice(WRITES)
    return {"qp": rng.randrange(qps), "psn": rng.getrandbits(24), "opcode": int(opcode),
            "ack_req": rng.getrandbits(1), "rtx": rng.getrandbits(1),
            "va": rng.getrandbits(64), "rkey": rng.getrandbits(32),
            "dma_length": rng.getrandbits(32),
            "length": (0 if opcode in (Opcode.PROBE, Opcode.EP_REQUEST)
                       else rng.randrange(max_len + 1)),
            "imm": rng.getrandbits(32), "rqmsn": rng.getrandbits(16), "msn": rng.getrandbits(16),
            "entropy": rng.getrandbits(32), "ts": rng.getrandbits(1),
            "timestamp": rng.getrandbits(16)}


def mixed_descs(rng, qps, count, probe_share, **kw):
    """``count`` random descriptors of which exactly ``round(count * probe_share)`` are probes,
    at random places (a fixed number, so no seed leaves the probe checks without probes)."""
    at = set(rng.sample(range(count), round(count * probe_share)))
    return [random_desc(rng, qps, opcode=Opcode.PROBE if i in at else None, **kw)
            for i in range(count)]


def check_probe(frame, desc, model):
    """A probe frame read back with the packet codec (ICRC checked): opcode, PSN, A = 0,
    rtx = 0, the context's remote QP, the STEV, and the PETH mapping of the module
    docstring; no payload, no METH or RETH; lengths of BTH + PETH."""
    p = pk.decode(frame, check_icrc=True, udp_dport=None)
    rqp = model.ctx.get(desc["qp"], (0, 0, 0))[2] if desc["qp"] < model.qps else 0
    assert p.opcode == Opcode.PROBE and p.headers[-1] == "peth"
    assert (p.bth["psn"], p.bth["ack_req"], p.bth["rtx"], p.bth["pad"], p.bth["dest_qp"]) == \
        (desc["psn"], 0, 0, 0, rqp)
    assert p.peth == {"vendor": 0, "probe_id": desc["msn"], "src_id": desc["qp"],
                      "dst_id": rqp & 0xFFFF, "timestamp": desc["timestamp"], "tsr": 0,
                      "type": proto.TSETH_TYPE}
    assert p.payload == b"" and p.meth is None and p.reth is None
    assert pk.stev_ev(p) == desc["entropy"]
    assert len(frame) == 94 and p.ip["payload_length"] == p.udp["length"] == 40


async def configure(regs, model, rng, qps):
    r = {"local_mac": rng.getrandbits(48), "local_ip": rng.getrandbits(128),
         "udp_dport": rng.getrandbits(16), "pkey": rng.getrandbits(16),
         "dscp_data": rng.getrandbits(6), "dscp_rtx": rng.getrandbits(6),
         "ecn": rng.getrandbits(2), "hop_limit": rng.getrandbits(8)}
    model.regs.update(r)
    await regs.write_mac("local", r["local_mac"])
    await regs.write_ipv6("local", r["local_ip"])
    await regs.write_fields("config", udp_dport=r["udp_dport"], pkey=r["pkey"])
    await regs.write_fields("ipv6", dscp_data=r["dscp_data"], dscp_rtx=r["dscp_rtx"],
                            ecn=r["ecn"], hop_limit=r["hop_limit"])
    for qp in range(qps):
        mac, ip, rqp = rng.getrandbits(48), rng.getrandbits(128), rng.getrandbits(24)
        model.write_ctx(qp, mac, ip, rqp)
        await regs.write("ctx_qp", qp)
        await regs.write_mac("ctx", mac)
        await regs.write_ipv6("ctx", ip)
        await regs.write("ctx_remote_qp", rqp)
        await regs.write_fields("control", ctx_write=1)


def run_tx(width, descs, payloads, *, qps=4, rng, idle=0.0, backpressure=0.0,
           pay_users=None, configure_regs=True, max_cycles=20_000):
    """Returns (sink, model, counters, desc handshake cycles)."""
    dut = RoceTx(width, qps)
    model = RoceTxModel(qps)
    frames = [p for p in payloads if p is not None]
    users = None
    if pay_users is not None:
        users = [u for p, u in zip(payloads, pay_users) if p is not None]
    psrc = AxisSource(dut.s_axis, frames, rng=rng, idle=idle, users=users)
    dsrc = MetaSource(dut.desc, descs, rng=rng, idle=idle)
    sink = AxisSink(dut.m_axis, len(descs), rng=rng, backpressure=backpressure,
                    max_cycles=max_cycles)
    started, done, counters, hs = [], [], {}, []

    async def control(ctx):
        regs = RegisterDriver(TX_REGS, AxiLiteSimMaster(ctx, dut.s_axil).read,
                              AxiLiteSimMaster(ctx, dut.s_axil).write)
        if configure_regs:
            await configure(regs, model, rng, qps)
        started.append(True)
        while not done:
            await ctx.tick()
        for _ in range(3 * dut.latency):
            assert not ctx.get(dut.m_axis.tvalid), "a frame more than expected"
            await ctx.tick()
        # A source still waiting would keep the simulation running for ever.
        assert psrc.done, "payload beats left that the block never took"
        assert dsrc_done, "descriptors left that the block never took"
        for name in ("frames", "retransmissions", "bad_qp", "bad_opcode", "too_long",
                     "payload"):
            counters[name] = await regs.read(name)

    dsrc_done = []

    async def sinker(ctx):
        await sink.run(ctx)
        done.append(True)

    run(dut, control, gated(started, dsrc.run, dsrc_done), gated(started, psrc.run), sinker,
        handshake_watcher(dut.desc, hs, done))
    return dut, sink, model, counters, hs


def payloads_for(rng, descs):
    """A payload frame per descriptor that takes one: a WRITE of length > 0 (a probe takes
    none, whatever its length)."""
    return [bytes(rng.getrandbits(8) for _ in range(d["length"]))
            if d["length"] and d["opcode"] not in (Opcode.PROBE, Opcode.EP_REQUEST) else None
            for d in descs]


@pytest.mark.parametrize("width", [64, 128, 512, 2048])
def test_frames_match_the_packet_model(width):
    rng = seeded()
    qps = 4
    descs = mixed_descs(rng, qps, soak(40), 0.25)
    payloads = payloads_for(rng, descs)
    _, sink, model, counters, _ = run_tx(width, descs, payloads, qps=qps, rng=rng, idle=0.2,
                                         backpressure=0.3)
    probes = 0
    for i, (d, got, user) in enumerate(zip(descs, sink.frames, sink.users)):
        want, causes = model.frame(d, payloads[i] or b"")
        assert not causes and user == 0, f"frame {i}: {causes}, tuser {user}"
        assert got == want, f"frame {i} ({Opcode(d['opcode']).name}, {d['length']} bytes) " \
                            f"differs at byte " \
                            f"{next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), 'length')}"
        pk.decode(got, check_icrc=True, udp_dport=None)
        if d["opcode"] == Opcode.PROBE:
            check_probe(got, d, model)
            probes += 1
    assert len(sink.frames) == len(descs) and probes == round(len(descs) * 0.25)
    assert counters["frames"] == len(descs)
    assert counters["retransmissions"] == sum(d["rtx"] for d in descs
                                              if d["opcode"] != Opcode.PROBE)
    assert counters["bad_opcode"] == counters["too_long"] == counters["payload"] == 0


def test_scapy_reads_the_frames():
    """scapy (an independent RoCEv2 implementation) reads the BTH and finds its own ICRC."""
    roce = pytest.importorskip("scapy.contrib.roce")
    from scapy.layers.l2 import Ether
    from scapy.layers.inet import UDP as ScapyUDP
    rng = seeded()
    descs = [random_desc(rng, 2, max_len=64) for _ in range(6)]
    payloads = payloads_for(rng, descs)
    # Registers at their reset values: UDP port 4971, MRC's, where testkit.scapy_mrc binds
    # scapy's BTH.
    import testkit.scapy_mrc  # noqa: F401
    _, sink, _, _, _ = run_tx(64, descs, payloads, qps=2, rng=rng, configure_regs=False)
    for d, got in zip(descs, sink.frames):
        s = Ether(got)
        b = s[roce.BTH]
        assert (b.opcode, b.psn, b.ackreq) == (d["opcode"], d["psn"], d["ack_req"])
        assert b.compute_icrc(b"") == got[-4:]
        assert s[ScapyUDP].sport == d["entropy"] & 0xFFFF and s[ScapyUDP].len == len(got) - 54


@pytest.mark.parametrize("width", [64, 512, 2048])
def test_back_to_back_one_beat_a_cycle_and_latency(width):
    """Payload and descriptors always there, sink always ready: the output carries one beat
    every cycle from the first frame's first beat to the last frame's last, with exactly
    ceil(len / B) beats a frame; the first frame's first beat comes ``latency`` cycles
    after its descriptor's handshake."""
    rng = seeded()
    B = width // 8
    descs = mixed_descs(rng, 4, soak(30), 0.3, max_len=600)
    payloads = payloads_for(rng, descs)
    dut, sink, model, _, hs = run_tx(width, descs, payloads, qps=4, rng=rng)
    beats = sink.beat_cycles
    assert beats[-1] - beats[0] + 1 == len(beats), "an idle cycle on the output"
    want_beats = sum(-(-len(model.frame(d, p or b"")[0]) // B) for d, p in zip(descs, payloads))
    assert len(beats) == want_beats
    assert beats[0] - hs[0] == dut.latency
    print(f"{width} bits: {len(descs)} frames ({sum(d['opcode'] == Opcode.PROBE for d in descs)}"
          f" probes), {len(beats)} beats in {beats[-1] - beats[0] + 1} cycles, first beat "
          f"{beats[0] - hs[0]} cycles after its descriptor")


@pytest.mark.parametrize("width", [64, 512, 2048])
def test_probes_back_to_back(width):
    """Probes only, descriptors always there (no payload at all): ceil(94 / B) beats a
    probe, one beat every cycle, a probe first gives its first beat ``latency`` cycles
    after its descriptor, as a WRITE does."""
    rng = seeded()
    B = width // 8
    descs = [random_desc(rng, 4, opcode=Opcode.PROBE) for _ in range(soak(24))]
    dut, sink, model, counters, hs = run_tx(width, descs, [None] * len(descs), qps=4, rng=rng)
    for d, got in zip(descs, sink.frames):
        assert got == model.frame(d, b"")[0]
        check_probe(got, d, model)
    beats = sink.beat_cycles
    assert len(beats) == len(descs) * -(-94 // B)
    assert beats[-1] - beats[0] + 1 == len(beats), "an idle cycle on the output"
    assert beats[0] - hs[0] == dut.latency
    assert counters["frames"] == len(descs) and counters["retransmissions"] == 0
    # End to end: the receive side's model reads each frame the block made as a probe of
    # the same QP (the peer's number, as its RoceRx sees it), PSN, STEV and timestamp.
    r = model.regs
    rx_regs = rx_model.RxRegs(udp_dport=r["udp_dport"], trim_dscp=(r["dscp_data"] + 1) % 64,
                              trim_lasthop_dscp=(r["dscp_data"] + 2) % 64)
    for d, got in zip(descs, sink.frames):
        res = rx_model.receive(got, rx_model.meta_of(), rx_regs)
        rqp = model.ctx[d["qp"]][2]
        assert res.kind == "probe", res
        assert (res.pkt["opcode"], res.pkt["qp"], res.pkt["psn"], res.pkt["entropy"],
                res.pkt["timestamp"], res.pkt["slot"]) == \
            (Opcode.PROBE, rqp & 0xFFFF, d["psn"], d["entropy"], d["timestamp"], 0)
    print(f"{width} bits: {len(descs)} probes, {len(beats)} beats in "
          f"{beats[-1] - beats[0] + 1} cycles, latency {beats[0] - hs[0]}")


@pytest.mark.parametrize("width", [64, 512])
def test_port_status_updates_among_writes_and_probes(width):
    """EP_REQUEST descriptors (``imm`` = the port mask) among writes and probes: each frame
    is the packet model's, one beat a cycle with the rest, and the receive side's model
    reads it as a port status update for the peer's QP with the mask."""
    rng = seeded()
    descs = mixed_descs(rng, 4, soak(24), 0.2, max_len=300)
    for i in rng.sample(range(len(descs)), len(descs) // 3):
        descs[i] = random_desc(rng, 4, opcode=Opcode.EP_REQUEST)
    payloads = payloads_for(rng, descs)
    dut, sink, model, counters, hs = run_tx(width, descs, payloads, qps=4, rng=rng)
    beats = sink.beat_cycles
    assert beats[-1] - beats[0] + 1 == len(beats), "an idle cycle on the output"
    r = model.regs
    rx_regs = rx_model.RxRegs(udp_dport=r["udp_dport"], trim_dscp=(r["dscp_data"] + 1) % 64,
                              trim_lasthop_dscp=(r["dscp_data"] + 2) % 64)
    updates = 0
    for i, (d, got, user) in enumerate(zip(descs, sink.frames, sink.users)):
        want, causes = model.frame(d, payloads[i] or b"")
        assert got == want and not causes and user == 0, f"frame {i}"
        if d["opcode"] == Opcode.EP_REQUEST:
            res = rx_model.receive(got, rx_model.meta_of(), rx_regs)
            rqp = model.ctx[d["qp"]][2]
            assert res.kind == "port_status" and len(got) == 94, res
            assert res.peer == {"qp": rqp & 0xFFFF, "ports": d["imm"]}
            updates += 1
    assert updates == len(descs) // 3 and counters["frames"] == len(descs)
    assert counters["bad_opcode"] == counters["too_long"] == 0


def test_payload_frames_that_disagree_are_marked_and_do_not_disturb_the_next():
    rng = seeded()
    width, qps = 64, 2
    descs, payloads, users, expect_bad = [], [], [], []
    for i in range(24):
        d = random_desc(rng, qps, max_len=100, opcode=Opcode.WRITE_MIDDLE)
        d["length"] = rng.randrange(2, 100)
        good = bytes(rng.getrandbits(8) for _ in range(d["length"]))
        kind = i % 4
        if kind == 0:
            pay, user, bad = good, 0, False
        elif kind == 1:                    # shorter than the descriptor, never empty
            pay, user, bad = good[:rng.randrange(1, d["length"])], 0, True
        elif kind == 2:                    # longer
            pay, user, bad = good + bytes(rng.randrange(1, 30)), 0, True
        else:                              # marked bad on input
            pay, user, bad = good, 1, True
        descs.append(d)
        payloads.append(pay)
        users.append(user)
        expect_bad.append((bad, good))
    _, sink, model, counters, _ = run_tx(width, descs, payloads, qps=qps, rng=rng, idle=0.1,
                                         backpressure=0.2, pay_users=users)
    for i, (d, got, user) in enumerate(zip(descs, sink.frames, sink.users)):
        bad, good = expect_bad[i]
        want, _ = model.frame(d, good)
        assert len(got) == len(want), f"frame {i}: length {len(got)}, want {len(want)}"
        assert user == int(bad), f"frame {i}: tuser {user}, want {int(bad)}"
        if not bad:
            assert got == want
    assert counters["payload"] == sum(b for b, _ in expect_bad)


def test_bad_descriptors_are_sent_marked_and_counted():
    rng = seeded()
    qps = 3
    descs = [random_desc(rng, qps, max_len=40) for _ in range(14)]
    descs[2]["qp"] = 7
    descs[5]["opcode"] = int(Opcode.SACK)
    descs[8]["qp"] = 3
    # A probe with a length: still a probe, marked too_long, takes no payload frame (the
    # next descriptor's payload is the next on s_axis); a good probe after it.
    descs[10] = random_desc(rng, qps, opcode=Opcode.PROBE)
    descs[10]["length"] = rng.randrange(1, 300)
    descs[12] = random_desc(rng, qps, opcode=Opcode.PROBE)
    descs[11]["length"] = descs[13]["length"] = 17
    payloads = payloads_for(rng, descs)
    assert payloads[10] is None and payloads[11] is not None
    _, sink, model, counters, _ = run_tx(64, descs, payloads, qps=qps, rng=rng,
                                         backpressure=0.3)
    for i, (d, got, user) in enumerate(zip(descs, sink.frames, sink.users)):
        want, causes = model.frame(d, payloads[i] or b"")
        assert user == int(bool(causes)), f"frame {i}"
        if want is not None:
            assert len(got) == len(want)
            if not causes or i == 10:
                assert got == want, f"frame {i}"
    assert model.frame(descs[10], b"")[1] == {"too_long"}
    check_probe(sink.frames[10], descs[10], model)
    check_probe(sink.frames[12], descs[12], model)
    assert counters["bad_qp"] == 2 and counters["bad_opcode"] == 1
    assert counters["too_long"] == 1 and counters["payload"] == 0


def test_parameters_are_checked():
    with pytest.raises(ValueError):
        RoceTx(48)
    with pytest.raises(ValueError):
        RoceTx(64, qps=0)
    with pytest.raises(ValueError):
        RoceTx(4096)


def test_docs_page_has_the_register_table():
    page = docs_page("blocks", "roce-tx.md")
    assert TX_REGS.markdown() in page.read_text()
