"""The self-test on a dev board: :class:`BoardSelfTest` (the top: clock, reset, pins) and
:func:`build_selftest` (bitstream, timing, utilisation; programming on request).

Each board of :data:`SELFTEST_BOARDS` (the pin maps of the board table,
:mod:`mrcnic.boards.table`) names the pins the self-test uses: its UART (when
the board has one), its LEDs (``leds`` of :class:`~mrcnic.boards.selftest.SelfTest` in order:
running, bad, NIC up, loss on, planes up), its buttons or switches (each fails and
restores a plane). The board clock feeds a PLL at ``freq_mhz``; the design is held in
reset until the PLL locks.
"""

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from amaranth.hdl import Elaboratable, Module
from amaranth.lib import io

from mrcnic.base.clocking import find_pll, pll_sync_domain
from mrcnic.boards.selftest import SelfTest
from mrcnic.boards.spraytest import SprayTest
from mrcnic.boards.table import TABLE
from mrcnic.flow.ecp5 import (
    _build_only, _critical_path, _refuse_xilinx, parse_nextpnr_report, synth_commands)
from mrcnic.flow.synth import BOARDS, XILINX_BOARDS, get_board
from mrcnic.flow.tools import SynthError, _run, rtlil_digest, tool_versions, yowasp_env

__all__ = ["SELFTEST_BOARDS", "SELFTEST_DEVICE", "NEXTPNR_OPTS", "fits_default", "DESIGNS",
           "default_design",
           "BoardSelfTest", "build_selftest", "selftest_result"]


# Board name -> its BoardPins: the boards of the table that have a self-test, in its order.
SELFTEST_BOARDS = {name: board.pins for name, board in TABLE.items() if board.pins is not None}


# The default self-test (2 planes, 64 bits, 2 QPs, the board options) needs an LFE5U-85F
# (its utilisation: docs/boards.md): boards with a smaller device keep their pin maps, for
# smaller configurations, and a build of the default refuses them before any tool runs.
SELFTEST_DEVICE = "85F"


def fits_default(board):
    """Whether ``board``'s device holds the default self-test (an 85F, or a Kintex)."""
    return board in XILINX_BOARDS or get_board(board).device.endswith(SELFTEST_DEVICE)


# The self-test designs: the NIC looped back to itself (mrcnic.boards.selftest), and the spray test
# (mrcnic.boards.spraytest: the path selector and the SRv6 blocks, for the boards the NIC does not
# fit, and the bitstream `make test` builds). Each with its clock when the board's pins
# name none: the spray test's longest path is the path selector's (docs/performance.md).
DESIGNS = {"nic": SelfTest, "spray": SprayTest}
DESIGN_FREQ_MHZ = {"nic": None, "spray": 40.0}


# The spray test fits an LFE5U-25F (docs/boards.md): the ECP5 boards with a smaller device
# (the ULX3S-12F) have no self-test.
SPRAY_DEVICES = ("25F", "45F", "85F")


def _check_board(board):
    if board in BOARDS and board not in SELFTEST_BOARDS:
        device = get_board(board).device
        if not device.endswith(SPRAY_DEVICES):
            raise ValueError(f"no self-test for board {board!r}: its {device} is too small "
                             f"for the smallest (the spray test, 17.6k LUT4, needs a 25F)")
    if board not in SELFTEST_BOARDS:
        raise ValueError(f"no self-test for board {board!r}; boards: "
                         f"{', '.join(SELFTEST_BOARDS)}")


def default_design(board):
    """The self-test ``mrcnic build`` makes for ``board``: the NIC where it fits."""
    return "nic" if fits_default(board) else "spray"


