"""RoceRx on Amaranth's simulator against mrcnic.model.rx.roce_rx, record for record and byte
for byte: random mixes of every kind of frame, directed checks, buffer full, throughput and
latency."""

import random
from collections import deque

import pytest

from mrcnic.base import proto
from mrcnic.host.driver import RegisterDriver
from mrcnic.model import packet as pk
from mrcnic.model.rx import roce_rx as model
from mrcnic.model.rx.roce_rx import (bad_frame, control_frame, data_frame, meta_of,
                                  random_mix, trimmed_frame, with_meta)
from mrcnic.base.proto import EvMode, Opcode
from mrcnic.rx.roce_rx import ROCE_RX_REGS, RoceRx
from mrcnic.base.records import (
    NAK, EV_PROBE, PEER_STATUS, PLACE, RX_PKT, VERDICT_IN, ACK_DESC, DECAP_META)
from testkit import docs_page
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import run, seeded, soak
from testkit.streams import AxisSource, beats_to_frame


def pack(layout, d):
    return layout.const(d).as_value().value


def unpack(layout, v):
    return {name: (v >> f.offset) & ((1 << f.width) - 1) for name, f in layout}


# --- Running the block ---------------------------------------------------------------------

class Run:
    """Drive frames, metas and verdicts; collect every output; compare with the model."""

    def __init__(self, width, frames, *, rng=None, idle=0.0, backpressure=0.0,
                 place_prob=0.8, verdict_delay=(0, 4), regs=None, bad_tags=0.0,
                 release_after=0, **params):
        self.dut = RoceRx(width, **params)
        self.width, self.frames = width, frames
        self.rng = rng or random.Random(0)
        self.idle, self.bp = idle, backpressure
        self.place_prob, self.verdict_delay, self.bad_tags = place_prob, verdict_delay, bad_tags
        self.release_after = release_after
        self.regs = regs or {}
        self.model_regs = model.RxRegs(**{k: v for k, v in self.regs.items()})
        self.pkts, self.acks, self.naks, self.places, self.payloads = [], [], [], [], []
        self.peers, self.ev_probes = [], []
        self.verdicts = []              # (tag, place) as sent
        self.beat_cycles = []           # every input beat taken
        self.in_cycles, self.pkt_cycles, self.out_cycles, self.verdict_cycles = [], [], [], []
        self.place_cycles = []
        self.src_done = False
        self.counters = {}

    async def source(self, ctx):
        dut = self.dut
        if self.regs:
            axil = AxiLiteSimMaster(ctx, dut.s_axil)
            drv = RegisterDriver(ROCE_RX_REGS, axil.read, axil.write)
            names = {"udp_dport": ("udp_dport", "port"), "pmtu": ("pmtu", "bytes"),
                     "trim_dscp": ("trim_dscp", "dscp"),
                     "trim_lasthop_dscp": ("trim_lasthop_dscp", "dscp"),
                     "stev_swap": ("stev_swap", "swap")}
            for k, v in self.regs.items():
                reg, field = names[k]
                await drv.write_fields(reg, **{field: v})
        await AxisSource(dut.s_axis, [f for f, _, _ in self.frames], rng=self.rng,
                         idle=self.idle, users=[u for _, _, u in self.frames]).run(ctx)
        self.src_done = True

    async def meta_source(self, ctx):
        port = self.dut.meta
        for _frame, meta, _user in self.frames:
            while self.idle and self.rng.random() < self.idle:
                ctx.set(port.valid, 0)
                await ctx.tick()
            ctx.set(port.payload.as_value(), pack(DECAP_META, meta))
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)

    async def sink(self, ctx):
        dut, rng = self.dut, self.rng
        outs = {"pkt": (dut.pkt, RX_PKT, self.pkts), "ack": (dut.ack, ACK_DESC, self.acks),
                "nak": (dut.nak, NAK, self.naks), "peer": (dut.peer, PEER_STATUS, self.peers),
                "ev_probe": (dut.ev_probe, EV_PROBE, self.ev_probes),
                "place": (dut.place, PLACE, self.places)}
        pending, cur = deque(), None
        beats, held = [], {}
        cycle, quiet = 0, 0
        B = self.width // 8
        while True:
            ready = {k: not (self.bp and rng.random() < self.bp) for k in [*outs, "m_axis"]}
            for k, (port, _, _) in outs.items():
                ctx.set(port.ready, ready[k])
            ctx.set(dut.m_axis.tready, ready["m_axis"])
            if cur is None and pending and pending[0][0] <= cycle and \
                    cycle >= self.release_after:
                cur = pending.popleft()[1:]
            ctx.set(dut.verdict.valid, cur is not None)
            if cur is not None:
                ctx.set(dut.verdict.payload.as_value(),
                        pack(VERDICT_IN, {"tag": cur[0], "place": cur[1]}))
            sig = [dut.s_axis.tvalid, dut.s_axis.tready, dut.s_axis.tlast,
                   dut.verdict.ready, dut.m_axis.tvalid, dut.m_axis.tdata,
                   dut.m_axis.tkeep, dut.m_axis.tlast, dut.m_axis.tuser]
            for port, _, _ in outs.values():
                sig += [port.valid, port.payload.as_value()]
            v = (await ctx.tick().sample(*sig))[2:]
            busy = False
            if v[0] and v[1]:
                self.beat_cycles.append(cycle)
                if v[2]:
                    self.in_cycles.append(cycle)
            if cur is not None and v[3]:
                self.verdicts.append(cur)
                self.verdict_cycles.append(cycle)
                cur, busy = None, True
            mv = v[4:9]
            if mv[0]:
                if "m" in held and held["m"] != mv:
                    raise AssertionError(f"cycle {cycle}: m_axis changed before tready")
                held["m"] = mv
            if mv[0] and ready["m_axis"]:
                del held["m"]
                beats.append((mv[1], mv[2], mv[3], mv[4]))
                self.out_cycles.append(cycle)
                busy = True
                if mv[3]:
                    assert not mv[4], "m_axis tuser set"
                    self.payloads.append(beats_to_frame(beats, B))
                    beats = []
            for i, (k, (port, layout, dest)) in enumerate(outs.items()):
                valid, payload = v[9 + 2 * i], v[10 + 2 * i]
                if valid:
                    if k in held and held[k] != payload:
                        raise AssertionError(f"cycle {cycle}: {k} changed before ready")
                    held[k] = payload
                if valid and ready[k]:
                    del held[k]
                    rec = unpack(layout, payload)
                    dest.append(rec)
                    busy = True
                    if k == "pkt":
                        self.pkt_cycles.append(cycle)
                        if rec["slot"]:
                            tag = rec["tag"]
                            if self.bad_tags and rng.random() < self.bad_tags:
                                tag ^= 0x8000
                            lo, hi = self.verdict_delay
                            pending.append((cycle + rng.randint(lo, hi), tag,
                                            int(rng.random() < self.place_prob)))
                    if k == "place":
                        self.place_cycles.append(cycle)
            cycle += 1
            quiet = 0 if (busy or not self.src_done or pending or cur) else quiet + 1
            if quiet > 300:
                break
            if cycle > 400_000:
                raise AssertionError("no end after 400000 cycles")
        for k in [*outs]:
            ctx.set(outs[k][0].ready, 0)
        axil = AxiLiteSimMaster(ctx, dut.s_axil)
        drv = RegisterDriver(ROCE_RX_REGS, axil.read, axil.write)
        for name in [r.name for r in ROCE_RX_REGS if "count" in r.fields]:
            self.counters[name] = await drv.read(name)
        self.counters["status"] = await drv.read_fields("status")

    def run(self):
        run(self.dut, self.source, self.meta_source, self.sink)
        return self

    def check(self):
        """Everything the block gave against the model. Returns the model's results."""
        results = [model.receive(f, meta, self.model_regs, tuser=u,
                                 pmtu_max=self.dut.pmtu_max) for f, meta, u in self.frames]
        assert self.acks == [r.ack for r in results if r.ack is not None]
        assert self.naks == [r.nak for r in results if r.nak is not None]
        assert self.peers == [r.peer for r in results if r.peer is not None]
        assert self.ev_probes == [r.ev_probe for r in results if r.ev_probe is not None]
        matched, skipped = model.match_pkts(results, self.pkts)
        want_place, want_payloads = [], []
        for (res, rec), (tag, place) in zip(matched, self.verdicts):
            if tag != rec["tag"]:
                continue
            pl, payload = model.expected_place(res, tag, place)
            if pl is not None:
                want_place.append(pl)
            if payload is not None:
                want_payloads.append(payload)
        assert len(self.verdicts) == len(matched)
        assert self.places == want_place
        assert len(self.payloads) == len(want_payloads)
        for i, (got, want) in enumerate(zip(self.payloads, want_payloads)):
            assert got == want, f"payload {i}: {len(got)} bytes, model {len(want)}"
        c = self.counters
        causes = {k: sum(r.cause == k for r in results) for k in model.CAUSES}
        causes["no_room"] = skipped
        kinds = {k: sum(r.kind == k for r in results) for k in model.KINDS}
        bad_tag = sum(t != rec["tag"] for (_, rec), (t, _) in zip(matched, self.verdicts))
        placed = sum(p and t == rec["tag"] for (_, rec), (t, p) in zip(matched, self.verdicts))
        want = {"frames": len(self.frames), **causes, "data": kinds["data"] - skipped,
                "trimmed": kinds["trimmed"], "probes": kinds["probe"],
                "sacks": kinds["sack"], "nacks": kinds["nack"], "acks": kinds["ack"],
                "naks": kinds["nak"], "port_status": kinds["port_status"],
                "ev_probes": kinds["ev_probe"],
                "placed": placed, "verdict_tag": bad_tag,
                "verdict_drop": len(matched) - placed - bad_tag}
        got = {k: c[k] for k in want}
        assert got == want, f"counters {got} != {want}"
        assert c["status"] == {"held": 0, "buffer_words": 0}, c["status"]
        return results, skipped


