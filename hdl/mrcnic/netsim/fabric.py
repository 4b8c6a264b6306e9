"""A discrete-event model of the MRC network: planes of two-tier Clos fabrics between hosts.

The fabric carries whole Ethernet frames (no FCS) between host ports. Each of up to 8 planes
is a separate network: host -> leaf -> spine -> leaf -> host, or host -> leaf -> host when
both hosts hang off the same leaf. Switches forward SRv6 uSID frames as spec §2.4 says (shift,
or End with the SRH's next segment, then a static table) and plain IPv6 frames by destination
host with ECMP over the spines. Every directed link has an egress at its transmitting node
with a rate and a propagation delay; switch egresses have a normal and a strict-priority
queue, trim data frames above a threshold and mark ECN (the decisions in :mod:`mrcnic.base.proto`:
``DSCP_*``, ``ECN_*`` and the trimming decision). Failures of links, switches and whole planes,
gray links, random loss and incast cross traffic are scheduled on the same clock.

Speed comes from working on the frame bytes at fixed offsets: a frame is parsed once, at its
first switch, for the facts that never change on the way (is it a RoCE WRITE, where its
trimmed length ends, how many SRH segments it has); every hop after that edits a few bytes
(destination address, hop limit, traffic class, payload length) in place.

Usage::

    fab = Fabric(FabricConfig(planes=2, hosts=4))
    frame = encode(encapsulate(write_packet(...), outer_src=fab.host_addr(0),
                               outer_dst=fab.usid_path(0, 1, spine=2)))
    fab.send(0.0, host=0, plane=1, frame=frame)
    for d in fab.run_until(10_000.0):
        print(d.t_ns, d.host, d.plane, len(d.frame))

Times are float nanoseconds. The model is deterministic for a given configuration, seed and
sequence of calls: its random choices (loss, jitter, gray drops) come from separate
generators seeded from ``FabricConfig.seed``, and events at the same time run in the order
they were scheduled.
"""

import collections
import heapq
import itertools
import random
import zlib

from mrcnic.base import proto
from mrcnic.model.packet import encapsulate, encode, make_usid_address, write_packet
from mrcnic.base.proto import Opcode
from mrcnic.netsim.fabric_config import (
    CROSS_TRAFFIC_QP, CrossTraffic, DROP_CAUSES, Delivery, FAILURE_KINDS, FabricConfig,
    FabricStats, Failure, HOST_USID_BASE, LEAF_USID_BASE, PlaneStats, SPINE_USID_BASE,
    _HOST_NET, _check_int, _check_num, host_usid, leaf_usid, spine_usid)


__all__ = [
    "FabricConfig", "Fabric", "Failure", "Delivery", "CrossTraffic", "FabricStats",
    "PlaneStats", "DROP_CAUSES", "FAILURE_KINDS", "LEAF_USID_BASE", "SPINE_USID_BASE",
    "HOST_USID_BASE", "CROSS_TRAFFIC_QP", "leaf_usid", "spine_usid", "host_usid",
]


# Fixed offsets in an Ethernet frame whose outermost header is IPv6 (no VLAN tag).
_IP = 14                        # outer IPv6 header
_TC_HI, _TC_LO = _IP, _IP + 1   # traffic class straddles these two bytes
_PLEN = _IP + 4                 # payload length
_NH = _IP + 6                   # next header
_HOPS = _IP + 7                 # hop limit
_SRC = _IP + 8
_DST = _IP + 24
_EXT = _IP + proto.IPV6.size    # first byte after the outer header (54)
_PREFIX_LEN = (proto.SRV6_LBL_BITS + proto.SRV6_USID_BITS) // 8          # /48 in bytes
_LBL_LEN = proto.SRV6_LBL_BITS // 8
_SRH_LEFT = _EXT + 3            # SRH segments_left
_SRH_SEGS = _EXT + proto.SRH_FIXED_LEN
_WRITE_OPCODES = frozenset(range(Opcode.WRITE_FIRST, Opcode.WRITE_ONLY_IMM + 1))
_ECT = (proto.ECN_ECT0, proto.ECN_ECT1)
_PRIORITY_DSCP = (proto.DSCP_CONTROL, proto.DSCP_TRIMMED, proto.DSCP_TRIMMED_LASTHOP)
# What a switch keeps of a data frame after the BTH (trimming decision in proto).
_AFTER_BTH = proto.BTH.size + proto.METH.size + proto.RETH.size
_ETHERTYPE_IPV6 = proto.ETHERTYPE_IPV6.to_bytes(2, "big")


