"""MrcTx on Amaranth's simulator, in a closed loop with a peer made of models: work
requests go in; the frames on the plane ports are decoded (ICRC checked), checked against
the EV each carries (outer SRv6 destination = the EV's address, plane = EV mod planes),
some are lost, and the rest go to the PSN tracker's model, whose SACKs and NACKs come back
on ``ack``. Every work request completes, every byte arrives once at its address, every
retransmission carries rtx and the retransmit DSCP."""

import pytest

from mrcnic.base import proto
from mrcnic.host.bringup import TxConfig, bring_up_tx
from mrcnic.base.records import RTT_SAMPLE, FeedbackKind
from mrcnic.model import packet as pk
from mrcnic.model.rx.psn_tracker import PsnTrackerModel
from mrcnic.tx.mrc_tx import DESC_LOOKAHEAD, LOOP_PACKETS, MrcTx
from testkit.axil import AxiLiteSimMaster
from testkit.nic_host import EVS, PMTU_LOG2, Host, as_dict, check_delivery, random_wrs
from testkit.simtools import seeded
from testkit.streams import AxisSink

PLANES = 4


class Loop(Host):
    """MrcTx with its host (:class:`nic_host.Host`), its wire (one sink per plane) and the
    peer (decode, lose, the PSN tracker's model, SACK/NACK back on ``ack``)."""

    def __init__(self, rng, wrs, *, loss=0.0, qps=2, backpressure=0.1, delay=(20, 80),
                 budget=60_000, lose=None, ports=None):
        dut = MrcTx(PLANES, 64, qps, 8, len(EVS), 1, 128, 128)
        super().__init__(dut, dut.sel, rng, wrs, backpressure=backpressure, budget=budget,
                         planes=PLANES)
        self.loss, self.lose, self.qps, self.delay = loss, lose, qps, delay
        self.sinks = [AxisSink(getattr(dut, f"m{p}_axis"), 10 ** 9, rng=rng,
                               backpressure=backpressure, max_cycles=10 ** 9)
                      for p in range(PLANES)]
        self.peer = PsnTrackerModel(qps=qps, mpr_max=8, sack_every=4)
        self.memory, self.frames, self.dropped, self.sent = {}, [], [], []
        self.ports = ports                             # ports(cycle) -> (up, credit) masks
        self.arrivals = []                             # (cycle off the wire, plane)
        self.updates = []              # the peer's port status: [cycle, qp, ports] for `peer`
        self.status = []               # port status updates sent: (cycle, plane, fields)
        self.acks_taken = []           # (cycle, SACK/NACK record) as ``ack`` took them
        self.rtts = []                 # the RTT_SAMPLE records of ``rtt``

    async def configure(self, ctx):
        master = AxiLiteSimMaster(ctx, self.dut.s_axil)
        cfg = TxConfig(local_mac=0x02_00_00_00_00_01, local_ip=0xFD00 << 112 | 1,
                       peer_mac=0x02_00_00_00_00_02, peer_ip=0xFD00 << 112 | 2,
                       outer_src=0xFC00_0000_0001 << 80, evs=EVS,
                       remote_qps=list(range(self.qps)), pmtu_log2=PMTU_LOG2,
                       tick_cycles=16, timeout_exp=6, reorder_guard=3)
        return await bring_up_tx(master.read, master.write, cfg)

    def arrive(self, plane, frame):
        """One frame off the wire: checked, then lost or given to the peer."""
        pkt = pk.decode(frame, check_icrc=True)
        ev = pk.srv6_ev_index(pkt)
        assert pkt.outer is not None and pkt.outer["dst"] == EVS[ev], "outer dst is not the EV"
        assert ev % PLANES == plane, f"EV {ev} left on plane {plane}"
        rtx = pkt.bth["rtx"]
        assert pkt.outer["dscp"] == (proto.DSCP_RTX if rtx else proto.DSCP_DATA)
        self.frames.append((self.cycle, plane, ev, pkt))
        if pkt.opcode == proto.Opcode.EP_REQUEST:
            self.status.append((self.cycle, plane, pk.port_status(pkt)))
            return None
        qp, psn = pkt.bth["dest_qp"], pkt.bth["psn"]
        lost = self.lose(qp, psn, rtx) if self.lose else self.rng.random() < self.loss
        if self.ports and not self.ports(self.cycle)[0] >> plane & 1:
            lost = True                                 # the plane's port is down
        if lost:
            self.dropped.append((qp, psn, ev))
            return None
        # The timestamp the peer's receive parser takes: a probe's PETH, a write's TSETH.
        stamp = (pkt.peth or pkt.tseth or {}).get("timestamp", 0)
        verdict, desc, _ = self.peer.packet({
            "qp": qp, "psn": psn, "opcode": pkt.bth["opcode"], "ack_req": pkt.bth["ack_req"],
            "rtx": rtx, "ce": 0, "trimmed": 0, "lasthop": 0, "length": len(pkt.payload),
            "entropy": ev, "timestamp": stamp, "imm": (pkt.immdt or {}).get("imm", 0),
            "tag": 0})
        if verdict["verdict"] == 0:                     # PLACE
            for k, b in enumerate(pkt.payload):
                addr = pkt.reth["va"] + k
                assert addr not in self.memory, f"byte at {addr:#x} written twice"
                self.memory[addr] = b
        return desc

    async def peer_side(self, ctx):
        dut = self.dut
        seen = [0] * PLANES
        pending, acks = [], []                          # (due cycle, plane, frame)
        while True:
            for p, sink in enumerate(self.sinks):
                while seen[p] < len(sink.frames):
                    frame = sink.frames[seen[p]]
                    self.arrivals.append((self.cycle, p))
                    pkt = pk.decode(frame, check_icrc=False)
                    self.sent.append((pkt, pk.srv6_ev_index(pkt)))
                    pending.append((self.cycle + self.rng.randint(*self.delay), p, frame))
                    seen[p] += 1
            for item in [x for x in pending if x[0] <= self.cycle]:
                pending.remove(item)
                desc = self.arrive(item[1], item[2])
                if desc is not None:
                    acks.append(desc)
            if self.ports:
                up, credit = self.ports(self.cycle)
                ctx.set(dut.port_up, up)
                ctx.set(dut.credit, credit)
            ctx.set(dut.ack.valid, bool(acks))
            if acks:
                ctx.set(dut.ack.payload, acks[0])
            upd = self.updates[0] if self.updates and self.updates[0][0] <= self.cycle \
                else None
            ctx.set(dut.peer.valid, upd is not None)
            if upd is not None:
                ctx.set(dut.peer.payload, {"qp": upd[1], "ports": upd[2]})
            fb = dut.sel.fb
            ctx.set(dut.rtt.ready, 1)
            _, _, ready, p_ready, fv, fr, kind, rv, rtt = await ctx.tick().sample(
                dut.ack.ready, dut.peer.ready, fb.valid, fb.ready, fb.payload.kind,
                dut.rtt.valid, dut.rtt.payload.as_value())
            if acks and ready:
                self.acks_taken.append((self.cycle, acks.pop(0)))
            if rv:
                self.rtts.append(as_dict(RTT_SAMPLE, rtt))
            if upd is not None and p_ready:
                self.updates.pop(0)
                self.peer_taken = self.cycle
            if fv and fr and kind == FeedbackKind.PEER_PORTS:
                self.peer_applied = self.cycle         # the selector takes it as feedback


    def run_loop(self):
        return self.run(self.peer_side, *[s.run for s in self.sinks])


