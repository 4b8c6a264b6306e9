"""``mrcnic demo-summary``: the runs of ``make demo`` side by side, from the ``metrics.json``
each run of ``mrcnic demo`` leaves in its folder: one table (a row per run) and one picture
(the runs' goodput plots next to each other).
"""

import json
from pathlib import Path

from mrcnic.netsim import demo

__all__ = ["load_runs", "fault_name", "row", "table", "plot_runs"]

# The table's columns: heading, width (the first two left-aligned, the others right)
COLUMNS = [("run", 13), ("fault", 24), ("goodput %", 11), ("after %", 7), ("rtx N/H/T", 9),
           ("EV", 3), ("last use", 8), ("verdict", 7)]


def load_runs(folders):
    """``[(name, metrics)]`` of the run folders (each holding the ``metrics.json`` of a
    ``mrcnic demo`` run), named after the folder."""
    runs = []
    for folder in folders:
        path = Path(folder) / "metrics.json"
        if not path.exists():
            raise ValueError(f"{path} is missing: run mrcnic demo --out {folder} first")
        runs.append((Path(folder).name, json.loads(path.read_text())))
    return runs


def fault_name(metrics):
    """The run's faults in a few words: the failures with their times, the random loss
    rate and the frames it dropped, incast, injected frames; ``none``."""
    cfg = metrics["config"]
    parts = [f"{demo._failure_name(f)} at {f['at_ns'] / 1000:g} us" for f in cfg["failures"]]
    if cfg.get("loss"):
        lost = demo.fabric_drops(metrics).get("loss", 0)
        parts.append(f"{100 * cfg['loss']:g}% loss: {lost} dropped")
    if cfg.get("incast"):
        parts.append(f"incast x{cfg['incast']}")
    if metrics.get("injected"):
        parts.append(f"{len(metrics['injected'])} bad frames")
    return ", ".join(parts) or "none"


def _last_use(metrics, failures):
    """The time from a failure to the last data frame NIC a started on a path it cut, the
    latest over the failures: ``none`` when no frame started on one after its failure."""
    latest = None
    for f in failures:
        if f["frames_after"]:
            ns = f["last_after_cycles"] * metrics["config"]["clock_ns"]
            latest = ns if latest is None else max(latest, ns)
    if latest is None:
        return "none"
    return f"{latest:.0f} ns" if latest < 1000 else f"{latest / 1000:.1f} us"


def row(name, metrics):
    """The table's cells for one run (strings, in the order of :data:`COLUMNS`)."""
    failures = demo.failure_report(metrics)
    rtx = demo.retransmissions(metrics)
    whole = demo.goodput_run(metrics)
    after = (f"{100 * min(f['goodput_after'] for f in failures):.1f}" if failures else "-")
    ok = metrics["complete"] and metrics["completions"] == metrics["work_requests"]
    return [name, fault_name(metrics),
            f"{100 * whole:.1f} / {100 * demo.goodput_flowing(metrics):.1f}", after,
            f"{rtx['nack']} / {rtx['hole']} / {rtx['timeout']}", str(len(metrics["events"])),
            _last_use(metrics, failures) if failures else "-",
            "intact" if ok else "FAILED"]


def table(runs):
    """The closing table of ``make demo``: a heading, a rule and a row per run of ``runs``
    (``[(name, metrics)]``), and a line that says what the columns hold."""
    def line(cells):
        out = []
        for i, (cell, (_, width)) in enumerate(zip(cells, COLUMNS)):
            out.append(cell.ljust(width) if i < 2 else cell.rjust(width))
        return "  ".join(out).rstrip()
    lines = [line([h for h, _ in COLUMNS]),
             line(["-" * w for _, w in COLUMNS])]
    lines += [line(row(name, m)) for name, m in runs]
    lines += ["goodput %: of line rate, over the run / while data flows; after %: after the "
              "failure, recovered",
              "rtx N/H/T: retransmit requests on NACK (trim) / SACK hole / timeout; EV: EV "
              "state changes",
              "last use: from the failure to the last data frame on the failed path (none: no "
              "frame after it)"]
    return "\n".join(lines)


def plot_runs(runs, path):
    """One PNG with the goodput plot of each run (per plane above, total below) side by
    side on one time axis, each titled with its name and fault."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(runs)
    # one time axis for all: the runs' lengths compare at a glance
    fig, axes = plt.subplots(2, n, figsize=(4.6 * n, 5.6), squeeze=False, sharey="row",
                             sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for k, (name, m) in enumerate(runs):
        ax, tot = axes[0][k], axes[1][k]
        if demo.draw_goodput(m, ax, tot, legend=k == 0):
            ax.set_title(f"{name}: {fault_name(m)}", fontsize=9)
        if k:
            ax.set_ylabel("")
            tot.set_ylabel("")
    first = runs[0][1]
    sizes = {m["bytes"] for _, m in runs}
    fig.suptitle(f"mrcnic demo: {first['config']['planes']} planes, "
                 + (f"{first['bytes']} bytes per run, " if len(sizes) == 1 else "")
                 + f"{first['line_gbps']:.0f} Gb/s line rate", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