def _dscp(buf):
    return (buf[_TC_HI] & 0x0F) << 2 | buf[_TC_LO] >> 6


def _set_dscp(buf, dscp):
    buf[_TC_HI] = (buf[_TC_HI] & 0xF0) | dscp >> 2
    buf[_TC_LO] = (dscp & 0x3) << 6 | (buf[_TC_LO] & 0x3F)


def _ecn(buf):
    return buf[_TC_LO] >> 4 & 0x3



# --- Internal state ------------------------------------------------------------------------

class _Frame:
    """A frame in the fabric, with the facts its first switch parsed (``data`` None until
    then)."""
    __slots__ = ("buf", "data", "trim_len", "srh_n", "sink", "hops")

    def __init__(self, buf, sink=False):
        self.buf = buf
        self.data = None
        self.trim_len = 0
        self.srh_n = 0
        self.sink = sink
        self.hops = 0


class _Egress:
    """The transmit side of one directed link."""
    __slots__ = ("plane", "node", "peer", "key", "host_port", "to_host", "dest", "rate",
                 "delay", "normal", "prio", "normal_bytes", "prio_bytes", "busy_until",
                 "pump_pending", "down", "epoch", "grays", "slow", "extra", "drop", "peak",
                 "frames")

    def __init__(self, plane, node, peer, rate, delay):
        self.plane, self.node, self.peer = plane, node, peer
        self.key = (plane, node, peer)
        self.host_port = node[0] == "host"
        self.to_host = peer[0] == "host"
        self.dest = None                  # the _Switch at the far end (None for a host)
        self.rate = rate                  # bits per ns
        self.delay = delay
        self.normal = collections.deque()
        self.prio = collections.deque()
        self.normal_bytes = self.prio_bytes = 0
        self.busy_until = 0.0
        self.pump_pending = False
        self.down = 0                     # active failures covering this link
        self.epoch = 0                    # bumped at each failure: frames on the wire die
        self.grays = []
        self.slow, self.extra, self.drop = 1.0, 0.0, 0.0
        self.peak = 0
        self.frames = 0

    def regray(self):
        self.slow, self.extra, keep = 1.0, 0.0, 1.0
        for g in self.grays:
            self.slow *= g.slow
            self.extra += g.extra_delay_ns
            keep *= 1.0 - g.drop
        self.drop = 1.0 - keep


class _Switch:
    __slots__ = ("plane", "name", "is_leaf", "prefix", "table", "host_port", "uplinks",
                 "downlinks")

    def __init__(self, plane, name, prefix):
        self.plane, self.name, self.prefix = plane, name, prefix
        self.is_leaf = name[0] == "leaf"
        self.table = {}        # next /48 (locator + uSID) -> egress
        self.host_port = {}    # leaf: attached host -> egress
        self.uplinks = []      # leaf: egress to spine s
        self.downlinks = []    # spine: egress to leaf i


_SEND, _PUMP, _ARRIVE, _FAIL, _RECOVER, _CROSS = range(6)


# --- The fabric ----------------------------------------------------------------------------

