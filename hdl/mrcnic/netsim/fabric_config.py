"""The fabric model's configuration and records: :class:`FabricConfig`, the failures it
schedules (:class:`Failure`), cross traffic, what it delivers and counts, and the uSID
numbering of its nodes (:mod:`mrcnic.netsim.fabric` runs them)."""

import collections
from dataclasses import dataclass, field

from mrcnic.base import proto


__all__ = [
    "FabricConfig", "Failure", "Delivery", "CrossTraffic", "FabricStats", "PlaneStats",
    "DROP_CAUSES", "FAILURE_KINDS", "LEAF_USID_BASE", "SPINE_USID_BASE", "HOST_USID_BASE",
    "CROSS_TRAFFIC_QP", "leaf_usid", "spine_usid", "host_usid",
]


# uSID numbering of the fabric's nodes, the same in every plane.
LEAF_USID_BASE = 0x0100
SPINE_USID_BASE = 0x0200
HOST_USID_BASE = 0x1000
MAX_LEAVES = SPINE_USID_BASE - LEAF_USID_BASE          # 256
MAX_SPINES = 0x0300 - SPINE_USID_BASE                   # 256
MAX_HOSTS = 0x10000 - HOST_USID_BASE                    # 61440
MAX_PLANES = 8                                          # spec §1

# Cross traffic goes to a QP no NIC configuration of this project uses, so that a NIC that
# receives it (sink=False) drops it as an unknown QP rather than taking it for its own.
CROSS_TRAFFIC_QP = 0xFFFFF0

DROP_CAUSES = ("loss", "failed", "queue_full", "hop_limit", "no_route", "gray", "malformed")
FAILURE_KINDS = ("link", "switch", "plane", "gray")

def leaf_usid(i):
    return LEAF_USID_BASE + i


def spine_usid(s):
    return SPINE_USID_BASE + s


def host_usid(h):
    return HOST_USID_BASE + h


_HOST_NET = 0xFD00 << 112       # fd00::/16; host h is fd00::(h+1)


# --- Configuration -------------------------------------------------------------------------

def _check_int(name, value, lo, hi=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} = {value} is outside {rng}")