@pytest.mark.soak
def test_work_requests_complete_with_no_loss():
    rng = seeded()
    wrs = random_wrs(rng, 10, 2, 3 * (1 << PMTU_LOG2) + 7)
    loop = Loop(rng, wrs).run_loop()
    check_delivery(loop)
    assert loop.counters["retransmissions"] == 0 and not loop.dropped
    assert {p for _, p in loop.arrivals} == set(range(PLANES))


def test_timestamps_and_rtt_samples():
    """With ``timestamp.tseth`` (and a timestamp unit of one cycle) every data packet carries
    a TSETH (BTH ts) and every SACK or NACK that echoes it gives an RTT sample: the cycles
    from the packet's fork to the echo's arrival on ``ack``, the wire and the peer's delay
    (fixed here) included. One time base: a sample is the arrival less the echoed
    timestamp, with the same offset for every sample."""
    rng = seeded()
    wrs = random_wrs(rng, 6, 2, 2 * (1 << PMTU_LOG2))
    delay = 40
    loop = Loop(rng, wrs, delay=(delay, delay), backpressure=0.0)

    async def setup(blocks):
        await blocks["mrc-tx"][0].write_fields("timestamp", tseth=1, cycles=1)
    loop.setup = setup
    loop.run_loop()
    check_delivery(loop)
    data = [pkt for pkt, _ in loop.sent if pkt.opcode.is_write]
    assert data and all(p.tseth is not None and p.bth["ts"] == 1 for p in data)
    assert len(loop.rtts) == len(loop.acks_taken) > 0
    offsets = {(c - a["timestamp"] - s["rtt"]) & 0xFFFF
               for (c, a), s in zip(loop.acks_taken, loop.rtts)}
    assert len(offsets) == 1, f"samples from more than one time base: {offsets}"
    (k,) = offsets                      # cycle - timestamp: the stamp's cycle is T + k
    # Each echo names a data frame by its TSETH timestamp: it was stamped at the fork, took
    # at least its beats to reach the wire's end, and its SACK came back at least the peer's
    # delay after that.
    wire = {p.tseth["timestamp"]: (c, len(p.payload)) for (p, _), (c, _) in
            zip(loop.sent, loop.arrivals) if p.tseth is not None}
    for (c, a), s in zip(loop.acks_taken, loop.rtts):
        assert (s["qp"], s["entropy"], s["nack"], s["probe"]) == \
            (a["qp"], a["entropy"], a["nack"], a["pr"] & ~a["nack"])
        arrived, length = wire[a["timestamp"]]
        stamped = (a["timestamp"] + k) & 0xFFFF
        assert (arrived - stamped) & 0xFFFF >= length // 8 and c >= arrived + delay, s
    rtts = sorted(s["rtt"] for s in loop.rtts)
    print(f"{len(rtts)} RTT samples, {rtts[0]} .. {rtts[-1]} cycles (peer delay {delay})")