# --- Tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [64, 128, 512, 2048])
def test_random_mix_matches_the_model(width):
    rng = seeded()
    n = soak({64: 40, 128: 50, 512: 60, 2048: 40}[width])
    frames = random_mix(rng, n, max_payload=600 if width >= 512 else 300)
    # The mix draws a trimmed frame one time in ten: one is always there, whatever the seed.
    f, meta = trimmed_frame(rng, rng.choice([EvMode.PASS, EvMode.SRV6, EvMode.SRV6_SRH]),
                            rng.getrandbits(1))
    frames.insert(rng.randrange(len(frames) + 1), (f, meta, 0))
    # At 128 bits the pmtu register is below the largest payloads: too_long in the mix.
    regs = {"pmtu": 250} if width == 128 else None
    r = Run(width, frames, rng=rng, idle=0.2, backpressure=0.3, regs=regs).run()
    results, skipped = r.check()
    assert skipped == 0
    assert {res.kind for res in results} >= {"data", "trimmed"}


def test_too_long_and_registers():
    """pmtu, udp_dport, the trim codepoints and the STEV split are registers."""
    rng = seeded()
    regs = {"pmtu": 512, "udp_dport": 4791, "trim_dscp": 0x21, "trim_lasthop_dscp": 0x22,
            "stev_swap": 1}
    frames = []
    for i in range(16):
        # Frame 0 is over the pmtu whatever the seed: the case is always there.
        f = data_frame(rng, length=700 if i == 0 else rng.choice([0, 100, 511, 512, 513, 700]))
        f = f[:56] + (4791).to_bytes(2, "big") + f[58:]
        f = f[:-4] + pk.icrc(f[14:-4]).to_bytes(4, "little")
        meta = meta_of()
        if i % 4 == 3:          # trimmed by the new codepoint in the outer header
            meta = meta_of(EvMode.SRV6, 0x21 + (i % 8 == 7), 3)
            f = f[:94 + 4 * (f[70] >> 4 & 1)]
        frames.append((f, meta, 0))
    frames.append((data_frame(rng), meta_of(), 0))        # port 4971: not MRC any more
    r = Run(512, frames, rng=rng, regs=regs).run()
    results, _ = r.check()
    causes = [res.cause for res in results]
    assert "too_long" in causes and causes[-1] == "not_roce"
    assert sum(res.kind == "trimmed" for res in results) == 4
    # The EV with the halves swapped: EV[31:16] from the port (the model compared every
    # record; this pins the convention itself).
    k = next(i for i, res in enumerate(results) if res.kind == "data")
    f = frames[k][0]
    port, flow = int.from_bytes(f[54:56], "big"), int.from_bytes(f[15:18], "big") & 0xFFFF
    assert results[k].pkt["entropy"] == port << 16 | flow


