"""Streams: the AXI-Stream packet interface, metadata streams, and the blocks on them.

:class:`AxiStreamSignature` is every block's packet port and :func:`meta_stream` its
metadata ports (docs/architecture.md, "Interfaces every block shares"). :class:`SkidBuffer`
(AXI-Stream) and :class:`MetaSkidBuffer` (metadata) are the register slice every wide block
puts on its ports; :class:`MetaArbiter` merges metadata streams and
:class:`FramePriorityMux` whole frames; the functions are the pieces the blocks build their
stages from.

Operation and measured figures of the skid buffers and the merges:
docs/blocks/skid-buffer.md.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out



__all__ = ["AxiStreamSignature", "meta_stream", "SkidBuffer", "MetaSkidBuffer", "skid_buffer",
           "keep_count", "FrameCursor", "const_lt", "stream_fifo", "skid_chain",
           "length_countdown", "register_stages", "drive_axis", "MetaArbiter", "frame_demux",
           "FramePriorityMux"]


def check_data_width(data_width, *, minimum=8, maximum=4096, power_of_two=False):
    """Refuse a data width the blocks cannot use, with a message that says why."""
    if not isinstance(data_width, int) or isinstance(data_width, bool):
        raise TypeError(f"data_width must be an int, not {data_width!r}")
    if data_width % 8:
        raise ValueError(f"data_width = {data_width} is not a whole number of bytes")
    if not minimum <= data_width <= maximum:
        raise ValueError(f"data_width = {data_width} is outside {minimum}..{maximum}")
    if power_of_two and data_width & (data_width - 1):
        raise ValueError(f"data_width = {data_width} is not a power of two")
    return data_width


class AxiStreamSignature(wiring.Signature):
    """AXI-Stream of the house rules, source view. Parameters: ``data_width`` (8..4096,
    whole bytes), ``user_width`` (>= 1; bit 0 is the bad-frame flag).

    ``tdata`` (``data_width`` bits, byte 0 of the frame in ``tdata[7:0]``), ``tkeep`` (one
    bit a byte, contiguous from byte 0, partial only on the last beat), ``tlast``, ``tuser``
    (bit 0 = bad frame: drop it), ``tvalid``, and ``tready`` from the sink. A component takes
    one as ``s_axis: In(AxiStreamSignature(w))`` and gives one as ``m_axis: Out(...)``; the
    Verilog exporter names the ports ``s_axis_tdata`` ... ``m_axis_tready``.
    """

    def __init__(self, data_width, user_width=1):
        check_data_width(data_width)
        if not isinstance(user_width, int) or user_width < 1:
            raise ValueError(f"user_width = {user_width!r} must be an int >= 1")
        self.data_width = data_width
        self.user_width = user_width
        self.keep_width = data_width // 8
        super().__init__({
            "tdata":  Out(data_width),
            "tkeep":  Out(data_width // 8),
            "tlast":  Out(1),
            "tuser":  Out(user_width),
            "tvalid": Out(1),
            "tready": In(1),
        })

    def __eq__(self, other):
        return (type(other) is AxiStreamSignature and other.data_width == self.data_width
                and other.user_width == self.user_width)

    def __hash__(self):
        return hash((AxiStreamSignature, self.data_width, self.user_width))

    def __repr__(self):
        return f"AxiStreamSignature({self.data_width}, user_width={self.user_width})"


def meta_stream(layout):
    """A metadata stream (``valid``/``ready``/``payload``) carrying ``layout``.

    ``layout`` is a ``data.StructLayout`` or a ``{field: shape}`` dict; ``payload`` is then a
    view whose fields the exporter turns into one port each: ``<name>_<field>``,
    ``<name>_valid``, ``<name>_ready``. Descriptors and events between blocks are such
    streams.
    """
    if isinstance(layout, dict):
        layout = data.StructLayout(layout)
    if not isinstance(layout, data.StructLayout):
        raise TypeError(f"a metadata stream carries a data.StructLayout, not {layout!r}")
    return stream.Signature(layout)


def skid_buffer(m, *, i_valid, i_ready, i_payload, o_valid, o_ready, o_payload, name="skid"):
    """Add a two-entry skid buffer to module ``m`` between two handshakes.

    ``i_ready`` is driven from a register (``~skid_valid``), so the ready path is cut; ``o_valid``
    and ``o_payload`` come from the output register. One beat per cycle in steady state: the
    skid entry fills only in the cycle the sink drops ready while a beat is being accepted, and
    drains before the source is allowed in again.
    """
    i_payload = Value.cast(i_payload)
    width = len(i_payload)
    out_valid = Signal(name=f"{name}_out_valid")
    # Data registers need no reset: valid flags guard them, and a reset on a 2048-bit bus costs
    # routing for nothing.
    out_data = Signal(width, name=f"{name}_out_data", reset_less=True)
    skid_valid = Signal(name=f"{name}_skid_valid")
    skid_data = Signal(width, name=f"{name}_skid_data", reset_less=True)

    m.d.comb += [
        i_ready.eq(~skid_valid),
        o_valid.eq(out_valid),
        Value.cast(o_payload).eq(out_data),
    ]
    accept = i_valid & ~skid_valid
    with m.If(o_ready | ~out_valid):
        # The output register is free (or being emptied): refill it, the skid entry first.
        with m.If(skid_valid):
            m.d.sync += [out_data.eq(skid_data), out_valid.eq(1), skid_valid.eq(0)]
        with m.Else():
            m.d.sync += [out_data.eq(i_payload), out_valid.eq(i_valid)]
    with m.Elif(accept):
        # The sink stalled while the source delivered: park the beat.
        m.d.sync += [skid_data.eq(i_payload), skid_valid.eq(1)]


class SkidBuffer(wiring.Component):
    """AXI-Stream register slice with a two-entry skid buffer: it cuts every combinational
    path between its two sides while moving one beat per cycle.

    Two registers: the output register, which drives ``m_axis``, and the skid register.
    When the output register is empty or being emptied it loads the skid entry if there is
    one, else the beat on ``s_axis``; when the sink stalls while a beat is accepted, that
    beat is parked in the skid register and ``s_axis.tready`` (the inverse of its valid
    flag) falls at the next edge. So ``s_axis.tready`` is a flip-flop output and
    ``m_axis`` never depends on ``m_axis.tready``. Frames pass unchanged, bad ones
    included; after reset ``s_axis.tready`` is 1. :func:`skid_buffer` builds it.

    Parameters
    ----------
    data_width : int
        ``tdata`` bits, 8 .. 4096, a multiple of 8 (no default here; the block catalogue,
        :data:`mrcnic.flow.registry.CATALOGUE`, builds it at 64).
    user_width : int
        ``tuser`` bits, >= 1 (bit 0 marks a bad frame). Default 1.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``user_width``), in
        Beats in; ``s_axis.tready`` is registered.
    m_axis : AXI-Stream (``data_width``, ``user_width``), out
        The same beats, from registers.
    data_width, user_width : int
        The parameters.

    Latency
    -------
    1 cycle from ``s_axis`` accepting a beat to it being valid on ``m_axis``.

    Throughput
    ----------
    1 beat per cycle with the sink ready; no bubble between frames.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a whole number of bytes or is outside 8 .. 4096, or
        ``user_width`` is not an int >= 1.
    """

    def __init__(self, data_width, user_width=1):
        self.data_width = data_width
        self.user_width = user_width
        sig = AxiStreamSignature(data_width, user_width)
        super().__init__({"s_axis": In(sig), "m_axis": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        fields = ("tdata", "tkeep", "tlast", "tuser")
        skid_buffer(m,
                    i_valid=self.s_axis.tvalid, i_ready=self.s_axis.tready,
                    i_payload=wiring_cat(self.s_axis, fields),
                    o_valid=self.m_axis.tvalid, o_ready=self.m_axis.tready,
                    o_payload=wiring_cat(self.m_axis, fields))
        return m


class MetaSkidBuffer(wiring.Component):
    """The two-entry skid buffer of :class:`SkidBuffer` on a metadata stream of ``layout``:
    registered ``i.ready``, ``o`` from registers, one record per cycle.

    Parameters
    ----------
    layout : ``data.StructLayout`` or dict
        The records' layout, or a ``{field: shape}`` dict of it.

    Attributes
    ----------
    i : stream of ``layout`` (:func:`meta_stream`), in
        Records in; ``i.ready`` is registered.
    o : stream of ``layout``, out
        The same records, from registers.
    layout : ``data.StructLayout``
        The records' layout.

    Latency
    -------
    1 cycle from ``i`` accepting a record to it being valid on ``o``.

    Throughput
    ----------
    1 record per cycle with the sink ready.

    Raises
    ------
    TypeError
        If ``layout`` is neither a ``data.StructLayout`` nor a ``{field: shape}`` dict.
    """

    def __init__(self, layout):
        sig = meta_stream(layout)
        self.layout = sig.members["payload"].shape
        super().__init__({"i": In(sig), "o": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        skid_buffer(m, i_valid=self.i.valid, i_ready=self.i.ready, i_payload=self.i.payload,
                    o_valid=self.o.valid, o_ready=self.o.ready, o_payload=self.o.payload)
        return m


class MetaArbiter(wiring.Component):
    """Round-robin merge of ``n`` metadata streams of ``layout`` into one, with the source.

    Each cycle the output register is free or being taken, the first input with a record
    after the one served last (rotating priority) moves into it. Every input with a record
    waiting is served within ``n`` records; the records of one input keep their order.

    Parameters
    ----------
    layout : ``data.StructLayout`` or dict
        The records' layout, or a ``{field: shape}`` dict of it.
    n : int
        Inputs, 2 .. 16.

    Attributes
    ----------
    i : array of ``n`` streams of ``layout`` (:func:`meta_stream`), in
        The inputs; every ``i[k].ready`` is a register (a skid buffer on each input).
    o : stream of ``layout``'s fields then ``src``, out
        The merged records; ``src`` (:attr:`src_bits` bits) is the index of the input the
        record came from. From a register.
    layout : ``data.StructLayout``
        The inputs' layout.
    n, src_bits : int
        The inputs, and the width of ``src``.

    Latency
    -------
    2 cycles from an input's handshake to the record valid on ``o`` (the input skid buffer,
    the output register).

    Throughput
    ----------
    One record per cycle, from whichever inputs have records, with no idle cycle.

    Raises
    ------
    ValueError
        If ``n`` is not an int in 2 .. 16.
    TypeError
        If ``layout`` is neither a ``data.StructLayout`` nor a ``{field: shape}`` dict.
    """

    def __init__(self, layout, n):
        if not isinstance(n, int) or not 2 <= n <= 16:
            raise ValueError(f"n = {n!r} is outside 2 .. 16")
        self.layout = meta_stream(layout).members["payload"].shape
        self.n = n
        self.src_bits = (n - 1).bit_length()
        out = data.StructLayout({**{name: f.shape for name, f in self.layout},
                                 "src": self.src_bits})
        super().__init__({"i": In(meta_stream(self.layout)).array(n),
                          "o": Out(meta_stream(out))})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        skids = []
        for k in range(n):
            skid = MetaSkidBuffer(self.layout)
            m.submodules[f"skid{k}"] = skid
            wiring.connect(m, wiring.flipped(self.i[k]), skid.i)
            skids.append(skid.o)
        last = Signal(range(n), init=n - 1)         # the input served last
        out_valid = Signal()
        out = Signal.like(self.o.payload)
        free = ~out_valid | self.o.ready
        # Rotating priority: the first valid input after ``last``, built as one choice per
        # value of ``last`` (n small), so no adder sits on the path.
        pick = Signal(range(n))
        any_valid = Cat(*(s.valid for s in skids)).any()
        with m.Switch(last):
            for l in range(n):
                with m.Case(l):
                    order = [(l + k) % n for k in range(1, n + 1)]
                    choice = order[-1]
                    for idx in reversed(order[:-1]):
                        choice = Mux(skids[idx].valid, idx, choice)
                    m.d.comb += pick.eq(choice)
        for k in range(n):
            m.d.comb += skids[k].ready.eq(free & any_valid & (pick == k))
        with m.If(free):
            m.d.sync += out_valid.eq(any_valid)
            with m.If(any_valid):
                m.d.sync += last.eq(pick)
                with m.Switch(pick):
                    for k in range(n):
                        with m.Case(k):
                            m.d.sync += [out.as_value()[:len(skids[k].payload.as_value())]
                                         .eq(skids[k].payload), out.src.eq(k)]
        m.d.comb += [self.o.valid.eq(out_valid), self.o.payload.eq(out)]
        return m


def keep_count(keep):
    """Number of bytes a contiguous ``tkeep`` marks, as a Value.

    Each bit of the count is an OR over the lanes where the run of ones can end, so the
    logic is a shallow OR tree (about log4(width) LUT levels), not an adder tree.
    """
    keep = Value.cast(keep)
    n = len(keep)
    ends = [keep[j] & (~keep[j + 1] if j + 1 < n else 1) for j in range(n)]
    bits = []
    for b in range(n.bit_length()):
        terms = [ends[j] for j in range(n) if ((j + 1) >> b) & 1]
        bits.append(Cat(*terms).any() if terms else Const(0, 1))
    return Cat(*bits)


class FrameCursor:
    """Where a stage is in the frame it is accepting, and the header bytes it has seen.

    ``beat`` counts accepted beats of the frame, saturating one past the beat that holds
    byte ``header_bytes - 1`` (so that its compares stay small); ``off`` is the beat's byte
    offset (17 bits); ``first`` is the first beat. ``now(pos)`` is byte ``pos`` of the frame:
    the lane of the current beat when it carries it, else the copy taken (into
    ``regs[pos]``) when the beat that carried it was accepted. ``here(pos)`` says that this
    beat has it; ``field(pos, n)`` is the big-endian ``n``-byte field at ``pos``. Call
    :meth:`capture` once, at the end of ``elaborate`` and outside any ``If``: it adds the
    counters' updates and the copies of every byte asked for, on ``accept``.
    """

    def __init__(self, m, s_axis, accept, *, header_bytes):
        self.m, self.s, self.accept = m, s_axis, accept
        self.tdata, self.tkeep = s_axis.tdata, s_axis.tkeep
        self.B = len(s_axis.tkeep)
        self.header_beats = (header_bytes - 1) // self.B + 1
        self.beat = Signal(range(self.header_beats + 1), name="beat")
        self.off = Signal(17, name="off")
        self.first = self.beat == 0
        self.regs = {}
        self.captured = False

    def here(self, pos):
        """The current beat carries byte ``pos`` (its lane is kept)."""
        return (self.beat == pos // self.B) & self.tkeep[pos % self.B]

    def lane(self, pos):
        return self.tdata.word_select(pos % self.B, 8)

    def now(self, pos):
        if pos not in self.regs:
            if self.captured:
                raise RuntimeError(f"byte {pos} asked for after capture()")
            self.regs[pos] = Signal(8, name=f"byte{pos}")
        return Mux(self.beat == pos // self.B, self.lane(pos), self.regs[pos])

    def field(self, pos, nbytes):
        return Cat(*(self.now(pos + i) for i in reversed(range(nbytes))))

    def capture(self):
        self.captured = True
        m, beat, last = self.m, self.beat, self.s.tlast
        with m.If(self.accept):
            m.d.sync += [
                beat.eq(Mux(last, 0, Mux(beat == self.header_beats, beat, beat + 1))),
                self.off.eq(Mux(last, 0, self.off + self.B)),
            ]
            for pos, reg in self.regs.items():
                with m.If(beat == pos // self.B):
                    m.d.sync += reg.eq(self.lane(pos))


def register_stages(m, en, stage, count, prefix):
    """``count`` pipeline registers behind ``stage`` (a ``{name: Value}`` dict), all moving
    when ``en``; returns the list of stages, ``stage`` first."""
    stages = [stage]
    for i in range(1, count + 1):
        nxt = {n: Signal(Value.cast(v).shape(), name=f"{prefix}{i}_{n}")
               for n, v in stages[-1].items()}
        with m.If(en):
            m.d.sync += [nxt[n].eq(v) for n, v in stages[-1].items()]
        stages.append(nxt)
    return stages


def drive_axis(m, port, *, valid, data, keep, last, user):
    """Drive an AXI-Stream source ``port`` (the ready is the caller's to read)."""
    m.d.comb += [port.tvalid.eq(valid), port.tdata.eq(data), port.tkeep.eq(keep),
                 port.tlast.eq(last), port.tuser.eq(user)]


def length_countdown(m, cap, *, pos, bias, first_use_beat):
    """``(rel, ok)``: ``rel`` = the big-endian 16-bit header field at byte ``pos`` + ``bias``
    - the current beat's byte offset ``off``; valid (``ok``) from beat ``first_use_beat`` on.

    Counted down by the bus width a beat at a time, so that where it is used it is a
    register, not an adder chain behind the lane muxes of the field's beat. It is loaded one
    beat after the field, from the bytes ``cap`` captured, when it is not needed before
    (narrow buses); from the field's lanes when it is first needed in the next beat; and used
    straight from the lanes in the field's own beat when it is needed there (wide buses).
    """
    B, beat, accept = cap.B, cap.beat, cap.accept
    value = Signal(range(-2 ** 17, 2 ** 17))
    held = Signal.like(value)
    field_beat = (pos + 1) // B
    if first_use_beat > field_beat + 1:
        cap.now(pos), cap.now(pos + 1)             # make sure both bytes are captured
        field = Cat(cap.regs[pos + 1], cap.regs[pos])
        load_beat = field_beat + 1
    else:
        field = cap.field(pos, 2)
        load_beat = field_beat
    load = bias + field - cap.off
    if first_use_beat > field_beat:
        m.d.comb += value.eq(held)
    else:
        m.d.comb += value.eq(Mux(beat == field_beat, load, held))
    with m.If(accept):
        m.d.sync += held.eq(Mux(beat == load_beat, load, value) - B)
    return value, ~const_lt(beat, min(load_beat + 1, first_use_beat))


def const_lt(value, n):
    """``value < n`` for a constant ``n``, constant 0 when ``n`` is 0 (no always-false
    comparison in the Verilog)."""
    return (value < n) if n else Const(0, 1)


def skid_chain(m, s_axis, stages, m_axis):
    """Connect ``s_axis`` (a component's own input) through ``stages`` (components with
    ``s_axis``/``m_axis``) to ``m_axis`` (its own output), with a :class:`SkidBuffer`
    before, between and after them, so that no combinational path crosses a stage."""
    width = len(s_axis.tdata)
    skids = [SkidBuffer(width) for _ in range(len(stages) + 1)]
    for i, skid in enumerate(skids):
        m.submodules[f"skid{i}"] = skid
    wiring.connect(m, wiring.flipped(s_axis), skids[0].s_axis)
    for i, stage in enumerate(stages):
        wiring.connect(m, skids[i].m_axis, stage.s_axis)
        wiring.connect(m, stage.m_axis, skids[i + 1].s_axis)
    wiring.connect(m, skids[-1].m_axis, wiring.flipped(m_axis))
    return skids


def stream_fifo(m, name, i, o, depth):
    """Add a ``SyncFIFOBuffered`` of ``depth`` records to ``m`` from metadata stream ``i``
    (a source's port) to ``o`` (a sink's port, or a component's own output)."""
    fifo = SyncFIFOBuffered(width=len(Value.cast(i.payload)), depth=depth)
    m.submodules[name] = fifo
    m.d.comb += [
        fifo.w_data.eq(i.payload), fifo.w_en.eq(i.valid), i.ready.eq(fifo.w_rdy),
        o.payload.eq(fifo.r_data), o.valid.eq(fifo.r_rdy), fifo.r_en.eq(o.ready),
    ]
    return fifo


def wiring_cat(interface, names):
    """Concatenate members of an interface (first name least significant)."""
    return Cat(*(getattr(interface, n) for n in names))




def frame_demux(m, src, sel, sel_valid, outs):
    """Steer each frame of AXI-Stream ``src`` whole to ``outs[sel]``; ``sel`` (with
    ``sel_valid``) names the port of the frame at ``src``'s head and must hold until its last
    beat. A frame waits while ``sel_valid`` is low. Returns the signal that is high in the
    cycle the frame's last beat is taken (when the next ``sel`` may be presented)."""
    ready = Signal(name="demux_ready")
    for p, port in enumerate(outs):
        mine = sel_valid & (sel == p)
        m.d.comb += [port.tdata.eq(src.tdata), port.tkeep.eq(src.tkeep),
                     port.tlast.eq(src.tlast), port.tuser.eq(src.tuser),
                     port.tvalid.eq(src.tvalid & mine)]
        with m.If(mine):
            m.d.comb += ready.eq(port.tready)
    done = Signal(name="demux_done")
    m.d.comb += [src.tready.eq(ready & sel_valid), done.eq(src.tvalid & src.tready & src.tlast)]
    return done


class FramePriorityMux(wiring.Component):
    """Whole frames of ``n`` AXI-Stream inputs onto one output, input 0 first.

    Between frames, the lowest-numbered input with a beat waiting is chosen, and its frame
    passes whole (to its ``tlast``) before another is chosen: fixed priority, not round
    robin (the reason: docs/blocks/skid-buffer.md).

    Parameters
    ----------
    data_width : int
        ``tdata`` bits, 8 .. 4096, a multiple of 8 (no default).
    n : int
        Inputs, 2 .. 16. Default 2.

    Attributes
    ----------
    s_axis : array of ``n`` AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        The inputs, input 0 first.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The frames, each whole; from a :class:`SkidBuffer`.
    data_width, n : int
        The parameters.

    Latency
    -------
    1 cycle (the :class:`SkidBuffer` at the output).

    Throughput
    ----------
    One beat a cycle, no idle cycle between frames of one input or from one input to
    another.

    Raises
    ------
    ValueError
        If ``n`` is not an int in 2 .. 16, or ``data_width`` is not a whole number of bytes
        in 8 .. 4096.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, data_width, n=2):
        if not isinstance(n, int) or not 2 <= n <= 16:
            raise ValueError(f"n = {n!r} is outside 2 .. 16")
        self.data_width, self.n = data_width, n
        sig = AxiStreamSignature(data_width)
        super().__init__({"s_axis": In(sig).array(n), "m_axis": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        m.submodules.out = out = SkidBuffer(self.data_width)
        wiring.connect(m, out.m_axis, wiring.flipped(self.m_axis))
        busy = Signal()                          # inside a frame of input `cur`
        cur = Signal(range(n))
        pick = Signal(range(n))
        choice = n - 1
        for k in reversed(range(n - 1)):
            choice = Mux(self.s_axis[k].tvalid, k, choice)
        m.d.comb += pick.eq(Mux(busy, cur, choice))
        o = out.s_axis
        for k in range(n):
            i = self.s_axis[k]
            with m.If(pick == k):
                m.d.comb += [o.tdata.eq(i.tdata), o.tkeep.eq(i.tkeep), o.tlast.eq(i.tlast),
                             o.tuser.eq(i.tuser), o.tvalid.eq(i.tvalid),
                             i.tready.eq(o.tready)]
        with m.If(o.tvalid & o.tready):
            m.d.sync += [busy.eq(~o.tlast), cur.eq(pick)]
        return m
