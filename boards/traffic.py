"""Traffic for a self-test top that loops a NIC back to itself: :class:`TrafficGen` posts
work requests and answers their payload requests with a known pattern;
:class:`DataChecker` checks every byte the NIC places against it, and that every chunk of
a run is placed exactly once.

The pattern (:func:`pattern_word`): the 64-bit word at byte address ``A`` (a multiple
of 8) is ``A[34:3]`` in its low half and the complement in its high half, all inverted on
odd runs; so every word says where it belongs, and a stale packet of the run before is
caught. Lane ``j`` of a beat at address ``A`` holds the word of ``A + 8 j``.

A run (:class:`TrafficGen`): ``msgs`` WRITEs, every message a whole number of PMTU
packets, so every placement is one whole chunk of ``2^pmtu_log2`` bytes; the next run
starts when every WRITE of the run completed and the checker saw every chunk placed.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mrcnic.base.records import PAYLOAD_REQ, PLACE, WR, WR_DONE
from mrcnic.base.stream import AxiStreamSignature, MetaArbiter, check_data_width, meta_stream

__all__ = ["TrafficGen", "DataChecker", "pattern_word", "pattern_bytes"]


def pattern_word(addr, odd):
    """The pattern's 64-bit word at byte address ``addr`` (software twin)."""
    low = addr >> 3 & 0xFFFF_FFFF
    word = low | (low ^ 0xFFFF_FFFF) << 32
    return word ^ (0xFFFF_FFFF_FFFF_FFFF if odd else 0)


def pattern_bytes(addr, length, odd):
    """``length`` bytes of the pattern from ``addr`` (a multiple of 8)."""
    words = b"".join(pattern_word(a, odd).to_bytes(8, "little")
                     for a in range(addr, addr + length + 7, 8))
    return words[:length]


def _pattern_beat(addr, odd, lanes):
    """The gateware pattern of a beat whose lane 0 is at ``addr``."""
    parts = []
    for j in range(lanes):
        low = (addr + 8 * j)[3:35]
        word = Cat(low, ~low)
        parts.append(Mux(odd, ~word, word))          # 64 bits: lane j at bit 64 j
    return Cat(*parts)


def _check_run(data_width, qps, msg_log2, msgs, pmtu_log2, base):
    check_data_width(data_width, minimum=64, maximum=2048, power_of_two=True)
    if not 1 <= qps <= 1024:
        raise ValueError(f"qps = {qps!r} must be 1 .. 1024")
    if not 8 <= pmtu_log2 <= msg_log2 <= 31:
        raise ValueError(f"need 8 <= pmtu_log2 ({pmtu_log2}) <= msg_log2 ({msg_log2}) <= 31")
    if not 1 <= msgs <= 1 << 16:
        raise ValueError(f"msgs = {msgs!r} must be 1 .. 65536 (wr_id is 16 bits)")
    if base % (1 << msg_log2) or not 0 <= base < 1 << 48:
        raise ValueError(f"base = {base:#x} must be a multiple of the message size, below 2^48")


