"""``mrcnic report``: every block's resources and speed in one table, docs/performance.md.

Two measurements per block, each at the block's reference configuration:

ECP5 (:data:`ECP5_CASES`)
    64-bit data, the configurations that fit an LFE5U-85F; placed and routed on the ULX3S-85F
    by :func:`mrcnic.flow.ecp5.build_block` (the block in its registered-port harness) against
    :data:`ECP5_FREQ_MHZ` or the case's own constraint: LUT4, FF, DP16KD and LUT levels of
    the block alone, fmax from nextpnr. The first case is a bare
    registered AXI-Stream slice (the skid buffer) of the same width: the "of slice" column is
    each block's fmax as a share of the slice's, what the device allows a registered stream.

Xilinx 7-series (:data:`XILINX_CASES`)
    512-bit data, the blocks' defaults elsewhere; Yosys ``synth_xilinx -family xc7`` only (no
    open place and route for the family here): LUT, FF, block RAM, LUT RAM, carry and DSP
    cells and the deepest path in LUT levels (:func:`mrcnic.flow.xilinx.synth_xilinx`).

Each measurement is kept as JSON in the repository (:data:`KEPT_ROOT`,
``docs/measurements/<kind>/<module>.json``; the tools' files in :data:`WORK_ROOT`) with a
digest of the gateware it was made on (:func:`gateware_digest`), and reused while the
block's gateware and clock constraint are the same (until ``--rerun``), so a run that stops
early (a full report takes hours of CPU) resumes where it stopped, in this checkout or a
fresh clone, and a block that changed is measured again; the page is rewritten after every
measurement from all those kept, a row not yet measured says so. A measurement whose
``gateware`` is null was carried over from an earlier page without its digest: shown, and
measured again by the next run.
"""

import json
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from mrcnic.flow import registry
from mrcnic.flow.ecp5 import ABC9_WIRE_PS, build_block, synth_block_alone
from mrcnic.flow.synth import get_board
from mrcnic.flow.tools import SynthError, rtlil_digest, tool_versions, yowasp_env
from mrcnic.flow.xilinx import XILINX_FAMILY, synth_xilinx

__all__ = ["Case", "ECP5_CASES", "XILINX_CASES", "ECP5_BOARD", "measure", "render", "run"]

KEPT_ROOT = "docs/measurements"
WORK_ROOT = "build/report"
ECP5_BOARD = "ulx3s-85f"
ECP5_FREQ_MHZ = 100.0            # the constraint nextpnr places against; fmax is what it reaches


@dataclass(frozen=True)
class Case:
    block: str
    params: tuple                # ((name, value), ...): hashable, in the order written
    note: str = ""
    router: str = "router1"      # nextpnr's (ecp5.ROUTERS), ECP5 only
    freq_mhz: float = ECP5_FREQ_MHZ  # the clock constraint on ECP5
    selftest: bool = False       # ECP5 fmax from the board self-test's build (the NIC only)

    @classmethod
    def of(cls, block, note="", router="router1", freq_mhz=ECP5_FREQ_MHZ, selftest=False,
           **params):
        return cls(block, tuple(params.items()), note, router, freq_mhz, selftest)

    @property
    def full_params(self):
        return {**registry.get(self.block).defaults, **dict(self.params)}

    @property
    def module(self):
        return registry.module_name(self.block, self.full_params)

    def label(self):
        return ", ".join(f"{k}={v}" for k, v in self.params) or "defaults"


def _as_in_selftest(block, router, freq_mhz=ECP5_FREQ_MHZ, selftest=False):
    """The NIC or one of its halves with the board self-test's parameters
    (:func:`mrcnic.boards.selftest.nic_params`): its planes and width, and those that differ
    from the block's defaults."""
    from mrcnic.boards.selftest import nic_params
    defaults = registry.get(block).defaults
    params = {k: v for k, v in nic_params().items()
              if k in defaults and (defaults[k] != v or k in ("planes", "data_width"))}
    return Case.of(block, "as in the board self-test", router, freq_mhz, selftest, **params)