class Fabric:
    """The simulated network built from ``cfg`` (a :class:`FabricConfig`).

    Drive it with :meth:`send`, :meth:`schedule` (failures) and :meth:`cross_traffic`; run it
    with :meth:`run_until` (or :meth:`run`), which returns the :class:`Delivery` records in
    time order; :meth:`next_event_ns` tells a harness how much idle time it may skip.
    :attr:`stats` counts everything (:class:`FabricStats`). ``capture`` records the frames
    at host ports in :attr:`captures` as ``(t_ns, host, plane, "tx" or "rx", frame)``:
    ``True`` for every host, or a collection of host numbers.
    """

    def __init__(self, cfg=None, *, capture=False):
        if cfg is None:
            cfg = FabricConfig()
        if not isinstance(cfg, FabricConfig):
            raise TypeError(f"Fabric takes a FabricConfig, not {type(cfg).__name__}")
        self.cfg = cfg
        self.now = 0.0
        self._heap = []
        self._seq = itertools.count()
        self._out = []
        self.captures = []
        if capture is True:
            self._capture = frozenset(range(cfg.hosts))
        elif not capture:
            self._capture = frozenset()
        else:
            self._capture = frozenset(capture)
        self._rng_loss = random.Random(f"{cfg.seed}:loss")
        self._rng_jitter = random.Random(f"{cfg.seed}:jitter")
        self._rng_gray = random.Random(f"{cfg.seed}:gray")
        self._locator = cfg.locator.to_bytes(_LBL_LEN, "big")
        self._leaf_of = [h % cfg.leaves for h in range(cfg.hosts)]
        self._host_of_addr = {self.host_addr(h).to_bytes(16, "big"): h
                              for h in range(cfg.hosts)}
        self._build()
        self.stats = FabricStats(cfg.planes, self._ports)

    # --- topology --------------------------------------------------------------------------

    def _prefix(self, usid):
        return self._locator + usid.to_bytes(2, "big")

    def _build(self):
        cfg = self.cfg
        rate = cfg.link_gbps              # Gb/s is bits per ns
        self._ports = []
        self._links = {}                  # (plane, a, b) -> egress a -> b
        self._switches = {}               # (plane, name) -> _Switch
        self._host_egress = []            # [plane][host]

        def link(p, a, b, delay):
            for x, y in ((a, b), (b, a)):
                e = _Egress(p, x, y, rate, delay)
                self._links[(p, x, y)] = e
                self._ports.append(e)
                if y[0] != "host":
                    e.dest = self._switches[(p, y)]

        for p in range(cfg.planes):
            for i in range(cfg.leaves):
                self._switches[(p, ("leaf", i))] = _Switch(p, ("leaf", i),
                                                           self._prefix(leaf_usid(i)))
            for s in range(cfg.spines):
                self._switches[(p, ("spine", s))] = _Switch(p, ("spine", s),
                                                            self._prefix(spine_usid(s)))
            hosts = []
            for h in range(cfg.hosts):
                leaf = ("leaf", self._leaf_of[h])
                link(p, ("host", h), leaf, cfg.link_delay_ns)
                sw = self._switches[(p, leaf)]
                e = self._links[(p, leaf, ("host", h))]
                sw.host_port[h] = e
                sw.table[self._prefix(host_usid(h))] = e
                hosts.append(self._links[(p, ("host", h), leaf)])
            self._host_egress.append(hosts)
            for i in range(cfg.leaves):
                leaf = self._switches[(p, ("leaf", i))]
                for s in range(cfg.spines):
                    link(p, ("leaf", i), ("spine", s),
                         cfg.link_delay_ns + s * cfg.spine_skew_ns)
                    up = self._links[(p, ("leaf", i), ("spine", s))]
                    leaf.uplinks.append(up)
                    leaf.table[self._prefix(spine_usid(s))] = up
            for s in range(cfg.spines):
                spine = self._switches[(p, ("spine", s))]
                for i in range(cfg.leaves):
                    down = self._links[(p, ("spine", s), ("leaf", i))]
                    spine.downlinks.append(down)
                    spine.table[self._prefix(leaf_usid(i))] = down

    def _check_host(self, h, what="host"):
        _check_int(what, h, 0, self.cfg.hosts - 1)

    def _check_plane(self, p):
        _check_int("plane", p, 0, self.cfg.planes - 1)

    def host_addr(self, h):
        """Host h's plain IPv6 address (an int), fd00::(h+1), the same in every plane."""
        self._check_host(h)
        return _HOST_NET | (h + 1)

    def leaf_of(self, h):
        """The leaf host h is attached to (in every plane)."""
        self._check_host(h)
        return self._leaf_of[h]

    def usid_path(self, src, dst, spine=0):
        """Outer destination (an int) that takes a frame from host ``src`` through ``spine``
        to host ``dst``: locator, leaf(src), spine, leaf(dst), host(dst); only leaf and host
        when both hosts share a leaf (``spine`` is then ignored)."""
        self._check_host(src, "src")
        self._check_host(dst, "dst")
        _check_int("spine", spine, 0, self.cfg.spines - 1)
        a, b = self._leaf_of[src], self._leaf_of[dst]
        if a == b:
            usids = [leaf_usid(a), host_usid(dst)]
        else:
            usids = [leaf_usid(a), spine_usid(spine), leaf_usid(b), host_usid(dst)]
        return make_usid_address(self.cfg.locator, usids)

    def host_residue(self, h):
        """The outer destination host h's NIC sees once the uSIDs are used up: locator, the
        host's uSID, zeros."""
        self._check_host(h)
        return make_usid_address(self.cfg.locator, [host_usid(h)])

    def _node_check(self, plane, node):
        cfg = self.cfg
        limits = {"host": cfg.hosts, "leaf": cfg.leaves, "spine": cfg.spines}
        if (len(node) != 2 or node[0] not in limits or isinstance(node[1], bool)
                or not isinstance(node[1], int) or not 0 <= node[1] < limits[node[0]]):
            raise ValueError(f"no node {node!r} in plane {plane} (nodes are ('host', "
                             f"0..{cfg.hosts - 1}), ('leaf', 0..{cfg.leaves - 1}), "
                             f"('spine', 0..{cfg.spines - 1}))")

    def _failure_ports(self, f):
        self._check_plane(f.plane)
        for n in f.nodes:
            self._node_check(f.plane, n)
        if f.kind == "plane":
            return [e for e in self._ports if e.plane == f.plane]
        if f.kind == "switch":
            node = f.nodes[0]
            if node[0] == "host":
                raise ValueError(f"a switch failure names a leaf or a spine, not {node!r} "
                                 f"(fail its link instead)")
            return [e for e in self._ports if e.plane == f.plane and node in (e.node, e.peer)]
        a, b = f.nodes
        if (f.plane, a, b) not in self._links:
            raise ValueError(f"no link between {a!r} and {b!r} in plane {f.plane}")
        return [self._links[(f.plane, a, b)], self._links[(f.plane, b, a)]]

    # --- public API ------------------------------------------------------------------------

    def _push(self, t, kind, a, b=None, c=None):
        heapq.heappush(self._heap, (t, next(self._seq), kind, a, b, c))

    def _check_time(self, name, t):
        _check_num(name, t, 0)
        if t < self.now:
            raise ValueError(f"{name} = {t} is in the past (the fabric is at {self.now} ns)")

    def send(self, t_ns, host, plane, frame):
        """Host ``host``'s port on ``plane`` sends ``frame`` (bytes-like, no FCS) from
        ``t_ns``, or once the frames it already queued are out. Anything bytes-like goes on
        the wire; what the first switch cannot parse is counted as ``malformed``."""
        self._check_time("t_ns", t_ns)
        self._check_host(host)
        self._check_plane(plane)
        if not isinstance(frame, (bytes, bytearray, memoryview)):
            raise TypeError(f"frame must be bytes-like, not {type(frame).__name__}")
        buf = bytearray(frame)
        ps = self.stats.planes[plane]
        ps.sent += 1
        ps.sent_bytes += len(buf)
        self._push(float(t_ns), _SEND, self._host_egress[plane][host], _Frame(buf))

    def host_port(self, host, plane):
        """``(up, queued)`` of host ``host``'s port on ``plane``: whether its link is up (no
        failure covers it: what the NIC's PHY sees) and the bytes waiting in its egress, sent
        but not yet on the wire (what the NIC's transmit FIFO holds)."""
        self._check_host(host)
        self._check_plane(plane)
        e = self._host_egress[plane][host]
        return e.down == 0, e.normal_bytes + e.prio_bytes

    def schedule(self, failure):
        """Schedule a :class:`Failure` (its nodes and plane checked against the topology)."""
        if not isinstance(failure, Failure):
            raise TypeError(f"schedule takes a Failure, not {type(failure).__name__}")
        ports = self._failure_ports(failure)
        self._check_time("at_ns", failure.at_ns)
        self._push(float(failure.at_ns), _FAIL, failure, ports)
        if failure.until_ns is not None:
            self._push(float(failure.until_ns), _RECOVER, failure, ports)

    def cross_traffic(self, src_host, dst_host, plane, rate_gbps, start_ns, stop_ns,
                      frame_bytes=4096, *, sink=True, srv6=True):
        """A source of RoCE WRITE frames from ``src_host`` to ``dst_host`` on ``plane`` at
        ``rate_gbps`` from ``start_ns`` until ``stop_ns`` (exclusive).

        Frames go to :data:`CROSS_TRAFFIC_QP` with DSCP_DATA and ECT(0). With ``srv6`` they
        are SRv6 frames sprayed over the spines in turn; otherwise plain IPv6 (one ECMP
        path). ``frame_bytes`` is rounded down to the nearest length the RoCE pad rule allows
        (see the returned :attr:`CrossTraffic.frame_len`). A rate above the link's fills
        the source host's FIFO without bound. With ``sink`` the frames are counted as
        ``sunk`` at the destination instead of being delivered.
        """
        self._check_host(src_host, "src_host")
        self._check_host(dst_host, "dst_host")
        if src_host == dst_host:
            raise ValueError(f"cross traffic from host {src_host} to itself")
        self._check_plane(plane)
        _check_num("rate_gbps", rate_gbps, 0, open_lo=True)
        self._check_time("start_ns", start_ns)
        _check_num("stop_ns", stop_ns, 0)
        _check_int("frame_bytes", frame_bytes, 1)

        def frame(spine, payload):
            pkt = write_packet(Opcode.WRITE_MIDDLE, qp=CROSS_TRAFFIC_QP, psn=0, va=0, rkey=0,
                               dma_length=0, payload=bytes(payload),
                               src_ip=self.host_addr(src_host), dst_ip=self.host_addr(dst_host),
                               dscp=proto.DSCP_DATA, ecn=proto.ECN_ECT0,
                               udp_dport=self.cfg.udp_dport)
            if srv6:
                pkt = encapsulate(pkt, outer_src=self.host_addr(src_host),
                                  outer_dst=self.usid_path(src_host, dst_host, spine))
            return encode(pkt)

        overhead = len(frame(0, 0))
        if frame_bytes < overhead:
            raise ValueError(f"frame_bytes = {frame_bytes} is below the {overhead} bytes of "
                             f"a cross-traffic frame's headers")
        payload = (frame_bytes - overhead) // 4 * 4
        same_leaf = self._leaf_of[src_host] == self._leaf_of[dst_host]
        spines = 1 if (same_leaf or not srv6) else self.cfg.spines
        templates = [frame(s, payload) for s in range(spines)]
        src = CrossTraffic(src_host, dst_host, plane, float(rate_gbps), float(start_ns),
                           float(stop_ns), len(templates[0]), sink)
        if start_ns < stop_ns:
            self._push(float(start_ns), _CROSS, src, templates, 0)
        return src

    def next_event_ns(self):
        """Time of the next scheduled event, or ``None`` when nothing is pending."""
        return self._heap[0][0] if self._heap else None

    def run_until(self, t_ns):
        """Run every event up to and including ``t_ns``; the frames delivered meanwhile, in
        time order."""
        self._check_time("t_ns", t_ns)
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= t_ns:
            t, _, kind, a, b, c = pop(heap)
            if kind == _ARRIVE:
                self._arrive(a, b, c, t)
            elif kind == _PUMP:
                self._pump(a, t)
            elif kind == _SEND:
                self._host_enqueue(a, b, t)
            elif kind == _CROSS:
                self._cross(a, b, c, t)
            elif kind == _FAIL:
                self._fail(a, b, t)
            else:
                self._recover(a, b)
        self.now = float(t_ns)
        out, self._out = self._out, []
        return out

    def run(self, limit_ns=None):
        """Run until nothing is pending (or up to ``limit_ns``); the frames delivered."""
        out = []
        while self._heap:
            t = self._heap[0][0]
            if limit_ns is not None and t > limit_ns:
                break
            out += self.run_until(t)
        return out

    # --- event handlers --------------------------------------------------------------------

    def _drop(self, plane, cause):
        self.stats.planes[plane].drops[cause] += 1

    def _host_enqueue(self, e, frm, t):
        if e.down:
            self._drop(e.plane, "failed")
            return
        if e.busy_until <= t and not e.normal:
            self._transmit(e, frm, t)
            return
        e.normal.append(frm)
        e.normal_bytes += len(frm.buf)
        if e.normal_bytes > e.peak:
            e.peak = e.normal_bytes
        if not e.pump_pending:
            e.pump_pending = True
            self._push(max(e.busy_until, t), _PUMP, e)

    def _cross(self, src, templates, k, t):
        e = self._host_egress[src.plane][src.src]
        buf = bytearray(templates[k % len(templates)])
        ps = self.stats.planes[src.plane]
        ps.sent += 1
        ps.sent_bytes += len(buf)
        src.frames += 1
        self._host_enqueue(e, _Frame(buf, sink=src.sink), t)
        nxt = src.start_ns + (k + 1) * src.frame_len * 8 / src.rate_gbps
        if nxt < src.stop_ns:
            self._push(nxt, _CROSS, src, templates, k + 1)

    def _transmit(self, e, frm, t):
        buf = frm.buf
        done = t + len(buf) * 8 / e.rate * e.slow
        e.busy_until = done
        e.frames += 1
        if e.host_port and e.node[1] in self._capture:
            self.captures.append((t, e.node[1], e.plane, "tx", bytes(buf)))
        if e.drop and self._rng_gray.random() < e.drop:
            self._drop(e.plane, "gray")
            return
        arrive = done + e.delay + e.extra
        if self.cfg.jitter_ns:
            arrive += self._rng_jitter.random() * self.cfg.jitter_ns
        self._push(arrive, _ARRIVE, e, frm, e.epoch)

    def _pump(self, e, t):
        e.pump_pending = False
        if e.busy_until > t:            # the link was reset and restarted meanwhile
            e.pump_pending = True
            self._push(e.busy_until, _PUMP, e)
            return
        if e.prio:
            frm = e.prio.popleft()
            e.prio_bytes -= len(frm.buf)
        elif e.normal:
            frm = e.normal.popleft()
            e.normal_bytes -= len(frm.buf)
        else:
            return
        self._transmit(e, frm, t)
        if e.prio or e.normal:
            e.pump_pending = True
            self._push(e.busy_until, _PUMP, e)

    def _arrive(self, e, frm, epoch, t):
        if e.down or e.epoch != epoch:
            self._drop(e.plane, "failed")
            return
        if e.to_host:
            host = e.peer[1]
            ps = self.stats.planes[e.plane]
            if frm.sink:
                ps.sunk += 1
                return
            frame = bytes(frm.buf)
            ps.delivered += 1
            ps.delivered_bytes += len(frame)
            self._out.append(Delivery(t, host, e.plane, frame))
            if host in self._capture:
                self.captures.append((t, host, e.plane, "rx", frame))
            return
        self._switch(e.dest, frm, t)

    def _classify(self, frm):
        """Parse what stays true of the frame at every hop; False if it is not routable."""
        buf = frm.buf
        n = len(buf)
        if n < _EXT or buf[12:14] != _ETHERTYPE_IPV6 or buf[_IP] >> 4 != proto.IPV6_VERSION:
            return False
        nh, off = buf[_NH], _EXT
        if nh == proto.IPPROTO_ROUTING:
            if n < _SRH_SEGS:
                return False
            srh_len = proto.SRH_FIXED_LEN + 8 * buf[_EXT + 1]
            if n < _EXT + srh_len:
                return False
            frm.srh_n = srh_len // proto.SRH_SEGMENT_LEN
            nh, off = buf[_EXT], _EXT + srh_len
        if nh == proto.IPPROTO_IPV6:
            if n < off + proto.IPV6.size or buf[off] >> 4 != proto.IPV6_VERSION:
                frm.data = False
                return True
            nh, off = buf[off + 6], off + proto.IPV6.size
        frm.data = False
        if nh == proto.IPPROTO_UDP and n >= off + proto.UDP.size + proto.BTH.size:
            bth = off + proto.UDP.size
            if (int.from_bytes(buf[off + 2:off + 4], "big") == self.cfg.udp_dport
                    and buf[bth] in _WRITE_OPCODES and _dscp(buf) not in _PRIORITY_DSCP):
                ts = buf[bth + 8] >> proto.BTH_TS_BIT & 1
                trim = bth + _AFTER_BTH + ts * proto.TSETH.size
                if n > trim:
                    frm.data = True
                    frm.trim_len = trim
        return True

    def _switch(self, sw, frm, t):
        buf = frm.buf
        if not frm.hops:
            loss = self.cfg.loss
            if loss and self._rng_loss.random() < loss:
                self._drop(sw.plane, "loss")
                return
            if not self._classify(frm):
                self._drop(sw.plane, "malformed")
                return
        frm.hops += 1
        if buf[_HOPS] <= 1:
            self._drop(sw.plane, "hop_limit")
            return
        prefix = bytes(buf[_DST:_DST + _PREFIX_LEN])
        if prefix == sw.prefix:
            if any(buf[_DST + _PREFIX_LEN:_DST + 16]):
                # uN: the rest of the uSID container moves up by one uSID.
                buf[_DST + _LBL_LEN:_DST + 14] = buf[_DST + _PREFIX_LEN:_DST + 16]
                buf[_DST + 14:_DST + 16] = b"\0\0"
            elif buf[_NH] == proto.IPPROTO_ROUTING and 0 < buf[_SRH_LEFT] <= frm.srh_n:
                left = buf[_SRH_LEFT]
                seg = _SRH_SEGS + proto.SRH_SEGMENT_LEN * (left - 1)
                buf[_DST:_DST + 16] = buf[seg:seg + 16]
                buf[_SRH_LEFT] = left - 1
            else:
                # The path ends at a switch: nothing here terminates tunnels.
                self._drop(sw.plane, "no_route")
                return
            e = sw.table.get(bytes(buf[_DST:_DST + _PREFIX_LEN]))
        elif prefix[:_LBL_LEN] == self._locator:
            e = None
        else:
            h = self._host_of_addr.get(bytes(buf[_DST:_DST + 16]))
            if h is None:
                e = None
            elif not sw.is_leaf:
                e = sw.downlinks[self._leaf_of[h]]
            else:
                e = sw.host_port.get(h)
                if e is None:
                    e = sw.uplinks[self._ecmp(buf) % len(sw.uplinks)]
        if e is None:
            self._drop(sw.plane, "no_route")
            return
        buf[_HOPS] -= 1
        self._switch_enqueue(e, frm, t)

    def _ecmp(self, buf):
        """Hash of source, destination, flow label and UDP ports of the outermost header."""
        flow = bytes((buf[_IP + 1] & 0x0F, buf[_IP + 2], buf[_IP + 3]))
        ports = buf[_EXT:_EXT + 4] if buf[_NH] == proto.IPPROTO_UDP and len(buf) >= _EXT + 4 \
            else b"\0\0\0\0"
        return zlib.crc32(bytes(buf[_SRC:_DST + 16]) + flow + bytes(ports))

    def _switch_enqueue(self, e, frm, t):
        if e.down:
            self._drop(e.plane, "failed")
            return
        buf = frm.buf
        cfg = self.cfg
        ps = self.stats.planes[e.plane]
        if frm.data:
            if e.normal_bytes > cfg.trim_bytes:
                del buf[frm.trim_len:]
                buf[_PLEN:_PLEN + 2] = (frm.trim_len - _EXT).to_bytes(2, "big")
                _set_dscp(buf, proto.DSCP_TRIMMED_LASTHOP if e.to_host else proto.DSCP_TRIMMED)
                frm.data = False
                ps.trims += 1
                if e.to_host:
                    ps.trims_lasthop += 1
            elif e.normal_bytes > cfg.ecn_bytes and _ecn(buf) in _ECT:
                buf[_TC_LO] |= proto.ECN_CE << 4
                ps.ecn_marks += 1
        n = len(buf)
        if frm.data:
            if e.normal_bytes + n > cfg.queue_bytes:
                self._drop(e.plane, "queue_full")
                return
        elif e.prio_bytes + n > cfg.queue_bytes:
            self._drop(e.plane, "queue_full")
            return
        if e.busy_until <= t and not e.normal and not e.prio:
            self._transmit(e, frm, t)
            return
        if frm.data:
            e.normal.append(frm)
            e.normal_bytes += n
        else:
            e.prio.append(frm)
            e.prio_bytes += n
        if e.normal_bytes + e.prio_bytes > e.peak:
            e.peak = e.normal_bytes + e.prio_bytes
        if not e.pump_pending:
            e.pump_pending = True
            self._push(max(e.busy_until, t), _PUMP, e)

    def _fail(self, f, ports, t):
        if f.kind == "gray":
            for e in ports:
                e.grays.append(f)
                e.regray()
            return
        for e in ports:
            e.down += 1
            e.epoch += 1
            lost = len(e.normal) + len(e.prio)
            if lost:
                self.stats.planes[e.plane].drops["failed"] += lost
            e.normal.clear()
            e.prio.clear()
            e.normal_bytes = e.prio_bytes = 0
            # The frame being sent dies with the link (its arrival sees the new epoch).
            e.busy_until = min(e.busy_until, t)

    def _recover(self, f, ports):
        for e in ports:
            if f.kind == "gray":
                e.grays.remove(f)
                e.regray()
            else:
                e.down -= 1
