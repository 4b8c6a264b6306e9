"""Every board the project builds for, in one table: :data:`TABLE`, one :class:`Board` per
board name (the name ``mrcnic build --board`` takes).

Each entry gives the board's amaranth-boards platform class, its family (:data:`ECP5`: built
here with the open toolchain; :data:`XILINX`: built with Vivado elsewhere, ``--plan-only``),
the pins of the board self-test (:class:`BoardPins`; None: no self-test fits the board), and
openFPGALoader's arguments that reach it (None: the user names the cable, ``--cable``).

The flow reads its own views of this table: ``mrcnic.flow.synth.BOARDS`` (the ECP5 boards),
``XILINX_BOARDS`` and ``get_board``, and ``mrcnic.flow.board.SELFTEST_BOARDS`` (the pin
maps); :mod:`mrcnic.boards.program` loads a board through the programmer it names. The table
imports nothing of the flow.
"""

from dataclasses import dataclass

from amaranth_boards.butterstick import ButterStickPlatform
from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform
from amaranth_boards.ecp5_5g_evn import ECP55GEVNPlatform
from amaranth_boards.ecpix5 import ECPIX545Platform, ECPIX585Platform
from amaranth_boards.icepi_zero import IcepiZero1_3Platform
from amaranth_boards.icesugar_pro import ICESugarProPlatform
from amaranth_boards.kc705 import KC705Platform
from amaranth_boards.kcu105 import KCU105Platform
from amaranth_boards.logicbone import Logicbone85FPlatform, LogicbonePlatform
from amaranth_boards.orangecrab_r0_1 import OrangeCrabR0_1Platform
from amaranth_boards.orangecrab_r0_2 import (OrangeCrabR0_2_25FPlatform,
                                             OrangeCrabR0_2_85FPlatform)
from amaranth_boards.supercon19badge import Supercon19BadgePlatform
from amaranth_boards.ulx3s import (ULX3S_12F_Platform, ULX3S_25F_Platform, ULX3S_45F_Platform,
                                   ULX3S_85F_Platform)
from amaranth_boards.versa_ecp5 import VersaECP5Platform
from amaranth_boards.versa_ecp5_5g import VersaECP55GPlatform

__all__ = ["ECP5", "XILINX", "BoardPins", "Board", "TABLE"]

ECP5 = "ECP5"
XILINX = "Xilinx"


@dataclass(frozen=True)
class BoardPins:
    """The pins the board self-test uses (``mrcnic.flow.board.BoardSelfTest``), its clock
    and what its build needs of nextpnr."""
    uart: bool                  # the board's "uart" 0 (tx, rx)
    leds: tuple                 # (resource, number, pin) per SelfTest LED; pin: None (the
                                # resource), a subsignal's name, or (subsignal, bit)
    buttons: tuple              # (resource, number) per plane's fail button
    planes: int = 2             # the self-test's planes on this board
    freq_mhz: float = 20.0      # the self-test's clock (the PLL must reach it within 1%)
    fixed: tuple = ()           # (resource, number, pin, value): outputs held constant
    nic_seed: int = 0           # nextpnr's --seed for the NIC self-test (0: its default)


@dataclass(frozen=True)
class Board:
    platform: type              # the amaranth-boards platform class
    family: str                 # ECP5 or XILINX
    pins: BoardPins | None      # the self-test's pins; None: no self-test
    loader: tuple | None        # openFPGALoader's arguments; None: the user names --cable
    # Only for a board whose toolchain_prepare is broken: the options of its own
    # toolchain_prepare, which the flow's build-only platform skips and applies itself.
    prepare_overrides: dict | None = None


# --- Self-test pins ------------------------------------------------------------------------

# LED order: running, bad, up, loss, plane 0 up, plane 1 up.
# speed grade 6 (the others: 8): the self-test's clock is the board clock x 2/3, what its
# longest paths reach after placement (docs/boards.md)
_ULX3S = BoardPins(True, tuple(("led", i, None) for i in range(6)),
                   (("button_fire", 0), ("button_fire", 1)), freq_mhz=16.667)
_ECPIX5 = BoardPins(True, (("rgb_led", 0, "g"), ("rgb_led", 0, "r"), ("rgb_led", 1, "g"),
                           ("rgb_led", 1, "b"), ("rgb_led", 2, "g"), ("rgb_led", 3, "g")), ())
_ORANGECRAB = BoardPins(False, (("rgb_led", 0, "g"), ("rgb_led", 0, "r")), (("button", 0),))
_LOGICBONE = BoardPins(False, tuple(("led", i, None) for i in range(4)), (("button", 0),))
_SIX_LEDS = tuple(("led", i, None) for i in range(6))


# --- The table -----------------------------------------------------------------------------

