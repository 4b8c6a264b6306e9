"""``mrcnic demo``: two NICs over the fabric model, simulated on Verilator.

:func:`run_demo` exports :class:`~mrcnic.nic_pair.NicPair` as Verilog, builds it once with
Verilator (optimised C++; the build is kept in ``build/demo/<module>``), runs
:mod:`mrcnic.demo_bench` on it, and returns the metrics it wrote; :func:`summary` turns
them into the printed report.
"""

import hashlib
import json
import os
from pathlib import Path

from .export import verilog_text
from .nic_pair import NicPair
from .simrun import run as simrun

__all__ = ["DEFAULTS", "run_demo", "summary", "parse_failure"]

# The demo's NIC and network. Decision: 64-bit datapath at 250 MHz (16 Gb/s), each plane's
# links at 1/planes of it; jumbo PMTU (8192) so that a plane's loss costs its share and
# little more (headers are 1.7% of a frame).
DEFAULTS = {
    "planes": 8, "data_width": 64, "clock_ns": 4.0, "qps": 4, "ev_count": 32,
    "pmtu_log2": 13, "size": 1 << 20, "msg_bytes": 64 << 10, "loss": 0.0, "seed": 1,
    "spines": 4, "link_delay_ns": 200.0, "jitter_ns": 0.0, "queue_bytes": 256 << 10,
    "timeout_exp": 8, "reorder_guard": 3, "sack_every": 8, "bin_ns": 20_000.0,
    "max_cycles": 4_000_000, "failures": [], "pcap": False,
}


# Modules that make no gateware: a change to them needs no new Verilog.
_SOFTWARE = {"demo.py", "demo_bench.py", "bringup.py", "cli.py", "fabric.py", "pcap.py",
             "simrun.py", "synth.py", "formal.py", "__init__.py"}


def parse_failure(text):
    """``plane@TIME`` (TIME in us, the plane's every link fails for good), or
    ``plane:P@TIME``; returns the failure dict of the bench."""
    what, _, when = text.partition("@")
    if not when:
        raise ValueError(f"--fail {text!r}: use PLANE@MICROSECONDS")
    plane = int(what.split(":")[-1])
    return {"kind": "plane", "plane": plane, "at_ns": float(when) * 1000.0}


def _nic_params(cfg):
    return {"planes": cfg["planes"], "data_width": cfg["data_width"], "qps": cfg["qps"],
            "ev_count": cfg["ev_count"], "buffer_bytes": 4 << cfg["pmtu_log2"]}


def run_demo(cfg, out_dir="build/demo", waves=False, build_root="build/demo"):
    """Run the two-NIC simulation of ``cfg`` (``DEFAULTS`` updated); returns the metrics.
    The Verilator model is built under ``build_root`` (kept between runs), the metrics
    (and pcap) go to ``out_dir``."""
    cfg = {**DEFAULTS, **cfg}
    for f in cfg["failures"]:
        if not 0 <= f["plane"] < cfg["planes"]:
            raise ValueError(f"failure of plane {f['plane']}: planes are 0..{cfg['planes'] - 1}")
    params = _nic_params(cfg)
    # The module name says which parameters and which gateware: a change of either
    # exports and builds anew.
    digest = hashlib.sha1(json.dumps(params, sort_keys=True).encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name not in _SOFTWARE:
            digest.update(path.read_bytes())
    tag = digest.hexdigest()[:10]
    top = f"mrcnic_nic_pair_{tag}"
    build = Path(build_root) / top
    build.mkdir(parents=True, exist_ok=True)
    source = build / f"{top}.v"
    if not source.exists():
        print(f"mrcnic demo: exporting two MrcNic ({params}) to {source}")
        source.write_text(verilog_text(NicPair(**params), top))
    cfg["out_dir"] = str(Path(out_dir).resolve())
    simrun(top, source, params, "mrcnic.demo_bench", "verilator", build / "verilator",
           extra_env={"MRCNIC_DEMO": json.dumps(cfg)}, seed=cfg["seed"], waves=waves,
           optimize=cfg.get("optimize", True))
    with open(os.path.join(cfg["out_dir"], "metrics.json")) as f:
        return json.load(f)


def goodput(metrics, t0_ns=None, t1_ns=None):
    """Payload bytes placed per ns between t0 and t1, as a share of the line rate."""
    cfg = metrics["config"]
    bin_ns = cfg["bin_ns"]
    t0 = metrics["t_start_ns"] if t0_ns is None else t0_ns
    t1 = metrics["t_end_ns"] if t1_ns is None else t1_ns
    placed = sum(v for b, _, v in metrics["goodput_bins"]
                 if t0 <= b * bin_ns and (b + 1) * bin_ns <= t1)
    span = (int(t1 // bin_ns) - int(-(-t0 // bin_ns))) * bin_ns
    return placed * 8 / span / metrics["line_gbps"] if span > 0 else 0.0


def summary(metrics):
    cfg = metrics["config"]
    lines = []
    span_ns = metrics["t_end_ns"] - metrics["t_start_ns"]
    total = metrics["delivered_bytes"] * 8 / span_ns / metrics["line_gbps"]
    lines.append(f"{cfg['planes']} planes, {metrics['bytes']} bytes in "
                 f"{metrics['work_requests']} writes, {span_ns / 1000:.1f} us simulated "
                 f"({metrics['cycles']} cycles, {metrics['wall_s']:.0f} s)")
    lines.append(f"goodput {100 * total:.1f}% of line rate ({metrics['line_gbps']:.0f} Gb/s) "
                 f"over the whole run")
    for f in cfg["failures"]:
        t = f["at_ns"]
        after = goodput(metrics, t + (metrics["t_end_ns"] - t) / 4, metrics["t_end_ns"])
        sent = [c * cfg["clock_ns"] for c in metrics["sent_per_plane"][f["plane"]]]
        last = max((x for x in sent if x >= t), default=None)
        lines.append(f"plane {f['plane']} failed at {t / 1000:.1f} us: goodput after recovery "
                     f"{100 * after:.1f}% of line rate; last data frame sent on it "
                     + ("before the failure" if last is None else
                        f"{(last - t) / 1000:.2f} us ({(last - t) / cfg['clock_ns']:.0f} "
                        f"cycles) after it"))
    rt = metrics["counters"]["retransmit-tracker"]
    causes = {k: v for k, v in rt.items() if k.startswith("rtx") or "timeout" in k}
    lines.append(f"retransmissions: {metrics['counters']['mrc-tx'].get('retransmissions', 0)} "
                 f"({', '.join(f'{k} {v}' for k, v in causes.items() if v)})")
    states = {}
    for _, _, st in metrics["events"]:
        states[st] = states.get(st, 0) + 1
    lines.append(f"EV state changes: {len(metrics['events'])} "
                 f"({', '.join(f'to state {k}: {v}' for k, v in sorted(states.items()))})")
    ok = metrics["complete"] and metrics["completions"] == metrics["work_requests"]
    lines.append("verdict: " + ("all data arrived intact, each byte once" if ok else
                                f"FAILED: {metrics['missing']} bytes missing, "
                                f"{metrics['duplicates']} placed twice"))
    return "\n".join(lines)