@pytest.mark.parametrize("width", [64, 512])
def test_each_check(width):
    """One directed frame per check, each between two good frames."""
    rng = seeded()
    frames = []
    good = lambda: (data_frame(rng), meta_of(), 0)            # noqa: E731
    for kind in ["icrc", "truncated", "length", "udp_port", "opcode", "ethertype", "tuser",
                 "meta_bad", "junk"]:
        f, meta, u = bad_frame(rng, kind)
        while kind == "junk" and len(f) < 14:
            f, meta, u = bad_frame(rng, kind)
        frames += [good(), (f, meta, u)]
    # Length rules on a control packet, pad on a control packet, a bad pad count.
    s = bytearray(control_frame(rng, "sack")); s[63] |= 0x10
    s[-4:] = pk.icrc(bytes(s[14:-4])).to_bytes(4, "little")
    frames.append((bytes(s), meta_of(), 0))
    d = bytearray(data_frame(rng, length=0)); d[63] = (d[63] & 0xCF) | 0x10   # pad > rest
    d[-4:] = pk.icrc(bytes(d[14:-4])).to_bytes(4, "little")
    frames.append((bytes(d), meta_of(), 0))
    # Trimmed control packet: an opcode drop; trimmed frame shorter than its RETH.
    f, meta = trimmed_frame(rng, EvMode.SRV6)
    frames.append((f[:90], meta, 0))
    c = control_frame(rng, "nack")
    frames.append((c, meta_of(EvMode.SRV6, proto.DSCP_TRIMMED), 0))
    # A trimmed frame with a corrupt ICRC region and a wrong inner length is still trimmed.
    f, meta = trimmed_frame(rng, EvMode.SRV6_SRH, lasthop=True)
    frames.append((f, meta, 0))
    f = data_frame(rng)
    frames.append((f, meta_of(EvMode.SRV6, proto.DSCP_DATA, proto.ECN_CE), 0))  # CE
    frames.append(good())
    r = Run(width, frames, rng=rng).run()
    results, _ = r.check()
    got = [res.cause or res.kind for res in results]
    want = ["icrc", "truncated", "length", "not_roce", "opcode", "not_roce", "in_bad",
            "in_bad", "not_roce"]
    assert got[1:18:2] == want, got
    assert got[18:] == ["length", "length", "truncated", "opcode", "trimmed", "data", "data"]
    assert results[-2].pkt["ce"] == 1 and results[-3].pkt["lasthop"] == 1


