"""AXI4-Lite register blocks, declared once.

A block lists its registers as data (:class:`Field`, :class:`Register`, :class:`RegisterMap`)
and gets from that one declaration

* the gateware, :class:`CsrBlock`, an AXI4-Lite slave with one plain Signal per field;
* a Python driver, :class:`RegisterDriver`, that needs nothing but a ``read(addr)`` and a
  ``write(addr, value)`` coroutine, so the same code runs over Amaranth's simulator
  (``testkit/axil.py``), cocotbext-axi's ``AxiLiteMaster`` or a real bus;
* a Markdown table for the docs, :meth:`RegisterMap.markdown`.

Field access kinds:

====== ================================================== ===================================
access software                                           gateware
====== ================================================== ===================================
rw     reads and writes the value                         reads an output held in a register
ro     reads the value                                    drives an input Signal
w1p    writing 1 to a bit pulses it for one cycle; reads 0 reads a one-cycle output pulse
w1c    reads the sticky bit; writing 1 clears it          pulses ``<field>_set`` to set it,
                                                          reads the sticky bit
====== ================================================== ===================================
"""

import keyword
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = [
    "CsrError", "ACCESS", "RESP_OKAY", "RESP_SLVERR",
    "AxiLiteSignature", "Field", "Register", "RegisterMap", "CsrBlock", "RegisterDriver",
    "COUNTER_WIDTHS", "check_counter_width", "event_counters", "mac_registers",
    "ipv6_registers", "ipv6_value",
]


ACCESS = ("rw", "ro", "w1p", "w1c")
RESP_OKAY = 0b00
RESP_SLVERR = 0b10
# The set input of a w1c field ``x`` is ``x`` + this suffix.
SET_SUFFIX = "_set"


class CsrError(ValueError):
    """A register map that cannot be built, or a driver call that names what does not exist."""


def _check_name(kind, name):
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise CsrError(f"{kind} name {name!r} is not a Python identifier")


def _bits(lsb, width):
    return str(lsb) if width == 1 else f"{lsb + width - 1}:{lsb}"


# --- Interface -----------------------------------------------------------------------------

