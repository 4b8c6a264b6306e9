"""One plane of the on-chip fabric of a self-test top: :class:`PlaneLoop` takes the frames
a NIC sends on a plane and gives them back to it, losing some on purpose (a failed plane,
random loss). Ports and timing: the class docstring.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mrcnic.base.stream import AxiStreamSignature, check_data_width

__all__ = ["PlaneLoop", "lfsr16_next"]

LFSR_TAPS = (16, 15, 13, 4)         # x^16 + x^15 + x^13 + x^4 + 1, maximal length


def lfsr16_next(state, steps=16):
    """The software twin of the gateware's LFSR: ``steps`` Fibonacci steps (shifting
    left). A frame's draw moves it 16 steps, so successive draws share no bits."""
    for _ in range(steps):
        bit = 0
        for t in LFSR_TAPS:
            bit ^= state >> (t - 1) & 1
        state = (state << 1 | bit) & 0xFFFF
    return state


class PlaneLoop(wiring.Component):
    """One plane of an on-chip fabric: a NIC's frames back to it, some lost on purpose.

    Frames from ``s_axis`` (the NIC's ``m{p}_axis``) go into a FIFO of ``depth`` beats and
    leave on ``m_axis`` (the NIC's ``s{p}_axis``) in order. A frame is dropped whole,
    decided at its first beat, when the plane is failed (``fail``: every frame, and
    ``port_up`` is low, as a NIC's PHY would see a dead link) or when a 16-bit LFSR, moved
    16 steps per frame (:func:`lfsr16_next` is its software twin), is below ``loss``
    (``loss`` / 65536 of the frames). ``tuser`` is not carried: it is 0 on ``m_axis``.

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 2048. Default 64.
    depth : int
        Beats of FIFO, at least 2 x ``frame_beats``. Default 512.
    frame_beats : int
        The largest frame, in beats, >= 1 (sets ``credit``). Default 160.
    seed : int
        The LFSR's seed, non-zero, 16 bits; give each plane its own. Default 1.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames from the NIC. Always ready while a frame is being dropped.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The frames kept, in order.
    fail : Signal(1), in
        The plane is failed: drop every frame from its first beat on.
    loss : Signal(16), in
        Drop ``loss`` / 65536 of the frames at random.
    port_up : Signal(1), out
        ``~fail``: the link as the NIC's PHY would see it.
    credit : Signal(1), out
        The FIFO has room for a frame of ``frame_beats`` beats: what a NIC's transmit FIFO
        tells the path selector.
    level : Signal(range(depth + 1)), out
        Beats in the FIFO.
    frames, lost, failed : Signal(32), out
        Counters, wrapping: frames taken (kept or dropped), frames dropped by the random
        loss, frames dropped while failed.

    Latency
    -------
    A beat leaves 2 cycles after it entered an empty FIFO.

    Throughput
    ----------
    One beat a cycle in and out.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, ``frame_beats`` is not a
        positive int, ``depth`` is not an int of at least 2 x ``frame_beats``, or ``seed``
        is not an int in 1 .. 65535.
    """

    def __init__(self, data_width=64, depth=512, frame_beats=160, seed=1):
        check_data_width(data_width, minimum=64, maximum=2048, power_of_two=True)
        if not isinstance(frame_beats, int) or frame_beats < 1:
            raise ValueError(f"frame_beats = {frame_beats!r} must be a positive int")
        if not isinstance(depth, int) or depth < 2 * frame_beats:
            raise ValueError(f"depth = {depth!r} must be at least 2 x frame_beats "
                             f"({2 * frame_beats})")
        if not isinstance(seed, int) or not 0 < seed < 1 << 16:
            raise ValueError(f"seed = {seed!r} must be a non-zero 16-bit value")
        self.data_width, self.depth = data_width, depth
        self.frame_beats, self.seed = frame_beats, seed
        axis = AxiStreamSignature(data_width)
        super().__init__({
            "s_axis": In(axis), "m_axis": Out(axis),
            "fail": In(1), "loss": In(16),
            "port_up": Out(1), "credit": Out(1), "level": Out(range(depth + 1)),
            "frames": Out(32), "lost": Out(32), "failed": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        W, K = self.data_width, self.data_width // 8
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=W + K + 1, depth=self.depth)
        s, o = self.s_axis, self.m_axis
        lfsr = Signal(16, init=self.seed)
        first = Signal(init=1)              # the next beat starts a frame
        dropping = Signal()                 # the frame under way is dropped
        drop_now = Signal()
        take = s.tvalid & s.tready
        m.d.comb += drop_now.eq(Mux(first, self.fail | (lfsr < self.loss), dropping))
        m.d.comb += [
            s.tready.eq(drop_now | fifo.w_rdy),
            fifo.w_en.eq(s.tvalid & ~drop_now),
            fifo.w_data.eq(Cat(s.tdata, s.tkeep, s.tlast)),
            o.tdata.eq(fifo.r_data[:W]), o.tkeep.eq(fifo.r_data[W:W + K]),
            o.tlast.eq(fifo.r_data[W + K]), o.tvalid.eq(fifo.r_rdy), fifo.r_en.eq(o.tready),
            self.port_up.eq(~self.fail),
            self.level.eq(fifo.level),
            self.credit.eq(fifo.level <= self.depth - self.frame_beats),
        ]
        with m.If(take):
            m.d.sync += first.eq(s.tlast)
            with m.If(first):
                bits = list(lfsr)           # 16 steps unrolled: an XOR network
                for _ in range(16):
                    fb = bits[LFSR_TAPS[0] - 1]
                    for t in LFSR_TAPS[1:]:
                        fb = fb ^ bits[t - 1]
                    bits = [fb] + bits[:15]
                m.d.sync += [lfsr.eq(Cat(*bits)), dropping.eq(drop_now),
                             self.frames.eq(self.frames + 1)]
                with m.If(self.fail):
                    m.d.sync += self.failed.eq(self.failed + 1)
                with m.Elif(drop_now):
                    m.d.sync += self.lost.eq(self.lost + 1)
        return m

