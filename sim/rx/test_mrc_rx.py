"""MrcRx on Amaranth's simulator: SRv6 data frames of several QPs sprayed over the planes,
with duplicates, received SACKs, an out-of-window packet and WRITEs the memory check refuses;
every payload placed once at its address, SACK/NACK frames on the planes of their EVs, an
AETH NAK for each refused WRITE on plane qp mod planes, the peer's SACKs passed on."""

import pytest
from amaranth.lib import data

from mrcnic.base import proto
from mrcnic.base.records import ACK_DESC, NAK, PEER_STATUS, PLACE
from mrcnic.model import packet as pk
from mrcnic.rx.ack_generator import ACK_REGS
from mrcnic.rx.mrc_rx import MrcRx
from mrcnic.base.proto import Opcode
from mrcnic.host.driver import RegisterDriver
from mrcnic.rx.memory_protect import MP_REGS, table_op
from testkit.axil import AxiLiteSimMaster
from testkit.simtools import run, seeded
from testkit.streams import AxisSink, AxisSource
from testkit.meta import MetaSink


def srv6(frame):
    return pk.encapsulate(frame, outer_src=0xFD00 << 112, outer_dst=0xFC00_0000_1001 << 80,
                          dscp=proto.DSCP_DATA, ecn=proto.ECN_ECT0)


