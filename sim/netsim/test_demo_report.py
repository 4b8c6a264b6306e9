"""The software half of ``mrcnic demo`` without a simulation: the bad frames the bench
injects, the failure report and goodput computed from metrics, the summary and the plot, the
closing table and picture of ``mrcnic demo-summary``, and the progress the bench reports to
the bar."""

import pytest

import json

from mrcnic.host import bringup
from mrcnic.netsim import demo, demo_summary
from mrcnic.netsim.demo_bench import INJECT_KINDS, PROGRESS_PREFIX, Progress, bad_frame
from mrcnic.netsim.demo_progress import ProgressFollower
from mrcnic.model import packet as pk
from mrcnic.base.proto import EvState, Opcode


def _frame(qp=0, psn=100, va=0x1_0000_0000):
    pkt = pk.write_packet(Opcode.WRITE_ONLY, qp, psn, va, 0x1234, 512, bytes(range(256)) * 2)
    return pk.encapsulate(pk.encode(pkt), outer_src=0xFC00 << 112,
                          outer_dst=0xFC01 << 112 | 0x1234)


def test_bad_frames():
    frame = _frame()
    with pytest.raises(pk.PacketError, match="ICRC"):
        pk.decode(bad_frame("icrc", frame, 3, 4), udp_dport=None)
    cut = bad_frame("truncated", frame, 3, 4)
    assert len(cut) == len(frame) // 2
    with pytest.raises(pk.PacketError):
        pk.decode(cut, udp_dport=None)
    want = {"unknown_qp": (9, 100, 0x1234, 0x1_0000_0000),
            "psn_far": (0, 100 + (1 << 23), 0x1234, 0x1_0000_0000),
            "bad_rkey": (3, 100, 0x1234 ^ 0x5A5A, 0x1_0000_0000),
            "outside": (3, 100, 0x1234, 1 << 60)}
    for kind, (qp, psn, rkey, va) in want.items():
        p = pk.decode(bad_frame(kind, frame, 3, 4), udp_dport=None)     # ICRC right
        assert (p.bth["dest_qp"], p.bth["psn"], p.reth["rkey"], p.reth["va"]) == \
            (qp, psn, rkey, va), kind
        assert p.outer is not None and p.payload == bytes(range(256)) * 2
    assert set(want) | {"icrc", "truncated"} == set(INJECT_KINDS)
    with pytest.raises(ValueError, match="one of"):
        bad_frame("nonsense", frame, 3, 4)


