"""The two-NIC simulation of ``mrcnic demo``: a short transfer on Icarus with a frame lost and
resent (``make test``), and on Verilator (in ``make soak`` and ``make demo``: building two
NICs takes minutes) 4 planes, a plane failing mid-transfer, 1% loss, a gray link, incast
with trimming, heavy reordering; every byte placed once, intact, every work request
completed; and bad frames of every kind dropped and counted."""

import shutil
import subprocess

import pytest

from mrcnic.netsim import demo
from mrcnic.netsim.demo_bench import INJECT_KINDS
from mrcnic.base.records import TICK_NS
from testkit import ROOT

SMALL = {"planes": 4, "size": 256 << 10, "msg_bytes": 32 << 10, "pmtu_log2": 12,
         "qps": 2, "ev_count": 16, "max_cycles": 600_000}


CASES = {
    "plane_failure": {"failures": [demo.parse_failure("1@60")]},
    "loss": {"loss": 0.01},
    # plane 2's link from a's leaf to spine 1 drops 30% of its frames from 40 us on
    "gray_link": {"failures": [demo.parse_gray("2:1@40:0.3")]},
    # two more hosts send to b on every plane at a link's full rate from 20 us: b's leaf
    # egress queues fill and trim
    "incast": {"incast": 2},
    # up to 2 us of random delay per frame: frames of one plane overtake each other
    "reordering": {"jitter_ns": 2000.0},
}


# The short Icarus run's loss: seed 95 draws a loss for the first frame the fabric carries
# (QP 0's first data frame) and none for the 29 after it, at 2%.
SHORT_LOSS = {"loss": 0.02, "seed": 95}


def test_a_short_transfer_on_icarus_with_a_frame_lost(tmp_path):
    """The same bench and Verilog on Icarus, at 2 planes: 16 KiB in 2 writes over a fabric
    that loses the first data frame (2% random loss, seed 95). The frame is resent on the
    SACK hole (a reorder guard of 1 PSN and no time guard: each QP sends 2 frames, so the
    hole has one PSN past it, sent less than the time guard's three frame times after it;
    at the guard of 2 planes, 3, or with the time guard, the timeout would resend it, 65 us
    later); every byte placed once, intact, both WRITEs completed (about 30 s of Icarus).
    TSETH is on: every SACK gives an RTT sample, and so does the probe's answer."""
    cfg = dict(SMALL, planes=2, size=16 << 10, msg_bytes=8 << 10, ev_count=8,
               max_cycles=40_000, reorder_guard=1, reorder_time=0, tseth=True, pcap=True,
               **SHORT_LOSS)
    m = demo.run_demo(cfg, out_dir=str(tmp_path), simulator="icarus")
    print(demo.summary(m))
    # With TSETH on, RTT samples at a: a probe's answer among them; none shorter than the
    # fabric's propagation alone (4 links each way).
    rtts = demo.rtt_report(m)
    print("RTT samples (ns):", sorted(rtts["all"]), "probe answers:", rtts["probe"])
    assert rtts["probe"] and len(rtts["all"]) > len(rtts["probe"])
    assert min(rtts["all"]) >= 8 * m["config"]["link_delay_ns"]
    # The probe's sample against its round on the wire, from a's port to a's port: longer
    # by a's own transmit and receive pipelines only, well within one 1.024 us tick.
    assert rtts["wire"]
    for wire_ns, ns in rtts["wire"]:
        assert 0 <= ns - wire_ns <= TICK_NS, (wire_ns, ns)
    # The run's wire.pcap through tshark and the MRC dissector: every SACK with its M, CACK
    # and bitmap, and the probe with its PETH timestamp, as the bench saw them.
    if shutil.which("tshark"):
        out = subprocess.run(
            ["tshark", "-X", f"lua_script:{ROOT / 'tools' / 'wireshark' / 'mrc.lua'}", "-r",
             str(tmp_path / "wire.pcap"), "-Y", "mrc.seth or mrc.peth", "-T", "fields",
             "-E", "separator=,", "-e", "mrc.bth.opcode", "-e", "mrc.seth.m", "-e",
             "mrc.seth.cack_psn", "-e", "mrc.seth.bitmap", "-e", "mrc.peth.timestamp"],
            capture_output=True, text=True, check=True).stdout.splitlines()
        sacks = [r.split(",") for r in out if r.startswith("0xdc")]
        probes = [r.split(",") for r in out if r.startswith("0xde")]
        assert len(sacks) >= len(rtts["all"]) - len(rtts["probe"]) and probes
        assert all(r[1] != "" and r[2] != "" and r[3].startswith("0x") for r in sacks)
        assert all(r[4] != "" for r in probes)
    assert demo.fabric_drops(m) == {"loss": 1}
    rtx = demo.retransmissions(m)
    assert rtx["frames"] >= 1 and rtx["hole"] >= 1 and rtx["timeout"] == 0, rtx
    assert m["complete"] and m["completions"] == m["work_requests"] == 2
    assert m["missing"] == 0 and m["duplicates"] == 0
    assert m["delivered_bytes"] == 16 << 10