# ECP5: every ECP5 platform of amaranth-boards 0.0.21 (the MachXO2/XO3 ones share the base
# class and are left out: another family). OrangeCrabR0_2Platform is the same board as the
# 25F entry. The smaller devices of a family share its pins (the spray test only; the
# ULX3S-12F is too small even for that).
#
# openFPGALoader: its board entry (-b), or the cable (-c) of the programmer on the board.
# The boards without one (ButterStick, Logicbone, Icepi Zero, Supercon badge) are loaded
# through a cable the user names (--cable, openFPGALoader's -c).
#
# Xilinx: Vivado is not installed here, so for them `mrcnic build --plan-only` writes
# Amaranth's build plan (sources, constraints and Vivado scripts, as a zip) to run elsewhere;
# an MMCM makes the self-test's clock from the board's.
TABLE = {
    "ulx3s-12f": Board(ULX3S_12F_Platform, ECP5, None, ("-b", "ulx3s")),
    "ulx3s-25f": Board(ULX3S_25F_Platform, ECP5, _ULX3S, ("-b", "ulx3s")),
    "ulx3s-45f": Board(ULX3S_45F_Platform, ECP5, _ULX3S, ("-b", "ulx3s")),
    "ulx3s-85f": Board(ULX3S_85F_Platform, ECP5, _ULX3S, ("-b", "ulx3s")),
    "ecpix5-45f": Board(ECPIX545Platform, ECP5, _ECPIX5, ("-b", "ecpix5")),
    "ecpix5-85f": Board(ECPIX585Platform, ECP5, _ECPIX5, ("-b", "ecpix5")),
    # both Versas: the EVN's FT2232H programmer
    "versa-ecp5": Board(VersaECP5Platform, ECP5,
                        BoardPins(True, _SIX_LEDS, (("switch", 0), ("switch", 1))),
                        ("-c", "ft2232")),
    "versa-ecp5-5g": Board(VersaECP55GPlatform, ECP5,
                           BoardPins(True, _SIX_LEDS, (("switch", 0), ("switch", 1))),
                           ("-c", "ft2232")),
    "ecp5-5g-evn": Board(ECP55GEVNPlatform, ECP5,
                         BoardPins(True, _SIX_LEDS, (("switch", 1), ("switch", 2))),
                         ("-b", "ecp5_evn")),
    # its LED and button share their pins with the UART: the UART it is
    "colorlight-5a-75b-r7": Board(Colorlight_5A75B_R70Platform, ECP5, BoardPins(True, (), ()),
                                  ("-b", "colorlight")),
    # The OrangeCrabs are loaded through their DFU bootloader.
    "orangecrab-r0.1-25f": Board(OrangeCrabR0_1Platform, ECP5,
                                 BoardPins(False, _ORANGECRAB.leds, ()),
                                 ("-b", "orangeCrab")),
    "orangecrab-r0.2-25f": Board(OrangeCrabR0_2_25FPlatform, ECP5, _ORANGECRAB,
                                 ("-b", "orangeCrab")),
    "orangecrab-r0.2-85f": Board(OrangeCrabR0_2_85FPlatform, ECP5, _ORANGECRAB,
                                 ("-b", "orangeCrab")),
    # Seven LEDs sharing one colour select (active high, as the board's LiteX target drives
    # it): green on, red and blue off; no UART.
    "butterstick": Board(
        ButterStickPlatform, ECP5,
        BoardPins(False, tuple(("rgb_leds_muxed", 0, ("leds", i)) for i in range(6)),
                  (("button", 0), ("button", 1)),
                  fixed=(("rgb_leds_muxed", 0, "g", 1), ("rgb_leds_muxed", 0, "r", 0),
                         ("rgb_leds_muxed", 0, "b", 0)),
                  # The NIC placed with nextpnr's default seed did not route (router2: 333
                  # overused wires at iteration 30, then rising to 874 by 81); placed with
                  # seed 2 it routes.
                  nic_seed=2),
        None),
    "logicbone-45f": Board(LogicbonePlatform, ECP5, _LOGICBONE, None),
    "logicbone-85f": Board(Logicbone85FPlatform, ECP5, _LOGICBONE, None),
    "icesugar-pro": Board(ICESugarProPlatform, ECP5,
                          BoardPins(True, (("rgb_led", 0, "g"), ("rgb_led", 0, "r"),
                                           ("rgb_led", 0, "b")), ()),
                          ("-c", "cmsisdap", "--vid", "0x1d50", "--pid", "0x602b")),
    "icepi-zero": Board(IcepiZero1_3Platform, ECP5,
                        BoardPins(True, tuple(("led", i, None) for i in range(5)),
                                  (("button", 0), ("button", 1))),
                        None),
    # its LEDs are the common anodes of RGB LEDs of which one cathode is on by default: plain
    # LEDs while the cathodes are left alone.
    # Its toolchain_prepare is broken in amaranth-boards 0.0.21: it passes every option twice
    # ("got multiple values for keyword argument"), so it could not be given the nextpnr
    # report option at all. Its only override, reapplied by the build-only platform:
    "supercon19badge": Board(Supercon19BadgePlatform, ECP5,
                             BoardPins(True, _SIX_LEDS, (("button", 0), ("button", 1))),
                             None,
                             prepare_overrides={"ecppack_opts": "--compress --freq 38.8"}),
    "kcu105": Board(KCU105Platform, XILINX,      # XCKU040-2E, the board's LVDS clock
                    BoardPins(False, _SIX_LEDS, (), freq_mhz=62.5), None),
    "kc705": Board(KC705Platform, XILINX,        # XC7K325T-2, the board's LVDS clock
                   BoardPins(True, _SIX_LEDS, (), freq_mhz=62.5), None),
}