def broken_probes(rng):
    """Three probes each broken in one way, with what the block must count: a bit of the
    ICRC flipped; four bytes after the PETH (lengths and ICRC consistent, so only the
    probe's own length rule fails); cut inside the PETH."""
    f = bytearray(control_frame(rng, "probe"))
    f[rng.randrange(len(f) - 4, len(f))] ^= 1 << rng.randrange(8)
    icrc_bad = bytes(f)
    f = bytearray(control_frame(rng, "probe"))
    f[-4:-4] = rng.randbytes(4)
    f[18:20] = (len(f) - 54).to_bytes(2, "big")
    f[58:60] = (len(f) - 54).to_bytes(2, "big")
    f[-4:] = pk.icrc(bytes(f[14:-4])).to_bytes(4, "little")
    long = bytes(f)
    short = control_frame(rng, "probe")[:rng.randrange(74, 94)]
    return [(icrc_bad, "icrc"), (long, "length"), (short, "truncated")]


def run_among_random_traffic(width, rng, kind, n, good, broken):
    """``good`` control frames of ``kind`` and the ``broken`` ones ((frame, cause) pairs)
    at random places among ``n`` random frames, run with idle and backpressure and checked
    against the model, each broken frame under its cause. Returns (frames, run, results,
    skipped)."""
    frames = random_mix(rng, n, max_payload=600 if width >= 512 else 300)
    for _ in range(good):
        f = control_frame(rng, kind)
        frames.insert(rng.randrange(len(frames) + 1), (f, with_meta(rng, f), 0))
    for f, _ in broken:
        frames.insert(rng.randrange(len(frames) + 1), (f, with_meta(rng, f), 0))
    r = Run(width, frames, rng=rng, idle=0.2, backpressure=0.3).run()
    results, skipped = r.check()
    for f, cause in broken:
        got = next(res for (g, _, _), res in zip(frames, results) if g == f)
        assert got.cause == cause, f"broken {kind}: model says {got.cause}, not {cause}"
    return frames, r, results, skipped


