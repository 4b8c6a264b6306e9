"""mrcnic.netsim.fabric: forwarding of real MRC frames (checked with mrcnic.model.packet), exact
serialization and propagation times, trimming, ECN, queue drops, loss, failures of every
kind, determinism, bad input, pcap output, and the model's speed."""

import ipaddress
import math
import shutil
import subprocess
import time
import zlib

import pytest

from mrcnic.base import proto
from mrcnic.netsim.fabric import (CROSS_TRAFFIC_QP, DROP_CAUSES, Fabric, FabricConfig, Failure,
                           host_usid, leaf_usid, spine_usid)
from mrcnic.model import packet as pk
from mrcnic.netsim.pcap import PCAP_MAGIC_NS, read_pcap, write_pcap
from mrcnic.base.proto import BTH, IPV6, RETH, SRH, Opcode
from testkit.simtools import seeded

# Ethernet + outer IPv6 + inner IPv6 + UDP + BTH + METH + RETH + ICRC of an SRv6 write.
SRV6_WRITE_OVERHEAD = 14 + 40 + 40 + 8 + 12 + 4 + 16 + 4
TRIMMED_LEN = 14 + 40 + 40 + 8 + 12 + 4 + 16


def inner_frame(fab, src, dst, psn, payload=1000, *, qp=0x10, ecn=proto.ECN_ECT0,
                dscp=proto.DSCP_DATA, ts=None, flow_label=0, opcode=Opcode.WRITE_MIDDLE):
    pkt = pk.write_packet(opcode, qp=qp, psn=psn, va=0x10000 + 4096 * psn, rkey=0x77,
                          dma_length=1 << 20, payload=bytes(range(256)) * (payload // 256)
                          + bytes(payload % 256), ts=ts, src_ip=fab.host_addr(src),
                          dst_ip=fab.host_addr(dst), ecn=ecn, dscp=dscp,
                          flow_label=flow_label, udp_sport=0xC000 + psn % 64)
    return pk.encode(pkt)


def srv6_frame(fab, src, dst, psn, spine=0, payload=1000, *, srh=False, **kw):
    """An SRv6 frame from ``src`` to ``dst`` through ``spine`` and its inner frame; with
    ``srh`` the path is split: leaf and spine in the address, leaf and host in the SRH."""
    inner = inner_frame(fab, src, dst, psn, payload, **kw)
    if srh:
        loc = fab.cfg.locator
        a, b = fab.leaf_of(src), fab.leaf_of(dst)
        outer = pk.make_usid_address(loc, [leaf_usid(a), spine_usid(spine)])
        seg = pk.make_usid_address(loc, [leaf_usid(b), host_usid(dst)])
        return pk.encapsulate(inner, outer_src=fab.host_addr(src), outer_dst=outer,
                              srh_segment=seg), inner
    return pk.encapsulate(inner, outer_src=fab.host_addr(src),
                          outer_dst=fab.usid_path(src, dst, spine)), inner


def outer(frame):
    return IPV6.unpack(frame[14:54])


def inner_bth(frame):
    """BTH of an SRv6 frame, with or without its one-segment SRH."""
    at = 102 + (SRH.size if frame[20] == proto.IPPROTO_ROUTING else 0)
    return BTH.unpack(frame[at:at + BTH.size])


def conserved(fab):
    s = fab.stats
    assert s.total("sent") == s.total("delivered") + s.total("sunk") + s.drops()


# --- forwarding ----------------------------------------------------------------------------

@pytest.mark.parametrize("srh", [False, True], ids=["usid", "usid+srh"])
def test_srv6_frames_reach_their_host(srh):
    fab = Fabric(FabricConfig(planes=3, hosts=4, spines=4))
    sent = {}
    for plane in range(3):
        for spine in range(4):
            psn = plane * 8 + spine
            frame, inner = srv6_frame(fab, 0, 1, psn, spine, srh=srh, payload=997)
            sent[psn] = (plane, spine, inner)
            fab.send(100.0 * psn, 0, plane, frame)
    got = fab.run_until(1e6)
    assert len(got) == 12 and fab.next_event_ns() is None
    assert [d.t_ns for d in got] == sorted(d.t_ns for d in got)
    for d in got:
        o = outer(d.frame)
        psn = inner_bth(d.frame)["psn"]
        plane, spine, inner = sent[psn]
        assert (d.host, d.plane) == (1, plane)
        assert o["dst"] == fab.host_residue(1) == pk.make_usid_address(0xFC000000, [0x1001])
        assert o["hop_limit"] == 64 - 3
        assert pk.decapsulate(d.frame) == inner
        pkt = pk.decode(d.frame, check_icrc=True)
        assert pkt.bth["psn"] == psn and pkt.payload == pk.decode(inner).payload
        if srh:
            assert pkt.srh["segments_left"] == 0
        assert fab.stats.port_frames[(plane, ("spine", spine), ("leaf", 1))] == 1
    for plane in range(3):
        p = fab.stats.planes[plane]
        assert (p.sent, p.delivered, sum(p.drops.values())) == (4, 4, 0)


def test_hosts_on_one_leaf_skip_the_spines():
    fab = Fabric(FabricConfig(hosts=4, leaves=2))
    assert fab.leaf_of(2) == 0
    path = fab.usid_path(0, 2, spine=3)
    assert path == pk.make_usid_address(fab.cfg.locator, [0x0100, 0x1002])
    frame, inner = srv6_frame(fab, 0, 2, 5)
    fab.send(0, 0, 0, frame)
    fab.send(0, 0, 0, inner)               # plain IPv6 too
    got = fab.run_until(1e5)
    assert [d.host for d in got] == [2, 2]
    assert outer(got[0].frame)["hop_limit"] == 63 and pk.decapsulate(got[0].frame) == inner
    assert outer(got[1].frame)["hop_limit"] == 63
    assert got[1].frame[:21] == inner[:21] and got[1].frame[22:] == inner[22:]
    assert not any(n for (p, a, b), n in fab.stats.port_frames.items() if "spine" in a + b)


def test_plain_ipv6_ecmp_is_the_documented_hash_and_uses_every_spine():
    def run():
        fab = Fabric(FabricConfig(hosts=2, spines=4, spine_skew_ns=1000))
        for k in range(64):
            fab.send(20_000.0 * k, 0, 0, inner_frame(fab, 0, 1, k, 100, flow_label=k * 4099))
        return fab, fab.run_until(2e6)

    fab, got = run()
    base = 4 * (len(got[0].frame) * 8 / 100 + 500)
    spines = [round((d.t_ns - 20_000.0 * k - base) / 2000) for k, d in enumerate(got)]
    for k, s in enumerate(spines):
        f = inner_frame(fab, 0, 1, k, 100, flow_label=k * 4099)
        key = f[22:54] + bytes((f[15] & 0xF, f[16], f[17])) + f[54:58]
        assert s == zlib.crc32(key) % 4
    assert set(spines) == {0, 1, 2, 3}
    assert spines == [round((d.t_ns - 20_000.0 * k - base) / 2000)
                      for k, d in enumerate(run()[1])]
    for s in range(4):
        assert fab.stats.port_frames[(0, ("leaf", 0), ("spine", s))] == spines.count(s)


# --- timing --------------------------------------------------------------------------------

@pytest.mark.parametrize("gbps,skew,spine", [(100.0, 0.0, 0), (25.0, 0.0, 1), (100.0, 250.0, 3)])
def test_serialization_and_delay_are_exact(gbps, skew, spine):
    fab = Fabric(FabricConfig(hosts=2, link_gbps=gbps, link_delay_ns=500, spine_skew_ns=skew))
    frames = [srv6_frame(fab, 0, 1, k, spine, 1250 - SRV6_WRITE_OVERHEAD)[0] for k in range(5)]
    assert {len(f) for f in frames} == {1250}
    for f in frames:
        fab.send(1000.0, 0, 0, f)
    got = fab.run_until(1e6)
    ser = 1250 * 8 / gbps                  # 100 ns at 100 Gb/s, 400 ns at 25 Gb/s
    first = 1000.0 + 4 * (ser + 500) + 2 * spine * skew
    assert [d.t_ns for d in got] == [first + k * ser for k in range(5)]
    assert [inner_bth(d.frame)["psn"] for d in got] == list(range(5))
    assert fab.stats.peak_host_bytes[(0, 0)] == 4 * 1250


def test_host_port_waits_for_its_egress():
    fab = Fabric(FabricConfig(hosts=2, link_delay_ns=0))
    a, _ = srv6_frame(fab, 0, 1, 0, payload=1250 - SRV6_WRITE_OVERHEAD)
    fab.send(0.0, 0, 0, a)
    fab.send(30.0, 0, 0, a)                # the port is busy until 100 ns
    fab.send(500.0, 0, 0, a)               # idle again
    got = fab.run_until(1e4)
    assert [d.t_ns for d in got] == [400.0, 500.0, 900.0]


# --- trimming, priority, ECN, queue drops --------------------------------------------------

def test_incast_trims_at_the_last_hop_and_trimmed_frames_go_first():
    fab = Fabric(FabricConfig(hosts=6, spines=4))
    for src in (2, 3, 4):
        fab.cross_traffic(src, 1, 0, 100.0, 0.0, 30_000.0, 4096)
    sent = {}
    for k in range(60):
        variant = k % 3                    # SRv6, SRv6 + SRH, SRv6 with a TSETH
        frame, inner = srv6_frame(fab, 0, 1, k, k % 4, 2000, srh=variant == 1,
                                  ts=0x1234 if variant == 2 else None)
        sent[k] = (frame, inner, variant)
        fab.send(400.0 * k, 0, 0, frame)
    got = fab.run_until(1e6)
    assert fab.next_event_ns() is None
    s = fab.stats.planes[0]
    assert s.trims > 0 and s.trims == s.trims_lasthop
    assert s.sunk > 0 and not s.drops
    conserved(fab)
    order, trimmed = [], set()
    for d in got:
        assert d.host == 1
        o = outer(d.frame)
        srh_len = SRH.size if d.frame[20] == proto.IPPROTO_ROUTING else 0
        psn = inner_bth(d.frame)["psn"]
        frame, inner, variant = sent[psn]
        order.append(psn)
        assert o["hop_limit"] == 61 and o["dst"] == fab.host_residue(1)
        if o["dscp"] == proto.DSCP_TRIMMED_LASTHOP:
            trimmed.add(psn)
            want = TRIMMED_LEN + srh_len + (4 if variant == 2 else 0)
            assert len(d.frame) == want and o["payload_length"] == want - 54
            # Decapsulated, the trimmed frame is the original's first bytes, unchanged.
            assert d.frame[:14] + d.frame[54 + srh_len:] == inner[:want - 40 - srh_len]
            reth = RETH.unpack(d.frame[want - 16:want])
            assert reth["va"] == 0x10000 + 4096 * psn
        else:
            assert o["dscp"] == proto.DSCP_DATA
            assert pk.decapsulate(d.frame) == inner
            pk.decode(d.frame, check_icrc=True)
    assert trimmed and len(trimmed) < 60 and sorted(order) == list(range(60))
    # A trimmed frame overtakes data frames sent before it that were still queued.
    assert any(order.index(k) < order.index(j) for k in trimmed for j in range(k)
               if j not in trimmed)


def test_a_slow_spine_link_trims_with_the_not_last_hop_codepoint():
    fab = Fabric(FabricConfig(hosts=2, spines=2))
    fab.schedule(Failure("gray", 0.0, plane=0, nodes=(("spine", 0), ("leaf", 1)), slow=4))
    for k in range(40):
        fab.send(0.0, 0, 0, srv6_frame(fab, 0, 1, k, 0, 4000)[0])
    got = fab.run_until(1e6)
    s = fab.stats.planes[0]
    assert s.trims > 0 and s.trims_lasthop == 0 and s.delivered == 40
    dscp = [outer(d.frame)["dscp"] for d in got]
    assert set(dscp) == {proto.DSCP_DATA, proto.DSCP_TRIMMED}
    for d in got:
        if outer(d.frame)["dscp"] == proto.DSCP_TRIMMED:
            assert len(d.frame) == TRIMMED_LEN
    # The spine queue filled to just above the trimming threshold and no further.
    peak = fab.stats.peak_queue_bytes[(0, ("spine", 0), ("leaf", 1))]
    assert 32 * 1024 < peak <= 32 * 1024 + 4138 + 40 * TRIMMED_LEN
    psns = [inner_bth(d.frame)["psn"] for d in got]
    first_trim = dscp.index(proto.DSCP_TRIMMED)
    next_data = dscp.index(proto.DSCP_DATA, first_trim)
    assert psns[first_trim] > psns[next_data]      # ahead of the data queued before it


def test_control_frames_overtake_queued_data():
    fab = Fabric(FabricConfig(hosts=3, trim_bytes=1 << 20, queue_bytes=1 << 20))
    fab.schedule(Failure("gray", 0.0, plane=0, nodes=(("leaf", 1), ("host", 1)), slow=4))
    for k in range(20):
        fab.send(0.0, 0, 0, srv6_frame(fab, 0, 1, k, 0, 4000)[0])
    sack = pk.encode(pk.encapsulate(
        pk.sack_packet(0x10, 123, 0b1011, src_ip=fab.host_addr(2), dst_ip=fab.host_addr(1),
                       dscp=proto.DSCP_CONTROL),
        outer_src=fab.host_addr(2), outer_dst=fab.usid_path(2, 1, 1)))
    marked = srv6_frame(fab, 2, 1, 99, 1, 100, dscp=proto.DSCP_CONTROL)[0]
    fab.send(2000.0, 2, 0, sack)
    fab.send(2000.0, 2, 0, marked)
    got = fab.run_until(1e6)
    kinds = [pk.decode(d.frame).opcode for d in got]
    at = kinds.index(Opcode.SACK)
    assert 0 < at < 10 and kinds[at + 1] == Opcode.WRITE_MIDDLE
    assert pk.decode(got[at + 1].frame).bth["psn"] == 99
    assert pk.decode(got[at].frame).seth["cack_psn"] == 123
    assert len(got) == 22 and fab.stats.planes[0].trims == 0


@pytest.mark.parametrize("ecn_bytes,first", [(16 * 1024, 35), (8 * 1024, 19)])
def test_ecn_marks_above_the_threshold_and_only_ect(ecn_bytes, first):
    fab = Fabric(FabricConfig(hosts=2, ecn_bytes=ecn_bytes, trim_bytes=1 << 20,
                              queue_bytes=1 << 20))
    fab.schedule(Failure("gray", 0.0, plane=0, nodes=(("leaf", 1), ("host", 1)), slow=2))
    ecns = [proto.ECN_ECT0, proto.ECN_NOT_ECT, proto.ECN_ECT1]
    for k in range(120):
        frame = srv6_frame(fab, 0, 1, k, 0, 1002 - SRV6_WRITE_OVERHEAD, ecn=ecns[k % 3])[0]
        assert len(frame) == 1002
        fab.send(0.0, 0, 0, frame)
    got = fab.run_until(1e6)
    marks = 0
    # Frame k meets ceil(k / 2) - 1 frames of 1002 bytes waiting at the slowed egress (one
    # fewer or more at even k, where its arrival and a departure fall on the same time).
    for d in got:
        k = inner_bth(d.frame)["psn"]
        o = outer(d.frame)
        if ecns[k % 3] == proto.ECN_NOT_ECT:
            assert o["ecn"] == proto.ECN_NOT_ECT
            continue
        if k < first - 1:
            assert o["ecn"] == ecns[k % 3], k
        elif k >= first:
            assert o["ecn"] == proto.ECN_CE, k
        marks += o["ecn"] == proto.ECN_CE
        assert pk.decode(pk.decapsulate(d.frame)).ip["ecn"] == ecns[k % 3]   # inner kept
    assert marks == fab.stats.planes[0].ecn_marks > 0


@pytest.mark.parametrize("what", ["trim", "ecn"])
def test_thresholds_mean_more_than(what):
    # Frames of n bytes arrive every n * 8 / 100 ns at an egress slowed to 4 times that:
    # frame k finds k - k // 4 - 1 frames waiting (k = 5: exactly 3 n bytes; k = 6: 4 n).
    n = 1002                               # a length the RoCE pad rule allows
    kw = {"trim_bytes": 3 * n} if what == "trim" else {"ecn_bytes": 3 * n,
                                                         "trim_bytes": 1 << 20}
    fab = Fabric(FabricConfig(hosts=2, queue_bytes=1 << 20, **kw))
    fab.schedule(Failure("gray", 0.0, plane=0, nodes=(("leaf", 1), ("host", 1)), slow=4))
    for k in range(12):
        frame = srv6_frame(fab, 0, 1, k, 0, n - SRV6_WRITE_OVERHEAD)[0]
        assert len(frame) == n
        fab.send(0.0, 0, 0, frame)
    got = fab.run_until(1e6)
    hit = sorted(inner_bth(d.frame)["psn"] for d in got
                 if (len(d.frame) < n if what == "trim"
                     else outer(d.frame)["ecn"] == proto.ECN_CE))
    if what == "trim":
        assert hit[0] == 6 and fab.stats.planes[0].trims == len(hit)
    else:
        assert hit == list(range(6, 12))


def test_full_queues_drop():
    fab = Fabric(FabricConfig(hosts=3, queue_bytes=8192, trim_bytes=8192))
    fab.schedule(Failure("gray", 0.0, plane=0, nodes=(("leaf", 1), ("host", 1)), slow=4))
    for k in range(50):
        fab.send(0.0, 0, 0, srv6_frame(fab, 0, 1, k, 0, 1002 - SRV6_WRITE_OVERHEAD)[0])
    sack = pk.encode(pk.encapsulate(pk.sack_packet(0x10, 1, dscp=proto.DSCP_CONTROL),
                                    outer_src=fab.host_addr(2),
                                    outer_dst=fab.usid_path(2, 1, 0)))
    for k in range(200):
        fab.send(0.0, 2, 0, sack)
    got = fab.run_until(1e6)
    s = fab.stats.planes[0]
    assert s.drops["queue_full"] > 0 and s.trims == 0 and set(s.drops) == {"queue_full"}
    conserved(fab)
    peak = fab.stats.peak_queue_bytes[(0, ("leaf", 1), ("host", 1))]
    assert 8192 - 1000 < peak <= 2 * 8192
    assert len(got) == s.delivered


def test_loss_rate():
    n = 20_000
    fab = Fabric(FabricConfig(planes=2, hosts=2, loss=0.01, seed=seeded().getrandbits(32)))
    frames = [srv6_frame(fab, 0, 1, k, k % 4, 64)[0] for k in range(8)]
    for k in range(n):
        fab.send(0.0, 0, k % 2, frames[k % 8])
    got = fab.run_until(1e9)
    lost = fab.stats.drops("loss")
    sigma = math.sqrt(n * 0.01 * 0.99)
    print(f"lost {lost} of {n} (expected {n * 0.01:.0f} +- {sigma:.1f})")
    assert abs(lost - n * 0.01) < 5 * sigma
    assert len(got) + lost == n and fab.stats.drops() == lost
    assert all(fab.stats.planes[p].drops["loss"] > 0 for p in (0, 1))


# --- failures ------------------------------------------------------------------------------

FAILURES = {
    "link": (dict(kind="link", nodes=(("leaf", 0), ("spine", 1))), {1}, "failed"),
    "host-link": (dict(kind="link", nodes=(("host", 0), ("leaf", 0))), {0, 1, 2, 3}, "failed"),
    "switch": (dict(kind="switch", nodes=("spine", 1)), {1}, "failed"),
    "leaf": (dict(kind="switch", nodes=(("leaf", 1),)), {0, 1, 2, 3}, "failed"),
    "plane": (dict(kind="plane"), {0, 1, 2, 3}, "failed"),
    "gray": (dict(kind="gray", nodes=(("spine", 1), ("leaf", 1)), drop=1.0), {1}, "gray"),
}


@pytest.mark.parametrize("name", FAILURES)
def test_failures_drop_from_start_to_recovery_on_their_plane(name):
    spec, spines, cause = FAILURES[name]
    at, until = 10_000.0, 25_000.0
    fab = Fabric(FabricConfig(planes=2, hosts=2, spines=4))
    fab.schedule(Failure(at_ns=at, until_ns=until, plane=0, **spec))
    frames = [srv6_frame(fab, 0, 1, s, s, 500)[0] for s in range(4)]
    times = {}
    for k in range(200):
        t = 200.0 * k
        for plane in (0, 1):
            fab.send(t, 0, plane, frames[k % 4])
        times[k] = t
    got = fab.run_until(1e6)
    # Plane 1 never notices; plane 0 loses exactly the affected paths in the window.
    assert fab.stats.planes[1].delivered == 200 and not fab.stats.planes[1].drops
    s0 = fab.stats.planes[0]
    assert set(s0.drops) == {cause} and s0.delivered + s0.drops[cause] == 200
    seen = {}
    for d in got:
        if d.plane == 0:
            seen.setdefault(inner_bth(d.frame)["psn"], []).append(d.t_ns)
    latency = 4 * (len(frames[0]) * 8 / 100 + 500)
    for k, t in times.items():
        affected = k % 4 in spines
        fate = [x for x in seen.get(k % 4, []) if abs(x - t - latency) < 1.0]
        if not affected or t + latency < at - 1 or t >= until:
            assert fate, (k, t)
        elif at + 1 <= t <= until - latency:
            assert not fate, (k, t)


def test_failure_kills_frames_in_flight_and_queued():
    fab = Fabric(FabricConfig(hosts=2, link_delay_ns=5000))
    frame = srv6_frame(fab, 0, 1, 0, 0, 1250 - SRV6_WRITE_OVERHEAD)[0]
    fab.send(0.0, 0, 0, frame)
    # The frame is on the wire from leaf 0 to spine 0 from 5100 to 10200 ns.
    fab.schedule(Failure("link", 6000.0, 6500.0, plane=0, nodes=(("leaf", 0), ("spine", 0))))
    for k in range(3):
        fab.send(20_000.0, 0, 0, frame)    # queued at the host port when it fails
    fab.schedule(Failure("link", 20_050.0, 20_060.0, plane=0,
                         nodes=(("host", 0), ("leaf", 0))))
    fab.send(30_000.0, 0, 0, frame)        # after recovery: delivered
    # A link that fails while sending is free as soon as it recovers.
    fab.send(50_000.0, 0, 0, frame)
    fab.schedule(Failure("link", 50_010.0, 50_020.0, plane=0,
                         nodes=(("host", 0), ("leaf", 0))))
    fab.send(50_030.0, 0, 0, frame)
    got = fab.run_until(1e6)
    assert [d.t_ns for d in got] == [30_000.0 + 4 * 5100, 50_030.0 + 4 * 5100]
    assert fab.stats.drops("failed") == 5


def test_gray_link_drop_fraction_slowdown_and_extra_delay():
    rng = seeded()
    fab = Fabric(FabricConfig(hosts=2, spines=2, seed=rng.getrandbits(32)))
    fab.schedule(Failure("gray", 0.0, plane=0, nodes=(("leaf", 0), ("spine", 0)), drop=0.25))
    frame = srv6_frame(fab, 0, 1, 0, 0, 64)[0]
    n = 4000
    for k in range(n):
        fab.send(0.0, 0, 0, frame)
    got = fab.run_until(1e9)
    frac = fab.stats.drops("gray") / n
    sigma = math.sqrt(0.25 * 0.75 / n)
    print(f"gray drop fraction {frac:.4f} (0.25 +- {sigma:.4f})")
    assert abs(frac - 0.25) < 5 * sigma and len(got) + fab.stats.drops("gray") == n

    fab = Fabric(FabricConfig(hosts=2, spines=2))
    fab.schedule(Failure("gray", 0.0, 1e5, plane=0, nodes=(("spine", 0), ("leaf", 0)),
                         slow=4, extra_delay_ns=1000))
    frame = srv6_frame(fab, 0, 1, 0, 0, 1250 - SRV6_WRITE_OVERHEAD)[0]
    for k in range(4):
        fab.send(0.0, 0, 0, frame)
    fab.send(2e5, 0, 0, frame)
    got = fab.run_until(1e6)
    # Both directions of leaf 0 - spine 0 are gray: 4 x 100 ns to send, 1000 ns more.
    first = 3 * 600 + 400 + 500 + 1000
    assert [d.t_ns for d in got] == [first + 400 * k for k in range(4)] + [2e5 + 2400]


# --- determinism, bad input ----------------------------------------------------------------

def test_same_seed_same_deliveries():
    rng = seeded()
    seed = rng.getrandbits(32)
    plan = [(rng.uniform(0, 50_000), rng.randrange(4), rng.randrange(2), rng.randrange(4),
             rng.randrange(64, 3000)) for _ in range(400)]
    plan.sort()

    def run(seed):
        fab = Fabric(FabricConfig(planes=2, hosts=4, jitter_ns=300, loss=0.05,
                                  spine_skew_ns=20, seed=seed))
        fab.cross_traffic(2, 1, 0, 60.0, 0, 40_000, 2048)
        for t, src, plane, spine, size in plan:
            dst = 1 if src != 1 else 0
            fab.send(t, src, plane, srv6_frame(fab, src, dst, size, spine, size)[0])
        out = []
        for stop in range(0, 200_000, 3000):      # as a harness would: in slices
            out += fab.run_until(float(stop))
        return out, [vars(p) for p in fab.stats.planes]

    a, b = run(seed), run(seed)
    assert a == b and len(a[0]) > 300
    assert run(seed + 1)[0] != a[0]
    t = [d.t_ns for d in a[0]]              # deliveries come in time order
    assert t == sorted(t)


def test_jitter_can_reorder_one_link():
    fab = Fabric(FabricConfig(hosts=2, jitter_ns=2000, seed=1))
    for k in range(50):
        fab.send(0.0, 0, 0, srv6_frame(fab, 0, 1, k, 0, 64)[0])
    psns = [inner_bth(d.frame)["psn"] for d in fab.run_until(1e6)]
    assert sorted(psns) == list(range(50)) and psns != list(range(50))


def test_bad_frames_are_counted_not_fatal():
    fab = Fabric(FabricConfig(hosts=3, spines=2))
    loc = fab.cfg.locator
    good, inner = srv6_frame(fab, 0, 1, 1)

    def with_dst(frame, dst, hop=None):
        b = bytearray(frame)
        b[38:54] = dst.to_bytes(16, "big")
        if hop is not None:
            b[21] = hop
        return bytes(b)

    ipv4 = bytearray(inner)
    ipv4[12:14] = b"\x08\x00"
    v4hdr = bytearray(inner)
    v4hdr[14] = 0x45
    srh_frame, _ = srv6_frame(fab, 0, 1, 2, srh=True)
    cut_srh = bytearray(srh_frame[:70])
    cut_srh[55] = 8                        # claims four segments it does not have
    cases = {
        "malformed": [b"", b"\x00" * 10, good[:53], bytes(ipv4), bytes(v4hdr), bytes(cut_srh)],
        "no_route": [
            with_dst(good, pk.make_usid_address(loc, [0x0333, 0x1001])),     # unknown uSID
            with_dst(good, pk.make_usid_address(loc, [leaf_usid(1), 0x0200])),  # not mine
            with_dst(good, pk.make_usid_address(loc, [leaf_usid(0)])),       # ends at a leaf
            with_dst(good, pk.make_usid_address(loc, [leaf_usid(0), 0x0207])),  # no spine 7
            with_dst(inner, int(ipaddress.IPv6Address("fd00::99"))),                        # unknown host
            with_dst(inner, int(ipaddress.IPv6Address("2001:db8::1"))),
        ],
        "hop_limit": [with_dst(good, fab.usid_path(0, 1, 0), hop=1),
                      with_dst(good, fab.usid_path(0, 1, 0), hop=0),
                      with_dst(good, fab.usid_path(0, 1, 0), hop=2)],  # dies at the spine
    }
    for frames in cases.values():
        for f in frames:
            fab.send(0.0, 0, 0, f)
    fab.send(0.0, 0, 0, good)
    got = fab.run_until(1e6)
    assert len(got) == 1 and pk.decapsulate(got[0].frame) == inner
    for cause, frames in cases.items():
        assert fab.stats.drops(cause) == len(frames), cause
    conserved(fab)

    # Random bytes and random corruptions of valid frames: counted somewhere, never fatal.
    rng = seeded()
    fab = Fabric(FabricConfig(hosts=3, spines=2, planes=2))
    srh_good = srv6_frame(fab, 0, 1, 3, 1, srh=True)[0]
    for k in range(1500):
        choice = rng.randrange(3)
        if choice == 0:
            f = rng.randbytes(rng.randrange(200))
        else:
            f = bytearray(rng.choice((good, srh_good, inner)))
            for _ in range(rng.randrange(1, 4)):
                f[rng.randrange(14, 120)] = rng.getrandbits(8)
            f = bytes(f[:rng.randrange(len(f) + 1)]) if rng.random() < 0.3 else bytes(f)
        fab.send(rng.uniform(0, 1e5), rng.randrange(3), rng.randrange(2), f)
    fab.run_until(1e7)
    assert fab.next_event_ns() is None
    conserved(fab)


def test_bad_arguments_raise_clear_errors():
    bad_cfgs = [
        (dict(planes=0), r"planes = 0 is outside 1\.\.8"),
        (dict(planes=9), r"planes = 9 is outside 1\.\.8"),
        (dict(planes=True), "planes must be an int"),
        (dict(hosts=1), r"hosts = 1 is outside 2\.\."),
        (dict(hosts=300), "needs leaves set explicitly"),
        (dict(leaves=0), r"leaves = 0 is outside 1\.\.256"),
        (dict(spines=0), r"spines = 0 is outside 1\.\.256"),
        (dict(link_gbps=0), "link_gbps = 0 must be finite, > 0"),
        (dict(link_gbps=float("nan")), "link_gbps must be a number"),
        (dict(link_delay_ns=-1), "link_delay_ns = -1 must be finite, >= 0"),
        (dict(jitter_ns=float("inf")), "jitter_ns = inf must be finite"),
        (dict(queue_bytes=0), r"queue_bytes = 0 is outside >= 1"),
        (dict(trim_bytes=-1), "trim_bytes = -1"),
        (dict(loss=1.0), r"loss = 1\.0 must be finite, >= 0 and < 1"),
        (dict(locator=1 << 32), "locator"),
        (dict(locator=0xFD000000), "the block host addresses use"),
        (dict(udp_dport=70000), "udp_dport"),
    ]
    for kw, msg in bad_cfgs:
        with pytest.raises(ValueError, match=msg):
            FabricConfig(**kw)
    with pytest.raises(TypeError, match="FabricConfig"):
        Fabric({"planes": 2})

    fab = Fabric(FabricConfig(planes=2, hosts=3))
    frame = srv6_frame(fab, 0, 1, 0)[0]
    with pytest.raises(ValueError, match=r"host = 3 is outside 0\.\.2"):
        fab.send(0, 3, 0, frame)
    with pytest.raises(ValueError, match=r"plane = 2 is outside 0\.\.1"):
        fab.send(0, 0, 2, frame)
    with pytest.raises(TypeError, match="bytes-like"):
        fab.send(0, 0, 0, "frame")
    with pytest.raises(ValueError, match="t_ns = -1 must be finite"):
        fab.send(-1, 0, 0, frame)
    fab.run_until(100.0)
    with pytest.raises(ValueError, match="in the past"):
        fab.send(50.0, 0, 0, frame)
    with pytest.raises(ValueError, match="in the past"):
        fab.run_until(99.0)
    with pytest.raises(ValueError, match="spine = 4"):
        fab.usid_path(0, 1, 4)

    with pytest.raises(ValueError, match="failure kind 'cable'"):
        Failure("cable", 0.0)
    with pytest.raises(ValueError, match="a link failure names 2 node"):
        Failure("link", 0.0, nodes=(("leaf", 0),))
    with pytest.raises(ValueError, match="before at_ns"):
        Failure("plane", 10.0, 5.0)
    with pytest.raises(ValueError, match="gray failures only"):
        Failure("link", 0.0, nodes=(("leaf", 0), ("spine", 0)), drop=0.5)
    with pytest.raises(ValueError, match=r"slow = 0\.5"):
        Failure("gray", 0.0, nodes=(("leaf", 0), ("spine", 0)), slow=0.5)
    with pytest.raises(ValueError, match="no node \\('spine', 9\\)"):
        fab.schedule(Failure("switch", 200.0, nodes=("spine", 9)))
    with pytest.raises(ValueError, match="no link between"):
        fab.schedule(Failure("link", 200.0, nodes=(("leaf", 0), ("leaf", 1))))
    with pytest.raises(ValueError, match="not \\('host', 0\\)"):
        fab.schedule(Failure("switch", 200.0, nodes=("host", 0)))
    with pytest.raises(ValueError, match="plane = 5"):
        fab.schedule(Failure("plane", 200.0, plane=5))
    with pytest.raises(ValueError, match="in the past"):
        fab.schedule(Failure("plane", 50.0))
    with pytest.raises(ValueError, match="below the 138 bytes"):
        fab.cross_traffic(2, 1, 0, 10.0, 100.0, 200.0, 100)
    with pytest.raises(ValueError, match="to itself"):
        fab.cross_traffic(1, 1, 0, 10.0, 100.0, 200.0)
    with pytest.raises(ValueError, match="rate_gbps = 0"):
        fab.cross_traffic(2, 1, 0, 0, 100.0, 200.0)
    with pytest.raises(ValueError, match="drop cause 'lost'"):
        fab.stats.drops("lost")
    assert fab.next_event_ns() is None and fab.stats.drops() == 0


# --- cross traffic, captures, API ----------------------------------------------------------

def test_cross_traffic_rate_sink_and_delivery():
    fab = Fabric(FabricConfig(hosts=4, spines=4))
    src = fab.cross_traffic(2, 1, 0, 50.0, 1000.0, 11_000.0, 4096)
    assert (src.frame_len - SRV6_WRITE_OVERHEAD) % 4 == 0 and src.frame_len > 4092
    kept = fab.cross_traffic(3, 1, 0, 10.0, 1000.0, 11_000.0, 1000, sink=False, srv6=False)
    got = fab.run_until(1e6)
    interval = src.frame_len * 8 / 50.0
    assert src.frames == math.ceil(10_000.0 / interval)
    s = fab.stats.planes[0]
    assert s.sunk == src.frames and s.delivered == kept.frames == len(got) > 0
    for d in got:
        pkt = pk.decode(d.frame, check_icrc=True)
        assert pkt.outer is None and pkt.bth["dest_qp"] == CROSS_TRAFFIC_QP
        assert len(d.frame) == kept.frame_len
    # SRv6 cross traffic is sprayed over every spine in turn.
    assert all(fab.stats.port_frames[(0, ("leaf", 2), ("spine", s))] > 0 for s in range(4))


def test_captures_and_pcap(tmp_path):
    fab = Fabric(FabricConfig(hosts=2), capture=True)
    frame = srv6_frame(fab, 0, 1, 7)[0]
    fab.send(1_000_000_123.0, 0, 0, frame)
    got = fab.run_until(2e9)
    assert [(c[1], c[2], c[3]) for c in fab.captures] == [(0, 0, "tx"), (1, 0, "rx")]
    assert fab.captures[0][0] == 1_000_000_123.0 and fab.captures[1][0] == got[0].t_ns
    assert fab.captures[0][4] == frame and fab.captures[1][4] == got[0].frame
    path = tmp_path / "fabric.pcap"
    assert write_pcap(path, fab.captures) == 2
    raw = path.read_bytes()
    assert int.from_bytes(raw[:4], "little") == PCAP_MAGIC_NS == 0xA1B23C4D
    assert int.from_bytes(raw[20:24], "little") == 1
    assert read_pcap(path) == [(round(c[0]), c[4]) for c in fab.captures]
    assert read_pcap(path)[0][0] == 1_000_000_123
    with pytest.raises(ValueError, match="negative time"):
        write_pcap(tmp_path / "bad.pcap", [(-5, frame)])
    if shutil.which("tshark"):
        out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-e", "frame.len",
                              "-e", "frame.time_epoch"], capture_output=True, text=True,
                             check=True).stdout.split()
        assert out[0] == str(len(frame)) and out[1].startswith("1.000000123")


