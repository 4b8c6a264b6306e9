"""MrcNic on Amaranth's simulator, its planes looped back to itself through a wire with
delay, reordering and loss: each QP writes to its own receive side, which places the
payloads, answers with SACK/NACK frames on the same planes, and feeds the answers to the
transmit half. Every work request completes and every byte lands once at its address;
WRITE-with-immediate completions come out in order."""

import pytest
from amaranth.lib import data

from mrcnic.host.bringup import RxConfig, TxConfig, bring_up_rx, bring_up_tx, find_blocks
from mrcnic.model import packet as pk
from mrcnic.nic import MrcNic
from mrcnic.base.proto import Opcode
from mrcnic.base.records import COMPLETION, PLACE
from testkit.axil import AxiLiteSimMaster
from testkit.nic_host import EVS, PMTU_LOG2, Host, as_dict, check_delivery, random_wrs
from testkit.simtools import seeded
from testkit.streams import AxisSink, frame_to_beats
from testkit.meta import MetaSink

PLANES = 4
MAC, IP = 0x02_00_00_00_00_01, 0xFD00 << 112 | 1
RKEY = 0x1234


class NicLoop(Host):
    def __init__(self, rng, wrs, *, loss=0.0, qps=2, delay=(10, 60), backpressure=0.1,
                 budget=60_000):
        dut = MrcNic(PLANES, 64, qps, ev_count=len(EVS), msgs=8,
                     regions=2)
        super().__init__(dut, dut.tx.sel, rng, wrs, backpressure=backpressure, budget=budget,
                         planes=PLANES)
        self.qps, self.loss, self.delay = qps, loss, delay
        big = dict(rng=rng, backpressure=backpressure, max_cycles=10 ** 9)
        self.out = [AxisSink(getattr(dut, f"m{p}_axis"), 10 ** 9, **big) for p in range(PLANES)]
        self.places = [MetaSink(getattr(dut, f"place{p}"), 10 ** 9, **big)
                       for p in range(PLANES)]
        self.bodies = [AxisSink(getattr(dut, f"pl{p}_axis"), 10 ** 9, **big)
                       for p in range(PLANES)]
        self.cpl = MetaSink(dut.cpl, 10 ** 9, **big)
        self.lost, self.kinds = [], {}
        self.sent, self.dropped = [], []        # (Packet, EV) of the data frames that left

    async def configure(self, ctx):
        master = AxiLiteSimMaster(ctx, self.dut.s_axil)
        blocks = await find_blocks(master.read, master.write)
        qps = list(range(self.qps))
        tx = TxConfig(local_mac=MAC, local_ip=IP, peer_mac=MAC, peer_ip=IP,
                      outer_src=0xFC00_0000_0001 << 80, evs=EVS, remote_qps=qps,
                      pmtu_log2=PMTU_LOG2, tick_cycles=16, timeout_exp=6)
        rx = RxConfig(local_mac=MAC, local_ip=IP, peer_mac=MAC, peer_ip=IP, remote_qps=qps,
                      pmtu_log2=PMTU_LOG2, regions=[(RKEY, 0, 1 << 32, 1, 0)], sack_every=4)
        await bring_up_tx(master.read, master.write, tx, blocks=blocks)
        await bring_up_rx(master.read, master.write, rx, blocks=blocks)
        return blocks

    async def wire(self, ctx):
        """Each plane's output back to its input, after a random delay; some frames lost."""
        dut = self.dut
        seen = [0] * PLANES
        flight = []                         # (due cycle, plane, frame)
        queues = [[] for _ in range(PLANES)]
        beats = [[] for _ in range(PLANES)]
        keep_width = len(dut.s0_axis.tkeep)
        while True:
            for p, sink in enumerate(self.out):
                while seen[p] < len(sink.frames):
                    frame = sink.frames[seen[p]]
                    seen[p] += 1
                    pkt = pk.decode(frame, check_icrc=True, udp_dport=None)
                    op = pkt.opcode
                    self.kinds[op.name] = self.kinds.get(op.name, 0) + 1
                    data_frame = Opcode.WRITE_FIRST <= op <= Opcode.WRITE_ONLY_IMM
                    if data_frame:
                        self.sent.append((pkt, pk.srv6_ev_index(pkt)))
                    if self.rng.random() < self.loss:
                        self.lost.append(op.name)
                        if data_frame:
                            self.dropped.append((pkt.bth["dest_qp"], pkt.bth["psn"],
                                                 pk.srv6_ev_index(pkt)))
                        continue
                    flight.append((self.cycle + self.rng.randint(*self.delay), p, frame))
            for item in [x for x in flight if x[0] <= self.cycle]:
                flight.remove(item)
                queues[item[1]].append(item[2])
            for p in range(PLANES):
                port = getattr(dut, f"s{p}_axis")
                if not beats[p] and queues[p]:
                    beats[p] = list(frame_to_beats(queues[p].pop(0), keep_width))
                if beats[p]:
                    d, k, last, u = beats[p][0]
                    ctx.set(port.tdata, d)
                    ctx.set(port.tkeep, k)
                    ctx.set(port.tlast, last)
                    ctx.set(port.tuser, u)
                ctx.set(port.tvalid, bool(beats[p]))
            await ctx.tick()
            for p in range(PLANES):
                if beats[p] and ctx.get(getattr(dut, f"s{p}_axis").tready):
                    beats[p].pop(0)

    def placed(self):
        """Remote memory from the placements: every byte once."""
        memory = {}
        for p in range(PLANES):
            bodies = iter(self.bodies[p].frames)
            for v in self.places[p].records:
                r = data.Const(PLACE, v)
                body = next(bodies) if int(r.length) else b""
                assert len(body) == int(r.length)
                for k, b in enumerate(body):
                    assert int(r.va) + k not in memory, "a byte written twice"
                    memory[int(r.va) + k] = b
        return memory

    def run_loop(self):
        sinks = self.out + self.places + self.bodies + [self.cpl]
        self.run(self.wire, *[s.run for s in sinks])
        self.memory = self.placed()
        return self


def check_completions(loop):
    """WRITE-with-immediate completions: one per such WR, in each QP's order, with its
    immediate."""
    got = [as_dict(COMPLETION, v) for v in loop.cpl.records]
    for q in range(loop.qps):
        want = [w["imm"] for w in loop.wrs if w["qp"] == q and w["with_imm"]]
        assert [c["imm"] for c in got if c["qp"] == q] == want, f"QP {q}: completions"


@pytest.mark.soak                       # ~25 cycles/s here: the cocotb bench runs it faster
def test_loopback_with_loss_and_reordering():
    rng = seeded()
    wrs = random_wrs(rng, 8, 2, 3 * (1 << PMTU_LOG2) + 5)
    loop = NicLoop(rng, wrs, loss=0.04).run_loop()
    check_delivery(loop)
    check_completions(loop)
    print(f"frames by kind {loop.kinds}, lost {len(loop.lost)}")
    assert loop.kinds.get("SACK"), "no SACK frames"