@pytest.mark.parametrize("width", [64, 512])
def test_probes_in_random_traffic(width):
    """Probes mixed into random traffic (data, control, trimmed, bad frames): each good one
    gives a pkt record with opcode PROBE, the BTH's QP and PSN, the frame's STEV, the PETH
    timestamp, length 0 and no slot (so no verdict is asked for it); a probe with a bad
    ICRC, a byte too many or cut short is dropped and counted. Records and counters match
    the model, and the probe records are also read off the frames directly."""
    rng = seeded()
    broken = broken_probes(rng)
    frames, r, results, skipped = run_among_random_traffic(
        width, rng, "probe", soak(40), 12, broken)
    assert skipped == 0
    assert r.counters["icrc"] >= 1 and r.counters["length"] >= 1
    # Probe records straight from the frames (the packet codec, not the RX model).
    want = []
    for (f, meta, _), res in zip(frames, results):
        if res.kind != "probe":
            continue
        p = pk.decode(f, check_icrc=True)
        ecn = p.ip["ecn"] if meta["mode"] == EvMode.PASS else meta["ecn"]
        want.append({"opcode": int(Opcode.PROBE), "qp": p.bth["dest_qp"] & 0xFFFF,
                     "psn": p.bth["psn"], "entropy": pk.stev_ev(p),
                     "timestamp": p.peth["timestamp"], "length": 0, "slot": 0, "tag": 0,
                     "ce": int(ecn == proto.ECN_CE), "trimmed": 0, "va": 0})
    got = [{k: rec[k] for k in want[0]} for rec in r.pkts
           if rec["opcode"] == Opcode.PROBE]
    assert len(want) >= 12 and got == want
    assert r.counters["probes"] == len(want)
    print(f"{width} bits: {len(frames)} frames, {len(want)} probe records, "
          f"{len(broken)} broken probes dropped")


def broken_endpoint_requests(rng, kind):
    """Endpoint requests of ``kind`` ("port_status" or "ev_probe", control_frame's), each
    broken in one way, with the drop the block must count."""
    def fix(f):
        f[-4:] = pk.icrc(bytes(f[14:-4])).to_bytes(4, "little")
        return bytes(f)
    out = []
    f = bytearray(control_frame(rng, kind))
    f[69] ^= 0x01                                  # BTH dest QP 3, not the endpoint QP
    out.append((fix(f), "opcode"))
    for op in (2, 3):                              # endpoint operations not defined
        f = bytearray(control_frame(rng, kind))
        f[75] = (f[75] & ~3) | op
        out.append((fix(f), "opcode"))
    f = bytearray(control_frame(rng, kind))
    f[-4:-4] = rng.randbytes(4)                    # a body longer than an ERTH
    f[18:20] = (len(f) - 54).to_bytes(2, "big")
    f[58:60] = (len(f) - 54).to_bytes(2, "big")
    out.append((fix(f), "length"))
    f = bytearray(control_frame(rng, kind))
    f[rng.randrange(len(f) - 4, len(f))] ^= 1 << rng.randrange(8)
    out.append((bytes(f), "icrc"))
    out.append((control_frame(rng, kind)[:rng.randrange(75, 94)], "truncated"))
    return out


