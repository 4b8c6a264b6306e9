"""Register maps, declared once: :class:`Field`, :class:`Register`, :class:`RegisterMap`.

A block lists its registers as data and gets from that one declaration

* the gateware, :class:`mrcnic.base.csr.gateware.CsrBlock`, an AXI4-Lite slave with one plain
  Signal per field;
* a Python driver, :class:`mrcnic.host.driver.RegisterDriver`, that needs nothing but a
  ``read(addr)`` and a ``write(addr, value)`` coroutine, so the same code runs over
  Amaranth's simulator (``testkit/axil.py``), cocotbext-axi's ``AxiLiteMaster`` or a real bus;
* a Markdown table for the docs, :func:`mrcnic.base.csr.markdown.markdown`.

This module is plain Python: the host side and the docs use it without any gateware.

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


__all__ = [
    "CsrError", "ACCESS", "RESP_OKAY", "RESP_SLVERR", "SET_SUFFIX", "Field", "Register",
    "RegisterMap", "COUNTER_WIDTHS", "check_counter_width", "mac_registers", "ipv6_registers",
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

    def with_resets(self, resets):
        """A copy of the map whose fields named in ``resets`` (register name -> {field
        name: value}) reset to other values: for a harness that must start from them (a
        bounded formal check spends no depth writing them)."""
        for reg, fields in resets.items():
            for name in fields:
                self[reg].field(name)           # CsrError if either is unknown
        return RegisterMap(self.name, [
            Register(r.name, [Field(f.name, f.width, f.access,
                                    resets.get(r.name, {}).get(f.name, f.reset), f.desc,
                                    offset=f.offset) for f in r.fields.values()],
                     r.desc, offset=r.offset)
            for r in self], data_width=self.data_width)

    def markdown(self):
        """The map as a Markdown table (:func:`mrcnic.base.csr.markdown.markdown`)."""
        from mrcnic.base.csr.markdown import markdown
        return markdown(self)


COUNTER_WIDTHS = (0, 16, 32)


def check_counter_width(width):
    """``width`` if it is one of :data:`COUNTER_WIDTHS`; a ValueError otherwise."""
    if width not in COUNTER_WIDTHS or isinstance(width, bool):
        raise ValueError(f"counter_width = {width!r} is not one of {COUNTER_WIDTHS}")
    return width


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
