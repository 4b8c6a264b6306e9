"""The boards the flow builds for: views of the one board table, :mod:`mrcnic.boards.table`.

:data:`BOARDS` names the ECP5 boards (every ECP5 board of amaranth-boards 0.0.21), built here
with the open toolchain; :data:`XILINX_BOARDS` the Xilinx boards, for which ``mrcnic build
--plan-only`` writes Vivado's build plan. Both map a board name to its amaranth-boards
platform class, in the table's order; :func:`get_board` looks up either.

The flow's synthesis is split by concern: :mod:`mrcnic.base.clocking` (the PLL and MMCM),
:mod:`mrcnic.flow.harness` (the block harness), :mod:`mrcnic.flow.tools` (the YoWASP tools),
:mod:`mrcnic.flow.ecp5` (``mrcnic build --block``: place and route, reports) and
:mod:`mrcnic.flow.xilinx` (Yosys ``synth_xilinx``, Vivado build plans).
"""

from mrcnic.boards.table import ECP5, TABLE, XILINX

__all__ = ["BOARDS", "XILINX_BOARDS", "get_board"]


BOARDS = {name: b.platform for name, b in TABLE.items() if b.family == ECP5}
XILINX_BOARDS = {name: b.platform for name, b in TABLE.items() if b.family == XILINX}


def get_board(name):
    """The amaranth-boards platform class of board ``name``; ``ValueError`` lists the names."""
    try:
        return {**BOARDS, **XILINX_BOARDS}[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}; boards: "
                         f"{', '.join([*BOARDS, *XILINX_BOARDS])}") from None
