"""A UART for a board's status and commands: :class:`UartTx` and :class:`UartRx` (8 data
bits, no parity, one stop bit; ``divisor`` clock cycles per bit, as :func:`divisor_for`
computes it from the clock and the baud rate), and :class:`StatusLine`, which prints named
values as hex over a UartTx. Ports and timing: the classes' docstrings.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UartTx", "UartRx", "StatusLine", "status_text", "divisor_for"]


def divisor_for(clk_hz, baud=115200):
    """Cycles per bit, and the error of the baud rate it gives (must stay under 2%)."""
    divisor = round(clk_hz / baud)
    error = abs(clk_hz / divisor - baud) / baud
    if divisor < 4 or error > 0.02:
        raise ValueError(f"{clk_hz} Hz cannot make {baud} baud within 2% (divisor {divisor})")
    return divisor


def _check_divisor(divisor):
    if not isinstance(divisor, int) or divisor < 4:
        raise ValueError(f"divisor = {divisor!r} must be an int >= 4")


class UartTx(wiring.Component):
    """UART transmitter: each byte of a stream sent 8N1 (a start bit, 8 data bits LSB
    first, a stop bit), ``divisor`` clock cycles per bit.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 4 (:func:`divisor_for` gives it for a clock and a
        baud rate).

    Attributes
    ----------
    i : stream of 8 bits, in
        The bytes to send. ``ready`` is high only while the line is idle: one byte is taken
        and held until its stop bit has been sent.
    tx : Signal(1), out
        The serial line; high when idle (and out of reset).

    Latency
    -------
    The start bit is on ``tx`` from the cycle after the byte's handshake; each bit lasts
    ``divisor`` cycles, so a byte takes ``10 x divisor`` cycles on the line.

    Throughput
    ----------
    One byte per ``10 x divisor + 1`` cycles when the stream never runs dry (``ready`` comes
    back in the cycle after the stop bit ends).

    Raises
    ------
    ValueError
        If ``divisor`` is not an int of at least 4.
    """

    def __init__(self, divisor):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__({"i": In(stream.Signature(8)), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        shift = Signal(10, init=0x3FF)          # stop, data LSB first, start; shifts right
        bits = Signal(range(11))
        timer = Signal(range(self.divisor))
        m.d.comb += [self.tx.eq(shift[0]), self.i.ready.eq(bits == 0)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [shift.eq(Cat(Const(0, 1), self.i.payload, Const(1, 1))),
                         bits.eq(10), timer.eq(self.divisor - 1)]
        with m.Elif(bits != 0):
            with m.If(timer == 0):
                m.d.sync += [shift.eq(Cat(shift[1:], Const(1, 1))), bits.eq(bits - 1),
                             timer.eq(self.divisor - 1)]
            with m.Else():
                m.d.sync += timer.eq(timer - 1)
        return m


class UartRx(wiring.Component):
    """UART receiver: 8N1 bytes from a serial line, ``divisor`` clock cycles per bit, as a
    stream, with counts of framing errors and overruns.

    The line goes through two synchronising flip-flops. A low level on it while idle is
    taken as a start bit's falling edge; each data bit is then sampled in its middle,
    ``divisor + divisor // 2`` cycles after that edge is seen for bit 0 and every
    ``divisor`` cycles after, and the stop bit likewise. A stop bit sampled high delivers the
    byte; a low one drops it and counts a framing error, and the receiver then waits for the
    line to go high before it looks for the next start bit.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 4 (:func:`divisor_for`).

    Attributes
    ----------
    rx : Signal(1), in
        The serial line, idle high; asynchronous (synchronised inside).
    o : stream of 8 bits, out
        The bytes received. A byte stays on ``o`` until taken; a byte not taken before the
        next one arrives is replaced by it (the older byte is lost) and counted in
        ``overruns``.
    errors : Signal(16), out
        Framing errors (stop bit low), wrapping.
    overruns : Signal(16), out
        Bytes lost because ``o`` was not taken in time, wrapping.

    Latency
    -------
    ``o.valid`` rises ``9 x divisor + divisor // 2 + 3`` cycles after the first cycle in
    which ``rx`` is low at the start bit (2 of them in the synchroniser).

    Throughput
    ----------
    Back-to-back bytes at the line rate, ``10 x divisor`` cycles each; a byte must be taken
    before the next byte's stop bit is sampled.

    Raises
    ------
    ValueError
        If ``divisor`` is not an int of at least 4.
    """

    def __init__(self, divisor):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__({"rx": In(1, init=1), "o": Out(stream.Signature(8)),
                          "errors": Out(16), "overruns": Out(16)})

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(self.divisor + self.divisor // 2 + 1))
        bits = Signal(range(10))
        shift = Signal(8)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~rx):                  # the start bit's edge
                    m.d.sync += [timer.eq(self.divisor + self.divisor // 2 - 1), bits.eq(0)]
                    m.next = "BITS"
            with m.State("BITS"):                # the middle of each data bit, then stop
                with m.If(timer == 0):
                    with m.If(bits == 8):
                        with m.If(rx):
                            with m.If(self.o.valid & ~self.o.ready):
                                m.d.sync += self.overruns.eq(self.overruns + 1)
                            m.d.sync += [self.o.payload.eq(shift), self.o.valid.eq(1)]
                        with m.Else():
                            m.d.sync += self.errors.eq(self.errors + 1)
                        m.next = "WAIT_HIGH"
                    with m.Else():
                        m.d.sync += [shift.eq(Cat(shift[1:], rx)), bits.eq(bits + 1),
                                     timer.eq(self.divisor - 1)]
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("WAIT_HIGH"):           # a low stop bit: wait for the line idle
                with m.If(rx):
                    m.next = "IDLE"
        return m


def status_text(items, prefix="MRC"):
    """A :class:`StatusLine`'s line as a list of characters (str) and nibbles ((item
    index, nibble)); its length is the line's in bytes."""
    text = list(prefix)
    for k, (name, width) in enumerate(items):
        text += list(f" {name}=")
        text += [(k, i) for i in reversed(range((width + 3) // 4))]
    return text + ["\r", "\n"]


class StatusLine(wiring.Component):
    """A status line printer: one line of ``name=HEX`` items as a stream of bytes for a
    :class:`UartTx`, each time ``trigger`` is high while idle.

    The line is ``prefix``, then for each item a space, ``name``, ``=`` and its value in
    ``ceil(width / 4)`` upper-case hex digits, most significant first, then CR LF
    (:func:`status_text`; :attr:`text` holds it, its length is the line's in bytes). Every
    value is latched when its line starts, so a line shows one instant. A ``trigger``
    while a line is being printed is ignored.

    Parameters
    ----------
    items : list of (str, int)
        ``(name, width)`` per item, in line order: ``name`` a Python identifier, ``width``
        1 .. 64 bits.
    prefix : str
        The line's first characters. Default ``"MRC"``.

    Attributes
    ----------
    trigger : Signal(1), in
        Print one line (taken only while ``busy`` is low).
    v_<name> : Signal(width), in
        One per item: the value to print, sampled in the cycle ``trigger`` is taken.
    o : stream of 8 bits, out
        The line's characters, to a :class:`UartTx`'s ``i``.
    busy : Signal(1), out
        High while a line is being printed.

    Latency
    -------
    The first character is on ``o`` in the cycle after the one in which ``trigger`` is
    taken.

    Throughput
    ----------
    One character per cycle while ``o.ready`` is high.

    Raises
    ------
    ValueError
        If an item's name is not an identifier or its width is outside 1 .. 64.
    """

    def __init__(self, items, prefix="MRC"):
        items = [(str(n), int(w)) for n, w in items]
        for name, width in items:
            if not name.isidentifier() or not 1 <= width <= 64:
                raise ValueError(f"item {name!r}: a name, and a width of 1 .. 64 bits")
        self.items = items
        self.text = status_text(items, prefix)
        super().__init__({"trigger": In(1), "o": Out(stream.Signature(8)), "busy": Out(1),
                          **{f"v_{n}": In(w) for n, w in items}})

    def elaborate(self, platform):
        m = Module()
        latched = [Signal(w, name=f"l_{n}") for n, w in self.items]
        pos = Signal(range(len(self.text) + 1), init=len(self.text))
        char = Signal(8)
        with m.Switch(pos):
            for i, t in enumerate(self.text):
                with m.Case(i):
                    if isinstance(t, str):
                        m.d.comb += char.eq(ord(t))
                    else:
                        k, nib = t
                        v = latched[k].shape().width
                        n = Signal(4, name=f"nib_{i}")
                        m.d.comb += n.eq(latched[k][4 * nib:min(4 * nib + 4, v)])
                        m.d.comb += char.eq(Mux(n < 10, ord("0") + n, ord("A") - 10 + n))
        idle = pos == len(self.text)
        m.d.comb += [self.busy.eq(~idle), self.o.valid.eq(~idle), self.o.payload.eq(char)]
        with m.If(idle & self.trigger):
            m.d.sync += pos.eq(0)
            for (name, _), reg in zip(self.items, latched):
                m.d.sync += reg.eq(getattr(self, f"v_{name}"))
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += pos.eq(pos + 1)
        return m
