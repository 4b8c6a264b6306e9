"""``mrcnic demo``: two NICs over the fabric model, simulated on Verilator.

:func:`run_demo` exports :class:`~mrcnic.netsim.nic_pair.NicPair` as Verilog, builds it once with
Verilator (optimised C++; the build is kept in ``build/demo/nic_pair_<hash>``), runs
:mod:`mrcnic.netsim.demo_bench` on it, and returns the metrics it wrote; :func:`summary` turns
them into the printed report.
"""

import hashlib
import json
import os
import re
from pathlib import Path

from mrcnic.flow.export import verilog_text
from mrcnic.netsim.demo_bench import INJECT_KINDS
from mrcnic.netsim.nic_pair import NicPair
from mrcnic.base.proto import EvState
from mrcnic.flow.simrun import run as simrun
from mrcnic.base.records import TICK_NS
from mrcnic.host.bringup import FRAME_HEADROOM, time_guard_ticks

__all__ = ["DEFAULTS", "tracker_registers", "run_demo", "summary", "failure_report", "plot",
           "parse_failure", "parse_gray", "affected_evs", "fabric_drops", "retransmissions",
           "goodput", "goodput_run", "goodput_flowing",
           "plane_goodput", "draw_goodput"]

# The demo's NIC and network. Decision: a 64-bit datapath on a 4 ns clock, each plane's links
# at 1/planes of its line rate; a jumbo PMTU so that a plane's loss costs its share and
# little more (the line rate: docs/blocks/mrc-nic.md).
DEFAULTS = {
    "planes": 8, "data_width": 64, "clock_ns": 4.0, "qps": 4, "ev_count": 32,
    "pmtu_log2": 13, "size": 1 << 20, "msg_bytes": 64 << 10, "loss": 0.0, "seed": 1,
    "spines": 4, "link_delay_ns": 200.0, "jitter_ns": 0.0, "queue_bytes": 256 << 10,
    # the retransmit tracker's registers: None = set for the fabric (tracker_registers)
    "timeout_exp": None, "reorder_guard": None, "sack_every": 8,
    "reorder_time": None,       # the tracker's time guard in ticks (0: off)
    "max_cycles": 4_000_000, "failures": [], "pcap": False, "probe_us": 20.0,
    "tseth": False,             # a TSETH on every data packet (RTT samples from every SACK)
    "inject": [], "inject_after_ns": 20_000.0, "inject_every_ns": 5_000.0,
    # incast: extra hosts, each sending cross traffic to b on every plane at incast_share of
    # a plane link's rate from incast_start_ns on (b's leaf egress is then oversubscribed)
    "incast": 0, "incast_share": 1.0, "incast_start_ns": 20_000.0,
    # -O1: the model's C++ (over 150 MB at 4 planes) compiles in about half the time of
    # -O2, and runs nearly as fast
    "optimize": "-O1",
}


def plane_link_gbps(cfg):
    """A plane link's rate: the line rate (data width x clock) over the planes."""
    return cfg["data_width"] / cfg["clock_ns"] / cfg["planes"]


def base_rtt_ns(cfg):
    """Round trip of a PMTU data frame and its SACK over an idle plane of the demo's fabric:
    four store-and-forward hops each way (host, leaf, spine, leaf) at a plane link's rate."""
    rate = plane_link_gbps(cfg)

    def hop(nbytes):
        return nbytes * 8 / rate + cfg["link_delay_ns"]
    return 4 * hop((1 << cfg["pmtu_log2"]) + FRAME_HEADROOM) + 4 * hop(FRAME_HEADROOM)


def control_rtt_ns(cfg):
    """Round trip of a frame with no payload (a probe) and its SACK over an idle plane: four
    store-and-forward hops each way, each at most FRAME_HEADROOM bytes."""
    hop = FRAME_HEADROOM * 8 / plane_link_gbps(cfg) + cfg["link_delay_ns"]
    return 8 * hop