@pytest.mark.parametrize("planes", [2, pytest.param(3, marks=pytest.mark.soak)])
def test_sprayed_writes_are_placed_once_and_answered_on_their_planes(planes):
    rng = seeded()
    qps = 5
    frames = {p: [] for p in range(planes)}
    # QPs 0..2 write into the one memory region; QP 3 sends one WRITE beyond the region's
    # end, QP 4 one with an unknown R_Key.
    want = {}                                   # (qp, psn) -> (va, payload)
    n_data = 0
    for qp in range(3):
        for psn in range(6):
            payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200)))
            va = (qp << 20) | psn << 8
            ev = rng.getrandbits(8)
            # The last PSN of each QP asks for an ACK (BTH A): at least one SACK a QP, however
            # the planes interleave (in order with no duplicate, nothing else calls for one).
            f = srv6(pk.encode(pk.write_packet(Opcode.WRITE_ONLY, qp, psn, va, 0x1234,
                                               len(payload), payload, ev=ev,
                                               ack_req=int(psn == 5))))
            frames[ev % planes].append(f)
            want[qp, psn] = (va, payload)
            n_data += 1
            if rng.random() < 0.2:              # a duplicate, on another plane
                frames[rng.randrange(planes)].append(f)
                n_data += 1
    # A packet far beyond the window (NACK 0x0B) and two SACKs from the peer.
    far = srv6(pk.encode(pk.write_packet(Opcode.WRITE_ONLY, 1, 5000, 0x100, 0x1234, 4,
                                         b"abcd", ev=7)))
    frames[7 % planes].append(far)
    sacks = [srv6(pk.encode(pk.sack_packet(q, 10 + q, 0b101))) for q in (0, 2)]
    frames[0].extend(sacks)
    # The peer's port status updates, one on each of two planes.
    frames[planes - 1].append(srv6(pk.encode(pk.port_status_packet(0b1101, src_id=9,
                                                                   dst_id=1))))
    frames[0].append(srv6(pk.encode(pk.port_status_packet(0xF, dst_id=2))))
    # The peer's EV probe requests, each answered on the plane of its EV.
    probes = [(rng.getrandbits(16), rng.getrandbits(16), rng.randrange(qps),
               rng.getrandbits(32), rng.getrandbits(24)) for _ in range(3)]
    for ts, peer_id, qp, ev, psn in probes:
        frames[rng.randrange(planes)].append(srv6(pk.encode(pk.ev_probe_packet(
            ts, src_id=peer_id, dst_id=qp, ev=ev, psn=psn))))
    frames[planes - 1].append(srv6(pk.encode(pk.write_packet(
        Opcode.WRITE_ONLY, 3, 2, (1 << 24) - 2, 0x1234, 4, b"over", ev=planes - 1))))
    frames[0].append(srv6(pk.encode(pk.write_packet(
        Opcode.WRITE_ONLY, 4, 1, 0x40, 0x9999, 4, b"evil", ev=0))))
    remote_qp3 = 0xABC00 | rng.getrandbits(8)   # QP 3's peer, in the generator's context

    dut = MrcRx(planes, 64, qps)
    srcs = [AxisSource(getattr(dut, f"s{p}_axis"), frames[p], rng=rng, idle=0.2)
            for p in range(planes)]
    started = []

    async def configure(ctx):
        master = AxiLiteSimMaster(ctx, dut.s_axil)
        base = (2 * planes + 1) << dut.bus.window_bits     # the memory-protect window
        drv = RegisterDriver(MP_REGS, master.read, master.write, base=base)
        await table_op(drv, ("region", 0, 0x1234, 0, 1 << 24, 1, 0))
        gen = RegisterDriver(ACK_REGS, master.read, master.write,
                             base=(2 * planes + 3) << dut.bus.window_bits)
        await gen.write("ctx_qp", 3)
        await gen.write("ctx_remote_qp", remote_qp3)
        await gen.write_fields("control", ctx_write=1)
        while await gen.read_field("status", "ctx_busy"):
            pass
        started.append(True)

    def after_configure(src):
        async def tb(ctx):
            while not started:
                await ctx.tick()
            await src.run(ctx)
        return tb
    # Every frame on a plane leaves the block as a placement, an answer or a record: the
    # sinks below wait for what must come, then a quiet period checks nothing more does.
    # The outputs are collected for a fixed number of cycles, long enough for every frame
    # (the sinks' cycle limit ends them); then what came out is checked.
    budget = 3000

    def open_ended(sink):
        sink.count, sink.max_cycles = 10 ** 9, budget

        async def tb(ctx):
            try:
                await sink.run(ctx)
            except AssertionError as e:
                if "after" not in str(e):          # the cycle limit: the end of collection
                    raise
        return tb

    places = [MetaSink(getattr(dut, f"place{p}"), 0, rng=rng, backpressure=0.2)
              for p in range(planes)]
    payloads = [AxisSink(getattr(dut, f"pl{p}_axis"), 0, rng=rng, backpressure=0.2)
                for p in range(planes)]
    acks_out = [AxisSink(getattr(dut, f"a{p}_axis"), 0, rng=rng, backpressure=0.2)
                for p in range(planes)]
    ack_rx = MetaSink(dut.ack, 0, rng=rng)
    peer_rx = MetaSink(dut.peer, 0, rng=rng, backpressure=0.3)
    access_rec = MetaSink(dut.access_nak, 0, rng=rng, backpressure=0.2)
    tbs = [configure] + [after_configure(s) for s in srcs] + \
        [open_ended(s) for s in places + payloads + acks_out + [ack_rx, peer_rx, access_rec]]
    run(dut, *tbs)
    assert all(s.done for s in srcs), "the block stopped taking frames"

    placed = {}
    for p in range(planes):
        recs = [data.Const(PLACE, v) for v in places[p].records]
        bodies = iter(payloads[p].frames)
        for r in recs:
            key = (int(r.qp), int(r.psn))
            body = next(bodies) if int(r.length) else b""
            assert key not in placed, f"{key} placed twice"
            placed[key] = (int(r.va), body)
    assert placed == want
    # Answers: every control frame decodes, with its ICRC; a SACK or NACK left on its EV's
    # plane, an AETH NAK on plane qp mod planes.
    n_frames, aeth_naks, answers = 0, [], []
    for p in range(planes):
        for f in acks_out[p].frames:
            pkt = pk.decode(f, check_icrc=True, udp_dport=None)
            assert pkt.opcode in (Opcode.SACK, Opcode.NACK, Opcode.ACK, Opcode.EP_RESPONSE)
            if pkt.opcode == Opcode.EP_RESPONSE:
                ev = pk.stev_ev(pkt)
                assert (ev & 0xFF) % planes == p, "an EV answer on another plane"
                eeth = pk.endpoint_response(pkt)
                answers.append((eeth["timestamp"], eeth["dst_id"], eeth["src_id"], ev,
                                pkt.bth["psn"]))
                continue
            if pkt.opcode == Opcode.ACK:
                aeth_naks.append((p, pkt.bth["dest_qp"], pkt.bth["psn"],
                                  pkt.aeth["syndrome"], pkt.aeth["msn"]))
                continue
            entropy = (pkt.seth or pkt.neth)["entropy"]
            assert (entropy & 0xFF) % planes == p, "a control frame on another plane"
            n_frames += 1
    assert n_frames >= 4, "too few SACKs"   # one a QP at least, and the NACK
    # The refused WRITEs: one AETH NAK each (opcode 0xD1, syndrome 0x62, the WRITE's PSN),
    # QP 3's to the remote QP of its context, QP 4's (no context written) to QP 0.
    access = proto.AETH_SYNDROME_ACCESS_ERROR
    assert sorted(aeth_naks) == sorted([(3 % planes, remote_qp3, 2, access, 0),
                                        (4 % planes, 0, 1, access, 0)])
    assert sorted(answers) == sorted(probes)
    nacks = [f for p in range(planes) for f in acks_out[p].frames
             if pk.decode(f, check_icrc=False, udp_dport=None).opcode == Opcode.NACK]
    assert len(nacks) == 1
    # The peer's SACKs reach the ack output as ACK_DESC records.
    recs = [data.Const(ACK_DESC, v) for v in ack_rx.records]
    assert sorted((int(r.qp), int(r.cack)) for r in recs) == [(0, 10), (2, 12)]
    # The peer's port status updates reach the peer output, for the QPs they name.
    recs = [data.Const(PEER_STATUS, v) for v in peer_rx.records]
    assert sorted((int(r.qp), int(r.ports)) for r in recs) == [(1, 0b1101), (2, 0xF)]
    # The refused WRITEs: not placed, and a copy of each access-error record on access_nak.
    naks = [data.Const(NAK, v) for v in access_rec.records]
    assert sorted((int(r.qp), int(r.psn), int(r.syndrome)) for r in naks) == \
        [(3, 2, access), (4, 1, access)]