@pytest.mark.parametrize("width", [64, pytest.param(512, marks=pytest.mark.soak)])
def test_port_status_updates_in_random_traffic(width):
    """Port status updates (endpoint request 0xD8 to QP 0x2, ERTH op 0) mixed into
    random traffic: each good one gives a ``peer`` record with the receiver's QP (dst_id)
    and the sender's port mask, read here off the frames with the packet codec; one to
    another QP, of an operation not defined, a byte too many, a bad ICRC or cut short is
    dropped under its cause. Records and counters also match the model."""
    rng = seeded()
    frames, r, results, _ = run_among_random_traffic(
        width, rng, "port_status", soak(30), 10, broken_endpoint_requests(rng, "port_status"))
    want = []
    for (f, _, _), res in zip(frames, results):
        if res.cause is None and f[62] == Opcode.EP_REQUEST:
            st = pk.port_status(pk.decode(f, check_icrc=True))
            if st is not None:
                want.append({"qp": st["dst_id"], "ports": st["ports"]})
    assert len(want) >= 10 and r.peers == want
    assert r.counters["port_status"] == len(want)


@pytest.mark.parametrize("width", [64, pytest.param(512, marks=pytest.mark.soak)])
def test_ev_probe_requests_in_random_traffic(width):
    """EV probe requests (endpoint request 0xD8 to QP 0x2, ERTH op 1) mixed into random
    traffic: each good one gives an ``ev_probe`` record (the QP it names, dst_id; the
    requester's QP, src_id; the BTH PSN; the frame's STEV; the ERTH timestamp), read here
    off the frames with the packet codec; one to another QP, of an operation not defined, a
    byte too many, a bad ICRC or cut short is dropped under its cause. Records and counters
    also match the model."""
    rng = seeded()
    broken = broken_endpoint_requests(rng, "ev_probe")
    frames, r, results, _ = run_among_random_traffic(
        width, rng, "ev_probe", soak(30), 10, broken)
    want = []
    for (f, _, _), res in zip(frames, results):
        if res.cause is None and f[62] == Opcode.EP_REQUEST:
            p = pk.decode(f, check_icrc=True)
            erth = pk.endpoint_request(p)
            if erth["op"] == proto.EP_EV_PROBE:
                want.append({"qp": erth["dst_id"], "peer_id": erth["src_id"],
                             "psn": p.bth["psn"], "entropy": pk.stev_ev(p),
                             "timestamp": erth["timestamp"]})
    assert len(want) >= 10 and r.ev_probes == want
    assert r.counters["ev_probes"] == len(want)


def test_wrong_verdict_tags_drop_the_packet():
    rng = seeded()
    frames = [(data_frame(rng, 200), meta_of(), 0) for _ in range(20)]
    r = Run(128, frames, rng=rng, bad_tags=0.3, place_prob=1.0).run()
    r.check()
    assert 0 < r.counters["verdict_tag"] < 20