@pytest.mark.soak
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_nics_over_the_fabric(case, tmp_path):
    cfg = dict(SMALL, **CASES[case])
    m = demo.run_demo(cfg, out_dir=str(tmp_path))
    print(demo.summary(m))
    assert m["complete"] and m["completions"] == m["work_requests"]
    assert m["missing"] == 0 and m["duplicates"] == 0
    if case == "incast":            # the case is what it says: trims, NACKed as trimmed
        assert m["fabric"]["trims"] > 0
        assert m["counters"]["b.psn-tracker"]["trimmed"] > 0


@pytest.mark.soak
def test_bad_frames_are_dropped_and_counted(tmp_path):
    """One bad frame of each kind on b's wire (5 us apart from 20 us), the transfer on QP 0
    undisturbed; each frame counted once where it must be dropped."""
    cfg = dict(SMALL, size=64 << 10, inject=list(INJECT_KINDS))
    m = demo.run_demo(cfg, out_dir=str(tmp_path))
    print(demo.summary(m))
    assert m["injected"] == list(INJECT_KINDS)             # all six reached the wire
    c = m["counters"]
    rx, prot, trk = c["b.roce-rx"], c["b.memory-protect"], c["b.psn-tracker"]
    assert rx["icrc"] == 1                                 # wrong ICRC
    assert rx["in_bad"] == 1                               # truncated (the decapsulator)
    # The spare QP: an unknown R_Key (NAK, QP in error), then an address outside the region
    # on the QP now in error (no second NAK); both never placed.
    assert (prot["unknown_rkey"], prot["qp_in_error"], prot["denied"], prot["naks"]) == \
        (1, 1, 2, 1)
    assert trk["no_qp"] == 3                               # unknown QP and the two denied
    assert trk["out_of_window"] == 1 and trk["nacks"] >= 1  # PSN far: NACK 0x0B
    assert trk["place"] == rx["placed"] == (64 << 10) >> 12  # only the real packets
    assert m["complete"] and m["completions"] == m["work_requests"]
    assert m["missing"] == 0 and m["duplicates"] == 0


# The must-show runs exactly as ``mrcnic demo`` makes them, at its defaults (8 planes of
# 2 Gb/s, PMTU 8192, 4 QPs, 32 EVs; the retransmit tracker's registers set for this fabric
# by demo.tracker_registers: time guard 99 ticks = 101 us, three frame times of a plane
# link; reorder guard 3; timeout 2^9 ticks = 524 us).
MUST_SHOW = {
    # every link of plane 3 fails at 100 us: the limit after recovery is 7/8 = 87.5%
    "plane_failure": ({"failures": [demo.parse_failure("3@100")]}, 0.85),
    # 1% of the frames lost: 4 MiB, so that a few dozen frames are
    "loss": ({"loss": 0.01, "size": 4 << 20}, 0.90),
}


@pytest.mark.soak
@pytest.mark.parametrize("case", sorted(MUST_SHOW))
def test_the_must_show_runs_at_8_planes(case, tmp_path):
    """``mrcnic demo --fail 3@100`` and ``mrcnic demo --loss 0.01 --size 4194304``: intact, each byte once; after a plane
    failure goodput at least 85% of line rate, and at most the one frame already under way
    started on the failed plane, within 64 cycles; under 1% loss, frames lost and resent,
    and goodput while data flows at least 90%."""
    extra, floor = MUST_SHOW[case]
    assert demo.tracker_registers(demo.DEFAULTS) == \
        {"reorder_guard": 3, "timeout_exp": 9, "reorder_time": 99}
    m = demo.run_demo(extra, out_dir=str(tmp_path))
    print(demo.summary(m))
    assert m["complete"] and m["completions"] == m["work_requests"]
    assert m["missing"] == 0 and m["duplicates"] == 0
    if case == "plane_failure":
        (f,) = demo.failure_report(m)
        assert f["frames_after"] <= 1 and (f["last_after_cycles"] or 0) <= 64, f
        assert f["goodput_after"] >= floor, f
    else:
        assert m["counters"]["mrc-tx"]["retransmissions"] > 0
        assert demo.goodput_flowing(m) >= floor