def _check_num(name, value, lo, *, open_lo=False, hi=None, open_hi=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    bad = value <= lo if open_lo else value < lo
    if hi is not None:
        bad = bad or (value >= hi if open_hi else value > hi)
    if bad or value == float("inf"):
        lo_s = f"> {lo}" if open_lo else f">= {lo}"
        hi_s = "" if hi is None else (f" and < {hi}" if open_hi else f" and <= {hi}")
        raise ValueError(f"{name} = {value} must be finite, {lo_s}{hi_s}")


@dataclass(frozen=True)
class FabricConfig:
    """Parameters of the fabric, checked on construction (``ValueError`` naming the field).

    ``planes`` 1..8; ``hosts`` 2..61440 (hosts 0 and 1 are the NICs under test, others
    carry cross traffic); ``leaves`` 1..256, default one per host (host h is on leaf
    h % leaves in every plane); ``spines`` 1..256; ``link_gbps`` > 0 (every link);
    ``link_delay_ns`` >= 0 (propagation, per link); ``spine_skew_ns`` >= 0 (links to and from
    spine s get s * spine_skew_ns more); ``jitter_ns`` >= 0 (uniform extra delay per frame per
    link: frames on one link may then arrive out of order); ``queue_bytes`` >= 1 (each of the
    two queues of a switch egress); ``trim_bytes``, ``ecn_bytes`` >= 0 (thresholds on the
    normal queue); ``loss`` in [0, 1) (end-to-end, drawn once per frame at its first switch);
    ``seed``; ``locator`` (32-bit uSID locator block, not fd00::/32, where host addresses
    live); ``udp_dport`` (the RoCEv2 port that makes a frame a RoCE data frame).
    """
    planes: int = 1
    hosts: int = 2
    leaves: int | None = None
    spines: int = 4
    link_gbps: float = 100.0
    link_delay_ns: float = 500.0
    spine_skew_ns: float = 0.0
    jitter_ns: float = 0.0
    queue_bytes: int = 64 * 1024
    trim_bytes: int = 32 * 1024
    ecn_bytes: int = 16 * 1024
    loss: float = 0.0
    seed: int = 0
    locator: int = 0xFC00_0000
    udp_dport: int = proto.UDP_DPORT_DEFAULT

    def __post_init__(self):
        _check_int("planes", self.planes, 1, MAX_PLANES)
        _check_int("hosts", self.hosts, 2, MAX_HOSTS)
        if self.leaves is None:
            if self.hosts > MAX_LEAVES:
                raise ValueError(f"hosts = {self.hosts} needs leaves set explicitly: the "
                                 f"default of one leaf per host exceeds {MAX_LEAVES} leaves")
            object.__setattr__(self, "leaves", self.hosts)
        _check_int("leaves", self.leaves, 1, MAX_LEAVES)
        _check_int("spines", self.spines, 1, MAX_SPINES)
        _check_num("link_gbps", self.link_gbps, 0, open_lo=True)
        _check_num("link_delay_ns", self.link_delay_ns, 0)
        _check_num("spine_skew_ns", self.spine_skew_ns, 0)
        _check_num("jitter_ns", self.jitter_ns, 0)
        _check_int("queue_bytes", self.queue_bytes, 1)
        _check_int("trim_bytes", self.trim_bytes, 0)
        _check_int("ecn_bytes", self.ecn_bytes, 0)
        _check_num("loss", self.loss, 0, hi=1, open_hi=True)
        _check_int("seed", self.seed, -(1 << 63))
        _check_int("locator", self.locator, 0, (1 << proto.SRV6_LBL_BITS) - 1)
        if self.locator == _HOST_NET >> 96:
            raise ValueError(f"locator {self.locator:#010x} is the block host addresses use "
                             f"(fd00::/32); pick another")
        _check_int("udp_dport", self.udp_dport, 0, 0xFFFF)



# --- Records -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Delivery:
    """A frame handed to a host port: ``t_ns`` is when its last byte arrived."""
    t_ns: float
    host: int
    plane: int
    frame: bytes


@dataclass(frozen=True)
class Failure:
    """A scheduled fault, active from ``at_ns`` until ``until_ns`` (``None``: for good).

    ``kind``: ``"link"`` (both directions of the link between the two ``nodes``), ``"switch"``
    (every link of the one node in ``nodes``), ``"plane"`` (every link of ``plane``; ``nodes``
    empty) or ``"gray"`` (the link between the two ``nodes``, both directions, stays up but
    drops a fraction ``drop`` of the frames it sends, adds ``extra_delay_ns`` and runs at its
    rate divided by ``slow``). Nodes are ``("host", h)``, ``("leaf", i)``, ``("spine", s)``.
    """
    kind: str
    at_ns: float
    until_ns: float | None = None
    plane: int = 0
    nodes: tuple = ()
    drop: float = 0.0
    extra_delay_ns: float = 0.0
    slow: float = 1.0

    def __post_init__(self):
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {self.kind!r} is not one of {FAILURE_KINDS}")
        _check_num("at_ns", self.at_ns, 0)
        if self.until_ns is not None:
            _check_num("until_ns", self.until_ns, 0)
            if self.until_ns < self.at_ns:
                raise ValueError(f"until_ns = {self.until_ns} is before at_ns = {self.at_ns}")
        nodes = self.nodes
        if len(nodes) == 2 and isinstance(nodes[0], str):
            nodes = (nodes,)            # a single node given bare: ("leaf", 1)
        object.__setattr__(self, "nodes", tuple(tuple(n) for n in nodes))
        want = {"link": 2, "gray": 2, "switch": 1, "plane": 0}[self.kind]
        if len(self.nodes) != want:
            raise ValueError(f"a {self.kind} failure names {want} node(s), got "
                             f"{len(self.nodes)}: {self.nodes!r}")
        if self.kind == "gray":
            _check_num("drop", self.drop, 0, hi=1)
            _check_num("extra_delay_ns", self.extra_delay_ns, 0)
            _check_num("slow", self.slow, 1)
        elif (self.drop, self.extra_delay_ns, self.slow) != (0.0, 0.0, 1.0):
            raise ValueError("drop, extra_delay_ns and slow apply to gray failures only")


@dataclass
class PlaneStats:
    """Counters of one plane. ``sent``: frames handed to the fabric (NIC sends and cross
    traffic); ``delivered``: frames handed to a host; ``sunk``: cross traffic discarded at its
    destination; ``drops``: frames per cause of :data:`DROP_CAUSES`; ``trims`` counts every
    trim, ``trims_lasthop`` those done by an egress to a host; ``ecn_marks``: frames set to
    CE."""
    sent: int = 0
    sent_bytes: int = 0
    delivered: int = 0
    delivered_bytes: int = 0
    sunk: int = 0
    trims: int = 0
    trims_lasthop: int = 0
    ecn_marks: int = 0
    drops: collections.Counter = field(default_factory=collections.Counter)


class FabricStats:
    """Counters per plane (:attr:`planes`, a list of :class:`PlaneStats`) and per port."""

    def __init__(self, planes, ports):
        self.planes = [PlaneStats() for _ in range(planes)]
        self._ports = ports

    def total(self, name):
        """Sum of counter ``name`` (a :class:`PlaneStats` field) over the planes."""
        return sum(getattr(p, name) for p in self.planes)

    def drops(self, cause=None, plane=None):
        """Dropped frames: of one cause or all, on one plane or all."""
        if cause is not None and cause not in DROP_CAUSES:
            raise ValueError(f"drop cause {cause!r} is not one of {DROP_CAUSES}")
        planes = self.planes if plane is None else [self.planes[plane]]
        return sum(p.drops[cause] if cause else sum(p.drops.values()) for p in planes)

    @property
    def peak_queue_bytes(self):
        """``{(plane, node, peer): bytes}``: the most a switch egress held in its two queues
        (the frame being transmitted not included)."""
        return {e.key: e.peak for e in self._ports if not e.host_port}

    @property
    def peak_host_bytes(self):
        """``{(plane, host): bytes}``: the most a host port's FIFO held."""
        return {(e.plane, e.node[1]): e.peak for e in self._ports if e.host_port}

    @property
    def port_frames(self):
        """``{(plane, node, peer): frames}`` each egress put on its link."""
        return {e.key: e.frames for e in self._ports}


@dataclass
class CrossTraffic:
    """A running cross-traffic source (what :meth:`Fabric.cross_traffic` returns)."""
    src: int
    dst: int
    plane: int
    rate_gbps: float
    start_ns: float
    stop_ns: float
    frame_len: int
    sink: bool
    frames: int = 0


