"""The two-NIC simulation of ``mrcnic demo`` (a cocotb test module, run on the Verilog of
:class:`mrcnic.netsim.nic_pair.NicPair` by :mod:`mrcnic.netsim.demo`).

NIC ``a`` (host 0 of :mod:`mrcnic.netsim.fabric`) writes ``size`` bytes to NIC ``b`` (host 1) in
work requests of ``msg_bytes`` spread over its QPs; the fabric carries the frames of every
plane both ways (data one way, SACK/NACK back), with the faults asked for. The testbench
plays the two hosts: it answers ``a``'s payload requests with a known pattern, gives each
NIC port the state of its fabric link (``port_up``) and whether its transmit queue has room
(``credit``: less than :data:`CREDIT_FRAMES` frames waiting), and checks every byte ``b``
places: each exactly once, at its address, equal to the pattern. It writes the metrics as
JSON (``metrics.json``) and the wire traffic as a pcap when asked.

Time: one clock cycle is ``clock_ns``; the NIC's line rate is ``data_width / clock_ns``
Gb/s, and each plane's fabric links run at the line rate divided by the planes, so that the
planes together carry exactly what one NIC sends.
"""

import json
import logging
import os
import sys
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from mrcnic.host.bringup import RxConfig, TxConfig, bring_up_rx, bring_up_tx, find_blocks
from mrcnic.netsim.fabric import Fabric, FabricConfig, Failure
from mrcnic.model import packet as pk
from mrcnic.base.proto import Opcode
from mrcnic.base.records import TICK_NS, TS_UNIT_NS

__all__ = ["CREDIT_FRAMES", "INJECT_KINDS", "PROGRESS_PREFIX", "Progress", "bad_frame",
           "pattern"]

CREDIT_FRAMES = 2               # a port has credit while fewer frames than this wait in it
RKEY = 0x1234
BASE_VA = 0x1_0000_0000


def pattern(va, length):
    """The bytes the demo writes at remote address ``va``: a function of the address only,
    so any byte placed anywhere can be checked."""
    return bytes(((a * 0x9E) ^ (a >> 8) ^ (a >> 16)) & 0xFF for a in range(va, va + length))


class _Port:
    """Beats in and out of one AXI-Stream port of the top, by name prefix."""

    def __init__(self, dut, prefix):
        self.tdata = getattr(dut, f"{prefix}_tdata")
        self.tkeep = getattr(dut, f"{prefix}_tkeep")
        self.tlast = getattr(dut, f"{prefix}_tlast")
        self.tvalid = getattr(dut, f"{prefix}_tvalid")
        self.tready = getattr(dut, f"{prefix}_tready")
        self.bytes = len(self.tkeep)
        self.parts = []                     # a frame coming out
        self.first = None                   # the cycle of its first beat
        self.beats = []                     # a frame going in: [(data, keep, last)]
        self.driving = False

    def take(self, cycle=None):
        """The beat on the port (valid, ready high) at ``cycle``: returns the frame when it
        ends (its first beat's cycle in ``first``)."""
        if not self.parts:
            self.first = cycle
        keep = int(self.tkeep.value)
        n = keep.bit_length()               # tkeep is contiguous from lane 0
        self.parts.append(int(self.tdata.value).to_bytes(self.bytes, "little")[:n])
        if int(self.tlast.value):
            frame, self.parts = b"".join(self.parts), []
            return frame
        return None

    def load(self, frame):
        B = self.bytes
        for i in range(0, len(frame), B):
            chunk = frame[i:i + B]
            self.beats.append((int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1,
                               i + B >= len(frame)))

    def drive(self):
        """After an edge: drop the beat taken at it, put the next one on."""
        if self.driving and int(self.tready.value):
            self.beats.pop(0)
        self.driving = bool(self.beats)
        if self.driving:
            d, k, last = self.beats[0]
            self.tdata.value, self.tkeep.value, self.tlast.value = d, k, int(last)
        self.tvalid.value = int(self.driving)


def _frame_record(first, plane, frame):
    """``[first beat cycle, plane, EV index, PSN, rtx, probe]`` of a frame NIC ``a`` sent
    (the EV index from the entropy the frame carries, in SRv6 mode)."""
    pkt = pk.decode(frame, check_icrc=False, udp_dport=None)
    return [first, plane, pk.srv6_ev_index(pkt), pkt.bth["psn"], pkt.bth["rtx"],
            int(pkt.opcode == Opcode.PROBE)]