def rtt_report(metrics):
    """a's RTT samples (MrcTx ``rtt``) in ns: ``{"all": [...], "probe": [...], "wire":
    [...]}``; ``wire`` pairs each probe's round on the wire (from a's port sending it to
    a's port receiving b's answer, ns) with the first probe sample a gave after it:
    ``(wire_ns, sample_ns)``."""
    unit = metrics.get("ts_unit_ns", 128)
    samples = metrics.get("rtts", [])
    probes = sorted((s[0], s[4] * unit) for s in samples if s[2])
    wire = []
    for _, a_tx, _, _, a_rx in sorted(metrics.get("probe_rounds", []), key=lambda r: r[4]):
        later = [ns for t, ns in probes if t >= a_rx]
        if later:
            wire.append((a_rx - a_tx, later[0]))
    return {"all": [s[4] * unit for s in samples], "probe": [ns for _, ns in probes],
            "wire": wire}


def tracker_registers(cfg):
    """The retransmit tracker's ``timeout_exp``, ``reorder_guard`` and ``reorder_time`` for
    the fabric of ``cfg``, as an operator sets them for a network (``cfg`` values that are
    not None win; ``reorder_time`` 0 turns the time guard off).

    **Decision** (the one place): the timeout is the shortest 1.024 us x 2^t of at least
    three idle round trips (:func:`base_rtt_ns`): loaded ports add a frame or two of
    queueing per hop, and a timeout shorter than the loaded round trip resends what is only
    late. The time guard is three PMTU frame times of a plane link, rounded up to whole
    ticks (:func:`mrcnic.host.bringup.time_guard_ticks`; 99 ticks, 101 us, at the 8-plane
    defaults; 26 ticks at 4 planes of 4 Gb/s and PMTU 4096): a hole counts as lost only
    once a packet sent that much after it has arrived, so the queueing skew between
    planes is not taken for loss, and the count guard is then 3 PSNs. With the time guard
    off, the count guard alone must cover that skew: planes // 2 + 1 PSNs, 3 at least (a
    frame queued behind one other on its plane is overtaken by more frames the more
    planes there are); measured at 8 planes, guard 3 alone took the skew for loss (30
    false-hole retransmissions after a plane failure), guard 8 was slower than the
    timeout, and guard 5 met the targets but still resent frames that were only late,
    which the time guard does not (docs/blocks/mrc-nic.md)."""
    t = 0
    while TICK_NS * (1 << t) < 3 * base_rtt_ns(cfg):
        t += 1
    rtime = cfg.get("reorder_time")
    if rtime is None:
        rtime = time_guard_ticks(plane_link_gbps(cfg), cfg["pmtu_log2"])
    guard = 3 if rtime else max(3, cfg["planes"] // 2 + 1)
    derived = {"timeout_exp": t, "reorder_guard": guard, "reorder_time": rtime}
    return {k: v if cfg.get(k) is None else cfg[k] for k, v in derived.items()}


# Modules that make no gateware: a change to them needs no new Verilog.
_SOFTWARE = {"demo.py", "demo_bench.py", "demo_progress.py", "demo_summary.py", "bringup.py",
             "cli.py", "fabric.py", "pcap.py", "simrun.py", "synth.py", "formal.py",
             "__init__.py"}
TOP = "mrcnic_nic_pair"


def parse_failure(text):
    """``plane@TIME`` (TIME in us, the plane's every link fails for good), or
    ``plane:P@TIME``; returns the failure dict of the bench."""
    what, _, when = text.partition("@")
    if not when:
        raise ValueError(f"--fail {text!r}: use PLANE@MICROSECONDS")
    plane = int(what.split(":")[-1])
    return {"kind": "plane", "plane": plane, "at_ns": float(when) * 1000.0}


def parse_gray(text):
    """``plane:spine@TIME[:DROP]`` (TIME in us, DROP the share of frames lost, default 0.2):
    the link between NIC a's leaf and ``spine`` in ``plane`` turns gray (up, but losing
    frames both ways) for good; returns the failure dict of the bench."""
    where, _, rest = text.partition("@")
    when, _, drop = rest.partition(":")
    try:
        plane, spine = (int(x) for x in where.split(":"))
        at, drop = float(when), float(drop or 0.2)
    except ValueError:
        raise ValueError(f"--gray {text!r}: use PLANE:SPINE@MICROSECONDS[:DROP]") from None
    return {"kind": "gray", "plane": plane, "spine": spine, "at_ns": at * 1000.0,
            "nodes": [["leaf", 0], ["spine", spine]], "drop": drop}


def affected_evs(failure, cfg):
    """The EV indices whose path a failure cuts: every EV of the plane, or for a gray link
    those through its spine (EV e: plane e mod planes, spine (e div planes) mod spines, as
    the bench configures them)."""
    P = cfg["planes"]
    return [e for e in range(cfg["ev_count"]) if e % P == failure["plane"] and
            (failure["kind"] != "gray" or (e // P) % cfg["spines"] == failure["spine"])]


def _failure_name(f):
    if f["kind"] == "gray":
        return f"gray link plane {f['plane']} spine {f['spine']} ({100 * f['drop']:g}% lost)"
    return f"plane {f['plane']}"


def _nic_params(cfg):
    return {"planes": cfg["planes"], "data_width": cfg["data_width"], "qps": cfg["qps"],
            "ev_count": cfg["ev_count"], "buffer_bytes": 4 << cfg["pmtu_log2"],
            "pmtu_max": max(4096, 1 << cfg["pmtu_log2"])}


def _gateware_sources():
    """The package's modules that can change the pair's Verilog: every one but the models,
    the host software, the tool flow (its Verilog export aside), the command line and this
    folder's software (:data:`_SOFTWARE`)."""
    package = Path(__file__).parent.parent
    skip = {"model", "host", "flow"}
    paths = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in skip and rel != Path("flow", "export.py"):
            continue
        if rel == Path("cli.py") or (rel.parts[0] == "netsim" and path.name in _SOFTWARE):
            continue
        paths.append(path)
    return paths


def _verilog(params, root, say=print):
    """The Verilog of the NIC pair of ``params``, in ``root/nic_pair_<hash of the
    Verilog>/`` (one Verilator build per distinct Verilog). Exported only when the
    parameters or a gateware module changed since the last export (``root/exports.json``
    maps a hash of both to the folder): a change that leaves the Verilog as it was (a
    docstring, a Python helper) reuses the build. ``say`` prints what it does."""
    digest = hashlib.sha1(json.dumps(params, sort_keys=True).encode())
    for path in _gateware_sources():
        digest.update(path.read_bytes())
    key = digest.hexdigest()
    index_path = root / "exports.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    if key in index and (root / index[key] / f"{TOP}.v").exists():
        return root / index[key] / f"{TOP}.v"
    say(f"mrcnic demo: exporting two MrcNic ({params}) to Verilog")
    text = verilog_text(NicPair(**params), TOP)
    folder = f"nic_pair_{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    source = root / folder / f"{TOP}.v"
    if not source.exists():
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        say(f"mrcnic demo: new Verilog in {source.parent}: Verilator builds it (minutes)")
    index[key] = folder
    index_path.write_text(json.dumps(index, indent=1))
    return source


def top_inputs(source):
    """The input ports of the top module in the Verilog file ``source``, but its clock and
    reset (read from the file: building the pair only for its ports would cost seconds at 8
    planes and leave every block it holds unelaborated)."""
    text = Path(source).read_text()
    body = text[text.index(f"module {TOP}("):]
    body = body[:body.index("endmodule")]
    names = re.findall(r"^\s*input\s+(?:wire\s+)?(?:\[[^\]]*\]\s*)?(\w+)\s*;", body, re.M)
    return [n for n in names if n not in ("clk", "rst")]


def run_demo(cfg, out_dir="build/demo", waves=False, build_root="build/demo",
             simulator="verilator", log_file=None, bar=None):
    """Run the two-NIC simulation of ``cfg`` (``DEFAULTS`` updated); returns the metrics.
    The simulator's model (Verilator by default; ``"icarus"`` for short runs) is built under
    ``build_root`` (kept between runs), the metrics (and pcap) go to ``out_dir``.
    ``log_file``: a file for the simulation's output (else the terminal); ``bar``: a
    :class:`~mrcnic.netsim.demo_progress.DemoBar` that the run's progress moves (else the
    bench prints a progress line now and then)."""
    cfg = {**DEFAULTS, **cfg}
    cfg.update(tracker_registers(cfg))
    bad = [k for k in cfg["inject"] if k not in INJECT_KINDS]
    if bad:
        raise ValueError(f"inject {bad}: kinds are {', '.join(INJECT_KINDS)}")
    if set(cfg["inject"]) & {"bad_rkey", "outside"} and cfg["qps"] < 2:
        raise ValueError("access-error injection needs qps >= 2 (the last QP takes them)")
    for f in cfg["failures"]:
        if not 0 <= f["plane"] < cfg["planes"]:
            raise ValueError(f"failure of plane {f['plane']}: planes are 0..{cfg['planes'] - 1}")
        if f["kind"] == "gray" and not (0 <= f["spine"] < cfg["spines"] and 0 <= f["drop"] <= 1):
            raise ValueError(f"gray link {f}: spines are 0..{cfg['spines'] - 1}, drop 0..1")
    if not (isinstance(cfg["incast"], int) and 0 <= cfg["incast"] <= 64
            and 0 < cfg["incast_share"] <= 4):
        raise ValueError(f"incast {cfg['incast']} sources at {cfg['incast_share']} of a link: "
                         "0..64 sources, a share in (0, 4]")
    params = _nic_params(cfg)
    source = _verilog(params, Path(build_root), say=print if bar is None else bar.note)
    build = source.parent
    cfg["out_dir"] = str(Path(out_dir).resolve())
    # Every input starts at 0 (Icarus starts them at X; an X data bus under valid = 0 must
    # not reach the NIC's state in one simulator and not in the other).
    cfg["inputs"] = top_inputs(source)
    env = {"MRCNIC_DEMO": json.dumps(cfg)}
    follower = None
    if bar is not None:
        from mrcnic.netsim.demo_progress import ProgressFollower
        progress = Path(cfg["out_dir"]) / "progress.txt"
        progress.parent.mkdir(parents=True, exist_ok=True)
        progress.write_text("")
        env["MRCNIC_PROGRESS"] = str(progress)
        if not (build / simulator / TOP).exists():
            bar.status(f"{simulator} build (minutes, once)")
        follower = ProgressFollower(progress, bar.report, idle=bar.tick)
        follower.start()
    try:
        simrun(TOP, source, params, "mrcnic.netsim.demo_bench", simulator, build / simulator,
               extra_env=env, seed=cfg["seed"], waves=waves, optimize=cfg["optimize"],
               log_file=log_file)
    finally:
        if follower is not None:
            follower.stop()
    with open(os.path.join(cfg["out_dir"], "metrics.json")) as f:
        return json.load(f)


def goodput(metrics, t0_ns=None, t1_ns=None):
    """Payload bytes placed per ns between t0 and t1, as a share of the line rate."""
    cfg = metrics["config"]
    t0 = metrics["t_start_ns"] if t0_ns is None else t0_ns
    t1 = metrics["t_end_ns"] if t1_ns is None else t1_ns
    placed = sum(v for t, _, v in metrics["placements"] if t0 <= t < t1)
    return placed * 8 / (t1 - t0) / metrics["line_gbps"] if t1 > t0 else 0.0


def goodput_run(metrics):
    """Goodput over the whole run: every byte placed at b, over the time from the first work
    request to the end of the run, as a share of the line rate."""
    span_ns = metrics["t_end_ns"] - metrics["t_start_ns"]
    return metrics["delivered_bytes"] * 8 / span_ns / metrics["line_gbps"] if span_ns > 0 else 0.0


def goodput_flowing(metrics):
    """Goodput while data flows: the bytes placed after the first placement, over the time
    from it to the last one. It leaves out the fabric's first-frame latency (four
    store-and-forward hops of a PMTU frame on a plane's link: 131 us for 8 KiB at 2 Gb/s),
    and keeps every cost of the NIC's own, retransmission tails included."""
    times = sorted(t for t, _, _ in metrics["placements"])
    if len(times) < 2 or times[-1] <= times[0]:
        return 0.0
    first = min(metrics["placements"])
    placed = sum(v for _, _, v in metrics["placements"]) - first[2]
    return placed * 8 / (times[-1] - times[0]) / metrics["line_gbps"]


# b's counters that show the injected bad frames (RoceRx, memory check, PSN tracker)
INJECT_COUNTERS = ("icrc", "length", "truncated", "verdict_drop", "no_qp", "out_of_window",
                   "denied", "unknown_rkey", "out_of_range", "qp_in_error", "naks")


def failure_report(metrics):
    """Per failure: goodput after recovery (placed bytes over the last three quarters of
    the time from the failure to the last new data frame); the data frames NIC ``a``
    started on the failed plane after the failure (count, cycles from the failure to the
    last one's first beat) and its probes there; and each of the plane's EVs taken
    ASSUMED_BAD: when, and the cycles from then to the last data frame on it."""
    cfg = metrics["config"]
    P, clock = cfg["planes"], cfg["clock_ns"]
    report = []
    # The steady state ends when the last new data frame leaves (what follows is the
    # tail: the last retransmissions and acknowledgements).
    end = max((c * clock for c, _, _, _, rtx, probe in metrics["frames"]
               if not rtx and not probe), default=metrics["t_end_ns"])
    for f in cfg["failures"]:
        t, plane = f["at_ns"], f["plane"]
        cut = set(affected_evs(f, cfg))
        data = [(c, p, e) for c, p, e, _, _, probe in metrics["frames"] if not probe]
        after = [c for c, _, e in data if e in cut and c * clock >= t]
        probes = sum(1 for c, p, e, *_, probe in metrics["frames"]
                     if probe and e in cut and c * clock >= t)
        evs = []
        for when, ev, state in metrics["events"]:
            if state == EvState.ASSUMED_BAD and ev in cut and when >= t:
                if any(e["ev"] == ev for e in evs):
                    continue
                last = max((c for c, _, e in data if e == ev and c * clock >= when),
                           default=None)
                evs.append({"ev": ev, "bad_ns": when, "last_after_bad_cycles":
                            None if last is None else round(last - when / clock)})
        report.append({
            "plane": plane, "at_ns": t, "name": _failure_name(f), "cut_evs": sorted(cut),
            "goodput_after": goodput(metrics, t + (end - t) / 4, end),
            "frames_after": len(after), "probes_after": probes,
            "last_after_cycles": round(max(after) - t / clock) if after else None,
            "evs": evs})
    return report


def plane_goodput(metrics, points=200):
    """Goodput per plane over time: ``(xs_us, per, window_ns)``, ``per[p][k]`` the payload
    placed at NIC b on receive plane ``p`` in the window ending at ``xs_us[k]``, as a share of
    a plane's rate; None for a run without time."""
    cfg = metrics["config"]
    P = cfg["planes"]
    plane_gbps = metrics["line_gbps"] / P
    t0, t1 = metrics["t_start_ns"] or 0.0, metrics["t_end_ns"]
    if t1 <= t0:
        return None
    # A sliding window of at least four frames per plane at the plane's rate (a frame is
    # placed at once: shorter windows show single frames, not a rate).
    frame_ns = (1 << cfg["pmtu_log2"]) * 8 / plane_gbps
    window = max((t1 - t0) / 30, 4 * frame_ns)
    xs = [t0 + (t1 - t0) * k / points for k in range(points + 1)]
    per = [[0.0] * len(xs) for _ in range(P)]
    for t, p, v in metrics["placements"]:
        for k, x in enumerate(xs):
            if x - window < t <= x:
                per[p][k] += v * 8 / window / plane_gbps
    return [x / 1000 for x in xs], per, window


def draw_goodput(metrics, ax, tot, legend=True):
    """Goodput per plane (on ``ax``) and their sum (on ``tot``) over time, the failures
    marked; False when the run has no time to draw."""
    curves = plane_goodput(metrics)
    if curves is None:
        return False
    xs, per, window = curves
    cfg = metrics["config"]
    P = cfg["planes"]
    for p in range(P):
        ax.plot(xs, [100 * y for y in per[p]], label=f"plane {p}", linewidth=1.2)
    ax.set_ylabel(f"goodput, % of a plane's rate\n({window / 1000:.0f} us window)")
    ax.set_ylim(0, max(110, 105 * max(max(y) for y in per)))
    if legend:
        ax.legend(ncol=min(P, 4), fontsize=8, loc="lower left")
    tot.plot(xs, [100 * sum(per[p][i] for p in range(P)) / P for i in range(len(xs))],
             color="black", linewidth=1.5)
    tot.set_ylabel("total, % of line rate")
    tot.set_ylim(0, 110)
    tot.set_xlabel("time, us")
    for a in (ax, tot):
        a.grid(alpha=0.3)
        for f in cfg["failures"]:
            a.axvline(f["at_ns"] / 1000, color="red", linestyle="--", linewidth=1)
    for f in cfg["failures"]:
        ax.text(f["at_ns"] / 1000, 104, f" {_failure_name(f)} fails", color="red", fontsize=8)
    return True


def plot(metrics, path):
    """A PNG of goodput per plane over time (placed payload at NIC b, per receive plane,
    averaged over a sliding window), their sum, and the failures marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = metrics["config"]
    fig, (ax, tot) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    if not draw_goodput(metrics, ax, tot):
        plt.close(fig)
        return
    title = (f"mrcnic demo: {cfg['planes']} planes, {metrics['bytes']} bytes, loss "
             f"{cfg['loss']:g}, {metrics['line_gbps']:.0f} Gb/s line rate")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# The fabric's drop causes as the summaries name them (mrcnic.netsim.fabric_config)
DROP_NAMES = {"loss": "random loss", "failed": "on failed links", "gray": "on gray links",
              "queue_full": "queues full", "hop_limit": "hop limit", "no_route": "no route"}


def fabric_drops(metrics):
    """The frames the fabric dropped, by cause (``{cause: frames}``, causes with none left
    out), summed over the planes; empty for metrics without the fabric's counters."""
    total = {}
    for per_plane in metrics.get("fabric", {}).get("drops", {}).values():
        for cause, n in per_plane.items():
            if n:
                total[cause] = total.get(cause, 0) + n
    return total


def retransmissions(metrics):
    """NIC a's frames resent (``frames``: the transmit path's count) and the retransmit
    tracker's requests by cause: ``nack`` (NACKs, trimmed frames among them), ``hole``
    (SACK holes past the reorder guard), ``timeout``."""
    rt = metrics["counters"]["retransmit-tracker"]
    return {"frames": metrics["counters"]["mrc-tx"].get("retransmissions", 0),
            "nack": rt.get("rtx_nack", 0), "hole": rt.get("rtx_hole", 0),
            "timeout": rt.get("rtx_timeout", 0)}


def summary(metrics):
    """The report of one run, a few lines: what ran, goodput, each failure and what the
    NIC did about it, the fabric's drops, retransmissions by cause, EV state changes,
    incast and injected frames when asked for, and the verdict on the data."""
    cfg = metrics["config"]
    lines = []
    span_ns = metrics["t_end_ns"] - metrics["t_start_ns"]
    total = goodput_run(metrics)
    lines.append(f"{cfg['planes']} planes, {metrics['bytes']} bytes in "
                 f"{metrics['work_requests']} writes, {span_ns / 1000:.1f} us simulated "
                 f"({metrics['cycles']} cycles, {metrics['wall_s']:.0f} s)"
                 + (f", {100 * cfg['loss']:g}% random loss (seed {cfg['seed']})"
                    if cfg.get("loss") else ""))
    regs = tracker_registers(cfg)
    lines.append(f"retransmit tracker: reorder guard {regs['reorder_guard']} PSNs, timeout "
                 f"{TICK_NS * (1 << regs['timeout_exp']) / 1000:.0f} us "
                 f"(2^{regs['timeout_exp']} ticks), "
                 + (f"time guard {regs['reorder_time']} ticks "
                    f"({TICK_NS * regs['reorder_time'] / 1000:.0f} us)"
                    if regs["reorder_time"] else "no time guard"))
    lines.append(f"goodput {100 * total:.1f}% of line rate ({metrics['line_gbps']:.0f} Gb/s) "
                 f"over the whole run, {100 * goodput_flowing(metrics):.1f}% while data "
                 f"flows (first placement to last)")
    for f in failure_report(metrics):
        lines.append(f"{f['name']} failed at {f['at_ns'] / 1000:.1f} us: goodput after "
                     f"recovery {100 * f['goodput_after']:.1f}% of line rate")
        evs = ", ".join(map(str, f["cut_evs"]))
        if f["frames_after"]:
            lines.append(f"  {f['frames_after']} data frames started on its EVs ({evs}) after "
                         f"the failure, the last {f['last_after_cycles']} cycles after")
        else:
            lines.append(f"  no data frame started on its EVs ({evs}) after the failure")
        if f["probes_after"]:
            lines.append(f"  {f['probes_after']} probes sent on its EVs after the failure")
        for e in f["evs"]:
            lines.append(f"  EV {e['ev']}: ASSUMED_BAD {e['bad_ns'] / 1000:.1f} us, last frame "
                         + ("before that" if e["last_after_bad_cycles"] is None else
                            f"{e['last_after_bad_cycles']} cycles after it"))
    dropped = fabric_drops(metrics)
    if dropped:
        fab = metrics["fabric"]
        causes = ", ".join(f"{DROP_NAMES.get(k, k)} {v}" for k, v in dropped.items())
        carried = f" of the {fab['sent']} frames it carried" if "sent" in fab else " frames"
        lines.append(f"the fabric dropped {sum(dropped.values())}{carried} ({causes})")
    rtx = retransmissions(metrics)
    lines.append(f"retransmissions: {rtx['frames']} frame{'s' * (rtx['frames'] != 1)} "
                 f"resent; requests by cause: "
                 f"NACK/trim {rtx['nack']}, hole (SACK) {rtx['hole']}, timeout "
                 f"{rtx['timeout']}")
    states = {}
    for _, _, st in metrics["events"]:
        states[st] = states.get(st, 0) + 1
    changes = ", ".join(f"to {EvState(k).name}: {v}" for k, v in sorted(states.items()))
    lines.append(f"EV state changes: {len(metrics['events'])}"
                 + (f" ({changes})" if changes else ""))
    rtts = rtt_report(metrics)
    if rtts["all"]:
        r = sorted(rtts["all"])
        lines.append(f"RTT samples at a: {len(r)} ({len(rtts['probe'])} probe answers"
                     + (", TSETH on" if cfg.get("tseth") else "") + f"), min "
                     f"{r[0] / 1000:.2f} us, median {r[len(r) // 2] / 1000:.2f} us, max "
                     f"{r[-1] / 1000:.2f} us; an idle plane's round trip of a probe and "
                     f"its SACK {control_rtt_ns(cfg) / 1000:.2f} us")
        for wire_ns, ns in rtts["wire"]:
            lines.append(f"  a probe's round on the wire (a's port to a's port) "
                         f"{wire_ns / 1000:.3f} us, its RTT sample {ns / 1000:.3f} us")
    if cfg["incast"]:
        fab = metrics["fabric"]
        nak = metrics["counters"]["b.psn-tracker"]
        lines.append(f"incast: {cfg['incast']} sources at {100 * cfg['incast_share']:g}% of a "
                     f"plane link each, into b from {cfg['incast_start_ns'] / 1000:g} us: "
                     f"{fab['trims']} frames trimmed ({fab['trims_lasthop']} at the last hop), "
                     f"{fab['ecn_marks']} ECN marks; b answered {nak['trimmed']} trimmed "
                     f"packets with NACKs")
    if metrics["injected"]:
        b = {k: v for name in ("b.roce-rx", "b.memory-protect", "b.psn-tracker")
             for k, v in metrics["counters"][name].items()}
        seen = ", ".join(f"{k} {b[k]}" for k in INJECT_COUNTERS if b.get(k))
        lines.append(f"bad frames injected at b: {', '.join(metrics['injected'])}; "
                     f"b counted: {seen}")
    ok = metrics["complete"] and metrics["completions"] == metrics["work_requests"]
    lines.append("verdict: " + ("all data arrived intact, each byte once" if ok else
                                f"FAILED: {metrics['missing']} bytes missing, "
                                f"{metrics['duplicates']} placed twice"))
    return "\n".join(lines)
