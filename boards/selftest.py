"""The self-test of a board: :class:`SelfTest` (``selftest``), an MrcNic looped back to
itself through an on-chip fabric, with its traffic, its checker and a UART. How it runs,
its parameters and ports: the class docstring.
"""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.rx.ack_generator import ACK_REGS
from mrcnic.boards.console import LOSS_LEVELS, Console
from mrcnic.host.bringup import RxConfig, TxConfig, bring_up_rx, bring_up_tx
from mrcnic.boards.csr_script import CsrScript, record
from mrcnic.nic import MrcNic
from mrcnic.tx.mrc_tx import MRC_TX_REGS
from mrcnic.boards.plane_loop import PlaneLoop
from mrcnic.boards.traffic import DataChecker, TrafficGen
from mrcnic.base.records import TICK_NS

__all__ = ["SelfTest", "LOSS_LEVELS", "MAC", "IP", "RKEY", "BASE", "evs", "nic_params"]

MAC = 0x02_4D_52_43_00_01            # the NIC's own MAC and address (its peer is itself)
IP = 0xFD00 << 112 | 1
RKEY = 0x1234
BASE = 0x1_0000_0000
# Decision: the NIC's board-size options (MrcNic). The receive window is the sender's
# outstanding PSNs (mpr_max = outstanding / 128), which at the default 128 a 2-chunk
# PSN-tracker window covers whole; 4 held completions and a 4-entry pending table (2 QPs,
# 8 messages a run); no counters, since nothing on a board reads the
# NIC's registers after the bring-up (the UART line has the self-test's own counts).
# Together a fifth of the logic (docs/boards.md).
BOARD_OPTIONS = {"window_chunks": 2, "max_wimm_dest": 4, "pending": 4, "counter_width": 0}