# Bad frames the bench can put on b's wire (``inject``), each a copy of a data frame just
# delivered to b, changed: a wrong ICRC; cut in half; for a QP b does not have; a PSN half
# the PSN space away; an R_Key b does not know; an address outside every region. The last
# two are for the spare QP (they put their QP in error).
INJECT_KINDS = ("icrc", "truncated", "unknown_qp", "psn_far", "bad_rkey", "outside")
ACCESS_KINDS = {"bad_rkey", "outside"}


def bad_frame(kind, frame, spare, qps):
    if kind == "icrc":
        return frame[:-12] + bytes([frame[-12] ^ 0x5A]) + frame[-11:]
    if kind == "truncated":
        return frame[:len(frame) // 2]
    pkt = pk.decode(frame, check_icrc=False, udp_dport=None)
    if kind == "unknown_qp":
        pkt.bth["dest_qp"] = qps + 5
    elif kind == "psn_far":
        pkt.bth["psn"] = (pkt.bth["psn"] + (1 << 23)) % (1 << 24)
    elif kind in ACCESS_KINDS:
        pkt.bth["dest_qp"] = spare
        if pkt.reth is None:
            raise ValueError("an access error needs a frame with a RETH")
        if kind == "bad_rkey":
            pkt.reth["rkey"] ^= 0x5A5A
        else:
            pkt.reth["va"] = 1 << 60
    else:
        raise ValueError(f"inject {kind!r}: one of {', '.join(INJECT_KINDS)}")
    pkt.icrc = None
    return pk.encode(pk.finalize(pkt))


def _fields(dut, prefix, names):
    return {n: int(getattr(dut, f"{prefix}_{n}").value) for n in names}


def _fabric(cfg, line_gbps):
    """The network of the run: the fabric with the failures and incast asked for."""
    P, clock_ns = cfg["planes"], cfg["clock_ns"]
    fab = Fabric(FabricConfig(planes=P, hosts=2 + cfg["incast"], spines=cfg["spines"],
                              link_gbps=line_gbps / P, link_delay_ns=cfg["link_delay_ns"],
                              jitter_ns=cfg["jitter_ns"], loss=cfg["loss"],
                              seed=cfg["seed"], queue_bytes=cfg["queue_bytes"],
                              trim_bytes=cfg["queue_bytes"] // 2,
                              ecn_bytes=cfg["queue_bytes"] // 4))
    for f in cfg["failures"]:
        fab.schedule(Failure(f["kind"], f["at_ns"], f.get("until_ns"), plane=f["plane"],
                             nodes=tuple(tuple(n) for n in f.get("nodes", ())),
                             drop=f.get("drop", 0.0), slow=f.get("slow", 1.0)))
    # Incast: hosts 2.. send to b (host 1) on every plane until the run's cycle limit.
    for src in range(2, 2 + cfg["incast"]):
        for p in range(P):
            fab.cross_traffic(src, 1, p, cfg["incast_share"] * line_gbps / P,
                              cfg["incast_start_ns"], cfg["max_cycles"] * clock_ns,
                              frame_bytes=1 << cfg["pmtu_log2"])
    return fab


class _Bench:
    """The two hosts around the NIC pair: bring-up, the work requests and payloads of ``a``,
    the fabric between the planes, the placements of ``b`` checked byte by byte, and the
    metrics. :meth:`cycle` is one clock cycle of all of it."""

    HOST = {"a": 0, "b": 1}
    PEER = {"a": "b", "b": "a"}
    MAC = {"a": 0x02_00_00_00_00_0A, "b": 0x02_00_00_00_00_0B}

    def __init__(self, dut, cfg):
        self.dut, self.cfg = dut, cfg
        self.P, self.clock_ns = cfg["planes"], cfg["clock_ns"]
        self.line_gbps = cfg["data_width"] / self.clock_ns
        self.fab = _fabric(cfg, self.line_gbps)
        self.size = cfg["size"]
        self.qps = cfg["qps"]
        # With injected access errors the last QP carries no data: the bad frames on it
        # put it in error (as they must), and the others must not notice.
        self.inject = cfg.get("inject", [])
        self.spare = self.qps - 1 if set(self.inject) & ACCESS_KINDS else None
        data_qps = self.qps - (self.spare is not None)
        msg = cfg["msg_bytes"]
        self.wrs = [{"qp": i % data_qps, "wr_id": i & 0xFFFF, "va": BASE_VA + off,
                     "rkey": RKEY, "length": min(msg, self.size - off), "imm": i,
                     "with_imm": 0}
                    for i, off in enumerate(range(0, self.size, msg))]
        self.va_of = {(w["qp"], w["wr_id"]): w["va"] for w in self.wrs}
        P = self.P
        self.out = {s: [_Port(dut, f"{s}_m{p}_axis") for p in range(P)] for s in "ab"}
        self.inp = {s: [_Port(dut, f"{s}_s{p}_axis") for p in range(P)] for s in "ab"}
        self.pl = [_Port(dut, f"b_pl{p}_axis") for p in range(P)]
        self.payload = _Port(dut, "a_s_axis")
        self.placed = bytearray(self.size)          # how often each byte was placed
        self.place_q = [[] for _ in range(P)]       # place records waiting for their payload
        self.body_q = [[] for _ in range(P)]
        self.delivered = 0
        self.sent_frames = []       # a's frames: [first beat cycle, plane, EV, psn, rtx]
        self.placements = []        # [ns, plane, payload bytes] placed at b
        self.events, self.done, self.preqs = [], [], []
        self.rtts = []              # a's RTT samples: [ns, qp, probe, nack, rtt in units]
        # a's probes on the wire, by PETH timestamp: [a sends, b has it, b sends the
        # answer, a has it] (ns; the fabric's host ports)
        self.probe_rounds = {}
        self.wr_i = 0
        self.injected, self.next_inject = 0, cfg.get("inject_after_ns", 0.0)
        self.captures = [] if cfg.get("pcap") else None
        self.credit_bytes = CREDIT_FRAMES * ((1 << cfg["pmtu_log2"]) + 200)
        self.last_ports = {s: None for s in "ab"}
        self.side_blocks = {}
        self.cycles = 0
        self.t_start_ns = None

    def now_ns(self):
        return self.cycles * self.clock_ns

    async def reset(self):
        """Clock, reset, every input idle, every output ready, every port up with credit."""
        dut, P = self.dut, self.P
        cocotb.start_soon(Clock(dut.clk, self.clock_ns, unit="ns").start())
        dut.rst.value = 1
        for name in self.cfg["inputs"]:
            getattr(dut, name).value = 0
        for side in "ab":
            for p in range(P):
                getattr(dut, f"{side}_s{p}_axis_tvalid").value = 0
                getattr(dut, f"{side}_m{p}_axis_tready").value = 1
                getattr(dut, f"{side}_pl{p}_axis_tready").value = 1
                getattr(dut, f"{side}_place{p}_ready").value = 1
            for name in ("done", "event", "rtt", "preq", "cpl", "nak", "access_nak"):
                if hasattr(dut, f"{side}_{name}_ready"):
                    getattr(dut, f"{side}_{name}_ready").value = 1
            getattr(dut, f"{side}_port_up").value = (1 << P) - 1
            getattr(dut, f"{side}_credit").value = (1 << P) - 1
        for _ in range(4):
            await RisingEdge(dut.clk)
        dut.rst.value = 0

    async def bring_up(self):
        """Both NICs configured through their register ports, as software would."""
        dut, cfg, fab, P = self.dut, self.cfg, self.fab, self.P
        for side in "ab":
            me, other = self.HOST[side], self.HOST[self.PEER[side]]
            master = AxiLiteMaster(AxiLiteBus.from_prefix(dut, f"{side}_s_axil"), dut.clk,
                                   dut.rst)
            for channel in (master.write_if, master.read_if):     # a line per access else
                channel.log.setLevel(logging.WARNING)
            rd, wr = master.read_dword, master.write_dword
            blocks = await find_blocks(rd, wr)
            evs = [fab.usid_path(me, other, spine=(e // P) % cfg["spines"])
                   for e in range(cfg["ev_count"])]
            addresses = dict(local_mac=self.MAC[side], local_ip=fab.host_addr(me),
                             peer_mac=self.MAC[self.PEER[side]], peer_ip=fab.host_addr(other),
                             remote_qps=list(range(self.qps)), pmtu_log2=cfg["pmtu_log2"])
            tx = TxConfig(**addresses, outer_src=fab.host_addr(me), evs=evs,
                          tick_cycles=max(1, round(TICK_NS / self.clock_ns)),
                          timeout_exp=cfg["timeout_exp"], reorder_guard=cfg["reorder_guard"],
                          reorder_time=cfg.get("reorder_time"),
                          link_gbps=cfg["data_width"] / self.clock_ns / P,
                          probe_interval=round(cfg["probe_us"] * 1000 / self.clock_ns),
                          ts_cycles=max(1, round(TS_UNIT_NS / self.clock_ns)),
                          tseth=bool(cfg.get("tseth")))
            rx = RxConfig(**addresses, regions=[(RKEY, 0, 1 << 48, 1, 0)],
                          sack_every=cfg["sack_every"])
            await bring_up_tx(rd, wr, tx, blocks=blocks)
            await bring_up_rx(rd, wr, rx, blocks=blocks)
            self.side_blocks[side] = blocks

    def finished(self):
        """Every WR completed at a and every byte placed at b (placement may trail the
        acknowledgement)."""
        return len(self.done) == len(self.wrs) and self.delivered >= self.size

    def cycle(self, t):
        """One clock cycle at time ``t``: the handshakes of the cycle that ended, then what
        the hosts and the fabric drive for the next one."""
        self._host_a(t)
        self._to_fabric(t)
        self._from_fabric(t)
        self._placement_b()
        self._port_state()

    def _host_a(self, t):
        """a's host: work requests, payload requests answered, completions and events."""
        dut = self.dut
        if (self.wr_i < len(self.wrs) and int(dut.a_wr_valid.value)
                and int(dut.a_wr_ready.value)):
            self.wr_i += 1
        if self.wr_i < len(self.wrs):
            for k, v in self.wrs[self.wr_i].items():
                getattr(dut, f"a_wr_{k}").value = int(v)
            dut.a_wr_valid.value = 1
            if self.t_start_ns is None:
                self.t_start_ns = t
        else:
            dut.a_wr_valid.value = 0
        if int(dut.a_preq_valid.value):
            r = _fields(dut, "a_preq", ("qp", "wr_id", "offset", "length"))
            self.preqs.append(r)
            self.payload.load(pattern(self.va_of[r["qp"], r["wr_id"]] + r["offset"],
                                      r["length"]))
        self.payload.drive()
        if int(dut.a_done_valid.value):
            self.done.append((self.cycles, _fields(dut, "a_done", ("qp", "wr_id"))))
        if int(dut.a_rtt_valid.value):
            self.rtts.append([t, *(_fields(dut, "a_rtt", ("qp", "probe", "nack", "rtt"))
                                   .values())])
        if int(dut.a_event_valid.value):
            self.events.append((t, _fields(dut, "a_event",
                                           ("profile", "ev", "state", "dropped"))))

    def _to_fabric(self, t):
        """The frames both NICs finished sending this cycle, into the fabric."""
        for s in "ab":
            valid = int(getattr(self.dut, f"{s}_tx_valid").value)
            p = 0
            while valid:
                if valid & 1:
                    frame = self.out[s][p].take(self.cycles)
                    if frame is not None:
                        self.fab.send(t, self.HOST[s], p, frame)
                        if s == "a":
                            self.sent_frames.append(_frame_record(self.out[s][p].first, p,
                                                                  frame))
                        self._probe_round(s == "b", 2 if s == "b" else 0, t, frame)
                        if self.captures is not None:
                            self.captures.append((t, frame))
                valid >>= 1
                p += 1

    def _from_fabric(self, t):
        """The fabric run up to now; its deliveries (and any bad frame injected after one)
        into the receiving ports, which are driven a beat a cycle."""
        fab, cfg = self.fab, self.cfg
        if fab.next_event_ns() is not None and fab.next_event_ns() <= t:
            for d in fab.run_until(t):
                self.inp["a" if d.host == 0 else "b"][d.plane].load(d.frame)
                self._probe_round(d.host == 0, 3 if d.host == 0 else 1, d.t_ns, d.frame)
                if (d.host == 1 and self.injected < len(self.inject)
                        and t >= self.next_inject and len(d.frame) > 200):
                    kind = self.inject[self.injected]
                    self.inp["b"][d.plane].load(bad_frame(kind, d.frame, self.spare,
                                                          self.qps))
                    self.injected += 1
                    self.next_inject = t + cfg["inject_every_ns"]
        for s in "ab":
            for port in self.inp[s]:
                if port.beats or port.driving:
                    port.drive()

    def _probe_round(self, answer, k, t, frame):
        """A probe of a's (``answer`` False) or b's answer to one (a SACK with pr = 1) at
        a host port: its time as item ``k`` of the probe's round, the first time only."""
        if len(frame) > 256:                 # neither is longer; data frames are
            return
        pkt = pk.decode(frame, check_icrc=False, udp_dport=None)
        if answer and pkt.opcode == Opcode.SACK and pkt.seth["pr"]:
            r = self.probe_rounds.get(pkt.cc_state["timestamp"])
        elif not answer and pkt.opcode == Opcode.PROBE:
            r = self.probe_rounds.setdefault(pkt.peth["timestamp"], [None] * 4)
        else:
            return
        if r is not None and r[k] is None:
            r[k] = t

    def _placement_b(self):
        """b's placements: each place record matched with its payload and checked."""
        dut = self.dut
        valid = int(dut.b_pl_valid.value)
        p = 0
        while valid:
            if valid & 1:
                if int(getattr(dut, f"b_place{p}_valid").value):
                    self.place_q[p].append(_fields(dut, f"b_place{p}",
                                                   ("qp", "psn", "va", "length")))
                if int(self.pl[p].tvalid.value):
                    body = self.pl[p].take()
                    if body is not None:
                        self.body_q[p].append(body)
                self._place_ready(p)
            valid >>= 1
            p += 1

    def _place_ready(self, p):
        place_q, body_q = self.place_q[p], self.body_q[p]
        while place_q and (place_q[0]["length"] == 0 or body_q):
            r = place_q.pop(0)
            body = body_q.pop(0) if r["length"] else b""
            assert len(body) == r["length"], f"placement of {r}: {len(body)} bytes came"
            off = r["va"] - BASE_VA
            assert 0 <= off and off + len(body) <= self.size, f"placement outside the data: {r}"
            assert body == pattern(r["va"], len(body)), f"bytes differ at {r['va']:#x}"
            for k in range(off, off + len(body)):
                self.placed[k] += 1
                assert self.placed[k] == 1, f"byte at {r['va'] + k - off:#x} placed twice"
            self.delivered += len(body)
            self.placements.append([self.now_ns(), p, len(body)])

    def _port_state(self):
        """Each NIC port's state and credit from its fabric link."""
        for s in "ab":
            up = credit = 0
            for p in range(self.P):
                ok, queued = self.fab.host_port(self.HOST[s], p)
                up |= ok << p
                credit |= (queued < self.credit_bytes) << p
            if (up, credit) != self.last_ports[s]:
                getattr(self.dut, f"{s}_port_up").value = up
                getattr(self.dut, f"{s}_credit").value = credit
                self.last_ports[s] = (up, credit)

    async def counters(self):
        """a's transmit blocks' and b's receive blocks' counters (RoceRx summed over the
        planes), read through the register ports."""
        counters = {}
        for side, name in (("a", "mrc-tx"), ("a", "retransmit-tracker"),
                           ("a", "path-selector"), ("b", "roce-rx"), ("b", "memory-protect"),
                           ("b", "psn-tracker")):
            key = name if side == "a" else f"b.{name}"
            counters[key] = {}
            for regs in self.side_blocks[side][name]:
                for reg in regs.regmap.registers.values():
                    fields = reg.fields.values() if isinstance(reg.fields, dict) else reg.fields
                    if [f.name for f in fields] == ["count"]:
                        n = (await regs.read_fields(reg.name))["count"]
                        counters[key][reg.name] = counters[key].get(reg.name, 0) + n
        return counters

    def metrics(self, counters, wall_s):
        fab, P, placed = self.fab, self.P, self.placed
        return {
            "config": self.cfg, "cycles": self.cycles, "t_start_ns": self.t_start_ns,
            "t_end_ns": self.now_ns(), "bytes": self.size, "delivered_bytes": self.delivered,
            "complete": all(b == 1 for b in placed),
            "duplicates": sum(1 for b in placed if b > 1), "missing": placed.count(0),
            "work_requests": len(self.wrs), "injected": self.inject[:self.injected],
            "completions": len(self.done), "completion_cycles": [c for c, _ in self.done],
            "line_gbps": self.line_gbps, "placements": self.placements,
            "frames": self.sent_frames,
            "events": [[t, e["ev"], e["state"]] for t, e in self.events],
            "rtts": self.rtts, "ts_unit_ns": TS_UNIT_NS,
            "probe_rounds": [[ts, *r] for ts, r in self.probe_rounds.items()
                             if None not in r],
            "counters": counters,
            "fabric": {"drops": {str(p): dict(fab.stats.planes[p].drops) for p in range(P)},
                       "trims": fab.stats.total("trims"),
                       "trims_lasthop": fab.stats.total("trims_lasthop"),
                       "ecn_marks": fab.stats.total("ecn_marks"),
                       "cross_sunk": fab.stats.total("sunk"),
                       "sent": fab.stats.total("sent"),
                       "delivered": fab.stats.total("delivered")},
            "wall_s": wall_s,
        }


PROGRESS_PREFIX = "mrcnic-progress"


class Progress:
    """Where the bench reports how far it is: a line ``mrcnic-progress PHASE PLACED SIZE
    T_NS`` (PHASE ``bring-up``, ``run`` or ``done``; PLACED of SIZE bytes placed at b at
    simulated time T_NS) appended to the file named by ``MRCNIC_PROGRESS``, which
    ``mrcnic demo`` follows to draw its progress bar; without it, a plain line on stderr
    every :attr:`EVERY_CYCLES` cycles (the simulator's log then shows the progress)."""

    EVERY_CYCLES = 20000
    CHECK_CYCLES = 500              # cycles between looks at the clock (about 1 s of wall)

    def __init__(self, size):
        self.size = size
        path = os.environ.get("MRCNIC_PROGRESS")
        self.file = open(path, "a") if path else None
        self.wall0 = time.time()
        self.last = 0.0

    def report(self, phase, cycles, placed, t_ns):
        """Report the state at ``cycles``: to the file at most twice a second (and at every
        change of phase), else on stderr every EVERY_CYCLES cycles."""
        if self.file is not None:
            if phase == "run" and (cycles % self.CHECK_CYCLES or
                                   time.time() - self.last < 0.5):
                return
            self.last = time.time()
            self.file.write(f"{PROGRESS_PREFIX} {phase} {placed} {self.size} {t_ns:.0f}\n")
            self.file.flush()
        elif phase == "run" and cycles % self.EVERY_CYCLES == 0:
            sys.stderr.write(f"mrcnic demo: {100 * placed // self.size:3d}% of {self.size} "
                             f"bytes, {t_ns / 1000:.0f} us simulated, "
                             f"{time.time() - self.wall0:.0f} s\n")
            sys.stderr.flush()


@cocotb.test()
async def demo(dut):
    cfg = json.loads(os.environ["MRCNIC_DEMO"])
    bench = _Bench(dut, cfg)
    progress = Progress(bench.size)
    progress.report("bring-up", 0, 0, 0.0)
    await bench.reset()
    await bench.bring_up()
    wall0 = time.time()
    # Until everything is there, or the cycle limit.
    while bench.cycles < cfg["max_cycles"] and not bench.finished():
        await RisingEdge(dut.clk)
        bench.cycles += 1
        t = bench.now_ns()
        bench.cycle(t)
        progress.report("run", bench.cycles, bench.delivered, t)
    progress.report("done", bench.cycles, bench.delivered, bench.now_ns())

    metrics = bench.metrics(await bench.counters(), time.time() - wall0)
    os.makedirs(cfg["out_dir"], exist_ok=True)
    with open(os.path.join(cfg["out_dir"], "metrics.json"), "w") as f:
        json.dump(metrics, f)
    if bench.captures is not None:
        from mrcnic.netsim.pcap import write_pcap
        write_pcap(os.path.join(cfg["out_dir"], "wire.pcap"), bench.captures)
    assert len(bench.done) == len(bench.wrs), \
        f"{len(bench.done)} of {len(bench.wrs)} work requests completed"
    assert metrics["complete"], "bytes missing or placed twice"