class TrafficGen(wiring.Component):
    """Work requests and their payloads for a NIC looped back to itself, run after run.

    A run: ``msgs`` RDMA WRITEs (no immediate) of ``2^msg_log2`` bytes, message ``k`` on
    QP ``k mod qps`` at ``base + k 2^msg_log2`` with R_Key ``rkey`` and ``wr_id`` ``k``.
    The NIC's payload requests are answered in order with the pattern
    (:func:`pattern_word`, module docstring) of the bytes they name, inverted on odd runs.
    The next run starts when every WRITE of the run has completed (``done``) and
    ``run_ok`` is high.

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 2048. Default 64.
    qps : int
        QPs the messages go round, 1 .. 1024. Default 2.
    msg_log2 : int
        Message size, ``2^msg_log2`` bytes; ``pmtu_log2`` .. 31. Default 13.
    msgs : int
        Messages a run, 1 .. 65536. Default 16.
    pmtu_log2 : int
        The PMTU, ``2^pmtu_log2`` bytes, 8 .. ``msg_log2`` (so every message is a whole
        number of packets). Default 10.
    base : int
        The buffer's virtual address, a multiple of the message size, below 2^48. Default
        0x1_0000_0000.
    rkey : int
        The R_Key of every WRITE, 32 bits. Default 0x1234.

    Attributes
    ----------
    start : Signal(1), in
        The first run begins once it is high; it is not looked at after that.
    wr : stream of :data:`~mrcnic.base.records.WR`, out
        The work requests, to the NIC's ``wr``.
    done : stream of :data:`~mrcnic.base.records.WR_DONE`, in
        The NIC's completions; always ready.
    preq : stream of :data:`~mrcnic.base.records.PAYLOAD_REQ`, in
        The NIC's payload requests (``wr_id``, ``offset``, ``length``), four held.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Each request's bytes, one frame a request, to the NIC's ``s_axis``; ``tuser`` 0.
    run_ok : Signal(1), in
        From the checker: every chunk of the run placed once.
    odd : Signal(1), out
        The run's parity, to the checker.
    runs : Signal(32), out
        Runs completed.
    completions : Signal(32), out
        Completions received, all runs.

    Throughput
    ----------
    One WR a cycle; one payload beat a cycle.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, ``qps`` is outside
        1 .. 1024, not ``8 <= pmtu_log2 <= msg_log2 <= 31``, ``msgs`` is outside
        1 .. 65536, or ``base`` is not a multiple of the message size below 2^48.
    """

    def __init__(self, data_width=64, qps=2, msg_log2=13, msgs=16, pmtu_log2=10,
                 base=0x1_0000_0000, rkey=0x1234):
        _check_run(data_width, qps, msg_log2, msgs, pmtu_log2, base)
        self.data_width, self.qps, self.msg_log2, self.msgs = data_width, qps, msg_log2, msgs
        self.base, self.rkey = base, rkey
        super().__init__({
            "start": In(1), "wr": Out(meta_stream(WR)), "done": In(meta_stream(WR_DONE)),
            "preq": In(meta_stream(PAYLOAD_REQ)), "m_axis": Out(AxiStreamSignature(data_width)),
            "run_ok": In(1), "odd": Out(1), "runs": Out(32), "completions": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        W, B = self.data_width, self.data_width // 8
        n = self.msgs
        k = Signal(range(n + 1))                 # next message to post
        got = Signal(range(n + 1))               # completions of the run
        m.d.comb += self.done.ready.eq(1)
        with m.If(self.done.valid):
            m.d.sync += self.completions.eq(self.completions + 1)
        w = self.wr.payload
        m.d.comb += [w.qp.eq(k % self.qps),
                     w.wr_id.eq(k), w.va.eq(self.base + (k << self.msg_log2)),
                     w.rkey.eq(self.rkey), w.length.eq(1 << self.msg_log2)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.next = "POST"
            with m.State("POST"):
                m.d.comb += self.wr.valid.eq(k < n)
                with m.If(self.wr.valid & self.wr.ready):
                    m.d.sync += k.eq(k + 1)
                with m.If((k == n) & (got == n) & self.run_ok):
                    m.d.sync += [k.eq(0), self.odd.eq(~self.odd), self.runs.eq(self.runs + 1)]
            # `got` counts this run's completions (a run's all come before the next run)
        with m.If(self.done.valid):
            m.d.sync += got.eq(got + 1)
        with m.If((k == n) & (got == n) & self.run_ok):
            m.d.sync += got.eq(0)

        # Payloads: the head request's bytes, beat by beat.
        fifo = SyncFIFOBuffered(width=len(self.preq.payload.as_value()), depth=4)
        m.submodules.preq_fifo = fifo
        m.d.comb += [fifo.w_data.eq(self.preq.payload), fifo.w_en.eq(self.preq.valid),
                     self.preq.ready.eq(fifo.w_rdy)]
        req = data.View(PAYLOAD_REQ, fifo.r_data)
        sent = Signal(32)                         # bytes of the head request sent
        addr = Signal(64)
        m.d.comb += addr.eq(self.base + (req.wr_id << self.msg_log2) + req.offset + sent)
        left = Signal(33)
        m.d.comb += left.eq(req.length - sent)
        last = left <= B
        o = self.m_axis
        m.d.comb += [o.tvalid.eq(fifo.r_rdy), o.tdata.eq(_pattern_beat(addr, self.odd, W // 64)),
                     o.tlast.eq(last),
                     o.tkeep.eq(Mux(last, (Const(1, B + 1) << left[:B.bit_length()]) - 1,
                                    (1 << B) - 1))]
        with m.If(o.tvalid & o.tready):
            with m.If(last):
                m.d.sync += sent.eq(0)
                m.d.comb += fifo.r_en.eq(1)
            with m.Else():
                m.d.sync += sent.eq(sent + B)
        return m


class DataChecker(wiring.Component):
    """Checks every byte a NIC places against the pattern, and that every chunk of a run
    is placed exactly once.

    The run's buffer (``msgs`` messages of ``2^msg_log2`` bytes from ``base``, as
    :class:`TrafficGen` writes it) is cut into chunks of ``2^pmtu_log2`` bytes. A placement
    record of a whole chunk marks it placed in this run (a bit a chunk, in a memory, holds
    the parity of the last run that placed it); a second one in the run counts a
    duplicate, and a placement that is not a whole chunk of the buffer counts a stray. The
    data of each placement (after its record: the data waits for it) is compared with the
    pattern (:func:`pattern_word`; ``odd`` selects the inverted one) 64-bit lane by lane.

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 2048. Default 64.
    planes : int
        Planes, 1 .. 16 (more are refused at elaboration): one ``place{p}`` and
        ``pl{p}_axis`` each. Default 2.
    msg_log2, msgs, pmtu_log2, base : int
        The run, as :class:`TrafficGen`'s (same ranges). Defaults 13, 16, 10,
        0x1_0000_0000.

    Attributes
    ----------
    place{p} : stream of :data:`~mrcnic.base.records.PLACE`, in
        The NIC's placement records of plane p.
    pl{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        The NIC's placed data of plane p, one frame a placement, in record order.
    odd : Signal(1), in
        The run's parity, from the generator.
    run_ok : Signal(1), out
        Every chunk of the run placed once and every placement's data checked.
    ready : Signal(1), out
        The chunk bitmap has been cleared after reset (``chunks`` cycles; no placement is
        counted before): start the traffic then.
    bytes : Signal(32), out
        Bytes of placed data, all planes, wrapping.
    bad_data : Signal(32), out
        Beats of placed data not the pattern (counted 3 cycles after the beat).
    duplicates : Signal(32), out
        Chunks placed twice in a run.
    strays : Signal(32), out
        Placements that are not a whole chunk of the run's buffer.
    placed : Signal(range(chunks + 1)), out
        Chunks placed in this run.
    chunks : int
        Chunks in a run's buffer, ``msgs x 2^(msg_log2 - pmtu_log2)``.

    Throughput
    ----------
    One beat a cycle on every plane; one placement record a cycle over all.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, not
        ``8 <= pmtu_log2 <= msg_log2 <= 31``, ``msgs`` is outside 1 .. 65536, or ``base`` is
        not a multiple of the message size below 2^48.
    """

    def __init__(self, data_width=64, planes=2, msg_log2=13, msgs=16, pmtu_log2=10,
                 base=0x1_0000_0000):
        _check_run(data_width, 1, msg_log2, msgs, pmtu_log2, base)
        self.data_width, self.planes = data_width, planes
        self.pmtu_log2, self.base = pmtu_log2, base
        self.chunks = msgs << (msg_log2 - pmtu_log2)
        members = {"odd": In(1), "run_ok": Out(1), "ready": Out(1),
                   "bytes": Out(32), "bad_data": Out(32),
                   "duplicates": Out(32), "strays": Out(32),
                   "placed": Out(range(self.chunks + 1))}
        for p in range(planes):
            members[f"place{p}"] = In(meta_stream(PLACE))
            members[f"pl{p}_axis"] = In(AxiStreamSignature(data_width))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        W, B, P = self.data_width, self.data_width // 8, self.planes
        C = self.chunks
        chunk_bits = max(1, (C - 1).bit_length())
        chunk_layout = data.StructLayout({"index": chunk_bits, "stray": 1})
        if P > 1:
            m.submodules.merge = merge = MetaArbiter(chunk_layout, P)
            ins, o = list(merge.i), merge.o
        else:                                # one plane: no merge
            o = ins = [wiring.Signature({"valid": Out(1), "ready": In(1),
                                         "payload": Out(chunk_layout)}).create()]
            o = ins[0]
        beat_events = []
        byte_counts = []
        waiting = []                          # per plane: placements whose data is due
        for p in range(P):
            place, pl = getattr(self, f"place{p}"), getattr(self, f"pl{p}_axis")
            rec = SyncFIFOBuffered(width=64, depth=4)          # the va of each placement
            m.submodules[f"rec{p}"] = rec
            r = place.payload
            off = Signal(64, name=f"off{p}")
            m.d.comb += off.eq(r.va - self.base)
            stray = ((off >> self.pmtu_log2) >= C) | (off[:self.pmtu_log2] != 0) | \
                (r.length != 1 << self.pmtu_log2) | (r.va < self.base)
            ci = ins[p]
            m.d.comb += [ci.payload.index.eq(off >> self.pmtu_log2), ci.payload.stray.eq(stray),
                         rec.w_data.eq(r.va),
                         place.ready.eq(rec.w_rdy & ci.ready),
                         rec.w_en.eq(place.valid & place.ready & (r.length != 0)),
                         ci.valid.eq(place.valid & rec.w_rdy)]
            # data against the pattern, lane by lane (whole lanes: lengths are chunks), in two
            # stages so that the check never sets the clock of the NIC it tests: the beat and
            # its pattern (with this beat's run parity) into registers, then the compare.
            pos = Signal(32, name=f"pos{p}")
            m.d.comb += pl.tready.eq(rec.r_rdy)
            waiting.append(rec.r_rdy)
            beat = pl.tvalid & pl.tready
            with m.If(beat):
                with m.If(pl.tlast):
                    m.d.sync += pos.eq(0)
                    m.d.comb += rec.r_en.eq(1)
                with m.Else():
                    m.d.sync += pos.eq(pos + B)
            c1_beat = Signal(name=f"check1_beat{p}")
            c1_data = Signal(W, name=f"check1_data{p}")
            c1_want = Signal(W, name=f"check1_want{p}")
            c1_keep = Signal(W // 64, name=f"check1_keep{p}")
            m.d.sync += [c1_beat.eq(beat), c1_data.eq(pl.tdata),
                         c1_want.eq(_pattern_beat(rec.r_data + pos, self.odd, W // 64)),
                         c1_keep.eq(Cat(*(pl.tkeep[8 * j] for j in range(W // 64))))]
            lanes_ok = Cat(*((c1_data[64 * j:64 * j + 64] == c1_want[64 * j:64 * j + 64])
                             | ~c1_keep[j] for j in range(W // 64)))
            bad = Signal(name=f"check2_bad{p}")
            m.d.sync += bad.eq(c1_beat & ~lanes_ok.all())
            beat_events.append(bad)
            n = Signal(range(B + 1), name=f"n{p}")
            m.d.comb += n.eq(Mux(beat, _popcount(pl.tkeep), 0))
            byte_counts.append(n)
        m.d.sync += [self.bytes.eq(self.bytes + sum(byte_counts)),
                     self.bad_data.eq(self.bad_data + sum(beat_events))]

        # Chunks: one bit a chunk holds the parity of the last run that placed it (all 1
        # after reset: run 0 is even). Read, then compare and write the next cycle; a chunk
        # written the cycle before is forwarded. A memory keeps its contents through a
        # reset: after one, a pass writes every bit to 1 before the checker is ``ready``.
        m.submodules.seen = seen = Memory(shape=1, depth=C, init=[1] * C)
        rd, wr = seen.read_port(), seen.write_port()
        clear = Signal(range(C + 1))              # bits cleared; C: done
        m.d.comb += self.ready.eq(clear == C)
        with m.If(clear != C):
            m.d.sync += clear.eq(clear + 1)
        m.d.comb += [o.ready.eq(self.ready), rd.addr.eq(o.payload.index), rd.en.eq(1)]
        s1_valid, s1_index, s1_stray = Signal(), Signal(chunk_bits), Signal()
        m.d.sync += [s1_valid.eq(o.valid & o.ready), s1_index.eq(o.payload.index),
                     s1_stray.eq(o.payload.stray)]
        last_w, last_valid = Signal(chunk_bits), Signal()
        stored = Mux(last_valid & (last_w == s1_index), self.odd, rd.data)
        fresh = s1_valid & ~s1_stray & (stored != self.odd)
        m.d.comb += [wr.addr.eq(Mux(self.ready, s1_index, clear)),
                     wr.data.eq(Mux(self.ready, self.odd, 1)), wr.en.eq(fresh | ~self.ready)]
        m.d.sync += [last_w.eq(s1_index), last_valid.eq(fresh)]
        odd_d = Signal()
        m.d.sync += odd_d.eq(self.odd)
        with m.If(odd_d != self.odd):
            m.d.sync += self.placed.eq(0)
        with m.Elif(fresh):
            m.d.sync += self.placed.eq(self.placed + 1)
        with m.If(s1_valid & s1_stray):
            m.d.sync += self.strays.eq(self.strays + 1)
        with m.If(s1_valid & ~s1_stray & ~fresh):
            m.d.sync += self.duplicates.eq(self.duplicates + 1)
        # The run is whole when every chunk was placed and every placement's data checked
        # (a NIC gives a placement record before its data).
        m.d.comb += self.run_ok.eq((self.placed == C) & (odd_d == self.odd)
                                   & ~Cat(*waiting).any())
        return m


def _popcount(v):
    return sum(v[i] for i in range(len(v)))
