"""The register layer's gateware: the AXI4-Lite signature, :class:`CsrBlock` (the slave that
holds a :class:`~mrcnic.base.csr.regs.RegisterMap`'s registers) and event counters."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr.regs import (RESP_OKAY, RESP_SLVERR, SET_SUFFIX, CsrError, RegisterMap,
                                  check_counter_width)

__all__ = ["AxiLiteSignature", "CsrBlock", "event_counters", "ipv6_value"]


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


class CsrBlock(wiring.Component):
    """AXI4-Lite slave holding the registers of a :class:`RegisterMap`.

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
    ----------
    regmap : RegisterMap
        The registers; its ``data_width`` (32 or 64) and ``addr_width`` size the port.

    Attributes
    ----------
    s_axil : AXI4-Lite (``regmap.addr_width``, ``regmap.data_width``), in
        The slave port, ``In(AxiLiteSignature(regmap.addr_width, regmap.data_width))``.
        Every AXI output, the readies included, and every field output comes straight from
        a flip-flop: no combinational path from any input.
    fields : dict of dict of Signal
        ``fields[reg][field]``: the field signals, plain Signals (not signature members)
        named ``<reg>_<field>``, of the field's width:

        * rw: output, the register itself, init = ``reset``;
        * w1p: output, high for exactly one cycle per written 1 bit;
        * w1c: output, the sticky bit, init = ``reset``; and input ``<field>_set``: a 1 bit
          sets the sticky bit on the next edge (a set wins over a clear on the same edge);
        * ro: input, init = ``reset`` (read while undriven); sampled on the read edge.
    f : SimpleNamespace
        The same signals as ``f.<reg>.<field>`` (and ``f.<reg>.<field>_set``).
    regmap : RegisterMap
        The map given.

    Latency
    -------
    Write: 1 cycle. ``bvalid`` is high in the cycle after the edge on which the later of
    AW and W is accepted (B free); the rw/w1c outputs have their new value and the w1p
    outputs pulse in that same cycle. Read: 1 cycle, ``rvalid`` in the cycle after the AR
    handshake. A parked request is performed on the edge that empties B (R).

    Throughput
    ----------
    One write per cycle and, at the same time, one read per cycle, without bubbles, while
    ``bready``/``rready`` stay high and AW comes with W. A master that waits for each
    response before the next request gets one write, or one read, per 2 cycles. Both
    figures are measured in ``sim/base/test_csr.py``.

    Raises
    ------
    CsrError
        A ``ValueError``: if ``regmap`` is not a :class:`RegisterMap`.

    Notes
    -----
    Resources: one flip-flop per bit of rw/w1p/w1c state, plus the AW/W/AR holding
    registers and the R data register: the price of full rate with registered readies.
    Measured on the demo map of ``sim/base/test_csr.py``: docs/csr.md.
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


def ipv6_value(fields, prefix):
    """The 128-bit address held by the registers :func:`ipv6_registers` declared for
    ``prefix`` (register 0 holds the address's first bytes, the most significant)."""
    return Cat(*(fields[f"{prefix}_ip{i}"]["ip"] for i in reversed(range(4))))