def nic_params(planes=2, data_width=64, qps=2, ev_count=8, msgs=8, outstanding=128):
    """The self-test's :class:`MrcNic` parameters (also the NIC's rows of ``mrcnic report``):
    the sizes given, 2 memory regions, a 16 KiB receive buffer and the board options."""
    return dict(planes=planes, data_width=data_width, qps=qps, ev_count=ev_count,
                msgs=max(4, msgs), buffer_bytes=16384, regions=2, outstanding=outstanding,
                mpr_max=min(64, max(1, outstanding // 128)), **BOARD_OPTIONS)


def evs(count):
    """The EVs: SRv6 addresses (the on-chip fabric does not route; they only have to
    differ)."""
    return [0xFC00 << 112 | (0x100 + e) << 80 for e in range(count)]


def bring_up(nic, planes, qps, ev_count, pmtu_log2, clk_hz):
    """The bring-up coroutine of a NIC that writes to itself (for the script)."""
    tx = TxConfig(local_mac=MAC, local_ip=IP, peer_mac=MAC, peer_ip=IP,
                  outer_src=0xFC00_0000_0001 << 80, evs=evs(ev_count),
                  remote_qps=list(range(qps)), pmtu_log2=pmtu_log2,
                  tick_cycles=max(1, round(TICK_NS * clk_hz / 1e9)), timeout_exp=6,
                  probe_interval=round(clk_hz / 10_000))          # a probe per 100 us
    rx = RxConfig(local_mac=MAC, local_ip=IP, peer_mac=MAC, peer_ip=IP,
                  remote_qps=list(range(qps)), pmtu_log2=pmtu_log2,
                  regions=[(RKEY, 0, 1 << 48, 1, 0)], sack_every=4)

    async def both(read, write):
        await bring_up_tx(read, write, tx)
        await bring_up_rx(read, write, rx)
    ro = {("mrc-tx", "info"): MRC_TX_REGS["info"].pack(planes=planes, qps=qps),
          ("ack-generator", "info"): ACK_REGS["info"].pack(qps=qps),
          ("path-selector", "error"): 0}
    return record(nic.csr_buses(), both, ro)


class SelfTest(wiring.Component):
    """A board's self-test: an MrcNic looped back to itself through an on-chip fabric, with
    its traffic, its checker and a UART console.

    1. After reset a :class:`~mrcnic.boards.csr_script.CsrScript` brings the NIC up: the
       register accesses of :func:`mrcnic.host.bringup.bring_up_tx` and ``bring_up_rx`` for a
       NIC whose peer is itself (:func:`bring_up`), recorded at elaboration.
    2. Then :class:`~mrcnic.boards.traffic.TrafficGen` writes runs of ``msgs`` messages of
       ``2^msg_log2`` bytes over ``qps`` QPs; each plane's frames come back to the NIC
       through a :class:`~mrcnic.boards.plane_loop.PlaneLoop` (random loss, plane failure);
       the NIC places the payloads, and :class:`~mrcnic.boards.traffic.DataChecker` checks
       every byte and that every chunk of a run is placed once.
    3. A status line leaves on the UART every ``1 / report_hz`` seconds (and on the
       command ``s``): ``MRC`` then ``runs`` (runs completed), ``bytes`` (placed, wraps),
       ``data`` (beats not the pattern), ``dup`` (chunks placed twice in a run),
       ``stray`` (placements outside the run's chunks): all 0 when all is well; ``ev``
       (the path selector's EV state changes), ``fail`` (the planes failed, a bit each),
       ``loss`` (the loss setting), ``script`` (operations done of the bring-up; ``err`` 1
       if one was refused), and per plane ``f<p>`` frames and ``l<p>`` frames lost or
       failed.
    4. The operator's side is a :class:`~mrcnic.boards.console.Console`: commands on the
       UART (``0`` .. ``planes - 1`` fail or restore that plane, ``l`` the next loss
       setting, ``p`` pause or resume, ``s`` a status line now), the ``buttons`` (as the
       digits) and the ``leds``. ``p`` drives the generator's ``start``, which
       :class:`~mrcnic.boards.traffic.TrafficGen` looks at only before its first run.

    Parameters
    ----------
    planes : int
        Planes, 1, 2 or 4. Default 2.
    data_width : int
        The NIC's bus width in bits, a power of two 64 .. 2048. Default 64.
    qps : int
        QPs, 1 .. 1024. Default 2.
    ev_count : int
        EVs of the path selector, a power of two 2 .. 256, at least ``planes``. Default 8.
    pmtu_log2 : int
        The PMTU, ``2^pmtu_log2`` bytes, 8 .. ``msg_log2``; the NIC receives payloads of at
        most 4096 bytes. Default 10.
    msg_log2 : int
        Message size, ``2^msg_log2`` bytes, ``pmtu_log2`` .. 31. Default 13.
    msgs : int
        Messages a run, 1 .. 256; the NIC is built for ``max(4, msgs)`` messages in
        flight, which must be a power of two. Default 8.
    outstanding : int
        PSNs outstanding per QP, a power of two 128 .. 16384. Default 128.
    clk_hz : int
        The clock in Hz: sets the UART's divisor and the NIC's timers. Default 25_000_000.
    baud, report_hz : int, int or float
        The console's (:class:`~mrcnic.boards.console.Console`): the UART's baud rate,
        reachable within 2 % at ``clk_hz`` (default 115200), and status lines per second
        (default 1).

    Attributes
    ----------
    tx, rx, buttons : Signal(1), Signal(1), Signal(planes)
        The console's UART lines and plane buttons (:class:`~mrcnic.boards.console.Console`).
    leds : Signal(8), out
        0 changes state at each report while runs complete and nothing is bad; 1 ``bad``;
        2 once the NIC is up (the script done without error); 3 while loss is on; from 4
        up, a plane's link up, one a plane.
    bad : Signal(1), out
        Something is bad: ``data``, ``dup`` or ``stray`` > 0, or the script failed.
    up : Signal(1), out
        The bring-up script has finished (with or without error: see ``bad``).
    runs : Signal(32), out
        Runs completed.
    nic : MrcNic
        The NIC under test (:func:`nic_params`).
    ops : list
        The bring-up script's operations.
    console : Console
        The operator's side.
    divisor : int
        The UART's clock cycles per bit.

    Raises
    ------
    ValueError
        If ``planes`` is not 1, 2 or 4; ``clk_hz`` cannot make ``baud`` or ``report_hz``
        is too high for a line (:class:`~mrcnic.boards.console.Console`); or MrcNic
        refuses a parameter. ``pmtu_log2``, ``msg_log2`` and ``msgs`` are also checked
        when the top elaborates (:class:`~mrcnic.boards.traffic.TrafficGen`).
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, planes=2, data_width=64, qps=2, ev_count=8, pmtu_log2=10,
                 msg_log2=13, msgs=8, outstanding=128, clk_hz=25_000_000, baud=115200,
                 report_hz=1):
        if planes not in (1, 2, 4):
            raise ValueError(f"planes = {planes!r}: a self-test has 1, 2 or 4 planes")
        self.planes, self.data_width, self.qps = planes, data_width, qps
        self.ev_count, self.pmtu_log2 = ev_count, pmtu_log2
        self.msg_log2, self.msgs, self.clk_hz = msg_log2, msgs, clk_hz
        items = [("runs", 32), ("bytes", 32), ("data", 16), ("dup", 16), ("stray", 16),
                 ("ev", 16)]
        self.console = Console(planes, items, "MRC", clk_hz, baud, report_hz)
        self.divisor = self.console.divisor
        frame_bytes = (1 << pmtu_log2) + 160                     # headers with room
        self.frame_beats = -(-frame_bytes // (data_width // 8))
        self.nic = MrcNic(**nic_params(planes, data_width, qps, ev_count, msgs, outstanding))
        self.ops = bring_up(self.nic, planes, qps, ev_count, pmtu_log2, clk_hz)
        super().__init__({"tx": Out(1, init=1), "rx": In(1, init=1), "buttons": In(planes),
                          "leds": Out(8), "bad": Out(1), "up": Out(1), "runs": Out(32)})

    def elaborate(self, platform):
        m = Module()
        P, W = self.planes, self.data_width
        nic = m.submodules.nic = self.nic
        script = m.submodules.script = CsrScript(self.ops, nic.bus.addr_width)
        wiring.connect(m, script.m_axil, nic.s_axil)
        up = script.done & ~script.error
        m.d.comb += self.up.eq(script.done)

        # The operator: commands, buttons, the status line, the LEDs.
        con = m.submodules.console = self.console
        m.d.comb += [con.rx.eq(self.rx), self.tx.eq(con.tx), con.buttons.eq(self.buttons),
                     self.leds.eq(con.leds)]


        run = dict(msg_log2=self.msg_log2, msgs=self.msgs, pmtu_log2=self.pmtu_log2,
                   base=BASE)
        gen = m.submodules.gen = TrafficGen(W, self.qps, rkey=RKEY, **run)
        chk = m.submodules.chk = DataChecker(W, P, **run)
        m.d.comb += [gen.start.eq(up & chk.ready & ~con.pause), chk.odd.eq(gen.odd),
                     gen.run_ok.eq(chk.run_ok),
                     self.runs.eq(gen.runs)]
        wiring.connect(m, gen.wr, nic.wr)
        wiring.connect(m, nic.done, gen.done)
        wiring.connect(m, nic.preq, gen.preq)
        wiring.connect(m, gen.m_axis, nic.s_axis)
        for name in ("cpl", "nak", "access_nak", "event", "rtt"):
            m.d.comb += getattr(nic, name).ready.eq(1)

        # The fabric: each plane back to itself.
        loops = []
        for p in range(P):
            lp = PlaneLoop(W, depth=max(512, 2 * self.frame_beats),
                           frame_beats=self.frame_beats, seed=0xACE1 + 0x1F3 * p)
            m.submodules[f"loop{p}"] = lp
            loops.append(lp)
            wiring.connect(m, getattr(nic, f"m{p}_axis"), lp.s_axis)
            wiring.connect(m, lp.m_axis, getattr(nic, f"s{p}_axis"))
            wiring.connect(m, getattr(nic, f"place{p}"), getattr(chk, f"place{p}"))
            wiring.connect(m, getattr(nic, f"pl{p}_axis"), getattr(chk, f"pl{p}_axis"))
            m.d.comb += [lp.fail.eq(con.fail[p]), lp.loss.eq(con.loss)]
        ups = Cat(lp.port_up for lp in loops)
        m.d.comb += [nic.port_up.eq(ups), nic.credit.eq(Cat(lp.credit for lp in loops))]

        events = Signal(32)
        with m.If(nic.event.valid):
            m.d.sync += events.eq(events + 1)

        # Status: the line and the LEDs.
        bad = Signal(32)
        m.d.comb += [bad.eq(chk.bad_data + chk.duplicates + chk.strays),
                     self.bad.eq((bad != 0) | script.error),
                     con.progress.eq(gen.runs), con.bad.eq(self.bad), con.up.eq(up),
                     con.ports_up.eq(ups)]
        line = con.line
        m.d.comb += [line.v_runs.eq(gen.runs), line.v_bytes.eq(chk.bytes),
                     line.v_data.eq(chk.bad_data), line.v_dup.eq(chk.duplicates),
                     line.v_stray.eq(chk.strays), line.v_ev.eq(events),
                     con.script.eq(script.step), con.script_error.eq(script.error)]
        for p, lp in enumerate(loops):
            m.d.comb += [con.frames[p].eq(lp.frames), con.lost[p].eq(lp.lost + lp.failed)]
        return m
