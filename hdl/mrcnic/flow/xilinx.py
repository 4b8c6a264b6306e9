"""The Xilinx side of the flow, without Vivado (not installed here).

:func:`synth_xilinx` synthesises one block with Yosys ``synth_xilinx`` (the 512-bit rows of
``mrcnic report``) and :func:`parse_xilinx_stat` reads its cell counts. :func:`plan_only`
writes Amaranth's build plan of a top for a Xilinx board of
:data:`mrcnic.flow.synth.XILINX_BOARDS` (``mrcnic build --board kcu105 --plan-only``): the
Verilog, the constraints and the Vivado scripts, as a zip to run where Vivado is installed.
"""

from pathlib import Path

from mrcnic.flow.synth import XILINX_BOARDS
from mrcnic.flow.tools import lut_depth, yosys_alone

__all__ = ["XILINX_FAMILY", "synth_xilinx", "parse_xilinx_stat", "plan_only"]

XILINX_FAMILY = "xc7"


# --- Synthesis -----------------------------------------------------------------------------

_XILINX_LUTS = tuple(f"LUT{n}" for n in range(1, 7))
_XILINX_COMB = set(_XILINX_LUTS) | {"MUXF7", "MUXF8", "CARRY4"}


def parse_xilinx_stat(stat):
    """``{"luts", "ffs", "bram36", "bram18", "lutram", "srl", "carry", "dsps", "cells"}`` from
    ``stat -json`` after ``synth_xilinx``. LUT RAM counts cells (RAM32M, RAM64X1D, ...), not
    the LUTs they occupy."""
    cells = stat.get("design", {}).get("num_cells_by_type")
    if cells is None:
        (module,) = stat["modules"].values()
        cells = module["num_cells_by_type"]
    count = lambda pred: sum(n for kind, n in cells.items() if pred(kind))
    return {
        "luts": count(lambda k: k in _XILINX_LUTS),
        "ffs": count(lambda k: k in ("FDRE", "FDSE", "FDCE", "FDPE")),
        "bram36": count(lambda k: k.startswith("RAMB36")),
        "bram18": count(lambda k: k.startswith("RAMB18")),
        "lutram": count(lambda k: k.startswith("RAM") and not k.startswith("RAMB")),
        "srl": count(lambda k: k.startswith("SRL")),
        "carry": count(lambda k: k.startswith("CARRY")),
        "dsps": count(lambda k: k.startswith("DSP")),
        "cells": dict(cells),
    }


def synth_xilinx(component, module, work_dir, *, family=XILINX_FAMILY, env=None):
    """Synthesise ``component`` with Yosys ``synth_xilinx -family <family>``, flattened; returns
    :func:`parse_xilinx_stat`'s figures plus ``"lut_depth"`` (LUT levels; the MUXF7/F8 that
    widen a LUT and the carry chain are not counted)."""
    stat, netlist = yosys_alone(
        component, module, work_dir,
        f"synth_xilinx -family {family} -flatten -noiopad -top {module}", env=env)
    figures = parse_xilinx_stat(stat)
    figures["lut_depth"] = lut_depth(netlist, module, comb=_XILINX_COMB,
                                     levels=_XILINX_LUTS, chain="CI")
    return figures


# --- Build plans ---------------------------------------------------------------------------

def plan_only(board, top, out_dir):
    """Amaranth's build plan of ``top`` (a :class:`~mrcnic.flow.harness.BlockHarness` or a
    board self-test) for the Xilinx ``board``, written as ``top_plan.zip`` in ``out_dir``: the
    Verilog, the constraints and the Vivado scripts (``build_top.sh``) to run where Vivado is
    installed. Returns the zip's path."""
    if board not in XILINX_BOARDS:
        raise ValueError(f"--plan-only is for the Xilinx boards ({', '.join(XILINX_BOARDS)}); "
                         f"{board!r} builds here")
    plan = XILINX_BOARDS[board]().build(top, name="top", do_build=False, do_program=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan.archive(out / "top_plan.zip")
    return out / "top_plan.zip"
