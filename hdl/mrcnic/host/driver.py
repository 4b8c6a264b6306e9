"""The host's register driver: a :class:`~mrcnic.base.csr.regs.RegisterMap` read and written
by name through two bus coroutines."""

from mrcnic.base.csr import CsrError

__all__ = ["RegisterDriver"]


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