def _metrics():
    """Four planes at 16 Gb/s (4 ns cycles); plane 1 fails at 10 us. Frames:
    [first beat cycle, plane, EV, PSN, rtx, probe]."""
    cfg = {**demo.DEFAULTS, "planes": 4, "clock_ns": 4.0,
           "failures": [{"kind": "plane", "plane": 1, "at_ns": 10_000.0}]}
    frames = [[c, c // 100 % 4, c // 100 % 4 + 4 * (c // 1000 % 2), c // 100, 0, 0]
              for c in range(0, 2500, 100)]            # 25 frames, round the planes
    frames += [[2510, 1, 5, 7, 1, 0],                 # a retransmission after the failure
               [2600, 1, 9, 0, 0, 1],                 # a probe on plane 1
               [5000, 0, 4, 99, 1, 0]]                # the tail: a late retransmission
    return {"config": cfg, "frames": frames, "t_start_ns": 0.0, "t_end_ns": 20_000.0,
            "line_gbps": 16.0, "bytes": 30_000, "delivered_bytes": 30_000,
            "placements": [[t, t // 1000 % 4, 1000] for t in range(0, 20_000, 1000)],
            "events": [[12_000.0, 5, int(EvState.ASSUMED_BAD)],
                       [13_000.0, 6, int(EvState.ASSUMED_BAD)],   # another plane's EV
                       [14_000.0, 5, int(EvState.ASSUMED_BAD)]],  # the same EV again
            "cycles": 5000, "wall_s": 1.0, "work_requests": 2, "completions": 2,
            "complete": True, "missing": 0, "duplicates": 0, "injected": [],
            "counters": {"mrc-tx": {"retransmissions": 2},
                         "retransmit-tracker": {"rtx_hole": 2, "rtx_timeout": 0}}}


def test_failure_report():
    m = _metrics()
    (f,) = demo.failure_report(m)
    # plane 1 after 10 us = cycle 2500: the retransmission at 2510 (the probe apart)
    assert (f["frames_after"], f["last_after_cycles"], f["probes_after"]) == (1, 10, 1)
    # EV 5 once (plane 1), ASSUMED_BAD at 12 us = cycle 3000: nothing on it after
    assert f["evs"] == [{"ev": 5, "bad_ns": 12_000.0, "last_after_bad_cycles": None}]
    # the steady state ends with the last new data frame (cycle 2400 = 9.6 us): the
    # failure came after it, so the window is empty
    assert f["goodput_after"] == 0.0


def test_goodput_is_placed_bytes_over_time():
    m = _metrics()
    # 20 placements of 1000 bytes in 20 us at 16 Gb/s: 160000 bits / 320000
    assert demo.goodput(m) == pytest.approx(0.5)
    assert demo.goodput(m, 0.0, 2_000.0) == pytest.approx(2 * 8000 / 2000 / 16)
    # while data flows: placements at 0 .. 19 us; the 19 after the first in 19 us
    assert demo.goodput_flowing(m) == pytest.approx(19 * 8000 / 19_000 / 16)
    m["placements"] = m["placements"][:1]
    assert demo.goodput_flowing(m) == 0.0


def test_summary_and_plot(tmp_path):
    m = _metrics()
    text = demo.summary(m)
    assert "plane 1 failed at 10.0 us" in text and "1 probes sent on its EVs" in text
    assert "to ASSUMED_BAD: 3" in text and "all data arrived intact" in text
    assert "75.0% of line rate (16 Gb/s) over the whole run, 50.0% while data flows" in text
    m["complete"], m["missing"] = False, 7
    assert "FAILED: 7 bytes missing" in demo.summary(m)
    png = tmp_path / "goodput.png"
    demo.plot(m, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gray_link_report_counts_the_evs_through_its_spine():
    m = _metrics()
    gray = demo.parse_gray("1:1@10:0.5")
    assert gray == {"kind": "gray", "plane": 1, "spine": 1, "at_ns": 10_000.0,
                    "nodes": [["leaf", 0], ["spine", 1]], "drop": 0.5}
    m["config"]["failures"] = [gray]
    # 32 EVs over 4 planes and 4 spines: plane 1 through spine 1 is EVs 5 and 21
    assert demo.affected_evs(gray, m["config"]) == [5, 21]
    (f,) = demo.failure_report(m)
    # the retransmission on EV 5 counts, the probe on EV 9 (spine 2) does not
    assert (f["frames_after"], f["probes_after"], f["cut_evs"]) == (1, 0, [5, 21])
    assert [e["ev"] for e in f["evs"]] == [5]
    text = demo.summary(m)
    assert "gray link plane 1 spine 1 (50% lost) failed at 10.0 us" in text
    assert "EVs (5, 21)" in text
    with pytest.raises(ValueError, match="PLANE:SPINE@"):
        demo.parse_gray("1@10")


def test_bad_gray_or_incast_is_refused():
    with pytest.raises(ValueError, match="spines are 0..3"):
        demo.run_demo({"planes": 4, "failures": [demo.parse_gray("1:7@10")]})
    with pytest.raises(ValueError, match="0..64 sources"):
        demo.run_demo({"planes": 4, "incast": -1})


def test_parse_failure():
    assert demo.parse_failure("3@12.5") == {"kind": "plane", "plane": 3, "at_ns": 12_500.0}
    with pytest.raises(ValueError, match="PLANE@"):
        demo.parse_failure("3")


def test_tracker_registers_follow_the_fabric():
    """The timeout is the shortest 2^t ticks of at least 3 idle round trips; the time
    guard three PMTU frame times of a plane link in whole ticks, with a reorder guard of 3;
    with the time guard off (0), the reorder guard planes // 2 + 1, 3 at least; values
    given win."""
    def regs(**kw):
        return demo.tracker_registers({**demo.DEFAULTS, **kw})
    # 8 planes of 2 Gb/s, 139 us round trip; 3 x 8392 bytes at 2 Gb/s = 100.7 us = 98.3 ticks
    assert regs() == {"timeout_exp": 9, "reorder_guard": 3, "reorder_time": 99}
    assert regs(reorder_time=0) == {"timeout_exp": 9, "reorder_guard": 5, "reorder_time": 0}
    # 4 planes of 4 Gb/s, PMTU 4096: 3 x 4296 bytes = 25.8 us = 25.2 ticks
    assert regs(planes=4, pmtu_log2=12) == {"timeout_exp": 7, "reorder_guard": 3,
                                            "reorder_time": 26}
    assert regs(planes=4, pmtu_log2=12, reorder_time=0)["reorder_guard"] == 3
    assert regs(planes=1) == {"timeout_exp": 6, "reorder_guard": 3, "reorder_time": 13}
    assert regs(reorder_guard=8, timeout_exp=12, reorder_time=50) == \
        {"timeout_exp": 12, "reorder_guard": 8, "reorder_time": 50}
    assert regs(reorder_time=98)["reorder_guard"] == 3
    for kw in ({}, {"planes": 4, "pmtu_log2": 12}, {"planes": 2, "link_delay_ns": 5000.0}):
        cfg = {**demo.DEFAULTS, **kw}
        t, rtt = regs(**kw)["timeout_exp"], demo.base_rtt_ns(cfg)
        assert 1024 << (t - 1) < 3 * rtt <= 1024 << t, (kw, t, rtt)
    # The round trip's frame size bound holds for the largest data frame the NIC sends
    # (a WRITE with immediate, RETH and METH, encapsulated).
    pkt = pk.write_packet(Opcode.WRITE_ONLY_IMM, 0, 0, 0, 0x1234, 4096, bytes(4096), imm=7)
    frame = pk.encapsulate(pk.encode(pkt), outer_src=0xFC00 << 112, outer_dst=0xFC01 << 112)
    assert len(frame) - 4096 + 4 <= demo.FRAME_HEADROOM       # + 4: the FCS


def test_the_cli_time_guard_is_derived_unless_given():
    """``mrcnic demo`` leaves the time guard to tracker_registers unless ``--reorder-time``
    is given; ``--reorder-time 0`` turns it off (and the reorder guard goes to
    planes // 2 + 1)."""
    import argparse
    from mrcnic import cli

    def config(*argv):
        parser = argparse.ArgumentParser()
        cli._add_demo(parser.add_subparsers(dest="command"))
        cfg = cli._demo_config(parser.parse_args(["demo", *argv]), demo)
        return demo.tracker_registers({**demo.DEFAULTS, **cfg})
    assert config() == {"timeout_exp": 9, "reorder_guard": 3, "reorder_time": 99}
    assert config("--reorder-time", "0") == {"timeout_exp": 9, "reorder_guard": 5,
                                             "reorder_time": 0}
    assert config("--reorder-time", "40")["reorder_time"] == 40


def test_bringup_derives_the_time_guard_from_the_link_rate():
    """The bring-up's time guard: three PMTU frame times of the given link rate in whole
    ticks, the demo's value; off when the caller gives no link rate, or 0."""
    addr = dict(local_mac=1, local_ip=2, peer_mac=3, peer_ip=4, outer_src=5, evs=[6])
    assert bringup.time_guard_ticks(2.0, 13) == 99 == demo.tracker_registers(
        demo.DEFAULTS)["reorder_time"]
    assert bringup.time_guard_ticks(4.0, 12) == 26
    assert bringup.time_guard_ticks(0.001, 13) == (1 << 16) - 1     # the register's range
    assert bringup.TxConfig(**addr).tracker_reorder_time() == 0
    assert bringup.TxConfig(**addr, link_gbps=2.0, pmtu_log2=13).tracker_reorder_time() == 99
    assert bringup.TxConfig(**addr, link_gbps=2.0, reorder_time=0).tracker_reorder_time() == 0
    assert bringup.TxConfig(**addr, reorder_time=40).tracker_reorder_time() == 40


def test_top_inputs_are_read_from_the_verilog(tmp_path):
    """The bench drives every input of the top from time 0: their names come from the
    Verilog's top module (other modules, outputs, clock and reset left out)."""
    v = tmp_path / "top.v"
    v.write_text(f"""module inner(x, y);
  input [3:0] x;
  output y;
endmodule
module {demo.TOP}(clk, rst, a_valid, a_data, b_ready, b_valid);
  input clk;
  input rst;
  input a_valid;
  input [63:0] a_data;
  wire [3:0] t;
  input wire b_ready;
  output b_valid;
endmodule
""")
    assert demo.top_inputs(v) == ["a_valid", "a_data", "b_ready"]


def test_one_build_per_distinct_verilog(tmp_path, monkeypatch):
    """The demo exports only when the parameters or a gateware module changed, and keeps
    one folder (one Verilator build) per distinct Verilog."""
    exports = []

    def fake_text(component, top):
        exports.append(component)
        return f"module {top}; // {component['planes']}\nendmodule\n"
    monkeypatch.setattr(demo, "verilog_text", fake_text)
    monkeypatch.setattr(demo, "NicPair", lambda **params: params)
    a = demo._verilog({"planes": 4}, tmp_path)
    assert a == demo._verilog({"planes": 4}, tmp_path) and len(exports) == 1   # reused
    b = demo._verilog({"planes": 8}, tmp_path)
    assert b.parent != a.parent and len(exports) == 2
    # a source change that leaves the Verilog as it was: exported again, same folder
    monkeypatch.setattr(demo, "_SOFTWARE", demo._SOFTWARE - {"pcap.py"})
    assert demo._verilog({"planes": 4}, tmp_path) == a and len(exports) == 3
    assert a.read_text().startswith(f"module {demo.TOP};")


def _lossy_metrics():
    """The metrics of a run without failures over a fabric that dropped 3 frames at random:
    2 resent on SACK holes, 1 on the timeout."""
    m = _metrics()
    m["config"] = {**m["config"], "failures": [], "loss": 0.02, "seed": 100}
    m["counters"] = {"mrc-tx": {"retransmissions": 3},
                     "retransmit-tracker": {"rtx_nack": 0, "rtx_hole": 2, "rtx_timeout": 1}}
    m["fabric"] = {"drops": {"0": {"loss": 2}, "1": {"loss": 1, "failed": 0}, "2": {}, "3": {}},
                   "sent": 67, "delivered": 64}
    return m


def test_summary_names_the_drops_and_the_retransmissions_by_cause():
    m = _lossy_metrics()
    assert demo.fabric_drops(m) == {"loss": 3}
    assert demo.retransmissions(m) == {"frames": 3, "nack": 0, "hole": 2, "timeout": 1}
    text = demo.summary(m)
    assert "2% random loss (seed 100)" in text
    assert "the fabric dropped 3 of the 67 frames it carried (random loss 3)" in text
    assert "3 frames resent; requests by cause: NACK/trim 0, hole (SACK) 2, timeout 1" in text
    # metrics without the fabric's counters (older runs): no drop line
    assert "the fabric dropped" not in demo.summary(_metrics())


def test_demo_summary_table_and_picture(tmp_path):
    """One row per run, in the order given, with its fault, goodput, the goodput after a
    failure, retransmit requests by cause, EV state changes, the failed path's last use
    and the verdict; and one picture of the runs side by side."""
    runs = {"plane-failure": _metrics(), "loss": _lossy_metrics()}
    for name, m in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))
    loaded = demo_summary.load_runs([tmp_path / "plane-failure", tmp_path / "loss"])
    assert [name for name, _ in loaded] == ["plane-failure", "loss"]
    assert demo_summary.row(*loaded[0]) == [
        "plane-failure", "plane 1 at 10 us", "75.0 / 50.0", "0.0", "0 / 2 / 0", "3",
        "40 ns", "intact"]                  # the retransmission 10 cycles after the failure
    assert demo_summary.row(*loaded[1]) == [
        "loss", "2% loss: 3 dropped", "75.0 / 50.0", "-", "0 / 2 / 1", "3", "-", "intact"]
    lines = demo_summary.table(loaded).splitlines()
    assert lines[0].split()[:2] == ["run", "fault"] and lines[2].startswith("plane-failure")
    assert lines[3].split()[-1] == "intact" and len(lines) == 7
    png = tmp_path / "summary.png"
    demo_summary.plot_runs(loaded, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="metrics.json is missing"):
        demo_summary.load_runs([tmp_path / "none"])


def test_progress_goes_from_the_bench_to_the_bar(tmp_path, monkeypatch):
    """The bench appends prefixed lines to the file MRCNIC_PROGRESS names; the follower
    reports each one once, in order, and ignores other lines."""
    path = tmp_path / "progress.txt"
    monkeypatch.setenv("MRCNIC_PROGRESS", str(path))
    seen = []
    follower = ProgressFollower(path, lambda *a: seen.append(a))
    bench = Progress(4096)
    bench.report("bring-up", 0, 0, 0.0)
    bench.report("run", 1, 100, 4.0)            # not a multiple of CHECK_CYCLES: skipped
    with open(path, "a") as f:
        f.write("a line of something else\n")
    bench.last = 0.0
    bench.report("run", Progress.CHECK_CYCLES, 2048, 2000.0)
    follower.start()
    bench.report("done", 2 * Progress.CHECK_CYCLES, 4096, 4000.0)
    bench.file.close()
    follower.stop()
    assert seen == [("bring-up", 0, 4096, 0.0), ("run", 2048, 4096, 2000.0),
                    ("done", 4096, 4096, 4000.0)]
    assert path.read_text().startswith(PROGRESS_PREFIX)