class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite, from the master's point of view; a slave port is ``In(AxiLiteSignature(...))``.

    Parameters: ``addr_width`` >= 1 (byte address), ``data_width`` 32 or 64.
    """

    def __init__(self, addr_width, data_width=32):
        if not isinstance(addr_width, int) or addr_width < 1:
            raise CsrError(f"addr_width must be a positive integer, not {addr_width!r}")
        if data_width not in (32, 64):
            raise CsrError(f"AXI4-Lite data_width must be 32 or 64, not {data_width!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "awaddr":  Out(addr_width),
            "awprot":  Out(3),
            "awvalid": Out(1),
            "awready": In(1),
            "wdata":   Out(data_width),
            "wstrb":   Out(data_width // 8),
            "wvalid":  Out(1),
            "wready":  In(1),
            "bresp":   In(2),
            "bvalid":  In(1),
            "bready":  Out(1),
            "araddr":  Out(addr_width),
            "arprot":  Out(3),
            "arvalid": Out(1),
            "arready": In(1),
            "rdata":   In(data_width),
            "rresp":   In(2),
            "rvalid":  In(1),
            "rready":  Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AxiLiteSignature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    def __repr__(self):
        return f"AxiLiteSignature({self.addr_width}, {self.data_width})"


# --- Declarations --------------------------------------------------------------------------

class Field:
    """``width`` bits of a register with one ``access`` kind (see module docstring).

    ``offset`` is the bit position in the register; ``None`` packs the field right after the
    previous one. ``reset`` is the value after reset (rw, w1c) or the value read while the
    gateware leaves the input undriven (ro); w1p fields reset to 0.
    """

    def __init__(self, name, width, access, reset=0, desc="", *, offset=None):
        _check_name("field", name)
        if not isinstance(width, int) or width < 1:
            raise CsrError(f"field {name!r}: width {width!r} must be an integer >= 1")
        if access not in ACCESS:
            raise CsrError(f"field {name!r}: access {access!r} is not one of "
                           f"{', '.join(ACCESS)}")
        if not isinstance(reset, int) or not 0 <= reset < (1 << width):
            raise CsrError(f"field {name!r}: reset {reset!r} does not fit {width} bit(s)")
        if access == "w1p" and reset:
            raise CsrError(f"field {name!r}: a w1p field is a pulse and resets to 0, "
                           f"not {reset:#x}")
        if offset is not None and (not isinstance(offset, int) or offset < 0):
            raise CsrError(f"field {name!r}: bit offset {offset!r} must be an integer >= 0")
        self.name = name
        self.width = width
        self.access = access
        self.reset = reset
        self.desc = desc
        self.offset = offset     # bit position; final once packed into a Register

    @property
    def mask(self):
        return ((1 << self.width) - 1) << self.offset

    @property
    def bits(self):
        return _bits(self.offset, self.width)

    def __repr__(self):
        return f"Field({self.name!r}, {self.width}, {self.access!r}, bits {self.bits})"


class Register:
    """One data word of fields, at byte ``offset`` (``None``: the word after the previous
    register of the map)."""

    def __init__(self, name, fields, desc="", *, offset=None):
        _check_name("register", name)
        fields = list(fields)
        if not fields:
            raise CsrError(f"register {name!r} has no fields")
        if offset is not None and (not isinstance(offset, int) or offset < 0):
            raise CsrError(f"register {name!r}: offset {offset!r} must be an integer >= 0")
        self.name = name
        self.desc = desc
        self.offset = offset
        self.fields = {}
        owners = {}              # every name a field takes -> what took it, for the message
        next_bit = 0
        for f in fields:
            if not isinstance(f, Field):
                raise CsrError(f"register {name!r}: {f!r} is not a Field")
            # A Field is placed once; copying keeps a Field object reusable across registers.
            f = Field(f.name, f.width, f.access, f.reset, f.desc,
                      offset=next_bit if f.offset is None else f.offset)
            taken = {f.name: None}
            if f.access == "w1c":
                taken[f.name + SET_SUFFIX] = f"the set input of w1c field {f.name!r}"
            for n, owner in taken.items():
                if n in owners:
                    why = owner or owners[n]
                    raise CsrError(f"register {name!r}: name {n!r} is used twice"
                                   + (f" ({why})" if why else ""))
                owners[n] = owner
            for g in self.fields.values():
                if f.mask & g.mask:
                    raise CsrError(f"register {name!r}: field {f.name!r} (bits {f.bits}) "
                                   f"overlaps field {g.name!r} (bits {g.bits})")
            self.fields[f.name] = f
            next_bit = f.offset + f.width

    @property
    def width(self):
        return max(f.offset + f.width for f in self.fields.values())

    @property
    def reset(self):
        return sum(f.reset << f.offset for f in self.fields.values())

    def field(self, name):
        try:
            return self.fields[name]
        except KeyError:
            raise CsrError(f"register {self.name!r} has no field {name!r}") from None

    def pack(self, **values):
        """Word with the named fields set (others 0); values must fit their fields."""
        word = 0
        for name, value in values.items():
            f = self.field(name)
            if not isinstance(value, int) or not 0 <= value < (1 << f.width):
                raise CsrError(f"register {self.name!r}: value {value!r} does not fit the "
                               f"{f.width}-bit field {name!r}")
            word |= value << f.offset
        return word

    def unpack(self, word):
        return {n: (word >> f.offset) & ((1 << f.width) - 1) for n, f in self.fields.items()}

    def __repr__(self):
        return f"Register({self.name!r}, offset {self.offset!r}, {list(self.fields)})"


class RegisterMap:
    """Registers at byte offsets ``0, 4, 8, ...`` (8 apart at ``data_width=64``) unless given.

    ``addr_width`` is the smallest byte-address width that reaches the last register.
    """

    def __init__(self, name, registers, *, data_width=32):
        _check_name("register map", name)
        if data_width not in (32, 64):
            raise CsrError(f"regmap {name!r}: data_width must be 32 or 64, "
                           f"not {data_width!r}")
        registers = list(registers)
        if not registers:
            raise CsrError(f"regmap {name!r} has no registers")
        self.name = name
        self.data_width = data_width
        self.word_bytes = data_width // 8
        self.registers = {}
        by_offset = {}
        next_offset = 0
        for r in registers:
            if not isinstance(r, Register):
                raise CsrError(f"regmap {name!r}: {r!r} is not a Register")
            if r.name in self.registers:
                raise CsrError(f"regmap {name!r}: register name {r.name!r} is used twice")
            offset = next_offset if r.offset is None else r.offset
            if offset % self.word_bytes:
                raise CsrError(f"regmap {name!r}: register {r.name!r} offset {offset:#x} is "
                               f"not a multiple of {self.word_bytes}")
            if offset in by_offset:
                raise CsrError(f"regmap {name!r}: register {r.name!r} at {offset:#x} overlaps "
                               f"register {by_offset[offset].name!r}")
            for f in r.fields.values():
                if f.offset + f.width > data_width:
                    raise CsrError(f"regmap {name!r}: register {r.name!r} field {f.name!r} "
                                   f"(bits {f.bits}) does not fit {data_width} bits")
            placed = Register(r.name, r.fields.values(), r.desc, offset=offset)
            self.registers[r.name] = placed
            by_offset[offset] = placed
            next_offset = offset + self.word_bytes
        last = max(by_offset)
        self.addr_width = max(1, (last + self.word_bytes - 1).bit_length())

    def __getitem__(self, name):
        try:
            return self.registers[name]
        except KeyError:
            raise CsrError(f"regmap {self.name!r} has no register {name!r}") from None

    def __iter__(self):
        return iter(self.registers.values())

    def __len__(self):
        return len(self.registers)

    def offset(self, name):
        return self[name].offset

    def markdown(self):
        """A Markdown title line and table: one row per register, then one per field."""
        def row(*cells):
            cells = (" ".join(str(c).split()).replace("|", "\\|") for c in cells)
            return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
        hexw = self.data_width // 4
        lines = [
            f"**{self.name}**: {len(self)} registers, {self.data_width}-bit AXI4-Lite, "
            f"addr_width {self.addr_width}",
            "",
            "| offset | register | field | bits | access | reset | description |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in sorted(self, key=lambda r: r.offset):
            lines.append(row(f"0x{r.offset:02x}", f"`{r.name}`", "", "", "",
                             f"0x{r.reset:0{hexw}x}", r.desc))
            for f in sorted(r.fields.values(), key=lambda f: f.offset):
                lines.append(row("", "", f"`{f.name}`", f.bits, f.access, f"{f.reset:#x}",
                                 f.desc))
        return "\n".join(lines) + "\n"


# --- Gateware ------------------------------------------------------------------------------

class CsrBlock(wiring.Component):
    """AXI4-Lite slave holding the registers of a :class:`RegisterMap`.

    Operation
        AW and W are accepted independently, in either order; each channel has a one-entry
        holding register, so the first to arrive waits there for the other. A write is
        performed when both are present and the B register is free (or being emptied in the
        same cycle), and answered on B. A read is performed when AR is present and the R
        register is free (or being emptied); R carries the register value sampled on that
        edge. While B (R) is held by ``bready`` (``rready``) low, at most one further write
        (read) is accepted and parked; ``awready``/``wready`` (``arready``) then drop, so no
        response is ever lost or duplicated, whatever the master does.

        Write data: ``wstrb`` bit ``i`` enables byte ``i`` for every field kind (an rw byte
        not enabled keeps its value; a w1p/w1c bit in it neither pulses nor clears). A
        write to an all-ro register is accepted (OKAY) and changes nothing. Addresses are
        byte addresses; the low ``log2(data_width/8)`` bits are ignored. An address where
        no register is declared answers SLVERR on B or R, writes nothing, reads 0.
        ``awprot``/``arprot`` are ignored. A read and a write of the same register on the
        same edge: the read returns the old value.

    Parameters
        ``regmap``: the :class:`RegisterMap`; its ``data_width`` (32 or 64) and
        ``addr_width`` size the port.

    Ports
        ``s_axil``: ``In(AxiLiteSignature(regmap.addr_width, regmap.data_width))``.
        Every AXI output, the readies included, and every field output comes straight from a
        flip-flop: no combinational path from any input.

        Field signals, in ``fields[reg][field]`` and ``f.<reg>.<field>``, are plain Signals
        (not signature members) named ``<reg>_<field>``:

        * rw: output, the register itself, init = ``reset``;
        * w1p: output, high for exactly one cycle per written 1 bit;
        * w1c: output, the sticky bit, init = ``reset``; and input ``<field>_set``: a 1 bit
          sets the sticky bit on the next edge (a set wins over a clear on the same edge);
        * ro: input, init = ``reset`` (read while undriven); sampled on the read edge.

    Latency
        Write: 1 cycle. ``bvalid`` is high in the cycle after the edge on which the later of
        AW and W is accepted (B free); the rw/w1c outputs have their new value and the w1p
        outputs pulse in that same cycle. Read: 1 cycle, ``rvalid`` in the cycle after the AR
        handshake. A parked request is performed on the edge that empties B (R).

    Throughput
        One write per cycle and, at the same time, one read per cycle, without bubbles, while
        ``bready``/``rready`` stay high and AW comes with W. A master that waits for each
        response before the next request gets one write, or one read, per 2 cycles. Both
        figures are measured in ``sim/base/test_csr.py``.

    Resources
        The demo map of ``sim/base/test_csr.py`` (7 registers, 81 bits of rw/w1p/w1c state):
        159 flip-flops, 275 LUT4 (Yosys 0.70 ``synth_ecp5``). The AW/W/AR holding registers
        and the R data register are about 80 of those flip-flops: the price of full rate
        with registered readies.
    """

    def __init__(self, regmap):
        if not isinstance(regmap, RegisterMap):
            raise CsrError(f"CsrBlock needs a RegisterMap, not {regmap!r}")
        self.regmap = regmap
        super().__init__({"s_axil": In(AxiLiteSignature(regmap.addr_width, regmap.data_width))})
        self.fields = {}
        self.f = SimpleNamespace()
        for r in regmap:
            sigs = {}
            for fd in r.fields.values():
                init = 0 if fd.access == "w1p" else fd.reset
                sigs[fd.name] = Signal(fd.width, init=init, name=f"{r.name}_{fd.name}")
                if fd.access == "w1c":
                    sigs[fd.name + SET_SUFFIX] = Signal(
                        fd.width, name=f"{r.name}_{fd.name}{SET_SUFFIX}")
            self.fields[r.name] = sigs
            setattr(self.f, r.name, SimpleNamespace(**sigs))

    def elaborate(self, platform):
        m = Module()
        bus = self.s_axil
        regmap = self.regmap
        dw = regmap.data_width
        lsb = (regmap.word_bytes - 1).bit_length()    # address bits below the word index

        def word_index(addr):
            return addr[lsb:] if len(addr) > lsb else Const(0, 1)

        # --- Write path: AW and W holding registers, one B register ---
        aw_full = Signal()
        aw_addr = Signal.like(bus.awaddr)
        w_full = Signal()
        w_data = Signal.like(bus.wdata)
        w_strb = Signal.like(bus.wstrb)
        bvalid = Signal()
        bresp = Signal(2)
        m.d.comb += [
            bus.awready.eq(~aw_full),
            bus.wready.eq(~w_full),
            bus.bvalid.eq(bvalid),
            bus.bresp.eq(bresp),
        ]
        # A channel is "present" if parked or handshaking now; the parked copy comes first.
        aw_here = aw_full | bus.awvalid
        w_here = w_full | bus.wvalid
        b_free = ~bvalid | bus.bready
        wr_go = aw_here & w_here & b_free
        wr_addr = Mux(aw_full, aw_addr, bus.awaddr)
        wr_data = Mux(w_full, w_data, bus.wdata)
        wr_strb = Mux(w_full, w_strb, bus.wstrb)
        wr_mask = Cat(wr_strb[i // 8] for i in range(dw))
        wr_bits = Signal(dw)     # bits written 1 with their byte enabled
        m.d.comb += wr_bits.eq(wr_data & wr_mask)

        with m.If(wr_go):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), bvalid.eq(1)]
        with m.Else():
            with m.If(bvalid & bus.bready):
                m.d.sync += bvalid.eq(0)
            with m.If(bus.awvalid & ~aw_full):
                m.d.sync += [aw_full.eq(1), aw_addr.eq(bus.awaddr)]
            with m.If(bus.wvalid & ~w_full):
                m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]

        # w1p outputs are pulses: zero unless written on this very edge.
        for r in regmap:
            for fd in r.fields.values():
                if fd.access == "w1p":
                    m.d.sync += self.fields[r.name][fd.name].eq(0)

        # w1c sticky bits: set by the gateware, cleared by writes; a set wins over a clear so
        # that an event arriving on the clearing edge is not lost.
        w1c_clear = {}
        for r in regmap:
            for fd in r.fields.values():
                if fd.access == "w1c":
                    sticky = self.fields[r.name][fd.name]
                    set_ = self.fields[r.name][fd.name + SET_SUFFIX]
                    clear = Signal(fd.width, name=f"{r.name}_{fd.name}_clear")
                    m.d.sync += sticky.eq((sticky & ~clear) | set_)
                    w1c_clear[(r.name, fd.name)] = clear

        with m.If(wr_go):
            with m.Switch(word_index(wr_addr)):
                for r in regmap:
                    with m.Case(r.offset >> lsb):
                        m.d.sync += bresp.eq(RESP_OKAY)
                        for fd in r.fields.values():
                            sig = self.fields[r.name][fd.name]
                            bits = wr_bits[fd.offset:fd.offset + fd.width]
                            if fd.access == "rw":
                                mask = wr_mask[fd.offset:fd.offset + fd.width]
                                m.d.sync += sig.eq((sig & ~mask) | bits)
                            elif fd.access == "w1p":
                                m.d.sync += sig.eq(bits)
                            elif fd.access == "w1c":
                                m.d.comb += w1c_clear[(r.name, fd.name)].eq(bits)
                with m.Default():
                    m.d.sync += bresp.eq(RESP_SLVERR)

        # --- Read path: AR holding register, one R register ---
        ar_full = Signal()
        ar_addr = Signal.like(bus.araddr)
        rvalid = Signal()
        rdata = Signal(dw)
        rresp = Signal(2)
        m.d.comb += [
            bus.arready.eq(~ar_full),
            bus.rvalid.eq(rvalid),
            bus.rdata.eq(rdata),
            bus.rresp.eq(rresp),
        ]
        rd_go = (ar_full | bus.arvalid) & (~rvalid | bus.rready)
        rd_addr = Mux(ar_full, ar_addr, bus.araddr)

        with m.If(rd_go):
            m.d.sync += [ar_full.eq(0), rvalid.eq(1)]
            with m.Switch(word_index(rd_addr)):
                for r in regmap:
                    with m.Case(r.offset >> lsb):
                        word = Const(0, dw)
                        for fd in r.fields.values():
                            if fd.access != "w1p":      # w1p reads 0
                                word = word | (self.fields[r.name][fd.name] << fd.offset)
                        m.d.sync += [rdata.eq(word), rresp.eq(RESP_OKAY)]
                with m.Default():
                    m.d.sync += [rdata.eq(0), rresp.eq(RESP_SLVERR)]
        with m.Else():
            with m.If(rvalid & bus.rready):
                m.d.sync += rvalid.eq(0)
            with m.If(bus.arvalid & ~ar_full):
                m.d.sync += [ar_full.eq(1), ar_addr.eq(bus.araddr)]

        return m


# --- Python driver -------------------------------------------------------------------------

class RegisterDriver:
    """Register-level access through two bus coroutines.

    ``read(addr)`` must return (an awaitable of) the data word at byte address ``addr``;
    ``write(addr, value)`` must write a whole word. ``base`` is added to every register
    offset. Over cocotbext-axi: ``RegisterDriver(regmap, axil.read_dword, axil.write_dword)``
    (``read_qword``/``write_qword`` at 64 bits).
    """

    def __init__(self, regmap, read, write, base=0):
        self.regmap = regmap
        self.base = base
        self._read = read
        self._write = write

    def _addr(self, reg):
        return self.base + self.regmap[reg].offset

    async def read(self, reg):
        return int(await self._read(self._addr(reg)))

    async def read_fields(self, reg):
        return self.regmap[reg].unpack(await self.read(reg))

    async def read_field(self, reg, field):
        self.regmap[reg].field(field)          # fail on a bad name before touching the bus
        return (await self.read_fields(reg))[field]

    async def wait_clear(self, reg, field):
        """Read ``reg`` until its ``field`` is 0 (a busy flag). A bus whose ``read`` has a
        ``poll(addr, mask)`` coroutine (:class:`~mrcnic.boards.csr_script.ScriptRecorder`) is
        asked for that instead: it records the wait."""
        poll = getattr(self._read, "poll", None)
        if poll is not None:
            await poll(self._addr(reg), self.regmap[reg].field(field).mask)
            return
        while await self.read_field(reg, field):
            pass

    async def write(self, reg, value):
        r = self.regmap[reg]
        if not isinstance(value, int) or not 0 <= value < (1 << self.regmap.data_width):
            raise CsrError(f"register {r.name!r}: value {value!r} does not fit "
                           f"{self.regmap.data_width} bits")
        await self._write(self._addr(reg), value)

    async def write_fields(self, reg, **values):
        """Write the named fields. Unnamed rw fields keep their value (read-modify-write,
        skipped when there are none); unnamed w1p/w1c fields are written 0, so a
        read-modify-write never pulses or clears by accident."""
        r = self.regmap[reg]
        for name in values:
            if r.field(name).access == "ro":
                raise CsrError(f"register {r.name!r}: field {name!r} is ro, not writable")
        word = r.pack(**values)
        keep = [f for n, f in r.fields.items() if f.access == "rw" and n not in values]
        if keep:
            current = await self.read(reg)
            for f in keep:
                word |= current & f.mask
        await self._write(self._addr(reg), word)

    async def write_mac(self, prefix, mac):
        """Write the 48-bit ``mac`` into the pair :func:`mac_registers` declares."""
        await self.write(f"{prefix}_mac_hi", mac >> 32)
        await self.write(f"{prefix}_mac_lo", mac & 0xFFFFFFFF)

    async def write_ipv6(self, prefix, ip):
        """Write the 128-bit ``ip`` into the four :func:`ipv6_registers` declares."""
        for i in range(4):
            await self.write(f"{prefix}_ip{i}", (ip >> (96 - 32 * i)) & 0xFFFFFFFF)


COUNTER_WIDTHS = (0, 16, 32)


def check_counter_width(width):
    """``width`` if it is one of :data:`COUNTER_WIDTHS`; a ValueError otherwise."""
    if width not in COUNTER_WIDTHS or isinstance(width, bool):
        raise ValueError(f"counter_width = {width!r} is not one of {COUNTER_WIDTHS}")
    return width


def event_counters(m, fields, events, names, clear, width=32):
    """Count one-cycle ``events`` (a view with one member per name, each 1 bit or a small
    increment) into the ro fields ``fields[name]["count"]``; ``clear`` zeroes them all.

    The events are registered once before they count, so that the counters' adders start
    from a flip-flop rather than from the end of the logic that raised them (1 cycle later).
    ``width`` (:data:`COUNTER_WIDTHS`): 32, 16 (wrapping at 2^16: the fields read the low
    16 bits) or 0 (no counters: the fields read 0; for a build in which nothing reads
    them, such as a board's self-test, where they are a tenth of the logic).
    """
    check_counter_width(width)
    if width == 0:
        return
    registered = Signal.like(events)
    m.d.sync += registered.eq(events)
    for name in names:
        count = Signal(width, name=f"count_{name}")
        with m.If(clear):
            m.d.sync += count.eq(0)
        with m.Else():
            m.d.sync += count.eq(count + getattr(registered, name))
        m.d.comb += fields[name]["count"].eq(count)


def mac_registers(prefix, what):
    """Two registers, ``<prefix>_mac_hi`` and ``_lo``, holding one 48-bit MAC address."""
    return [
        Register(f"{prefix}_mac_hi", [Field("mac", 16, "rw",
                                            desc=f"{what} MAC address, bits 47:32 (its "
                                                 f"first two bytes on the wire)")]),
        Register(f"{prefix}_mac_lo", [Field("mac", 32, "rw",
                                            desc=f"{what} MAC address, bits 31:0")]),
    ]


def ipv6_registers(prefix, what):
    """Four registers, ``<prefix>_ip0`` .. ``_ip3``, holding one IPv6 address (ip0 first on the
    wire)."""
    return [Register(f"{prefix}_ip{i}", [Field("ip", 32, "rw",
                                               desc=f"{what} IPv6 address, bits "
                                                    f"{127 - 32 * i}:{96 - 32 * i} (bytes "
                                                    f"{4 * i}-{4 * i + 3} on the wire)")])
            for i in range(4)]


def ipv6_value(fields, prefix):
    """The 128-bit address held by the registers :func:`ipv6_registers` declared for
    ``prefix`` (register 0 holds the address's first bytes, the most significant)."""
    return Cat(*(fields[f"{prefix}_ip{i}"]["ip"] for i in reversed(range(4))))
