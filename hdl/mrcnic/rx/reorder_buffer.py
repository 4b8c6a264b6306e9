"""Reorder buffer: one flow's packets in, in any PSN order; out in PSN order.
:class:`ReorderBuffer` (``reorder-buffer``).

For a consumer that wants a QP's packets in PSN order (an FPGA application without host
memory); the integration puts one per consumer. Packets wait in block RAM, one slot per PSN
of the window, and each leaves whole, exactly as it came in, once every earlier PSN has left
or been declared lost. :mod:`mrcnic.model.rx.reorder_buffer` is the reference model.

Operation, decisions and measured figures: docs/blocks/reorder-buffer.md.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters)
from mrcnic.base.proto import PSN_BITS
from mrcnic.base.stream import (
    AxiStreamSignature, MetaSkidBuffer, check_data_width, meta_stream, skid_buffer)

__all__ = ["PSN_META", "REORDER_COUNTERS", "REORDER_REGS", "reorder_regs", "ReorderBuffer",
           "DEPTH_RANGE", "MAX_PACKET_RANGE"]

PSN_META = data.StructLayout({"psn": PSN_BITS})

DEPTH_RANGE = (2, 1024)
MAX_PACKET_RANGE = (64, 16384)
OCCUPANCY_BITS = 11                      # 0 .. 1024 slots

REORDER_COUNTERS = ["packets_in", "released", "duplicates", "out_of_window", "too_long",
                    "bad", "skipped", "skip_ignored"]

_COUNTER_DESC = {
    "packets_in": "Packets in (every packet, at its last beat)",
    "released": "Packets released on m_axis (counted when their first beat is read)",
    "duplicates": "Packets dropped: PSN before expected, or its slot already held it",
    "out_of_window": "Packets dropped: PSN at or beyond expected + depth (and packets "
                     "in progress when a restart took effect)",
    "too_long": "Packets dropped: longer than max_packet",
    "bad": "Packets dropped: tuser[0] set on the last beat",
    "skipped": "Skips applied: expected moved on past a PSN declared lost",
    "skip_ignored": "Skips ignored: their PSN was not the expected one",
}


def reorder_regs(expected_reset=0):
    """The register map, with ``expected`` reset to ``expected_reset``."""
    return RegisterMap("reorder_buffer", [
        Register("expected", [Field("psn", PSN_BITS, "rw", reset=expected_reset,
                                    desc="Next PSN to release after a restart")]),
        Register("control", [
            Field("clear", 1, "w1p", desc="Zero every counter"),
            Field("restart", 1, "w1p", desc="Empty the buffer; expected.psn becomes the next "
                                            "PSN to release (once no packet is being read "
                                            "out)"),
        ]),
        Register("next_psn", [Field("psn", PSN_BITS, "ro",
                                    desc="PSN of the next packet to release")]),
        Register("occupancy", [Field("slots", OCCUPANCY_BITS, "ro",
                                     desc="Slots holding a packet not yet read out")]),
        *[Register(name, [Field("count", 32, "ro")], desc=desc)
          for name, desc in _COUNTER_DESC.items()],
    ])


REORDER_REGS = reorder_regs()


def _is_pow2(n):
    return n > 0 and not n & (n - 1)


def _times(value, k):
    """``value * k`` for a constant ``k``, as shifts and adds (no multiplier cell)."""
    if _is_pow2(k):
        return Cat(Const(0, k.bit_length() - 1), value)
    terms = [value << i for i in range(k.bit_length()) if k >> i & 1]
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


class ReorderBuffer(wiring.Component):
    """Reorder buffer: one flow's packets in, in any PSN order; out in PSN order, each
    whole and exactly as it came in.

    The packet of PSN p is written to slot ``p mod depth`` of a block RAM of ``depth``
    slots of ``max_packet`` bytes when p is in the window ``[expected, expected + depth)``
    (modulo 2^24) and its slot is empty. At its last beat the verdict is final, first match
    wins: ``bad`` (``tuser[0]`` on the last beat), ``too_long`` (more than ``max_packet``
    bytes), ``duplicates`` (p before ``expected``, or its slot already holds p),
    ``out_of_window`` (p at or beyond ``expected`` + ``depth``), otherwise stored; a dropped
    packet leaves no trace. Whenever the slot of ``expected`` holds its packet, the packet
    is read out and ``expected`` moves on. A ``skip`` record declares a PSN lost: taken only
    while the block has nothing it could release, it applies when its PSN is ``expected``
    (``expected`` moves on, nothing is released) and is ignored otherwise. Writing
    ``control.restart`` empties the buffer and makes the ``expected`` register the next PSN
    to release, once no packet is being read out. The window's base is the oldest PSN not
    yet read out of the RAM, so a packet waiting on ``m_axis`` backpressure still holds its
    slot.

    Parameters
    ----------
    data_width : int
        Bus width in bits (B = ``data_width`` / 8 bytes), one of 64, 128, 256, 512, 1024.
        Default 64.
    depth : int
        Slots, the PSNs held at once (the window), a power of two in 2 .. 1024
        (:data:`DEPTH_RANGE`). Default 32.
    max_packet : int
        Bytes per slot, 64 .. 16384 (:data:`MAX_PACKET_RANGE`), a multiple of B; it need
        not be a power of two. A longer packet is dropped. Default 2048.
    expected_reset : int
        The PSN expected after reset, 0 .. 2^24 - 1 (not a Verilog parameter: the
        ``expected`` register and ``control.restart`` set it at run time). Default 0.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Packets, in any PSN order; ``tuser[0]`` on a packet's last beat drops it.
        ``s_axis.tready`` comes from flip-flops; it is low at a first beat until its
        ``s_psn`` record is there.
    s_psn : stream of :data:`PSN_META`, in
        The PSN of each packet, one record per packet, with or before its first beat
        (two-entry skid buffer).
    skip : stream of :data:`PSN_META`, in
        PSNs declared lost. Judged in the cycle it is taken, so its handshake says when it
        took effect; ``skip.ready`` comes from flip-flops, high only while the block has
        nothing to release.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit, always 0), out
        The packets in PSN order: ``tdata`` of every beat and ``tkeep`` of the last as they
        came in; earlier beats with every ``tkeep`` bit set. Registered.
    m_psn : stream of :data:`PSN_META`, out
        The PSN of each released packet, in release order (two-entry skid buffer); two
        records not taken hold the next packet back.
    s_axil : AXI4-Lite, in
        Registers, :attr:`regmap` (:data:`REORDER_REGS` with ``expected`` reset to
        ``expected_reset``).
    regmap : :class:`~mrcnic.base.csr.regs.RegisterMap`
        The register map.
    latency : int
        Cycles from the last input beat of the expected packet to its first output beat.
    release_event, skip_event, event_psn : Signal
        For the formal checks: a release starts, or a skip applies, for PSN ``event_psn``.

    No ready or valid towards a port depends on an input in the same cycle.

    Latency
    -------
    :attr:`latency` = 4 cycles from a packet's last input beat to its first output beat
    when its PSN is the expected one and nothing is being read out (valid bit, read, plain
    register, skid buffer); its ``m_psn`` record is valid 2 cycles before that beat. A
    packet is stored whole before it leaves (its verdict comes with its last beat).

    Throughput
    ----------
    Input: one beat per cycle, packets back to back, whatever their fate, as long as the
    ``s_psn`` records keep up. Output: one beat per cycle while the consumer is ready, with
    no idle cycle between consecutive packets in the buffer: k packets of n beats leave in
    k*n cycles.

    Raises
    ------
    TypeError
        If ``data_width``, ``depth`` or ``max_packet`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 1024; ``depth`` is not a power of
        two in 2 .. 1024; ``max_packet`` is outside 64 .. 16384 or not a multiple of B;
        ``expected_reset`` is not an int that fits 24 bits; or ``counter_width`` is not 0,
        16 or 32.
    """

    # The memory class (lib.memory.Memory or a subclass with the same ports). The formal
    # checks use one built of flip-flops: the solver handles that far faster than an array.
    memory_type = Memory

    def __init__(self, data_width=64, depth=32, max_packet=2048, *, expected_reset=0,
                 counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        self.data_width = check_data_width(data_width, minimum=64, maximum=1024,
                                           power_of_two=True)
        B = data_width // 8
        if not isinstance(depth, int) or isinstance(depth, bool):
            raise TypeError(f"depth must be an int, not {depth!r}")
        if not DEPTH_RANGE[0] <= depth <= DEPTH_RANGE[1] or not _is_pow2(depth):
            raise ValueError(f"depth = {depth} must be a power of two in "
                             f"{DEPTH_RANGE[0]}..{DEPTH_RANGE[1]}")
        if not isinstance(max_packet, int) or isinstance(max_packet, bool):
            raise TypeError(f"max_packet must be an int, not {max_packet!r}")
        if not MAX_PACKET_RANGE[0] <= max_packet <= MAX_PACKET_RANGE[1]:
            raise ValueError(f"max_packet = {max_packet} is outside "
                             f"{MAX_PACKET_RANGE[0]}..{MAX_PACKET_RANGE[1]}")
        if max_packet % B:
            raise ValueError(f"max_packet = {max_packet} is not a multiple of {B} bytes "
                             f"(data_width = {data_width})")
        if not isinstance(expected_reset, int) or not 0 <= expected_reset < 1 << PSN_BITS:
            raise ValueError(f"expected_reset = {expected_reset!r} does not fit "
                             f"{PSN_BITS} bits")
        self.depth = depth
        self.max_packet = max_packet
        self.expected_reset = expected_reset
        self.slot_beats = max_packet // B
        self.regmap = reorder_regs(expected_reset)
        self.latency = 4
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)),
            "s_psn": In(meta_stream(PSN_META)),
            "skip": In(meta_stream(PSN_META)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "m_psn": Out(meta_stream(PSN_META)),
            "s_axil": In(AxiLiteSignature(self.regmap.addr_width)),
        })
        # The decisions that move `expected`, one a cycle at most, for the formal checks:
        # a release starts (release_event) or a skip applies (skip_event), for event_psn.
        self.release_event = Signal()
        self.skip_event = Signal()
        self.event_psn = Signal(PSN_BITS)

    def _window(self, p, expected, lap1):
        """PSN ``p`` is in ``[expected, expected + depth)``. With depth = 2^k, p = (lap, slot):
        the same lap as ``expected`` at or above its slot, or the next lap (``lap1``, kept
        in a register) below it. Equality compares and a k-bit compare: no 24-bit carry
        chain before the RAM's write enable."""
        k = (self.depth - 1).bit_length()
        p_slot, p_lap = p[:k], p[k:]
        e_slot, e_lap = expected[:k], expected[k:]
        return (((p_lap == e_lap) & (p_slot >= e_slot)) |
                ((p_lap == lap1) & (p_slot < e_slot)))

    @property
    def _slot_bits(self):
        """Bits of a slot number."""
        return (self.depth - 1).bit_length()

    @property
    def _words(self):
        """Words of the packet RAM: ``depth`` slots of ``slot_beats`` words."""
        return self.depth * self.slot_beats

    def _slot_base(self, slot):
        """The RAM address of the first word of ``slot``."""
        return _times(slot, self.slot_beats)[:max(1, (self._words - 1).bit_length())]

    def elaborate(self, platform):
        m = Module()
        # Registers: the CSR block on s_axil; returns its fields.
        f = self._register_block(m)
        # The s_psn records, through a skid buffer (skip has none: judged as taken).
        pin = self._psn_input(m)
        # Storage: the packet RAM and the per-slot table (last beat's index, its tkeep).
        wr, rd, iw, ir = self._storage(m)
        # Shared state: expected, its slot's base and valid bit, the valid bits, busy, ...
        st = self._shared_state()
        # Write side: take each beat, write it to its slot, judge the window at a first beat.
        w = self._write_side(m, pin, wr, st)
        # Per-slot table: the last beat's index and tkeep, written at a packet's last beat.
        self._slot_table_write(m, iw, w)
        # Skip and restart: take a skip while nothing can be released; restart when idle.
        ctl = self._skip_and_restart(m, f, st)
        # The verdict, at the last beat: commit the packet, or which drop it is.
        v = self._verdict(m, w, ctl)
        # Release engine: read the packet of expected out of the RAM, through b and r.
        rel = self._release_engine(m, rd, ir, st)
        # Output: the m_axis and m_psn skid buffers.
        self._output(m, rel, st.expected)
        # Expected PSN and slots: move on after a release or skip, restart, valid bits.
        self._expected_and_slots(m, f, ir, st, w, ctl, v, rel)
        # For the formal checks: the decisions that move expected.
        self._formal_events(m, st.expected, rel.start, ctl.skip_apply)
        # Occupancy, for the register: counted from registered events, a cycle late.
        self._occupancy(m, st.occupancy, v.commit, rel.advance, ctl.restart_apply)
        # Registers: next_psn, occupancy and the event counters.
        self._status_and_counters(m, f, st, w, ctl, v, rel)
        return m

    def _register_block(self, m):
        """The CSR block on ``s_axil``; returns its fields."""
        m.submodules.csr = csr = CsrBlock(self.regmap)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        return csr.fields

    def _psn_input(self, m):
        """The ``s_psn`` records through a two-entry skid buffer; returns its output."""
        m.submodules.psn_skid = psn_skid = MetaSkidBuffer(PSN_META)
        wiring.connect(m, wiring.flipped(self.s_psn), psn_skid.i)
        # No buffer on skip: a skip is judged in the cycle the port takes it, so that its
        # handshake tells the source exactly when it applied. Its ready comes from
        # flip-flops (through the valid-bit mux), never from an input.
        return psn_skid.o

    def _storage(self, m):
        """The packet RAM (``depth`` slots of ``slot_beats`` words) and the per-slot table;
        returns their ports: RAM write and read, table write and read."""
        B, D, S = self.data_width // 8, self.depth, self.slot_beats
        m.submodules.mem = mem = self.memory_type(shape=self.data_width, depth=self._words,
                                                  init=[])
        wr = mem.write_port()
        rd = mem.read_port()
        # (At least one bit wide: a one-beat slot would give zero-width signals.)
        info_layout = data.StructLayout({"last": range(max(S, 2)), "keep": B})
        m.submodules.info = info = self.memory_type(shape=info_layout, depth=D, init=[])
        iw = info.write_port()
        # Transparent: a packet committed in one cycle can start in the next.
        ir = info.read_port(transparent_for=(iw,))
        return wr, rd, iw, ir

    def _shared_state(self):
        """The registers the stages share (no logic: the stages drive them)."""
        D, S = self.depth, self.slot_beats
        expected = Signal(PSN_BITS, init=self.expected_reset)
        exp_base = Signal(range(self._words), init=(self.expected_reset % D) * S)
        valid = Signal(D)
        occupancy = Signal(OCCUPANCY_BITS)
        restart_pending = Signal()
        busy = Signal()                   # reading out the packet of `expected`
        exp_slot = expected[:self._slot_bits]
        # valid[slot of expected], kept in its own flip-flop so that starting a release (and
        # taking a skip) needs no D-way mux in the same cycle.
        valid_exp = Signal()
        return SimpleNamespace(expected=expected, exp_base=exp_base, valid=valid,
                               occupancy=occupancy, restart_pending=restart_pending,
                               busy=busy, exp_slot=exp_slot, valid_exp=valid_exp)

    def _write_side(self, m, pin, wr, st):
        """Write side: every beat taken, one a cycle; a first beat with its ``s_psn`` record.
        The packet is written to its slot when its PSN is in the window and the slot empty."""
        S, slot_bits, words = self.slot_beats, self._slot_bits, self._words
        expected, valid = st.expected, st.valid
        s = self.s_axis
        first = Signal(init=1)            # the next beat is a packet's first
        wr_psn = Signal(PSN_BITS)
        wr_writing = Signal()             # this packet is being written to its slot
        wr_dup = Signal()                 # not written: a duplicate (else out of window)
        wr_beat = Signal(range(S + 1))    # index of the next beat, saturating at S
        wr_addr = Signal(range(words))
        wr_abort = Signal()               # a restart took effect during this packet

        m.d.comb += [s.tready.eq(~first | pin.valid), pin.ready.eq(s.tvalid & first)]
        accept = s.tvalid & s.tready
        last_acc = accept & s.tlast
        # The lap after expected's and the one after that, in registers (see _window).
        laps = 1 << (PSN_BITS - slot_bits)
        lap1 = Signal(PSN_BITS - slot_bits, init=((self.expected_reset >> slot_bits) + 1) % laps)
        lap2 = Signal(PSN_BITS - slot_bits, init=((self.expected_reset >> slot_bits) + 2) % laps)
        # Each test is made on the record's PSN (a first beat) and on the packet's (a later
        # beat) separately, and only the 1-bit results are chosen by `first`.
        psn_rec = pin.payload.psn
        in_window = Mux(first, self._window(psn_rec, expected, lap1),
                        self._window(wr_psn, expected, lap1))
        at_expected = Mux(first, psn_rec == expected, wr_psn == expected)
        p_slot = Mux(first, psn_rec[:slot_bits], wr_psn[:slot_bits])
        held = valid.bit_select(psn_rec[:slot_bits], 1)
        # Before expected, for the verdict only (it reaches no write enable).
        d = Signal(PSN_BITS)
        m.d.comb += d.eq(psn_rec - expected)
        behind = d[-1]
        writing = Mux(first, in_window & ~held, wr_writing)
        dup = Mux(first, behind | (in_window & held), wr_dup)
        beat = Mux(first, 0, wr_beat)
        overflow = beat == S              # beat S + 1 or later: too long, not written
        addr = Mux(first, self._slot_base(p_slot), wr_addr)
        m.d.comb += [wr.addr.eq(addr), wr.data.eq(s.tdata),
                     wr.en.eq(accept & writing & ~overflow)]
        with m.If(accept):
            m.d.sync += [first.eq(s.tlast), wr_beat.eq(Mux(overflow, S, beat + 1)),
                         wr_addr.eq(addr + 1)]
            with m.If(first):
                m.d.sync += [wr_psn.eq(psn_rec), wr_writing.eq(writing),
                             wr_dup.eq(dup)]
        return SimpleNamespace(first=first, wr_abort=wr_abort, accept=accept,
                               last_acc=last_acc, lap1=lap1, lap2=lap2, in_window=in_window,
                               at_expected=at_expected, p_slot=p_slot, writing=writing,
                               dup=dup, beat=beat, overflow=overflow)

    def _slot_table_write(self, m, iw, w):
        """Per-slot table, written at the last beat of a packet being written. A slot so
        written is empty and nobody else writes it, so an uncommitted write is harmless."""
        s = self.s_axis
        m.d.comb += [iw.addr.eq(w.p_slot), iw.data.last.eq(w.beat), iw.data.keep.eq(s.tkeep),
                     iw.en.eq(w.last_acc & w.writing & ~w.overflow)]

    def _skip_and_restart(self, m, f, st):
        """Skip: taken only while nothing can be released, applied when its PSN is
        expected. Restart: pending from the register write until no packet is read out."""
        skin = self.skip
        busy, restart_pending = st.busy, st.restart_pending
        skip_ready = ~busy & ~st.valid_exp & ~restart_pending
        m.d.comb += skin.ready.eq(skip_ready)
        skip_fire = skin.valid & skip_ready
        skip_apply = skip_fire & (skin.payload.psn == st.expected)
        restart_apply = restart_pending & ~busy
        m.d.sync += restart_pending.eq((restart_pending & ~restart_apply) |
                                       f["control"]["restart"])
        return SimpleNamespace(skip_fire=skip_fire, skip_apply=skip_apply,
                               restart_apply=restart_apply)

    def _verdict(self, m, w, ctl):
        """The verdict, at the last beat: ``commit`` (stored) or the drop (first match
        wins: bad, too_long, duplicates, out_of_window); marks a packet a restart aborted."""
        s = self.s_axis
        first, wr_abort, writing = w.first, w.wr_abort, w.writing
        restart_apply = ctl.restart_apply
        bad = s.tuser[0]
        aborted = (~first & wr_abort) | restart_apply
        still = w.in_window & ~(ctl.skip_apply & w.at_expected)   # not passed by a skip
        commit = w.last_acc & writing & ~bad & ~w.overflow & ~aborted & still
        rest = w.last_acc & ~bad & ~w.overflow
        v_dup = rest & ~aborted & Mux(writing, ~still, w.dup)
        v_oow = rest & (aborted | (~writing & ~w.dup))
        in_packet_after = Mux(w.accept, ~s.tlast, ~first)
        with m.If(w.last_acc):
            m.d.sync += wr_abort.eq(0)
        with m.If(restart_apply & in_packet_after):
            m.d.sync += wr_abort.eq(1)
        return SimpleNamespace(bad=bad, commit=commit, v_dup=v_dup, v_oow=v_oow)

    def _release_engine(self, m, rd, ir, st):
        """Read side: whenever the slot of expected is valid, its packet is read out one
        beat a cycle, through the RAM's read data register (b) and a plain register (r)."""
        B, S = self.data_width // 8, self.slot_beats
        busy, exp_base = st.busy, st.exp_base
        b_valid = Signal()                # the RAM's read data register holds a beat
        b_last = Signal()
        b_keep = Signal(B)
        # A plain register after the RAM: its data output is slow (no output register in
        # the ECP5 mapping) and far from the logic; nothing else on that path.
        r_valid, r_last = Signal(), Signal()
        r_keep = Signal(B)
        r_data = Signal(self.data_width, reset_less=True)
        out_room = Signal()               # the output skid buffer takes a beat
        rec_room = Signal()               # the m_psn skid buffer takes a record
        rd_addr = Signal(range(self._words))
        left = Signal(range(max(S, 2)))   # beats still to read after the next one
        cur_keep = Signal(B)
        # b and r move together (a beat is read) when r is empty or moves on: flip-flops only.
        move = ~r_valid | out_room
        can_read = move
        start = ~busy & st.valid_exp & can_read & rec_room & ~st.restart_pending
        cont = busy & can_read
        read = start | cont
        info_last = ir.data.last
        is_last = Mux(busy, left == 0, info_last == 0)
        advance = read & is_last          # the packet's last beat is read: slot freed
        m.d.comb += [rd.addr.eq(Mux(busy, rd_addr, exp_base)), rd.en.eq(read)]
        with m.If(read):
            m.d.sync += [b_last.eq(is_last),
                         b_keep.eq(Mux(is_last, Mux(busy, cur_keep, ir.data.keep),
                                       (1 << B) - 1))]
        with m.If(start):
            m.d.sync += [busy.eq(~is_last), left.eq(info_last - 1), rd_addr.eq(exp_base + 1),
                         cur_keep.eq(ir.data.keep)]
        with m.Elif(cont):
            m.d.sync += [left.eq(left - 1), rd_addr.eq(rd_addr + 1)]
            with m.If(is_last):
                m.d.sync += busy.eq(0)
        with m.If(move):
            m.d.sync += [b_valid.eq(read), r_valid.eq(b_valid), r_data.eq(rd.data),
                         r_last.eq(b_last), r_keep.eq(b_keep)]
        return SimpleNamespace(start=start, advance=advance, r_valid=r_valid, r_data=r_data,
                               r_keep=r_keep, r_last=r_last, out_room=out_room,
                               rec_room=rec_room)

    def _output(self, m, rel, expected):
        """Output: ``m_axis`` through a two-entry skid buffer after r, and the ``m_psn``
        record of each release (made as its first beat is read) through another."""
        o = self.m_axis
        skid_buffer(m, i_valid=rel.r_valid, i_ready=rel.out_room,
                    i_payload=Cat(rel.r_data, rel.r_keep, rel.r_last, Const(0, 1)),
                    o_valid=o.tvalid, o_ready=o.tready,
                    o_payload=Cat(o.tdata, o.tkeep, o.tlast, o.tuser), name="out")
        skid_buffer(m, i_valid=rel.start, i_ready=rel.rec_room, i_payload=expected,
                    o_valid=self.m_psn.valid, o_ready=self.m_psn.ready,
                    o_payload=self.m_psn.payload, name="rec")

    def _expected_and_slots(self, m, f, ir, st, w, ctl, v, rel):
        """Expected PSN and slots: ``expected`` moves on after a release or an applied skip,
        or becomes the ``expected`` register at a restart; the valid bits follow."""
        D, S, slot_bits = self.depth, self.slot_beats, self._slot_bits
        expected, exp_base, exp_slot = st.expected, st.exp_base, st.exp_slot
        valid, valid_exp = st.valid, st.valid_exp
        lap1, lap2 = w.lap1, w.lap2
        advance, commit, p_slot = rel.advance, v.commit, w.p_slot
        step = advance | ctl.skip_apply
        exp_next = Signal(PSN_BITS)
        new_start = f["expected"]["psn"]
        with m.If(ctl.restart_apply):
            m.d.comb += exp_next.eq(new_start)
            m.d.sync += [exp_base.eq(self._slot_base(new_start[:slot_bits])),
                         lap1.eq(new_start[slot_bits:] + 1), lap2.eq(new_start[slot_bits:] + 2),
                         valid.eq(0), valid_exp.eq(0)]
        with m.Else():
            m.d.comb += exp_next.eq(Mux(step, expected + 1, expected))
            with m.If(step):
                m.d.sync += exp_base.eq(Mux(exp_base == (D - 1) * S, 0, exp_base + S))
                with m.If(exp_slot == D - 1):           # into the next lap
                    m.d.sync += [lap1.eq(lap2), lap2.eq(lap2 + 1)]
            clear = Mux(advance, Const(1, D) << exp_slot, 0)
            set_ = Mux(commit, Const(1, D) << p_slot, 0)
            m.d.sync += valid.eq((valid & ~clear) | set_)
            # The next slot's bit, as it will be after this edge (only `clear` touches the
            # current slot, and only `set_` can make a bit 1).
            slot1 = (exp_slot + 1)[:slot_bits]
            m.d.sync += valid_exp.eq(Mux(step,
                                         valid.bit_select(slot1, 1) | (commit & (p_slot == slot1)),
                                         valid_exp | (commit & (p_slot == exp_slot))))
        m.d.sync += expected.eq(exp_next)
        # The table is read for the slot `expected` will have in the next cycle.
        m.d.comb += ir.addr.eq(exp_next[:slot_bits])

    def _formal_events(self, m, expected, start, skip_apply):
        """The decisions that move ``expected``, for the formal checks."""
        m.d.comb += [self.release_event.eq(start), self.skip_event.eq(skip_apply),
                     self.event_psn.eq(expected)]

    def _occupancy(self, m, occupancy, commit, advance, restart_apply):
        """Occupancy, for the register only: counted from registered events, a cycle late,
        so that its adder is not behind the verdict logic."""
        got, left_ram, emptied = Signal(), Signal(), Signal()
        m.d.sync += [got.eq(commit), left_ram.eq(advance), emptied.eq(restart_apply)]
        m.d.sync += occupancy.eq(Mux(emptied, 0, occupancy + got - left_ram))

    def _status_and_counters(self, m, f, st, w, ctl, v, rel):
        """Registers: ``next_psn``, ``occupancy`` and the event counters."""
        last_acc, bad = w.last_acc, v.bad
        m.d.comb += [f["next_psn"]["psn"].eq(st.expected),
                     f["occupancy"]["slots"].eq(st.occupancy)]
        events = Signal(data.StructLayout({n: 1 for n in REORDER_COUNTERS}))
        m.d.comb += [
            events.packets_in.eq(last_acc),
            events.released.eq(rel.start),
            events.duplicates.eq(v.v_dup),
            events.out_of_window.eq(v.v_oow),
            events.too_long.eq(last_acc & ~bad & w.overflow),
            events.bad.eq(last_acc & bad),
            events.skipped.eq(ctl.skip_apply),
            events.skip_ignored.eq(ctl.skip_fire & ~ctl.skip_apply),
        ]
        event_counters(m, f, events, REORDER_COUNTERS, f["control"]["clear"],
                       width=self.counter_width)