class BoardSelfTest(Elaboratable):
    """:class:`~mrcnic.boards.selftest.SelfTest` on ``board`` at ``freq_mhz`` (module docstring;
    default: the board's);
    ``params``: the SelfTest's (``clk_hz`` is the PLL's output). ``core``: a function
    ``core(clk_hz=..., **params)`` that builds another component with the SelfTest's pins
    (``tx``, ``rx``, ``buttons``, ``leds``; for tests of the pin maps)."""

    def __init__(self, board, freq_mhz=None, core=SelfTest, **params):
        _check_board(board)
        self.board, self.pins = board, SELFTEST_BOARDS[board]
        design = next((d for d, c in DESIGNS.items() if c is core), None)
        self.freq_mhz = freq_mhz or DESIGN_FREQ_MHZ.get(design) or self.pins.freq_mhz
        self.params = {"planes": self.pins.planes, **params}
        self.core = core
        self.pll = None
        self.selftest = None

    def elaborate(self, platform):
        m = Module()
        self.pll = pll_sync_domain(m, platform, self.freq_mhz, "clk_selftest")

        st = self.selftest = self.core(clk_hz=round(self.pll.f_out_mhz * 1e6), **self.params)
        m.submodules.selftest = st
        if self.pins.uart:
            uart = platform.request("uart", 0, dir="-")
            m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
            m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
            m.d.comb += [tx.o.eq(st.tx), st.rx.eq(rx.i)]
        ports = {}                            # a resource is requested once (RGB LEDs)

        def output(name, number, pin):
            if (name, number) not in ports:
                ports[name, number] = platform.request(name, number, dir="-")
            port = ports[name, number]
            if isinstance(pin, tuple):
                return io.Buffer("o", getattr(port, pin[0])[pin[1]])
            return io.Buffer("o", getattr(port, pin) if pin else port)
        for k, (name, number, pin) in enumerate(self.pins.leds):
            m.submodules[f"led{k}"] = buf = output(name, number, pin)
            m.d.comb += buf.o.eq(st.leds[k])
        for k, (name, number, pin, value) in enumerate(self.pins.fixed):
            m.submodules[f"fixed{k}"] = buf = output(name, number, pin)
            m.d.comb += buf.o.eq(value)
        for p, (name, number) in enumerate(self.pins.buttons[:len(st.buttons)]):
            m.submodules[f"button{p}"] = buf = io.Buffer("i", platform.request(name, number,
                                                                                dir="-"))
            m.d.comb += st.buttons[p].eq(buf.i)
        return m


@dataclass
class SelfTestBuild:
    board: str
    freq_mhz: float
    pll_mhz: float
    fmax_mhz: float
    met: bool
    luts: int
    ffs: int
    brams: int
    available: dict
    critical_path: list
    bitstream: str
    seconds: float
    tools: dict
    design: str = ""            # design_digest() of what was built
    selftest: str = "nic"       # which self-test (DESIGNS)
    synth_opts: str = ""        # options given to synth_ecp5 (ABC9_WORKAROUND), if any
    reused: bool = False        # an earlier build of the same design (not written to JSON)


# Decision: nextpnr's router2. The default router (router1) made little headway on the
# congested self-test, ripping up as much as it routed (docs/boards.md); router2 routes it.
NEXTPNR_OPTS = "--report report.json --timing-allow-fail --router router2 --threads 2"


def build_selftest(board, freq_mhz=None, build_dir=None, *, design=None, reuse=True,
                   **params):
    """Place and route self-test ``design`` (:data:`DESIGNS`; default
    :func:`default_design`) of ``board``; returns a :class:`SelfTestBuild` (also
    ``summary.json`` in ``build_dir``, default ``build/boards/<board>``, with ``-spray``
    for the spray test). With ``reuse``, a finished build in ``build_dir`` of the same
    design (:func:`design_digest`, kept in its ``summary.json``; its bitstream there) is
    taken as it is (``reused``): an hour saved when the board is programmed after the
    build."""
    _refuse_xilinx(board)
    _check_board(board)
    design = design or default_design(board)
    if design not in DESIGNS:
        raise ValueError(f"no self-test design {design!r}; designs: {', '.join(DESIGNS)}")
    core = params.pop("core", DESIGNS[design])         # another core: tests of the flow
    top = BoardSelfTest(board, freq_mhz, core=core, **params)
    platform = _build_only(get_board(board))()
    if core is SelfTest and not params and not fits_default(board):
        raise ValueError(f"the NIC self-test fills 78% of an LFE5U-{SELFTEST_DEVICE}; the "
                         f"{board}'s {platform.device} cannot hold it (boards with room: "
                         f"{', '.join(b for b in SELFTEST_BOARDS if fits_default(b))}); "
                         "--design spray builds the spray test")
    find_pll(platform.default_clk_frequency / 1e6, top.freq_mhz)
    env = yowasp_env()
    where = board if design == "nic" else f"{board}-{design}"
    build_dir = Path(build_dir or Path("build", "boards", where)).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    nextpnr_opts = _selftest_nextpnr_opts(top, design)
    plan = _selftest_plan(platform, top, nextpnr_opts)
    digest = design_digest(plan)
    done = [build_dir / name for name in ("top.bit", "report.json", "summary.json")]
    if reuse and all(path.exists() for path in done):
        summary = json.loads(done[2].read_text())
        if summary.get("design") == digest:
            return SelfTestBuild(**summary, reused=True)
    for stale in done:
        stale.unlink(missing_ok=True)
    plan.extract(build_dir)
    synth_opts = ""
    try:
        _run(["sh", f"{plan.script}.sh"], cwd=build_dir, env=env, log=build_dir / "build.log")
    except SynthError as e:
        yosys_log = build_dir / "top.rpt"
        text = yosys_log.read_text(errors="replace") if yosys_log.exists() else ""
        if "ERROR: Assert `" + ABC9_BUG not in text:
            raise SynthError(f"{e}\n{_tail(yosys_log)}") from None
        synth_opts = ABC9_WORKAROUND
        platform = _build_only(get_board(board))()         # a platform is prepared once
        plan = _selftest_plan(platform, top, nextpnr_opts, synth_opts)
        plan.extract(build_dir)
        _run(["sh", f"{plan.script}.sh"], cwd=build_dir, env=env, log=build_dir / "build.log")
    return selftest_result(board, build_dir, top.freq_mhz, top.pll.f_out_mhz,
                           time.monotonic() - t0, digest, design, synth_opts)


