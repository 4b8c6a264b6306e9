"""The operator's side of a board self-test: :class:`Console`, the UART commands and
buttons that fail planes and set the loss, the status line every report period, and the
LEDs. Commands, line and LEDs: the class docstring.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.uart import StatusLine, UartRx, UartTx, divisor_for, status_text

__all__ = ["Console", "LOSS_LEVELS"]

LOSS_LEVELS = (0, 1024, 4096)        # PlaneLoop loss: none, 1/64, 1/16


class Console(wiring.Component):
    """The operator's side of a self-test: UART commands, buttons, status line and LEDs.

    * Commands on ``rx`` (8N1 at ``baud``): ``0`` .. ``planes - 1`` fail or restore that
      plane (``fail``), ``l`` the next loss setting (:data:`LOSS_LEVELS`: none, 1/64,
      1/16 of the frames; ``loss``), ``p`` pause or resume the traffic (``pause``), ``s``
      a status line now. A rising edge on ``buttons[p]`` (sampled every 10 ms, so
      debounced) does as ``p``'s digit.
    * The status line (:class:`~mrcnic.base.uart.StatusLine`) leaves on ``tx`` every
      ``1 / report_hz`` seconds and on ``s``: ``prefix``, the top's ``items`` (the top drives
      their ``v_<name>`` inputs of :attr:`line`), then the items every self-test shows,
      driven here: ``fail`` (the planes failed, a bit each), ``loss`` (the loss setting),
      ``script`` (the bring-up operations done, input ``script``; ``err`` = input
      ``script_error``), and per plane ``f<p>`` (input ``frames[p]``: frames into the
      plane) and ``l<p>`` (input ``lost[p]``: frames it lost or dropped while failed).
    * ``leds``: 0 changes state at each report while ``progress`` moved and ``bad`` is low;
      1 = ``bad``; 2 = ``up``; 3 on while loss is on; from 4 up, ``ports_up``, one a plane.

    Parameters
    ----------
    planes : int
        Planes, 1 .. 4.
    items : list of (str, int)
        The top's own ``(name, width)`` items, first on the line (names identifiers, widths
        1 .. 64, as :class:`~mrcnic.base.uart.StatusLine` takes them).
    prefix : str
        The line's first characters.
    clk_hz : int
        The clock, in Hz.
    baud : int
        The UART's baud rate; ``clk_hz`` must make it within 2 % with at least 4 cycles a
        bit (:func:`~mrcnic.base.uart.divisor_for`). Default 115200.
    report_hz : int or float
        Status lines per second, > 0; a line must take at most half a report period.
        Default 1.

    Attributes
    ----------
    rx : Signal(1), in
        The UART's receive line (commands), idle high.
    tx : Signal(1), out
        The UART's transmit line (status lines), idle high.
    buttons : Signal(planes), in
        One button a plane: a press fails or restores it.
    fail : Signal(planes), out
        The planes failed, a bit each.
    loss : Signal(16), out
        The loss setting for :class:`~mrcnic.boards.plane_loop.PlaneLoop`, one of
        :data:`LOSS_LEVELS` (``loss / 65536`` of the frames).
    pause : Signal(1), out
        Start no new traffic.
    progress : Signal(32), in
        A count that moves while the traffic goes well (LED 0 blinks while it does).
    bad : Signal(1), in
        Something is wrong (LED 1).
    up : Signal(1), in
        The device under test is up (LED 2).
    ports_up : Signal(planes), in
        The planes' links (LEDs 4 ..).
    leds : Signal(8), out
        The LEDs, as above; the bits above ``ports_up`` are 0.
    script : Signal(16), in
        The bring-up operations done, for the line's ``script``.
    script_error : Signal(1), in
        An operation of the bring-up was refused, for the line's ``err``.
    frames, lost : array of ``planes`` Signal(32), in
        Per plane, frames into it and frames it lost or dropped while failed.
    line : StatusLine
        The status line; the top drives the ``v_<name>`` inputs of its own ``items``.
    divisor : int
        The UART's clock cycles per bit.

    Raises
    ------
    ValueError
        If ``planes`` is outside 1 .. 4; ``clk_hz`` cannot make ``baud`` (see above);
        ``report_hz`` is not positive or reports more often than every two lines' time; or
        an item's name or width is refused by the status line.
    """

    def __init__(self, planes, items, prefix, clk_hz, baud=115200, report_hz=1):
        if not 1 <= planes <= 4:
            raise ValueError(f"planes = {planes!r}: a console has 1 .. 4 planes")
        self.planes, self.clk_hz = planes, clk_hz
        self.divisor = divisor_for(clk_hz, baud)
        self.items = [*items, ("fail", planes), ("loss", 16), ("script", 16), ("err", 1)]
        for p in range(planes):
            self.items += [(f"f{p}", 32), (f"l{p}", 32)]
        line_cycles = len(status_text(self.items, prefix)) * 10 * self.divisor
        self.report_cycles = clk_hz // report_hz if report_hz > 0 else 0
        if self.report_cycles < 2 * line_cycles:
            raise ValueError(f"report_hz = {report_hz!r}: a line takes {line_cycles} cycles "
                             f"at {baud} baud; report at most every {2 * line_cycles}")
        self.line = StatusLine(self.items, prefix)
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1), "buttons": In(planes),
                          "fail": Out(planes), "loss": Out(16), "pause": Out(1),
                          "progress": In(32), "bad": In(1), "up": In(1),
                          "ports_up": In(planes), "leds": Out(8),
                          "script": In(16), "script_error": In(1),
                          "frames": In(32).array(planes), "lost": In(32).array(planes)})

    def elaborate(self, platform):
        m = Module()
        P = self.planes
        fail, pause = self.fail, self.pause
        loss_sel = Signal(range(len(LOSS_LEVELS)))
        with m.Switch(loss_sel):
            for i, v in enumerate(LOSS_LEVELS):
                with m.Case(i):
                    m.d.comb += self.loss.eq(v)

        urx = m.submodules.urx = UartRx(self.divisor)
        m.d.comb += [urx.rx.eq(self.rx), urx.o.ready.eq(1)]
        cmd = urx.o.payload
        now = Signal()
        with m.If(urx.o.valid):
            for p in range(P):
                with m.If(cmd == ord("0") + p):
                    m.d.sync += fail[p].eq(~fail[p])
            with m.If(cmd == ord("l")):
                m.d.sync += loss_sel.eq(Mux(loss_sel == len(LOSS_LEVELS) - 1, 0, loss_sel + 1))
            with m.If(cmd == ord("p")):
                m.d.sync += pause.eq(~pause)
            with m.If(cmd == ord("s")):
                m.d.comb += now.eq(1)
        period = max(2, self.clk_hz // 100)
        debounce = Signal(range(period))
        held, last = Signal(P), Signal(P)
        m.d.sync += debounce.eq(Mux(debounce == 0, period - 1, debounce - 1))
        with m.If(debounce == 0):
            m.d.sync += [held.eq(self.buttons), last.eq(held)]
            for p in range(P):
                with m.If(held[p] & ~last[p]):
                    m.d.sync += fail[p].eq(~fail[p])

        line = m.submodules.line = self.line
        utx = m.submodules.utx = UartTx(self.divisor)
        wiring.connect(m, line.o, utx.i)
        m.d.comb += [self.tx.eq(utx.tx), line.v_fail.eq(fail), line.v_loss.eq(self.loss),
                     line.v_script.eq(self.script), line.v_err.eq(self.script_error)]
        for p in range(P):
            m.d.comb += [getattr(line, f"v_f{p}").eq(self.frames[p]),
                         getattr(line, f"v_l{p}").eq(self.lost[p])]
        timer = Signal(range(self.report_cycles))
        tick = timer == 0
        m.d.sync += timer.eq(Mux(tick, self.report_cycles - 1, timer - 1))
        m.d.comb += line.trigger.eq(tick | now)

        # LED 0: toggles each report period in which progress moved (and nothing is bad).
        blink, seen = Signal(), Signal(32)
        with m.If(tick):
            m.d.sync += seen.eq(self.progress)
            with m.If((self.progress != seen) & ~self.bad):
                m.d.sync += blink.eq(~blink)
            with m.Else():
                m.d.sync += blink.eq(0)
        m.d.comb += self.leds.eq(Cat(blink, self.bad, self.up, loss_sel != 0, self.ports_up,
                                     Const(0, 4 - P) if P < 4 else Cat()))
        return m