def _selftest_clock():
    """The NIC self-test's clock on :data:`ECP5_BOARD` (MHz)."""
    from mrcnic.flow.board import SELFTEST_BOARDS
    return SELFTEST_BOARDS[ECP5_BOARD].freq_mhz


ECP5_CASES = [
    Case.of("skid-buffer", "the bare registered slice", data_width=64),
    Case.of("srv6-encap", data_width=64),
    Case.of("srv6-decap", data_width=64),
    Case.of("roce-tx", data_width=64, qps=8),
    Case.of("roce-rx", data_width=64),
    Case.of("ack-generator", data_width=64, qps=64),
    Case.of("reorder-buffer", data_width=64),
    Case.of("tx-segmenter", qps=8, msgs=16),
    Case.of("memory-protect", regions=16, qps=64),
    Case.of("path-selector", qps=8, ev_count=32, planes=4, profiles=2, ev_bits=32),
    Case.of("psn-tracker", qps=8, mpr_max=8, max_wimm_dest=4),
    Case.of("retransmit-tracker", qps=8, outstanding=128),
    # The NIC's rows route with router2 (why: docs/synthesis.md).
    _as_in_selftest("mrc-rx", "router2"),
    _as_in_selftest("mrc-tx", "router1"),
    # Decision: the whole NIC's fmax is the board self-test's, the same NIC with its traffic
    # around it; the register harness does not route (docs/synthesis.md).
    _as_in_selftest("mrc-nic", "router2", freq_mhz=_selftest_clock(), selftest=True),
]

XILINX_CASES = [
    Case.of("skid-buffer", "the bare registered slice", data_width=512),
    Case.of("srv6-encap", data_width=512),
    Case.of("srv6-decap", data_width=512),
    Case.of("roce-tx", data_width=512),
    Case.of("roce-rx", data_width=512),
    Case.of("ack-generator", data_width=512),
    Case.of("reorder-buffer", data_width=512, depth=16, max_packet=4096),
    Case.of("tx-segmenter"),
    Case.of("memory-protect"),
    Case.of("path-selector"),
    Case.of("psn-tracker"),
    Case.of("retransmit-tracker"),
    Case.of("mrc-rx", data_width=512, planes=8),
    Case.of("mrc-tx", data_width=512, planes=8),
    Case.of("mrc-nic", data_width=512, planes=8),
]


# --- Measurements, kept --------------------------------------------------------------------

def _result_path(root, kind, case):
    return Path(root, kind, f"{case.module}.json")


def gateware_digest(case):
    """A digest of the case's gateware (its RTLIL without source locations; for a case
    measured in the board self-test, that of the self-test's whole build plan too): a kept
    measurement whose digest differs was made on other gateware and is measured again."""
    from amaranth.back import rtlil
    digest = rtlil_digest(rtlil.convert(registry.get(case.block).build(dict(case.params)),
                                        name=case.module))
    if case.selftest:
        from mrcnic.flow.board import selftest_digest
        digest += "+" + selftest_digest(ECP5_BOARD, case.freq_mhz)
    return digest