def _selftest_nextpnr_opts(top, design):
    seed = top.pins.nic_seed if design == "nic" else 0
    return NEXTPNR_OPTS + (f" --seed {seed}" if seed else "")


def selftest_digest(board, freq_mhz=None, design=None):
    """:func:`design_digest` of the board's self-test build plan, as :func:`build_selftest`
    makes it, without building: what a kept measurement of the self-test is checked against
    (the NIC and everything around it, the traffic checker included)."""
    design = design or default_design(board)
    top = BoardSelfTest(board, freq_mhz, core=DESIGNS[design])
    platform = _build_only(get_board(board))()
    return design_digest(_selftest_plan(platform, top, _selftest_nextpnr_opts(top, design)))


def _selftest_plan(platform, top, nextpnr_opts, synth_opts=""):
    """The self-test's build plan: the flow's synthesis (:func:`~mrcnic.flow.ecp5.synth_commands`,
    with ``synth_opts`` given to both of its ``synth_ecp5`` steps) and ``nextpnr_opts``."""
    first, after = synth_commands("top", synth_opts)
    return platform.build(top, name="top", do_build=False, do_program=False,
                          nextpnr_opts=nextpnr_opts, synth_opts=first,
                          script_after_synth="\n".join(after))


# Decision: Yosys 0.70's abc9 fails an internal assertion while reintegrating the mapped
# netlist of some flattened designs, deterministically (which designs and boards, and the
# options tried: docs/boards.md). The build then runs again with the hierarchy kept
# (synth_ecp5 -noflatten: abc9 maps each module apart; nextpnr flattens); summary.json names
# the option.
ABC9_BUG = "GetSize(conn.first) == GetSize(conn.second)"
ABC9_WORKAROUND = "-noflatten"


def _tail(path, lines=12):
    if not Path(path).exists():
        return ""
    return f"last lines of {path}:\n" + "".join(
        Path(path).read_text(errors="replace").splitlines(True)[-lines:])


def design_digest(plan):
    """A digest of what a build plan builds: its files (the RTLIL without source locations,
    the constraints, the script) and the tools' versions. A build whose ``summary.json``
    holds the same digest made the same bitstream."""
    parts = [json.dumps(tool_versions(), sort_keys=True)]
    for name in sorted(plan.files):
        content = plan.files[name]
        if isinstance(content, bytes):
            content = content.decode(errors="replace")
        parts.append(name + "\0" + (rtlil_digest(content) if name.endswith(".il") else content))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def selftest_result(board, build_dir, freq_mhz, pll_mhz, seconds, design="", selftest="nic",
                    synth_opts=""):
    """The :class:`SelfTestBuild` of a finished build in ``build_dir`` (nextpnr's
    ``report.json`` there), also written as ``summary.json``."""
    build_dir = Path(build_dir)
    report = json.loads((build_dir / "report.json").read_text())
    fmax, util = parse_nextpnr_report(report)
    # The PLL's net: named clk_selftest, or after flattening the design's own "clk" (Yosys
    # keeps one of a net's names); it is the clock constrained to the PLL's frequency.
    clock = next((c for c in fmax if "clk_selftest" in c), None) or next(
        (c for c in fmax if abs(fmax[c]["constraint"] - pll_mhz) <= 1e-3 * pll_mhz), None)
    achieved = fmax[clock]["achieved"] if clock else 0.0
    used = lambda kind: util.get(kind, {}).get("used", 0)
    result = SelfTestBuild(
        board=board, freq_mhz=freq_mhz, pll_mhz=pll_mhz, fmax_mhz=achieved,
        met=achieved >= max(freq_mhz, pll_mhz), luts=used("TRELLIS_COMB"),
        ffs=used("TRELLIS_FF"), brams=used("DP16KD"),
        available={k: v["available"] for k, v in util.items()},
        # through_block: through the design under test (the NIC, or the spray test).
        critical_path=(_critical_path(report, clock, "selftest.nic" if selftest == "nic"
                                      else "selftest") if clock else None),
        bitstream=str(build_dir / "top.bit"), seconds=seconds, tools=tool_versions(),
        design=design, selftest=selftest, synth_opts=synth_opts)
    summary = asdict(result)
    del summary["reused"]
    (build_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result