@pytest.mark.parametrize("width", [64, 512])
def test_buffer_full_drops_counts_and_recovers(width):
    """Verdicts held back: the buffer fills, data frames are dropped as no_room (control
    records still flow), and after the verdicts everything drains and new frames pass."""
    rng = seeded()
    frames = []
    for i in range(12):
        frames.append((data_frame(rng, length=1500), meta_of(), 0))
        if i % 3 == 0:
            f = control_frame(rng, "sack")
            frames.append((f, meta_of(), 0))
    B = width // 8
    r = Run(width, frames, rng=rng, verdict_delay=(8 * 1600 // B, 8 * 1600 // B),
            buffer_bytes=8192, pmtu_max=2048, place_prob=1.0).run()
    results, skipped = r.check()
    # 8192 bytes hold 5 payloads of 1500 bytes: the rest of the first burst is dropped;
    # the held ones place when their verdicts come, and the buffer takes frames again.
    assert skipped > 0 and r.counters["no_room"] == skipped
    assert r.counters["placed"] == 12 - skipped
    assert r.counters["sacks"] == 4
    # Recovered: the last frame, sent after the first verdicts freed the buffer, is kept.
    kept = [res.pkt["psn"] for res, _ in model.match_pkts(results, r.pkts)[0]]
    assert results[-1].kind == "data" and kept[-1] == results[-1].pkt["psn"]


def test_held_queue_full_is_no_room():
    rng = seeded()
    frames = [(data_frame(rng, length=rng.randrange(3)), meta_of(), 0) for _ in range(20)]
    r = Run(256, frames, rng=rng, verdict_delay=(300, 300), max_held=4,
            place_prob=1.0).run()
    _, skipped = r.check()
    assert skipped == 16


@pytest.mark.parametrize("width", [64, 512])
def test_throughput_and_latency(width):
    """No idle, no backpressure, verdicts at once: one input beat a cycle over 4 KiB
    payloads and over small control frames; the record and placement latencies the
    docstring states; payloads whose verdicts are all there leave one beat a cycle."""
    rng = seeded()
    big = [(data_frame(rng, length=4096, ts=0, op=Opcode.WRITE_MIDDLE), meta_of(), 0)
           for _ in range(3 if width == 64 else 8)]
    small = [(control_frame(rng, k), meta_of(), 0)
             for k in ["sack", "nack", "ack", "probe", "nak", "port_status"] * 5]
    small += [(data_frame(rng, length=rng.randrange(40)), meta_of(), 0) for _ in range(10)]
    rng.shuffle(small)
    small.insert(0, (data_frame(rng, length=8), meta_of(), 0))
    B = width // 8
    for frames, what in [(big, "4 KiB writes"), (small, "small frames")]:
        r = Run(width, frames, rng=rng, place_prob=1.0, verdict_delay=(0, 0)).run()
        r.check()
        beats = sum(-(-len(f) // B) for f, _, _ in frames)
        c = r.beat_cycles
        assert len(c) == beats
        assert c[-1] - c[0] + 1 == beats, f"{what}: {beats} input beats took {c[-1] - c[0] + 1}"
        # Frame 0 is a data packet in both runs: its record, then its first payload beat.
        lat = r.pkt_cycles[0] - r.in_cycles[0]
        place_lat = r.out_cycles[0] - r.verdict_cycles[0]
        print(f"{width} bits, {what}: {beats} input beats in {c[-1] - c[0] + 1} cycles; "
              f"record latency {lat}, verdict to first payload beat {place_lat}")
        assert lat == r.dut.record_latency
        assert place_lat == r.dut.place_latency
    # Output rate: three 4 KiB payloads held, their verdicts released together.
    r = Run(width, big[:3], rng=rng, place_prob=1.0, verdict_delay=(0, 0),
            release_after=(3 * 4300) // B + 50).run()
    r.check()
    out = r.out_cycles
    assert len(out) == 3 * 4096 // B and out[-1] - out[0] + 1 == len(out), \
        f"{len(out)} output beats took {out[-1] - out[0] + 1} cycles"
    print(f"  output: {len(out)} beats in {out[-1] - out[0] + 1} cycles")


@pytest.mark.parametrize("params, message", [
    ({"data_width": 32}, "outside 64..2048"),
    ({"data_width": 96}, "not a power of two"),
    ({"buffer_bytes": 12000}, "not a power of two"),
    ({"buffer_bytes": 4096}, "less than 2 x (pmtu_max + headers)"),
    ({"pmtu_max": 100}, "outside 256..16384"),
    ({"max_held": 3}, "max_held = 3"),
])
def test_refuses_bad_parameters(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("+", r"\+")):
        RoceRx(**params)


def test_docs_register_table_is_the_register_map():
    page = docs_page("blocks", "roce-rx.md")
    assert ROCE_RX_REGS.markdown() in page.read_text()
