"""Clock generation on a board: a ``sync`` domain from the board's oscillator through a PLL.

:func:`pll_sync_domain` is what the board tops use (the block harness of ``mrcnic build
--block``, the board self-tests): it requests the board's default clock, runs it through an
ECP5 ``EHXPLLL`` (:func:`find_pll`) or on a Xilinx board an MMCM and a BUFG
(:func:`find_mmcm`), and holds the domain in reset until the PLL locks.

The searches are exact (fractions of MHz, no float rounding in the choice) and refuse what
they cannot reach within 1 % (``ValueError``), before any tool runs.
"""

import math
from dataclasses import dataclass
from fractions import Fraction

from amaranth.hdl import ClockDomain, ClockSignal, Instance, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.vendor import XilinxPlatform

__all__ = ["PllConfig", "find_pll", "MmcmConfig", "find_mmcm", "pll_sync_domain"]


# --- ECP5 EHXPLLL ------------------------------------------------------------------------------

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
    ``vco = f_out * clkop_div``. Frequencies in MHz.

    Made by :func:`find_pll`, which keeps every value within the ranges below (the ECP5
    data sheet's); the class itself checks nothing. :meth:`instance` builds the gateware.

    Attributes
    ----------
    f_in_mhz : float
        The input (board oscillator) frequency, 8 .. 400.
    f_target_mhz : float
        The frequency asked for.
    f_out_mhz : float
        The output frequency the dividers give, 3.125 .. 400, within the search's tolerance
        of ``f_target_mhz``.
    clki_div, clkfb_div, clkop_div : int
        The input, feedback and output dividers: 1 .. 128, 1 .. 80, 1 .. 128.
    pfd_mhz : float
        The phase detector's frequency, ``f_in / clki_div``, 3.125 .. 400.
    vco_mhz : float
        The VCO's frequency, ``f_out * clkop_div``, 400 .. 800.
    error_ppm : float
        ``f_out_mhz``'s error against ``f_target_mhz``, in parts per million.
    """
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


# --- Xilinx MMCM -------------------------------------------------------------------------------

# Xilinx MMCM (MMCME2_BASE on 7-series, MMCME3_BASE on UltraScale): integer multiplier and
# dividers, and the VCO range every speed grade of both families allows.
MMCM_F_VCO = (600, 1200)
MMCM_F_PFD = (10, 450)
MMCM_MULT, MMCM_DIVCLK, MMCM_DIV = (2, 64), (1, 106), (1, 128)


@dataclass(frozen=True)
class MmcmConfig:
    """One MMCM setting: ``vco = f_in * mult / divclk``, ``f_out = vco / div`` (MHz).

    Made by :func:`find_mmcm`, which keeps every value within the ranges below (the VCO's
    is the one every speed grade of 7-series and UltraScale allows); the class itself
    checks nothing.
    :meth:`instance` builds the gateware: the MMCM and a BUFG on its output.

    Attributes
    ----------
    primitive : str
        ``"MMCME2_BASE"`` (7-series) or ``"MMCME3_BASE"`` (UltraScale).
    f_in_mhz : float
        The input (board oscillator) frequency.
    f_target_mhz : float
        The frequency asked for.
    f_out_mhz : float
        The output frequency the setting gives, within the search's tolerance of
        ``f_target_mhz``.
    mult : int
        The feedback multiplier (``CLKFBOUT_MULT_F``), 2 .. 64.
    divclk : int
        The input divider (``DIVCLK_DIVIDE``), 1 .. 106; ``f_in / divclk`` is 10 .. 450.
    div : int
        The output divider (``CLKOUT0_DIVIDE_F``), 1 .. 128.
    vco_mhz : float
        The VCO's frequency, 600 .. 1200.
    """
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


# --- The clock domain --------------------------------------------------------------------------

def pll_sync_domain(m, platform, freq_mhz, clk_name):
    """Add to ``m`` a ``sync`` domain clocked by a PLL at ``freq_mhz`` from the board's
    clock (an ECP5 EHXPLLL, or on a Xilinx board an MMCM), held in reset until the PLL
    locks; the clock net is named ``clk_name`` (the name nextpnr constrains and reports).

    The gateware: an input buffer on the board's default clock, the PLL (:func:`find_pll`)
    or the MMCM and its BUFG (:func:`find_mmcm`), and a
    :class:`~amaranth.lib.cdc.ResetSynchronizer` that holds ``sync`` in reset while the
    lock output is low and releases it on a clock edge. On ECP5 the PLL output carries the
    clock constraint (``f_out_mhz``); on a Xilinx board Vivado derives it from the board
    clock's.

    Parameters
    ----------
    m : Module
        The module to add the domain and the submodules to.
    platform : Platform
        The board; its ``default_clk`` is requested.
    freq_mhz : float
        The clock to ask of the PLL, reachable within 1 % from the board's clock.
    clk_name : str
        The name of the clock net.

    Returns
    -------
    PllConfig or MmcmConfig
        The setting chosen.

    Raises
    ------
    ValueError
        If no setting comes within 1 % of ``freq_mhz`` (or, on ECP5, the board clock is
        outside the PLL's input range).
    """
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
