"""The transmit and receive blocks one after the other, through the fabric model: work
requests are cut by TxSegmenter, built by RoceTx, SRv6-encapsulated by Srv6Encap on uSID
paths of mrcnic.netsim.fabric, carried over its planes (with reordering), decapsulated by
Srv6Decap and parsed by RoceRx, which places every payload. Each block runs on Amaranth's
simulator in turn, with the records and frames of the one before: the check is that the
blocks agree on every record and frame between them, and that every byte of every work
request lands once, at its address, intact."""

import pytest

from mrcnic.base import proto
from mrcnic.netsim.fabric import Fabric, FabricConfig
from mrcnic.base.proto import EvMode
from mrcnic.base.records import DECAP_META
from mrcnic.tx.segmenter import TxSegmenter
from testkit.simtools import run, seeded, sibling

_rx, _tx = sibling("rx/test_roce_rx"), sibling("tx/test_roce_tx")
_seg = sibling("tx/test_segmenter")
RxRun, unpack, run_tx = _rx.Run, _rx.unpack, _tx.run_tx
run_encap = sibling("tx/test_srv6_encap").run_encap
run_decap = sibling("rx/test_srv6_decap").run_decap
Bench, random_wr, ready_regs = _seg.Bench, _seg.random_wr, _seg.ready_regs

WIDTH = 64
PMTU_LOG2 = 8                 # the segmenter's PMTU in these tests (ready_regs sets it)


def segment(rng, wrs):
    dut = TxSegmenter(2, 8)
    bench = Bench(dut, rng, backpressure=0.2)

    async def control(ctx):
        await ready_regs(ctx, dut)
        for w in wrs:
            await bench.send(ctx, dut.wr, w)
        await bench.idle(ctx, 60)
        bench.stop = True

    run(dut, control, bench.sinks)
    return bench.pkts


@pytest.mark.parametrize("spine_skew_ns", [0, 700])
def test_work_requests_land_intact_through_the_blocks_and_the_fabric(spine_skew_ns):
    rng = seeded()
    fab = Fabric(FabricConfig(planes=4, hosts=2, spines=4, spine_skew_ns=spine_skew_ns,
                              jitter_ns=300, seed=rng.getrandbits(32)))
    # Work requests of both kinds, lengths 0 .. 3 PMTUs + a few bytes, on two QPs.
    wrs, data = [], {}
    va = 0x1000
    for i in range(8):
        w = random_wr(rng, i % 2, 3 * (1 << PMTU_LOG2) + 5)
        w["va"] = va
        va += w["length"] + 64
        data[w["wr_id"], w["qp"]] = bytes(rng.getrandbits(8) for _ in range(w["length"]))
        wrs.append(w)
    by_id = {(w["wr_id"], w["qp"]): w for w in wrs}

    pkts = segment(rng, wrs)
    assert len(pkts) == sum(max(1, -(-w["length"] >> PMTU_LOG2)) for w in wrs)

    # RoceTx: each packet with its payload, the EV index as the entropy.
    descs, payloads, evs = [], [], []
    for p in pkts:
        ev = rng.randrange(16)
        d = {k: p[k] for k in ("qp", "psn", "opcode", "ack_req", "rtx", "va", "rkey",
                               "dma_length", "length", "imm", "rqmsn", "msn")}
        d["entropy"] = ev
        descs.append(d)
        src = data[p["wr_id"], p["qp"]]
        payloads.append(src[p["offset"]:p["offset"] + p["length"]] or None)
        evs.append(ev)
    _, sink, _, counters, _ = run_tx(WIDTH, descs, payloads, qps=2, rng=rng,
                                     configure_regs=False)
    assert counters["frames"] == len(pkts) and not any(sink.users)

    # Srv6Encap: SRv6 on the uSID path through spine (EV index mod spines).
    enc = [{"mode": int(EvMode.SRV6), "ev": fab.usid_path(0, 1, ev % 4) << 128,
            "entropy": ev, "outer_src": fab.host_addr(0), "dscp": proto.DSCP_DATA,
            "ecn": proto.ECN_ECT0, "hop_limit": 64} for ev in evs]
    esink = run_encap(WIDTH, sink.frames, enc, rng=rng)
    assert not any(esink.users)

    # The fabric: each frame on plane EV mod 4, at line rate.
    t = 0.0
    for i, (frame, ev) in enumerate(zip(esink.frames, evs)):
        fab.send(t, 0, ev % 4, frame)
        t += len(frame) * 8 / 100.0
    got = fab.run_until(1e9)
    assert len(got) == len(pkts), f"fabric delivered {len(got)} of {len(pkts)}"
    arrived = [d.frame for d in got]

    # Srv6Decap, then RoceRx placing every data packet.
    dsink, dmeta, _ = run_decap(WIDTH, arrived, rng=rng)
    metas = [unpack(DECAP_META, v) for v in dmeta.records]
    assert all(m["mode"] == int(EvMode.SRV6) and not m["bad"] and
               m["residue"] == fab.host_residue(1) for m in metas)
    rx = RxRun(WIDTH, [(f, m, 0) for f, m in zip(dsink.frames, metas)], rng=rng,
               place_prob=1.0, verdict_delay=(0, 2)).run()
    assert len(rx.pkts) == len(pkts), "RoceRx refused a frame the transmit blocks made"

    # Remote memory: every byte written once, where its work request said.
    memory = {}
    payloads_out = iter(rx.payloads)
    for place in rx.places:
        body = next(payloads_out) if place["length"] else b""
        assert len(body) == place["length"]
        for k, b in enumerate(body):
            assert place["va"] + k not in memory, "a byte written twice"
            memory[place["va"] + k] = b
    for key, w in by_id.items():
        span = range(w["va"], w["va"] + w["length"])
        assert all(a in memory for a in span), f"WR {key}: bytes missing"
        assert bytes(memory[a] for a in span) == data[key], f"WR {key}: bytes differ"
    assert len(memory) == sum(w["length"] for w in wrs)
    # After decapsulation each frame is the one RoceTx made (the switches touched only the
    # outer header); paths of different lengths reordered them.
    sent_order = {f: i for i, f in enumerate(sink.frames)}
    order = [sent_order[f] for f in dsink.frames]
    assert sorted(order) == list(range(len(pkts)))
    if spine_skew_ns:
        assert order != sorted(order), "no reordering to show"