def measure(case, kind, root=KEPT_ROOT, *, rerun=False, work_root=WORK_ROOT):
    """The kept measurement of ``case`` (``kind`` "ecp5" or "xilinx"), made now if there is
    none (or ``rerun``): a dict with the figures, ``"date"``, ``"seconds"`` and ``"tools"``."""
    path = _result_path(root, kind, case)
    if path.exists() and not rerun:
        return json.loads(path.read_text())
    t0 = time.monotonic()
    if kind == "ecp5" and case.selftest:
        _check_selftest_case(case)                  # refused before anything is elaborated
    # The digest of the gateware as it is when the build starts (the sources may change
    # while a long build runs).
    digest = gateware_digest(case)
    work = Path(work_root, kind, case.module)
    if kind == "ecp5" and case.selftest:
        result = _measure_in_selftest(case, work)
    elif kind == "ecp5":
        r = build_block(ECP5_BOARD, case.block, dict(case.params),
                        freq_mhz=case.freq_mhz, build_dir=work, router=case.router)
        cp = r.critical_path
        result = {"luts": r.block_luts, "ffs": r.block_ffs, "brams": r.block_brams,
                  "lut_depth": r.block_lut_depth, "fmax_mhz": r.fmax_mhz,
                  "critical_path": cp, "device": f"{r.device}-{r.speed} {r.package}",
                  "total_luts": r.total_luts, "available": r.available, "router": r.router,
                  "constraint_mhz": case.freq_mhz, "abc9_wire_ps": r.abc9_wire_ps}
    elif kind == "xilinx":
        component = registry.get(case.block).build(dict(case.params))
        result = synth_xilinx(component, case.module, work)
        result["device"] = f"Xilinx 7-series (synth_xilinx -family {XILINX_FAMILY})"
    else:
        raise ValueError(f"kind {kind!r}: 'ecp5' or 'xilinx'")
    result.update(block=case.block, params=dict(case.params), gateware=digest,
                  date=date.today().isoformat(),
                  seconds=round(time.monotonic() - t0), tools=tool_versions())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _check_selftest_case(case):
    from mrcnic.boards.selftest import nic_params
    if case.block != "mrc-nic" or case.full_params != {**case.full_params, **nic_params()}:
        raise ValueError(f"{case.block} ({case.label()}) is not the self-test's NIC")


def _measure_in_selftest(case, work):
    """An ECP5 measurement of the NIC from the board self-test on :data:`ECP5_BOARD` (built,
    or reused when built, in ``build/boards/<board>`` as ``mrcnic build --board`` does): the
    block's own figures from ``synth_ecp5`` of the NIC alone, fmax and the critical path
    from the routed self-test."""
    from mrcnic.flow.board import build_selftest
    _check_selftest_case(case)
    platform = get_board(ECP5_BOARD)
    alone = synth_block_alone(registry.get(case.block).build(dict(case.params)),
                              case.module, work / "block", platform=platform(),
                              env=yowasp_env())
    st = build_selftest(ECP5_BOARD, case.freq_mhz)
    return {"luts": alone["luts"], "ffs": alone["ffs"], "brams": alone["brams"],
            "lut_depth": alone["lut_depth"], "fmax_mhz": st.fmax_mhz,
            "critical_path": st.critical_path,
            "device": f"{platform.device}-{platform.speed} {platform.package}",
            "total_luts": st.luts, "available": st.available, "router": case.router,
            "constraint_mhz": case.freq_mhz, "selftest_design": st.design,
            "abc9_wire_ps": ABC9_WIRE_PS}


def _wire_ps(result):
    """The ABC wire delay an ECP5 measurement was synthesised with (300 ps, synth_ecp5's own,
    before the flow set :data:`~mrcnic.flow.ecp5.ABC9_WIRE_PS`)."""
    return result.get("abc9_wire_ps", 300)


def kept(case, kind, root=KEPT_ROOT):
    path = _result_path(root, kind, case)
    return json.loads(path.read_text()) if path.exists() else None


# --- The page --------------------------------------------------------------------------------

def _cp_text(cp):
    if not cp:
        return ""
    return (f"{cp['from']} -> {cp['to']}, {cp['logic_levels']} LUT, "
            f"{cp['delay_ns']:.1f} ns").replace("|", "/")


def _conf(case, kind, result=None):
    notes = [case.note] if case.note else []
    if kind == "ecp5" and case.router != "router1":
        notes.append(f"routed with {case.router}")
    if kind == "ecp5" and case.selftest:
        notes.append(f"fmax of the board self-test, placed against {case.freq_mhz:g} MHz")
    elif kind == "ecp5" and case.freq_mhz != ECP5_FREQ_MHZ:
        notes.append(f"placed against {case.freq_mhz:g} MHz")
    if kind == "ecp5" and result and _wire_ps(result) != ABC9_WIRE_PS:
        notes.append(f"ABC wire delay {_wire_ps(result)} ps")
    return case.label() + (f" ({'; '.join(notes)})" if notes else "")


