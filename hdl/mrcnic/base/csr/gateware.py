"""The register layer's gateware: the AXI4-Lite signature, :class:`CsrBlock` (the slave that
holds a :class:`~mrcnic.base.csr.regs.RegisterMap`'s registers) and event counters."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr.counters import CounterBank, bank_addresses, high_part
from mrcnic.base.csr.regs import (RESP_OKAY, RESP_SLVERR, SET_SUFFIX, CsrError, RegisterMap,
                                  check_counter_width)

__all__ = ["AxiLiteSignature", "CsrBlock", "event_counters", "ipv6_value", "COUNTER_STORAGE"]

# Where :func:`event_counters` keeps the counts: flip-flops (the default) or a CounterBank.
COUNTER_STORAGE = ("ff", "ram")


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

    Each request channel (AW, W, AR) enters a two-entry buffer: a stage register, from
    which the request is performed, and a skid register behind it; the channel's ready is
    high while the skid is empty. AW and W are accepted independently, in either order.
    A write is performed on an edge where AW and W are both in their stages and the B
    register is free (or being emptied on that edge), and answered on B. A read is
    performed on an edge where AR is in its stage and the R register is free (or being
    emptied); R carries the register value sampled on that edge. A stage emptied on an
    edge takes the skid's request, else the bus's, on the same edge. While B (R) is held
    by ``bready`` (``rready``) low, at most two further AW and two further W (two further
    AR) are accepted, one in the stage and one in the skid; ``awready``/``wready``
    (``arready``) then drop, so no response is ever lost or duplicated, whatever the
    master does.

    Write data: ``wstrb`` bit ``i`` enables byte ``i`` for every field kind (an rw byte
    not enabled keeps its value; a w1p/w1c bit in it neither pulses nor clears). A
    write to an all-ro register is accepted (OKAY) and changes nothing. Addresses are
    byte addresses; the low ``log2(data_width/8)`` bits are ignored. An address where
    no register is declared answers SLVERR on B or R, writes nothing, reads 0.
    ``awprot``/``arprot`` are ignored. A read performed on the same edge as a write of
    the same register returns the old value: with B and R free, that is a read whose AR
    is accepted in the same cycle as the later of the write's AW and W; a read accepted
    one cycle later returns the new value.

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
        * ro: input, init = ``reset`` (read while undriven); sampled on the edge the read
          is performed: with R free, the edge after the AR handshake, so R returns the
          value the input has in the cycle after the handshake.
    f : SimpleNamespace
        The same signals as ``f.<reg>.<field>`` (and ``f.<reg>.<field>_set``).
    regmap : RegisterMap
        The map given.

    Latency
    -------
    Write: 2 cycles. ``bvalid`` is high two cycles after the cycle in which the later of
    AW and W is accepted (B free); the rw/w1c outputs have their new value and the w1p
    outputs pulse in that same cycle. Read: 2 cycles, ``rvalid`` two cycles after the
    cycle of the AR handshake. A request waiting in its stage behind a held B (R) is
    performed on the edge that empties B (R), its response in the next cycle; the one
    behind it in the skid, on the next edge that B (R) is free or emptied.

    Throughput
    ----------
    One write per cycle and, at the same time, one read per cycle, without bubbles, while
    ``bready``/``rready`` stay high and AW comes with W; after ``bready`` (``rready``) has
    been held low, the rate is back to one per cycle from the edge that empties B (R). A
    master that waits for each response before the next request gets one write, or one
    read, per 3 cycles. These figures are measured in ``sim/base/test_csr.py``.

    Raises
    ------
    CsrError
        A ``ValueError``: if ``regmap`` is not a :class:`RegisterMap`.

    Notes
    -----
    Logic depth: AR's stage holds the word index as it came, and R's data is a tree of
    4:1 multiplexers on it (in LUT6s, one level per two index bits: 3 up to 64 words);
    AW's stage holds the index predecoded, so that a field's write enable is the AND of
    the perform condition, one line per index pair and a strobe. Resources: one
    flip-flop per bit of rw/w1p/w1c state, plus the stage and skid registers of AW
    (predecoded index), W and AR and the R data register: the price of full rate with
    registered readies and a registered decode. Measured depths and resources:
    docs/csr.md.

    Counters in RAM: :func:`event_counters` with ``storage="ram"`` (through
    :meth:`counters_in_ram`) puts a :class:`~mrcnic.base.csr.counters.CounterBank` in the
    block. Its registers, addresses and read latency stay the same and a read of a counter
    returns the count of the edge it is performed on, exactly as with flip-flop counters;
    the bank's RAM is addressed by the low bits of AR's stage (no logic before it), and R
    takes the counters' side ORed with the tree of the other registers (see
    :meth:`_read_counters`). Without a bank the block is built as it always was.
    """

    def __init__(self, regmap):
        if not isinstance(regmap, RegisterMap):
            raise CsrError(f"CsrBlock needs a RegisterMap, not {regmap!r}")
        self.regmap = regmap
        super().__init__({"s_axil": In(AxiLiteSignature(regmap.addr_width, regmap.data_width))})
        self.fields = _Fields(self)
        self.counter_bank = None        # set by counters_in_ram()
        self._bank_words = {}           # word index -> counter number, with a bank
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
        lsb = (regmap.word_bytes - 1).bit_length()    # address bits below the word index
        words = [r.offset >> lsb for r in regmap]      # word index of each register

        def word_index(addr):
            return addr[lsb:] if len(addr) > lsb else Const(0, 1)

        def declared(index):
            return index.matches(*words)

        # --- Requests: AW, W and AR, each into a stage with a skid register behind it ---
        wr_go = Signal()        # the write in the AW and W stages is performed on this edge
        rd_go = Signal()        # the read in the AR stage is performed on this edge
        # AW's word index enters its stage predecoded (a pair of bits to four lines) with
        # its "declared" bit, so that on the perform edge a register's select is the AND
        # of a few flip-flops rather than a comparator of the whole index.
        aw_ready, aw_valid, aw_s1 = _request_stage(
            m, "aw", bus.awvalid, word_index(bus.awaddr), wr_go,
            load=lambda index: Cat(declared(index), _predecode(index)))
        w_ready, w_valid, w_s1 = _request_stage(
            m, "w", bus.wvalid, Cat(bus.wdata, bus.wstrb), wr_go)
        # AR's word index enters its stage as it is (through the stage's 2:1 skid
        # multiplexer only): the whole read multiplexer comes after a flip-flop.
        ar_ready, ar_valid, ar_index = _request_stage(
            m, "ar", bus.arvalid, word_index(bus.araddr), rd_go)
        m.d.comb += [bus.awready.eq(aw_ready), bus.wready.eq(w_ready),
                     bus.arready.eq(ar_ready)]

        # --- Responses: one B and one R register ---
        bvalid = Signal()
        bresp = Signal(2)
        rvalid = Signal()
        rdata = Signal(regmap.data_width, reset_less=True)     # meaningful with rvalid only
        rresp = Signal(2)
        m.d.comb += [
            bus.bvalid.eq(bvalid), bus.bresp.eq(bresp),
            bus.rvalid.eq(rvalid), bus.rdata.eq(rdata), bus.rresp.eq(rresp),
            wr_go.eq(aw_valid & w_valid & (~bvalid | bus.bready)),
            rd_go.eq(ar_valid & (~rvalid | bus.rready)),
        ]
        with m.If(wr_go):
            m.d.sync += [bvalid.eq(1), bresp.eq(Mux(aw_s1[0], RESP_OKAY, RESP_SLVERR))]
        with m.Elif(bus.bready):
            m.d.sync += bvalid.eq(0)
        with m.If(rd_go):
            m.d.sync += rvalid.eq(1)
        with m.Elif(bus.rready):
            m.d.sync += rvalid.eq(0)
        # R's data and response are loaded on every edge R is not held, whether a read is
        # performed or not (if not, rvalid falls and they are not looked at), so that their
        # enable, which synthesis may fold into the multiplexer's LUTs, is a function of
        # rvalid and rready alone.
        with m.If(~rvalid | bus.rready):
            m.d.sync += [rdata.eq(self._read_mux(m, ar_index, lsb)),
                         rresp.eq(Mux(declared(ar_index), RESP_OKAY, RESP_SLVERR))]
        if self.counter_bank is not None:
            m.submodules.counter_bank = bank = self.counter_bank
            m.d.comb += bank.read_addr.eq(ar_index[:bank.addr_width])

        index_bits = len(word_index(bus.awaddr))
        selects = [_predecoded_match(aw_s1[1:], index_bits, w) for w in words]   # per reg
        self._write(m, wr_go, selects, w_s1)
        return m

    def _write(self, m, go, sel, w_stage):
        """The fields' side of the write held in the stages, performed when ``go``."""
        dw = self.regmap.data_width
        data, strb = w_stage[:dw], w_stage[dw:]
        mask = Cat(strb[i // 8] for i in range(dw))
        bits = Signal(dw)                  # bits written 1 with their byte enabled
        m.d.comb += bits.eq(data & mask)
        for i, r in enumerate(self.regmap):
            for fd in r.fields.values():
                sig = self.fields[r.name][fd.name]
                field_bits = bits[fd.offset:fd.offset + fd.width]
                if fd.access == "rw":
                    field_mask = mask[fd.offset:fd.offset + fd.width]
                    with m.If(go & sel[i]):
                        m.d.sync += sig.eq((sig & ~field_mask) | field_bits)
                elif fd.access == "w1p":
                    # A pulse: zero unless written on this very edge.
                    m.d.sync += sig.eq(Mux(go & sel[i], field_bits, 0))
                elif fd.access == "w1c":
                    # Set by the gateware, cleared by writes; a set wins over a clear so
                    # that an event arriving on the clearing edge is not lost.
                    set_ = self.fields[r.name][fd.name + SET_SUFFIX]
                    clear = Mux(go & sel[i], field_bits, 0)
                    m.d.sync += sig.eq((sig & ~clear) | set_)

    def _read_mux(self, m, index, lsb):
        """The word at ``index`` (0 where no register is declared, w1p fields read 0). With
        a counter bank, see :meth:`_read_counters`."""
        dw = self.regmap.data_width
        entries = {}
        bank = self.counter_bank
        for r in self.regmap:
            if bank is not None and (r.offset >> lsb) in self._bank_words:
                continue
            word = Const(0, dw)
            for fd in r.fields.values():
                if fd.access != "w1p":
                    word = word | (self.fields[r.name][fd.name] << fd.offset)
            entries[r.offset >> lsb] = word
        tree = _mux_tree(m, entries, index, dw, "rd_mux")
        if bank is None:
            return tree
        return tree | self._read_counters(m, index)

    def _read_counters(self, m, index):
        """The counters' side of the read with a counter bank, 0 at other words, to be ORed
        with the other registers' tree (an OR, not a multiplexer, into R: synthesis then
        finds no constant case to turn into a reset of R, whose combination with R's
        enable would cost levels): a tree of the counters' low parts (flip-flops) and one
        of their flags, and one LUT per high bit that makes the high part from the flags
        and the bank's RAM, read at the same index (:func:`~mrcnic.base.csr.counters.
        high_part`): the tree's levels and one more. The flags of a word that is not a
        counter's are 0 (not valid, no carry): its high part is 0."""
        bank = self.counter_bank
        low = _mux_tree(m, {w: bank.low[i] for w, i in self._bank_words.items()}, index,
                        bank.low_width, "rd_counter_low")
        if bank.high_width == 0:
            return low
        flags = _mux_tree(m, {w: Cat(bank.valid[i], bank.carry[i])
                              for w, i in self._bank_words.items()}, index, 2, "rd_flags")
        return Cat(low, high_part(flags[0], flags[1], bank.read_hi, bank.read_hi1))

    def counters_in_ram(self, increments, width):
        """A :class:`~mrcnic.base.csr.counters.CounterBank` of ``width`` (16, 32) bits for
        the counters ``increments`` ({register name: event width}), which R then reads for
        those registers; :func:`event_counters` with ``storage="ram"`` calls this. Each of
        those registers must hold one ro field ``count`` at bit 0, at least ``width`` bits
        wide; the bank's RAM is addressed by the low bits of the AR stage's word index
        (:func:`~mrcnic.base.csr.counters.bank_addresses`). One bank per block; the bank's
        ``events`` and ``clear`` are the caller's to drive. Raises CsrError otherwise."""
        if self.counter_bank is not None:
            raise CsrError(f"regmap {self.regmap.name!r}: its CsrBlock already has a "
                           f"counter bank")
        lsb = (self.regmap.word_bytes - 1).bit_length()
        words = []
        for name in increments:
            r = self.regmap[name]
            fd = r.fields.get("count")
            if (list(r.fields) != ["count"] or fd.access != "ro" or fd.offset != 0
                    or fd.width < width):
                raise CsrError(f"regmap {self.regmap.name!r}: register {name!r} must hold "
                               f"one ro field 'count' at bit 0 of at least {width} bits to "
                               f"be read from a counter bank")
            words.append(r.offset >> lsb)
        index_bits = max(0, self.regmap.addr_width - lsb)
        _, addresses = bank_addresses(words, index_bits)
        self.counter_bank = CounterBank(increments, width, addresses=addresses,
                                        own_read=False)
        self._bank_words = {w: i for i, w in enumerate(words)}     # word -> counter
        return self.counter_bank


def _request_stage(m, name, valid, payload, take, load=lambda value: value):
    """One request channel (AW, W or AR) into a two-entry buffer: the stage register
    ``<name>_s1``, from which the request is performed, and a skid register behind it.
    ``ready`` is a flip-flop, high while the skid is empty, so it depends on no input; the
    stage takes the skid's request first, else the bus's, on every edge it is empty or
    emptied (``take``), so one request per cycle is accepted while requests are performed.
    ``load`` maps the payload as it is taken from the bus. Returns (ready, stage valid,
    stage contents)."""
    loaded = Value.cast(load(payload))
    ready = Signal(init=1, name=f"{name}_ready")
    skid = Signal(len(loaded), name=f"{name}_skid")
    s1_valid = Signal(name=f"{name}_s1_valid")
    s1 = Signal(len(loaded), name=f"{name}_s1")
    with m.If(~s1_valid | take):
        m.d.sync += [s1_valid.eq(valid | ~ready), s1.eq(Mux(ready, loaded, skid)),
                     ready.eq(1)]
    with m.Elif(valid & ready):
        m.d.sync += [skid.eq(loaded), ready.eq(0)]
    return ready, s1_valid, s1


def _pairs(width):
    """The bit pairs of a ``width``-bit index, low first: (first bit, bits) (1 for a last
    odd bit)."""
    return [(i, min(2, width - i)) for i in range(0, width, 2)]


def _predecode(index):
    """``index`` as one-hot lines, four per pair of bits (two for a last odd bit)."""
    return Cat(*(index[i:i + n] == v for i, n in _pairs(len(index)) for v in range(1 << n)))


def _predecoded_match(lines, width, value):
    """Whether the ``width``-bit index that :func:`_predecode` turned into ``lines`` is
    ``value``: the AND of one line per pair."""
    terms, first = [], 0
    for i, n in _pairs(width):
        terms.append(lines[first + ((value >> i) & ((1 << n) - 1))])
        first += 1 << n
    return Cat(*terms).all()


def _mux_tree(m, entries, index, width, name):
    """``entries.get(index, 0)`` for ``entries`` {int: Value}: a tree of 4:1 multiplexers
    on two bits of ``index`` per level (one LUT6 each), of the groups that hold an entry.
    The levels are kept signals: without them synthesis flattens the tree into a decoder
    and AND-OR chains, deeper than the tree."""
    level = 0
    while len(index) > 0:
        k = min(2, len(index))
        sel, index = index[:k], index[k:]
        groups = {}
        for i, value in entries.items():
            groups.setdefault(i >> k, {})[i & ((1 << k) - 1)] = value
        entries = {}
        for g, members in groups.items():
            out = Signal(width, name=f"{name}_l{level}_{g}",
                         attrs={"keep": 1} if len(index) > 0 else {})
            with m.Switch(sel):
                for j, value in members.items():
                    with m.Case(j):
                        m.d.comb += out.eq(value)
            entries[g] = out
        level += 1
    return entries.get(0, Const(0, width))


def event_counters(m, fields, events, names, clear, width=32, *, storage="ff", csr=None):
    """Count one-cycle ``events`` (a view with one member per name, each 1 bit or a small
    increment) into the ro fields ``fields[name]["count"]``; ``clear`` zeroes them all.

    The events are registered once before they count, so that the counters' adders start
    from a flip-flop rather than from the end of the logic that raised them (1 cycle later).
    ``width`` (:data:`COUNTER_WIDTHS`): 32, 16 (wrapping at 2^16: the fields read the low
    16 bits) or 0 (no counters: the fields read 0; for a build in which nothing reads
    them, such as a board's self-test, where they are a tenth of the logic).

    ``storage`` (:data:`COUNTER_STORAGE`): ``"ff"`` (the default), one ``width``-bit
    flip-flop counter with its adder per event, each driving its field; ``"ram"``, the
    counts in the distributed RAM of a :class:`~mrcnic.base.csr.counters.CounterBank`
    inside the block's :class:`CsrBlock` (``csr``, by default the block whose ``fields``
    these are; see :meth:`CsrBlock.counters_in_ram`). With ``"ram"`` an AXI read returns
    exactly what it returns with ``"ff"`` (the same count, sampled on the same edge, the
    same latency, the same clear), but the ``count`` field signals are not driven (they
    read 0 in the gateware): only the register read sees the counts. It takes about 40% of
    the flip-flops (28 counters of 32 bits with 2-bit events: 370 instead of 952) and
    some LUT RAM (docs/csr.md). ``names`` must then be register names whose only field is
    ``count``, at bit 0, at least ``width`` bits wide; one call per block. Switching a
    block over is this one keyword: ``event_counters(m, f, ev, NAMES, clear, width=w,
    storage="ram")``.
    """
    check_counter_width(width)
    if storage not in COUNTER_STORAGE:
        raise CsrError(f"counter storage {storage!r} is not one of {COUNTER_STORAGE}")
    if width == 0:
        return
    if storage == "ram":
        csr = csr if csr is not None else getattr(fields, "block", None)
        if not isinstance(csr, CsrBlock) or csr.fields is not fields:
            raise CsrError("storage='ram' needs the CsrBlock whose fields these are "
                           "(csr=...)")
        bank = csr.counters_in_ram({n: len(getattr(events, n)) for n in names}, width)
        m.d.comb += [getattr(bank.events, n).eq(getattr(events, n)) for n in names]
        m.d.comb += bank.clear.eq(clear)
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


class _Fields(dict):
    """:attr:`CsrBlock.fields`: a dict that knows its block (``.block``), so that
    :func:`event_counters` finds the block from the fields it is given."""

    def __init__(self, block):
        super().__init__()
        self.block = block


def ipv6_value(fields, prefix):
    """The 128-bit address held by the registers :func:`ipv6_registers` declared for
    ``prefix`` (register 0 holds the address's first bytes, the most significant)."""
    return Cat(*(fields[f"{prefix}_ip{i}"]["ip"] for i in reversed(range(4))))