def test_next_event_and_idle_time():
    fab = Fabric(FabricConfig(hosts=2))
    assert fab.next_event_ns() is None and fab.run_until(1e6) == []
    frame = srv6_frame(fab, 0, 1, 0)[0]
    fab.send(2e6, 0, 0, frame)
    assert fab.next_event_ns() == 2e6
    assert fab.run_until(2e6 - 1) == []
    got = []
    while fab.next_event_ns() is not None:     # a harness skipping idle time
        got += fab.run_until(fab.next_event_ns())
    assert len(got) == 1 and fab.now == got[0].t_ns
    fab.send(fab.now, 0, 0, frame)
    assert len(fab.run()) == 1


def test_model_speed():
    """Benchmark: frames per second through the model (reported, not asserted)."""
    fab = Fabric(FabricConfig(planes=4, hosts=8, spines=4))
    frames = [srv6_frame(fab, 0, 1, k, k % 4, 4000)[0] for k in range(16)]
    n = 40_000
    for k in range(n):
        fab.send(k * 90.0, 0, k % 4, frames[k % 16])
    for src in range(2, 8):
        fab.cross_traffic(src, 1, src % 4, 40.0, 0.0, n * 90.0, 4096)
    start = time.perf_counter()
    got = []
    while fab.next_event_ns() is not None:
        got += fab.run_until(fab.next_event_ns() + 1000.0)
    wall = time.perf_counter() - start
    frames_total = fab.stats.total("sent")
    hops = sum(fab.stats.port_frames.values())
    print(f"model speed: {frames_total} frames ({hops} link transmissions) in {wall:.2f} s: "
          f"{frames_total / wall:,.0f} frames/s, {hops / wall:,.0f} link hops/s")
    assert len(got) == fab.stats.total("delivered") and fab.stats.total("delivered") >= n - \
        fab.stats.drops()
    conserved(fab)
    assert set(DROP_CAUSES) >= set().union(*(p.drops for p in fab.stats.planes))