def _missing(case, kind, columns):
    """The row of a case not measured yet, in a table of ``columns`` columns."""
    return f"| {case.block} | {_conf(case, kind)} | not measured yet |" + " |" * (columns - 3)


def render(ecp5, xilinx):
    """docs/performance.md from ``[(Case, result or None)]`` of each kind."""
    results = [r for _, r in ecp5 + xilinx if r]
    dates = sorted({r["date"] for r in results})
    tools = {}
    for r in results:
        for k, v in r["tools"].items():
            tools.setdefault(k, set()).add(v)
    slice_fmax = next((r["fmax_mhz"] for c, r in ecp5 if r and c.block == "skid-buffer"), None)
    lines = [
        "# Performance: every block on ECP5 and at 512 bits on Xilinx 7-series",
        "",
        "Written by `mrcnic report` (`hdl/mrcnic/flow/report.py`); measured "
        + (f"{dates[0]}" if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates
           else "(nothing yet)") + ". Tools: "
        + ", ".join(f"{k} {'/'.join(sorted(map(str, v)))}" for k, v in sorted(tools.items()))
        + ".",
        "",
        "Each block is measured at its reference configuration; a row reads on its own (see",
        "each block's page for other widths and the reasons behind its figures). A row without",
        "figures has not been measured yet: `mrcnic report` measures the missing rows and",
        "rewrites this page (`--only BLOCK` for one block, `--rerun` to measure again). The",
        f"measurements are kept in `{KEPT_ROOT}/` with a digest of the gateware each was made",
        "on; a block whose gateware changed is measured again by the next run.",
        "",
        f"## ECP5: {ECP5_BOARD}, placed and routed",
        "",
        "LUT4 (a CCU2C carry cell counts as two), FF, DP16KD and LUT levels are the block's own",
        "(`synth_ecp5` of the block alone); fmax is nextpnr-ecp5's, placed and routed against a",
        f"{ECP5_FREQ_MHZ:g} MHz constraint with every port registered in the FPGA (the harness of",
        "[synthesis](synthesis.md)), with router1 (the better for timing) unless the row says",
        "router2 (for the rows router1 does not route in an hour), and against that constraint",
        "unless the row names another. The whole NIC does not route in the harness: its fmax",
        "is the board self-test's (the same NIC with the traffic generator and checker around",
        f"it, `mrcnic build --board {ECP5_BOARD}`), its critical path that build's. "
        "\"Of slice\" is fmax as a",
        "share of the bare registered AXI-Stream slice's (the first row), what the device allows",
        "a registered 64-bit stream. LUTs are mapped with ABC's wire delay at "
        f"{ABC9_WIRE_PS} ps (the",
        "flow's decision, [synthesis](synthesis.md)); a row measured before, at synth_ecp5's "
        "own 300 ps,",
        "says so.",
        "",
        "| block | configuration | LUT4 | FF | DP16KD | LUT levels | fmax (MHz) | of slice "
        "| critical path |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, r in ecp5:
        conf = _conf(case, "ecp5", r)
        if r is None:
            lines.append(_missing(case, "ecp5", 9))
            continue
        fmax = r["fmax_mhz"]
        share = (f"{100 * fmax / slice_fmax:.0f}%" if fmax and slice_fmax else "")
        lines.append(f"| {case.block} | {conf} | {r['luts']} | {r['ffs']} | {r['brams']} | "
                     f"{r['lut_depth']} | {fmax:.1f} | {share} | {_cp_text(r['critical_path'])} |"
                     if fmax else
                     f"| {case.block} | {conf} | {r['luts']} | {r['ffs']} | {r['brams']} | "
                     f"{r['lut_depth']} | (no timed path) | | |")
    device = next((r["device"] for _, r in ecp5 if r), None)
    if device:
        lines += ["", f"Device: {device}."]
    lines += [
        "",
        "## Xilinx 7-series at 512 bits: synthesis",
        "",
        f"Yosys `synth_xilinx -family {XILINX_FAMILY}` of the block alone (no open place and",
        "route for the family: no fmax). LUT counts LUT1 to LUT6; block RAM in RAMB36E1 and",
        "RAMB18E1; LUT RAM and SRL in cells; \"LUT levels\" is the deepest register-to-register",
        "path in LUTs (the F7/F8 muxes and the carry chain not counted). The bare slice's depth",
        "is the reference: one LUT is what a registered stream needs.",
        "",
        "| block | configuration | LUT | FF | RAMB36 | RAMB18 | LUT RAM | SRL | CARRY4 | DSP "
        "| LUT levels |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, r in xilinx:
        conf = _conf(case, "xilinx")
        if r is None:
            lines.append(_missing(case, "xilinx", 11))
            continue
        lines.append(f"| {case.block} | {conf} | {r['luts']} | {r['ffs']} | {r['bram36']} | "
                     f"{r['bram18']} | {r['lutram']} | {r['srl']} | {r['carry']} | {r['dsps']} "
                     f"| {r['lut_depth']} |")
    lines += ["", "Time to measure each row (seconds, on the machine that measured it): "
              + ", ".join(f"{c.block} {kind} {r['seconds']}"
                          for kind, rows in (("ECP5", ecp5), ("xc7", xilinx))
                          for c, r in rows if r) + ".", ""]
    return "\n".join(lines)


def select(cases, only):
    if not only:
        return list(cases)
    names = set(registry.blocks())
    unknown = sorted(set(only) - names)
    if unknown:
        raise ValueError(f"unknown block {', '.join(unknown)}; blocks: {', '.join(sorted(names))}")
    return [c for c in cases if c.block in only]


def run(*, only=(), kinds=("ecp5", "xilinx"), rerun=False, root=KEPT_ROOT,
        work_root=WORK_ROOT, out="docs/performance.md", measure_missing=True, log=print):
    """Measure the selected cases that are not kept yet (all of them with ``rerun``) and
    rewrite ``out`` after each one; returns the page's text."""
    todo = [(kind, c) for kind, cases in (("ecp5", ECP5_CASES), ("xilinx", XILINX_CASES))
            if kind in kinds for c in select(cases, only)]

    def write():
        page = render([(c, kept(c, "ecp5", root)) for c in ECP5_CASES],
                      [(c, kept(c, "xilinx", root)) for c in XILINX_CASES])
        if out:
            Path(out).write_text(page)
        return page

    page = write()
    if not measure_missing:
        return page
    digests = {}
    for i, (kind, case) in enumerate(todo, 1):
        old = kept(case, kind, root)
        if old and not rerun:
            if case not in digests:
                digests[case] = gateware_digest(case)
            same_constraint = (kind != "ecp5" or
                               old.get("constraint_mhz", ECP5_FREQ_MHZ) == case.freq_mhz)
            same_synth = kind != "ecp5" or _wire_ps(old) == ABC9_WIRE_PS
            if old.get("gateware") == digests[case] and same_constraint and same_synth:
                continue
            what = ("the gateware" if old.get("gateware") != digests[case] else
                    "the clock constraint" if not same_constraint else "the synthesis")
            log(f"[{i}/{len(todo)}] {kind} {case.block}: {what} changed since it was "
                f"measured ({old.get('date')})")
        log(f"[{i}/{len(todo)}] {kind} {case.block} ({case.label()}) ...")
        try:
            r = measure(case, kind, root, rerun=True, work_root=work_root)
        except SynthError as e:
            log(f"    failed: {str(e).splitlines()[0]}")
            continue
        fmax = f", fmax {r['fmax_mhz']:.1f} MHz" if r.get("fmax_mhz") else ""
        log(f"    {r['luts']} LUT, {r['ffs']} FF, {r['lut_depth']} LUT levels{fmax} "
            f"({r['seconds']} s)")
        page = write()
    return page
