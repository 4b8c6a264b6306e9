"""Register bring-up without a processor: a script of register accesses recorded in
Python and played by gateware, :class:`CsrScript` (``csr-script``).

A board's self-test top has no CPU to run :mod:`mrcnic.host.bringup`. Instead the bring-up
coroutines run once, at elaboration, against a :class:`ScriptRecorder`: a stand-in for
the register bus that answers reads from a mirror of the registers (the directories of
the buses, reset values, what was written) and records every write, and every wait for a
busy flag, as an operation. :class:`CsrScript` holds the operations in a ROM and plays
them on its AXI4-Lite master port after reset.

Operations (:data:`OP_WRITE`, :data:`OP_POLL`): ``(OP_WRITE, addr, data)`` writes a word;
``(OP_POLL, addr, mask)`` reads the word until ``word & mask`` is 0 (a busy flag that
:meth:`~mrcnic.host.driver.RegisterDriver.wait_clear` waits for). The recorder can only answer
what does not depend on the hardware's state: a read of anything but the directories,
rw fields and the read-only values it was given is an error, so a script never depends
on a value guessed at elaboration.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out

from mrcnic.base.csr import RESP_OKAY, AxiLiteSignature, CsrError
from mrcnic.base.csr.bus import CsrBus

__all__ = ["CsrScript", "ScriptRecorder", "OP_WRITE", "OP_POLL", "record"]

OP_WRITE = 0
OP_POLL = 1


class ScriptRecorder:
    """A register bus for :mod:`mrcnic.host.bringup` that records a script.

    ``buses``: ``[(base, CsrBus)]``, every bus of the address space, a nested one at its
    own base (window k of a bus is at ``base + (k << window_bits)``; a block's registers
    are those of its type's register map). ``ro``: ``{(block type, register): word}``,
    the value of each register with read-only fields that the bring-up reads (the
    ``info`` parameters, an error register taken as clear), for every block of the type.
    ``recorder.read`` and ``recorder.write`` are the bus coroutines.
    """

    def __init__(self, buses, ro=None):
        from mrcnic.host.bringup import _regmaps
        maps = _regmaps()
        self.ops = []
        self._words = {}                     # byte address -> current word
        self._regs = {}                      # byte address -> (block, Register)
        self._known = set()                  # addresses of read-only values given
        ro = dict(ro or {})
        unused = set(ro)
        nested = {base for base, _ in buses}
        for base, bus in buses:
            if not isinstance(bus, CsrBus):
                raise CsrError(f"bus at 0x{base:x} is a {type(bus).__name__}, not a CsrBus")
            for i, word in enumerate(bus.words):
                self._words[base + 4 * i] = word
            for k, (name, _) in enumerate(bus.blocks):
                where = base + ((k + 1) << bus.window_bits)
                if name == "csr-bus":
                    if where not in nested:
                        raise CsrError(f"nested bus at 0x{where:x} not given")
                    continue
                for reg in maps[name].registers.values():
                    addr = where + reg.offset
                    self._regs[addr] = (name, reg)
                    self._words[addr] = _reset(reg)
                    if (name, reg.name) in ro:
                        self._words[addr] = ro[name, reg.name]
                        self._known.add(addr)
                        unused.discard((name, reg.name))
        if unused:
            raise CsrError(f"read-only values for registers not on the buses: {sorted(unused)}")
        self.read = _Read(self)

    async def write(self, addr, value):
        if addr in self._regs:
            _, reg = self._regs[addr]
            keep = sum(f.mask for f in _fields(reg) if f.access == "rw")
            self._words[addr] = value & keep          # pulses and commands read back 0
        elif addr in self._words:
            raise CsrError(f"write to the directory at 0x{addr:x}")
        else:
            raise CsrError(f"write to 0x{addr:x}: no register there")
        self.ops.append((OP_WRITE, addr, value & 0xFFFFFFFF))

    def _read_word(self, addr):
        if addr not in self._words:
            raise CsrError(f"read of 0x{addr:x}: no register there")
        if addr in self._regs:
            name, reg = self._regs[addr]
            if any(f.access == "ro" for f in _fields(reg)) and addr not in self._known:
                raise CsrError(f"read of {name}.{reg.name}: its value depends on the hardware "
                               "(a script cannot know it)")
        return self._words[addr]

    async def poll(self, addr, mask):
        if addr not in self._regs:
            raise CsrError(f"poll of 0x{addr:x}: no register there")
        self.ops.append((OP_POLL, addr, mask))


class _Read:
    """The recorder's read coroutine; it also carries ``poll`` (see
    :meth:`~mrcnic.host.driver.RegisterDriver.wait_clear`)."""

    def __init__(self, recorder):
        self.poll = recorder.poll
        self._recorder = recorder

    async def __call__(self, addr):
        return self._recorder._read_word(addr)


def _fields(reg):
    return reg.fields.values() if isinstance(reg.fields, dict) else reg.fields


def _reset(reg):
    return sum((f.reset & ((1 << f.width) - 1)) << f.offset for f in _fields(reg))


def record(buses, coroutine_fn, ro=None):
    """Run ``coroutine_fn(read, write)`` (a bring-up) against a :class:`ScriptRecorder`
    of ``buses``; returns the operations."""
    rec = ScriptRecorder(buses, ro)
    coro = coroutine_fn(rec.read, rec.write)
    try:
        coro.send(None)
    except StopIteration:
        return rec.ops
    raise CsrError("the bring-up awaited something other than the recorder's bus")


class CsrScript(wiring.Component):
    """Plays a recorded script of register accesses on an AXI4-Lite master port after reset.

    The operations (:func:`record` makes them; module docstring) are held in a ROM and
    played in order, one at a time: ``(OP_WRITE, addr, data)`` writes ``data`` to
    ``addr`` (all four byte strobes); ``(OP_POLL, addr, mask)`` reads ``addr`` again and
    again until ``word & mask`` is 0. A response other than OKAY sets ``error`` and the
    script goes on with the next operation (a poll never waits on an error).

    Parameters
    ----------
    ops : list of (int, int, int)
        ``(op, addr, word)`` per operation: ``op`` :data:`OP_WRITE` or :data:`OP_POLL`;
        ``addr`` a byte address, a multiple of 4, below ``2^addr_width``; ``word`` (the
        data, or the poll's mask) 32 bits. May be empty.
    addr_width : int
        Address width of the port, >= 1.

    Attributes
    ----------
    m_axil : AXI4-Lite (``addr_width``, 32-bit data), out
        The master port; ``wiring.connect`` it to the bus's ``s_axil``.
    done : Signal(1), out
        High once the last operation has completed.
    error : Signal(1), out
        Sticky: a response was not OKAY.
    step : Signal(range(len(ops) + 1)), out
        The index of the operation under way (``len(ops)`` when done), for a status
        display.

    Throughput
    ----------
    One operation at a time: a write takes its AW/W handshake and its B response; a poll
    its AR handshake and its R response, again until clear. At most one transaction is
    outstanding, so any AXI4-Lite slave works.

    Raises
    ------
    CsrError
        A ``ValueError``: if an operation is neither :data:`OP_WRITE` nor :data:`OP_POLL`,
        an address does not fit ``addr_width`` bits or is not word aligned, a word is not
        in 0 .. 2^32 - 1, or ``addr_width`` is below 1.
    """

    def __init__(self, ops, addr_width):
        ops = [tuple(int(x) for x in op) for op in ops]
        for op, addr, word in ops:
            if op not in (OP_WRITE, OP_POLL):
                raise CsrError(f"unknown script operation {op}")
            if not 0 <= addr < 1 << addr_width or addr % 4:
                raise CsrError(f"script address 0x{addr:x} does not fit {addr_width} bits "
                               "or is not word aligned")
            if not 0 <= word < 1 << 32:
                raise CsrError(f"script word 0x{word:x} is wider than 32 bits")
        self.ops = ops
        self.addr_width = addr_width
        super().__init__({
            "m_axil": Out(AxiLiteSignature(addr_width)),
            "done": Out(1), "error": Out(1), "step": Out(range(len(ops) + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        n = len(self.ops)
        aw = self.addr_width
        entry_bits = 1 + aw + 32
        init = [op | addr << 1 | word << (1 + aw) for op, addr, word in self.ops] or [0]
        m.submodules.rom = rom = Memory(shape=entry_bits, depth=max(n, 1), init=init)
        rd = rom.read_port(domain="comb")
        bus = self.m_axil
        step = Signal(range(n + 1))
        m.d.comb += [rd.addr.eq(step), self.step.eq(step), self.done.eq(step == n),
                     bus.wstrb.eq(0xF)]
        op = rd.data[0]
        addr = rd.data[1:1 + aw]
        word = rd.data[1 + aw:]
        aw_done = Signal()
        w_done = Signal()
        error = Signal()
        m.d.comb += self.error.eq(error)
        with m.FSM():
            with m.State("ISSUE"):
                with m.If(step != n):
                    with m.If(op == OP_WRITE):
                        m.next = "WRITE"
                    with m.Else():
                        m.next = "READ"
            with m.State("WRITE"):
                m.d.comb += [bus.awaddr.eq(addr), bus.wdata.eq(word),
                             bus.awvalid.eq(~aw_done), bus.wvalid.eq(~w_done)]
                with m.If(bus.awvalid & bus.awready):
                    m.d.sync += aw_done.eq(1)
                with m.If(bus.wvalid & bus.wready):
                    m.d.sync += w_done.eq(1)
                with m.If((aw_done | bus.awready) & (w_done | bus.wready)):
                    m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                    m.next = "B"
            with m.State("B"):
                m.d.comb += bus.bready.eq(1)
                with m.If(bus.bvalid):
                    with m.If(bus.bresp != RESP_OKAY):
                        m.d.sync += error.eq(1)
                    m.d.sync += step.eq(step + 1)
                    m.next = "ISSUE"
            with m.State("READ"):
                m.d.comb += [bus.araddr.eq(addr), bus.arvalid.eq(1)]
                with m.If(bus.arready):
                    m.next = "R"
            with m.State("R"):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    with m.If(bus.rresp != RESP_OKAY):
                        m.d.sync += [error.eq(1), step.eq(step + 1)]   # never wait on an error
                    with m.Elif((bus.rdata & word) == 0):
                        m.d.sync += step.eq(step + 1)
                    m.next = "ISSUE"
        return m