def check_avoid(loop):
    """A retransmission never uses the EV of the transmission before it (the one that
    failed), in the order the frames left."""
    last_ev = {}
    for pkt, ev in loop.sent:
        key = pkt.bth["dest_qp"], pkt.bth["psn"]
        if pkt.bth["rtx"]:
            assert key in last_ev, f"{key} retransmitted before it was sent"
            assert ev != last_ev[key], f"{key} retransmitted on the EV that failed ({ev})"
        last_ev[key] = ev


def test_loss_a_port_down_and_a_plane_without_credit():
    """5% random loss; plane 3 without credit for 200 cycles; then plane 1's port down for
    good. Every WR completes, intact; retransmissions avoid the EV that failed; nothing is
    sent on plane 3 without credit; on plane 1 only what had passed the path selector."""
    rng = seeded()
    wrs = random_wrs(rng, 12, 2, 4 * (1 << PMTU_LOG2))
    box = {}

    def ports(cycle):
        t = box.get("t")
        down = t is not None and cycle >= t
        no_credit = t is not None and t - 300 <= cycle < t - 100
        return 0b1111 & ~(0b0010 if down else 0), 0b1111 & ~(0b1000 if no_credit else 0)

    loop = Loop(rng, wrs, ports=ports, loss=0.05)

    async def setup(blocks):
        box["t"] = loop.cycle + 600          # traffic starts after the bring-up
    loop.setup = setup
    loop.run_loop()
    check_delivery(loop)
    check_avoid(loop)
    assert loop.dropped and loop.counters["retransmissions"] >= len(loop.dropped)
    t = box["t"]
    # The port inputs are registered once and checked again at the selector's last stage
    # (4 cycles after the request): no request from 2 cycles before a port went down or
    # lost its credit gets its plane.
    late = [c for c, p in loop.decisions if p == 1 and c >= t - 2]
    assert not late, f"decisions for plane 1 after its port went down: {late}"
    starved = [c for c, p in loop.decisions if p == 3 and t - 302 <= c < t - 104]
    assert not starved, f"decisions for plane 3 while it had no credit: {starved}"
    # Frames forked before still leave on plane 1 (STALE_PORT): at most the descriptors
    # RoceTx holds, and the frame it was sending (its end comes after t).
    wire = [c for c, p in loop.arrivals if p == 1 and c >= t]
    assert len(wire) <= DESC_LOOKAHEAD + 1, f"{len(wire)} frames on plane 1 after its port went down"
    last = max((c for c, p in loop.decisions if p == 1), default=t)
    print(f"port down at {t}: last request given plane 1 {last - t} cycles after, "
          f"{len(wire)} frames on its wire after, the last {max(wire, default=t) - t} after; "
          f"{loop.counters['port_down']} decisions sent round again")
    assert any(p == 1 for c, p in loop.arrivals if c < t), "plane 1 never used before"


def test_port_status_updates_both_ways():
    """Spec §4 "Ports", both ways. This NIC's port 1 goes down for good: one port status
    update per QP leaves (endpoint request 0xD8 to QP 0x2, ERTH op 0, ports 0b1101, dst_id
    the QP's remote QP) on a live plane. The peer reports its port 2 down (a ``peer``
    record for QP 0; both QPs share the one profile): no request decided after it gets
    plane 2. Every WR completes, intact."""
    rng = seeded()
    # At least 3 packets each (42 in all): traffic goes on well after the peer's update.
    wrs = random_wrs(rng, 14, 2, 4 * (1 << PMTU_LOG2), min_len=2 * (1 << PMTU_LOG2) + 1)
    box = {}

    def ports(cycle):
        t = box.get("t")
        return 0b1111 & ~(0b0010 if t is not None and cycle >= t else 0), 0b1111

    loop = Loop(rng, wrs, ports=ports)

    async def setup(blocks):
        box["t"] = loop.cycle + 400
        loop.updates.append([loop.cycle + 600, 0, 0xFFFFFFFF & ~(1 << 2)])
    loop.setup = setup
    loop.run_loop()
    check_delivery(loop)
    t, tp, ts = box["t"], loop.peer_taken, loop.peer_applied
    assert sorted((f["dst_id"], f["ports"], f["op"], f["type"]) for _, _, f in loop.status) \
        == [(0, 0b1101, proto.EP_PORT_STATUS, proto.TSETH_TYPE),
            (1, 0b1101, proto.EP_PORT_STATUS, proto.TSETH_TYPE)]
    assert all(c > t and p != 1 for c, p, _ in loop.status)
    assert loop.counters["announcements"] == 2 and loop.counters["peer_ports"] == 1
    # The record is taken in cycle tp and reaches the selector's feedback port in ts, through
    # the feedback merge (2 cycles, and a turn behind the other feedback sources); the
    # selector applies it 2 cycles later, and rechecks every decision 4 cycles after its
    # request: no request from ts on is given plane 2.
    assert 2 <= ts - tp <= 2 + 4, (tp, ts)
    late = [c for c, p in loop.decisions if p == 2 and c >= ts]
    assert not late, f"requests given plane 2 after the peer's port 2 went down: {late}"
    assert any(p == 2 for c, p in loop.decisions if c < tp), "plane 2 never used before"
    after = [p for c, p in loop.decisions if c > ts]
    assert len(after) >= 10 and set(after) == {0, 3}, after   # planes 1 and 2 left
    print(f"port 1 down at {t}: updates at +{[c - t for c, _, _ in loop.status]} cycles "
          f"(off the wire); the peer's update taken at {tp}, by the selector at {ts}, "
          f"{sum(1 for c, _ in loop.decisions if c >= ts)} decisions after it, none on plane 2")


def test_a_qp_whose_retries_run_out_is_dropped_and_the_others_complete():
    rng = seeded()
    wrs = random_wrs(rng, 4, 2, 2 * (1 << PMTU_LOG2))
    later = [{**w, "wr_id": 100 + w["wr_id"], "va": w["va"] + 0x8000}
             for w in random_wrs(rng, 2, 2, 2 * (1 << PMTU_LOG2))]
    # Everything QP 1 sends is lost: its retries run out and it goes to error.
    loop = Loop(rng, wrs + later, lose=lambda qp, psn, rtx: qp == 1)
    box = {}

    async def setup(blocks):
        trk = blocks["retransmit-tracker"][0]
        await trk.write_fields("config2", retry_max=1)
        await trk.write_fields("config", retry_linear=1, timeout_exp=4)

    async def scenario(ctx):
        await loop.send(ctx, wrs)
        await loop.wait(ctx, lambda: ctx.get(loop.dut.trk.qp_error.valid), 20_000)
        box["error_at"] = loop.cycle
        await loop.send(ctx, later)                 # QP 0: completes; QP 1: dropped
        await loop.wait(ctx, lambda: sum(d["qp"] == 0 for d in loop.done) == 3, 10_000)
        await loop.wait(ctx, lambda: False, 300)
    loop.setup, loop.scenario = setup, scenario
    loop.run_loop()
    assert "error_at" in box and loop.counters["qp_errors"] == 1
    assert [d["wr_id"] for d in loop.done if d["qp"] == 0] == \
        [w["wr_id"] for w in wrs + later if w["qp"] == 0]
    assert not [d for d in loop.done if d["qp"] == 1]
    n_later = sum(max(1, -(-w["length"] >> PMTU_LOG2)) for w in later if w["qp"] == 1)
    # The later WRs' packets, and any retransmission of QP 1 that reached the gate after
    # the error.
    assert loop.counters["dropped_error"] >= n_later
    # After the error only the QP 1 packets already past the gate may leave: at most those
    # in the selector's loop and the descriptor FIFO (LOOP_PACKETS + 4).
    after = [pkt for (c, _), (pkt, _) in zip(loop.arrivals, loop.sent)
             if c > box["error_at"] and pkt.bth["dest_qp"] == 1]
    assert len(after) <= LOOP_PACKETS + 4, f"{len(after)} QP 1 frames after its error"
