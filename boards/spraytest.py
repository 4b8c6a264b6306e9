"""The self-test of the smaller boards: :class:`SprayTest`, the transmit
path selector spraying frames over an on-chip fabric through the SRv6 header inserter and
remover, every byte checked; :class:`SprayGen` and :class:`SprayCheck` are its traffic
and its checker. How it runs, what it shows, parameters and ports: the classes' docstrings.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto
from mrcnic.host.bringup import bring_up_selector, find_blocks
from mrcnic.boards.console import Console
from mrcnic.base.csr.bus import CsrBus
from mrcnic.boards.csr_script import CsrScript, record
from mrcnic.boards import spray_frame as spray
from mrcnic.tx.path_selector import SELECTOR_REGS, PathSelector
from mrcnic.base.records import REQUEST, response_layout, DECAP_META
from mrcnic.boards.plane_loop import PlaneLoop
from mrcnic.base.proto import BTH, ETH, IPV6, EvMode
from mrcnic.tx.srv6_encap import ENCAP_DESC, Srv6Encap
from mrcnic.rx.srv6_decap import Srv6Decap
from mrcnic.base.stream import AxiStreamSignature, check_data_width, frame_demux, meta_stream

__all__ = ["SprayTest", "SprayGen", "SprayCheck", "bring_up", "EV_BITS", "OUTER_SRC"]

EV_BITS = 128                             # the EVs are SRv6 addresses
OUTER_SRC = 0xFC00_0000_0002 << 80
POS_SEQ = ETH.size + IPV6.offset("src")[0] + 12         # the low 32 bits of the source
POS_FLOW = ETH.size + 2                                 # the flow label's low 16 bits
POS_SPORT = ETH.size + IPV6.size                        # the UDP source port
POS_QP = POS_SPORT + 8 + BTH.offset("dest_qp")[0]       # 24 bits
POS_PSN = POS_SPORT + 8 + BTH.offset("psn")[0]          # 24 bits


def _template(payload):
    """The header bytes of frame 0 of QP 0 (the rest is put in by :func:`_frame_beat`)."""
    return spray.frame(0, 0, payload)[:spray.HEADER_LEN]


def _frame_beat(m, beat, seq, qp, payload, data_width, name):
    """The beat ``beat`` of spray frame ``seq`` of QP ``qp`` (UDP source port 0, ICRC 0),
    as a signal: header bytes from the template, with ``seq`` and ``qp`` in place, then the
    payload's byte pattern (:mod:`mrcnic.boards.spray_frame`)."""
    B = data_width // 8
    n = spray.frame_len(payload)
    head = _template(payload)
    qp24 = Signal(24, name=f"{name}_qp")
    m.d.comb += qp24.eq(qp)
    dynamic = {}                         # big-endian fields: the first byte most significant
    for k in range(4):
        dynamic[POS_SEQ + k] = seq.word_select(3 - k, 8)
    for k in range(3):
        dynamic[POS_QP + k] = qp24.word_select(2 - k, 8)
        dynamic[POS_PSN + k] = seq.word_select(2 - k, 8)
    low, high = seq[:8], seq[8:16] ^ seq[16:24] ^ seq[24:32]

    def body(pos):                       # pos: a constant or a signal
        return ((pos + low)[:8] ^ high)

    out = Signal(data_width, name=name)
    header_beats = -(-spray.HEADER_LEN // B)
    with m.Switch(beat):
        for b in range(header_beats):
            with m.Case(b):
                lanes = []
                for j in range(B):
                    pos = b * B + j
                    if pos < spray.HEADER_LEN:
                        lanes.append(dynamic.get(pos, Const(head[pos], 8)))
                    elif pos < n - proto.ICRC_LEN:
                        lanes.append(body(pos))
                    else:
                        lanes.append(Const(0, 8))
                m.d.comb += out.eq(Cat(*lanes))
        with m.Default():
            base = Signal(16, name=f"{name}_pos")
            m.d.comb += base.eq(beat * B)
            lanes = [Mux(base + j < n - proto.ICRC_LEN, body(base + j), 0)
                     for j in range(B)]
            m.d.comb += out.eq(Cat(*lanes))
    return out


def _frame_shape(data_width, payload):
    """(bytes a beat, frame bytes, beats, bytes of the last beat) of a spray frame."""
    B = data_width // 8
    n = spray.frame_len(payload)
    beats = -(-n // B)
    return B, n, beats, n - (beats - 1) * B


def _check_params(planes, data_width, qps, ev_count, payload):
    if planes not in (2, 4):
        raise ValueError(f"planes = {planes!r}: the spray test has 2 or 4 planes")
    check_data_width(data_width, minimum=64, maximum=256, power_of_two=True)
    if not isinstance(qps, int) or not 1 <= qps <= 16:
        raise ValueError(f"qps = {qps!r} must be 1 .. 16")
    if not isinstance(ev_count, int) or ev_count < planes or ev_count & (ev_count - 1) \
            or ev_count > 256:
        raise ValueError(f"ev_count = {ev_count!r} must be a power of two, {planes} .. 256")
    if not isinstance(payload, int) or not 0 <= payload <= 4096:
        raise ValueError(f"payload = {payload!r} must be 0 .. 4096 bytes")


class SprayGen(wiring.Component):
    """The spray test's traffic: path requests, and a frame for each path given.

    It asks the path selector for a path for QP 0, 1, ... ``qps - 1`` in turn, one
    request a cycle while ``run`` is high. Each answer with a usable EV becomes the next
    frame: spray frame ``seq`` (a 32-bit count of the frames decided) of the answer's QP
    (:mod:`mrcnic.boards.spray_frame`, UDP source port 0, ICRC 0), with an encapsulator
    descriptor in SRV6 mode carrying the answer's expanded EV and entropy, and the plane
    the answer names. An answer with no usable EV (``none``) is counted in ``stalls`` and
    makes no frame.

    Parameters
    ----------
    data_width : int
        Bus width in bits, 64, 128 or 256. Default 64.
    qps : int
        QPs, 1 .. 16 (a frame keeps 4 bits of its QP). Default 2.
    payload : int
        Payload bytes per frame, 0 .. 4096. Default 256.

    Nothing is checked here; :class:`SprayTest` checks its parameters.

    Attributes
    ----------
    run : Signal(1), in
        Requests go out while high.
    req : stream of :data:`~mrcnic.base.records.REQUEST`, out
        To the path selector: ``qp`` only (the other fields 0).
    rsp : stream of :func:`~mrcnic.base.records.response_layout` (128), in
        The path selector's answers; ready while there is room for another frame.
    desc : stream of :data:`~mrcnic.tx.srv6_encap.ENCAP_DESC`, out
        One encapsulator descriptor a frame: SRV6 mode, the expanded EV, the entropy, outer
        source :data:`OUTER_SRC`, ECN ECT(0), hop limit 64.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        The frames, to the encapsulator; ``tuser`` 0.
    plane : stream of ``plane`` (3 bits), out
        The plane of each frame, in frame order, for the demultiplexer after the
        encapsulator.
    sent : Signal(32), out
        Frames whose last beat left.
    stalls : Signal(32), out
        Answers with no usable EV.

    Throughput
    ----------
    One request a cycle; one beat a cycle, frames back to back. Three frames are decided
    ahead of the one on ``m_axis`` (the FIFOs' depth).
    """

    def __init__(self, data_width=64, qps=2, payload=256):
        self.data_width, self.qps, self.payload = data_width, qps, payload
        super().__init__({
            "run": In(1),
            "req": Out(meta_stream(REQUEST)), "rsp": In(meta_stream(response_layout(EV_BITS))),
            "desc": Out(meta_stream(ENCAP_DESC)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "plane": Out(meta_stream(data.StructLayout({"plane": 3}))),
            "sent": Out(32), "stalls": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        B, n, beats, tail = _frame_shape(W, self.payload)

        qp = Signal(range(self.qps))
        m.d.comb += [self.req.valid.eq(self.run), self.req.payload.qp.eq(qp)]
        with m.If(self.req.valid & self.req.ready):
            m.d.sync += qp.eq(Mux(qp == self.qps - 1, 0, qp + 1))

        FRAME = data.StructLayout({"seq": 32, "qp": 4})
        fifos = {}
        for name, width in (("desc", ENCAP_DESC.size), ("frame", FRAME.size), ("plane", 3)):
            fifos[name] = m.submodules[f"{name}_fifo"] = SyncFIFOBuffered(width=width, depth=4)
        r = self.rsp.payload
        seq = Signal(32)
        room = Cat(f.w_rdy for f in fifos.values()).all()
        take = self.rsp.valid & room
        m.d.comb += self.rsp.ready.eq(room)
        with m.If(take & r.none):
            m.d.sync += self.stalls.eq(self.stalls + 1)
        go = take & ~r.none
        with m.If(go):
            m.d.sync += seq.eq(seq + 1)
        e = data.View(ENCAP_DESC, fifos["desc"].w_data)
        f = data.View(FRAME, fifos["frame"].w_data)
        m.d.comb += [e.mode.eq(EvMode.SRV6), e.ev.eq(r.expanded << (256 - EV_BITS)),
                     e.entropy.eq(r.entropy), e.outer_src.eq(OUTER_SRC),
                     e.ecn.eq(proto.ECN_ECT0), e.hop_limit.eq(64),
                     f.seq.eq(seq), f.qp.eq(r.qp), fifos["plane"].w_data.eq(r.plane)]
        for fifo in fifos.values():
            m.d.comb += fifo.w_en.eq(go)
        for name, port in (("desc", self.desc), ("plane", self.plane)):
            m.d.comb += [port.payload.eq(fifos[name].r_data), port.valid.eq(fifos[name].r_rdy),
                         fifos[name].r_en.eq(port.ready)]

        # The frame at the head of its FIFO, beat by beat.
        head = data.View(FRAME, fifos["frame"].r_data)
        beat = Signal(range(beats))
        o = self.m_axis
        last = beat == beats - 1
        m.d.comb += [o.tvalid.eq(fifos["frame"].r_rdy),
                     o.tdata.eq(_frame_beat(m, beat, head.seq, head.qp, self.payload, W,
                                            "gen_beat")),
                     o.tlast.eq(last), o.tkeep.eq(Mux(last, (1 << tail) - 1, (1 << B) - 1))]
        with m.If(o.tvalid & o.tready):
            m.d.sync += beat.eq(Mux(last, 0, beat + 1))
            with m.If(last):
                m.d.comb += fifos["frame"].r_en.eq(1)
                m.d.sync += self.sent.eq(self.sent + 1)
        return m


class SprayCheck(wiring.Component):
    """One plane's checker of the spray test: the decapsulator's frames and records in,
    ``good`` and ``bad`` frame counts out.

    A frame is bad when a byte differs from the frame its ``seq`` names (all but the UDP
    source port, the QP and the ICRC, which are checked apart or not at all), when it is
    not exactly the frame's length, when ``tuser[0]`` or its record's ``bad`` is set or the
    record's mode is not SRV6, when the outer destination is not the address of an EV of
    this plane or the UDP source port and flow label are not that EV's entropy
    (``proto.srv6_entropy``), when the
    QP is not below ``qps``, or when its ``seq`` is not above that of the plane's last good
    frame.

    Parameters
    ----------
    data_width : int
        Bus width in bits, 64, 128 or 256.
    plane : int
        This plane's index, 0 .. ``planes - 1``.
    planes : int
        Planes, 2 or 4 (EV ``e`` is on plane ``e mod planes``).
    qps : int
        QPs, 1 .. 16.
    ev_count : int
        EVs, a power of two ``planes`` .. 256.
    payload : int
        Payload bytes per frame, 0 .. 4096.

    Nothing is checked here; :class:`SprayTest` checks its parameters.

    Attributes
    ----------
    s_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        The decapsulator's frames.
    meta : stream of :data:`~mrcnic.base.records.DECAP_META`, in
        The decapsulator's record of each frame (mode, outer destination in ``residue``,
        ``bad``).
    good : Signal(32), out
        Frames that passed.
    bad : Signal(32), out
        Frames that did not.

    Throughput
    ----------
    One beat a cycle: always ready, but for a frame's last beat, which waits for the
    frame's record (the decapsulator gives it no later).
    """

    def __init__(self, data_width, plane, planes, qps, ev_count, payload):
        self.data_width, self.plane, self.planes = data_width, plane, planes
        self.qps, self.ev_count, self.payload = qps, ev_count, payload
        super().__init__({
            "s_axis": In(AxiStreamSignature(data_width)), "meta": In(meta_stream(DECAP_META)),
            "good": Out(32), "bad": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        W = self.data_width
        B, n, beats, tail = _frame_shape(W, self.payload)
        i = self.s_axis
        beat = Signal(16)                      # beats of this frame so far
        seq, qp, sport, flow = Signal(32), Signal(24), Signal(16), Signal(16)
        seen = Signal()                        # a frame checked on this plane before
        last_seq = Signal(32)
        wrong = Signal()                       # a fault in the frame's beats so far

        # The bytes that carry seq, the QP, the UDP port and the flow label: taken from the
        # beat they are in (so seq is known from its own beat on); compared apart.
        cur_seq, cur_qp, cur_sport = Signal(32), Signal(24), Signal(16)
        cur_flow = Signal(16)
        m.d.comb += [cur_seq.eq(seq), cur_qp.eq(qp), cur_sport.eq(sport), cur_flow.eq(flow)]
        skip = set(range(POS_SPORT, POS_SPORT + 2)) | set(range(POS_QP, POS_QP + 3)) \
            | set(range(POS_FLOW, POS_FLOW + 2)) \
            | set(range(n - proto.ICRC_LEN, n))
        for what, cur, reg, pos, size in (("seq", cur_seq, seq, POS_SEQ, 4),
                                          ("qp", cur_qp, qp, POS_QP, 3),
                                          ("sport", cur_sport, sport, POS_SPORT, 2),
                                          ("flow", cur_flow, flow, POS_FLOW, 2)):
            b0, j0 = divmod(pos, B)
            assert (pos + size - 1) // B == b0, f"{what} spans two beats"
            with m.If(beat == b0):
                value = Cat(*reversed([i.tdata.word_select(j0 + k, 8) for k in range(size)]))
                m.d.comb += cur.eq(value)
                with m.If(i.tvalid & i.tready):
                    m.d.sync += reg.eq(value)
        want = _frame_beat(m, beat, cur_seq, Const(0, 24), self.payload, W, "chk_beat")
        mask = Signal(B)
        with m.Switch(beat):
            for b in range(beats):
                with m.Case(b):
                    m.d.comb += mask.eq(Cat(Const(int(b * B + j not in skip and b * B + j < n),
                                                  1) for j in range(B)))
        lane_bad = Cat(*[mask[j] & (i.tdata.word_select(j, 8) != want.word_select(j, 8))
                         for j in range(B)]).any()
        at_last = beat == beats - 1
        shape_bad = Mux(i.tlast, ~at_last | (i.tkeep != (1 << tail) - 1),
                        at_last | (beat >= beats)) | i.tuser[0]
        order_bad = Signal()
        b_seq, j_seq = divmod(POS_SEQ, B)
        m.d.comb += order_bad.eq((beat == b_seq) & seen
                                 & ((cur_seq - last_seq)[31] | (cur_seq == last_seq)))

        # The record: the outer destination names the EV, which names the port and plane.
        meta = self.meta.payload
        ev_raw = Signal(16)
        m.d.comb += ev_raw.eq(meta.residue[80:96] - 0x100)
        want_addr = Const(0xFC00 << 112, 128) | (meta.residue[80:96] << 80)
        pb = (self.planes - 1).bit_length()
        meta_bad = (meta.bad | (meta.mode != EvMode.SRV6) | (meta.residue != want_addr)
                    | (ev_raw >= self.ev_count) | (ev_raw[:pb] != self.plane)
                    | (cur_sport != (ev_raw | proto.SRV6_ENTROPY_BASE))
                    | (cur_flow != (ev_raw | proto.SRV6_ENTROPY_BASE)) | (cur_qp >= self.qps))

        m.d.comb += i.tready.eq(~i.tlast | self.meta.valid)
        with m.If(i.tvalid & i.tready):
            fault = wrong | lane_bad | shape_bad | order_bad
            with m.If(i.tlast):
                m.d.comb += self.meta.ready.eq(1)
                m.d.sync += [beat.eq(0), wrong.eq(0)]
                with m.If(fault | meta_bad):
                    m.d.sync += self.bad.eq(self.bad + 1)
                with m.Else():
                    # the order follows the good frames (a bad one's seq may be garbage)
                    m.d.sync += [self.good.eq(self.good + 1), last_seq.eq(cur_seq),
                                 seen.eq(1)]
            with m.Else():
                m.d.sync += [beat.eq(Mux(beat == 0xFFFF, beat, beat + 1)), wrong.eq(fault)]
        return m


def bring_up(bus, qps, ev_count):
    """The bring-up script (operations) of the path selector behind ``bus``."""
    async def selector(read, write):
        blocks = await find_blocks(read, write)
        await bring_up_selector(blocks["path-selector"][0],
                                [spray.ev_address(e) for e in range(ev_count)], qps)
    return record([(0, bus)], selector, {("path-selector", "error"): 0})


class SprayTest(wiring.Component):
    """The self-test of the smaller boards: the transmit path selector spraying frames over
    an on-chip fabric through the SRv6 header inserter and remover, every byte checked.

    1. After reset a :class:`~mrcnic.boards.csr_script.CsrScript` loads the path selector:
       one SRv6 profile of ``ev_count`` EVs (EV ``e`` is the address
       :func:`~mrcnic.boards.spray_frame.ev_address`, on plane ``e mod planes``), every QP
       on it (:func:`bring_up`, the same :func:`~mrcnic.host.bringup.bring_up_selector` as
       the NIC's).
    2. :class:`SprayGen` asks the path selector for a path for QP 0, 1, ... in turn; each
       answer becomes the next frame, sent through a
       :class:`~mrcnic.tx.srv6_encap.Srv6Encap` in SRV6 mode to the plane the answer names.
       An answer with no usable EV (every plane failed) is counted (``stall``) and makes
       no frame.
    3. Each plane is a :class:`~mrcnic.boards.plane_loop.PlaneLoop` (random loss, failure:
       the path selector sees the plane's ``port_up`` and ``credit``), then a
       :class:`~mrcnic.rx.srv6_decap.Srv6Decap`, then a :class:`SprayCheck`. Frames that
       pass are ``good``; the others ``bad``.
    4. A :class:`~mrcnic.boards.console.Console` reports on the UART every
       ``1 / report_hz`` s: ``SPR`` then ``sent`` (frames sent), ``good``, ``bad``,
       ``stall``, ``fail`` (planes failed, a bit each), ``loss`` (the loss setting),
       ``script`` (bring-up operations done; ``err`` 1 if one was refused), and per plane
       ``f<p>`` (frames in) and ``l<p>`` (frames lost or dropped while failed). When the
       traffic is paused (``p``) and has drained, ``sent`` = ``good`` + ``bad`` + the sum
       of ``l<p>``. Commands and LEDs as the console's: ``0`` .. ``planes - 1`` fail or
       restore a plane, ``l`` loss, ``p`` pause, ``s`` a line now; LED 0 blinks while good
       frames arrive and nothing is bad.

    What it shows: the selector spreads the frames evenly over the planes; a plane failed
    by a button or a command stops receiving frames at once (only frames decided before
    the failure are dropped, a few), the others carry all the traffic; the SRv6 header is
    inserted and removed with every byte intact. (Loss is counted, not repaired: the
    retransmit tracker belongs to the NIC self-test of the 85F boards.)

    Parameters
    ----------
    planes : int
        Planes, 2 or 4. Default 2.
    data_width : int
        Bus width in bits: 64, 128 or 256. Default 64.
    qps : int
        QPs, 1 .. 16. Default 2.
    ev_count : int
        EVs, a power of two ``planes`` .. 256. Default 8.
    payload : int
        Payload bytes per frame, 0 .. 4096. Default 256.
    clk_hz : int
        The clock in Hz (the UART's divisor). Default 25_000_000.
    baud, report_hz : int, int or float
        The console's (:class:`~mrcnic.boards.console.Console`): the UART's baud rate,
        reachable within 2 % at ``clk_hz`` (default 115200), and status lines per second
        (default 1).

    Attributes
    ----------
    tx, rx, buttons : Signal(1), Signal(1), Signal(planes)
        The console's UART lines and plane buttons (:class:`~mrcnic.boards.console.Console`).
    leds : Signal(8), out
        The console's LEDs (:class:`~mrcnic.boards.console.Console`); LED 0 blinks while
        good frames arrive.
    up : Signal(1), out
        The bring-up script has finished (with or without error: see ``bad``).
    bad : Signal(1), out
        A bad frame on any plane, or the script failed.
    sent : Signal(32), out
        Frames sent.
    good : Signal(32), out
        Good frames, all planes.
    bus : CsrBus
        The register bus of the path selector, which the script plays on.
    ops : list
        The bring-up script's operations.
    console : Console
        The operator's side.
    divisor : int
        The UART's clock cycles per bit.

    Throughput
    ----------
    One beat a cycle from the encapsulator, frames back to back: with 256 payload bytes,
    a frame of 334 bytes is 47 beats at 64 bits with its 40-byte SRv6 header.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``planes`` is not 2 or 4, ``data_width`` is not 64, 128 or 256, ``qps`` is
        outside 1 .. 16, ``ev_count`` is not a power of two ``planes`` .. 256, ``payload``
        is outside 0 .. 4096; or ``clk_hz`` cannot make ``baud`` or ``report_hz`` is too
        high for a line (:class:`~mrcnic.boards.console.Console`).
    """

    def __init__(self, planes=2, data_width=64, qps=2, ev_count=8, payload=256,
                 clk_hz=25_000_000, baud=115200, report_hz=1):
        _check_params(planes, data_width, qps, ev_count, payload)
        self.planes, self.data_width, self.qps = planes, data_width, qps
        self.ev_count, self.payload, self.clk_hz = ev_count, payload, clk_hz
        items = [("sent", 32), ("good", 32), ("bad", 32), ("stall", 32)]
        self.console = Console(planes, items, "SPR", clk_hz, baud, report_hz)
        self.divisor = self.console.divisor
        B = data_width // 8
        self.frame_beats = -(-(spray.frame_len(payload) + proto.OUTER_IPV6_LEN) // B)
        self.bus = CsrBus([("path-selector", SELECTOR_REGS.addr_width)])
        self.ops = bring_up(self.bus, qps, ev_count)
        super().__init__({"tx": Out(1, init=1), "rx": In(1, init=1), "buttons": In(planes),
                          "leds": Out(8), "up": Out(1), "bad": Out(1),
                          "sent": Out(32), "good": Out(32)})

    def elaborate(self, platform):
        m = Module()
        P, W = self.planes, self.data_width
        sel = m.submodules.selector = PathSelector(self.qps, self.ev_count, P, profiles=1,
                                                   ev_bits=EV_BITS, counter_width=0)
        bus = m.submodules.bus = self.bus
        script = m.submodules.script = CsrScript(self.ops, bus.addr_width)
        wiring.connect(m, script.m_axil, bus.s_axil)
        wiring.connect(m, bus.m_axil[0], sel.s_axil)
        up = script.done & ~script.error
        m.d.comb += [self.up.eq(script.done), sel.fb.valid.eq(0), sel.event.ready.eq(1),
                     sel.probe.ready.eq(1)]

        con = m.submodules.console = self.console
        m.d.comb += [con.rx.eq(self.rx), self.tx.eq(con.tx), con.buttons.eq(self.buttons),
                     self.leds.eq(con.leds)]

        gen = m.submodules.gen = SprayGen(W, self.qps, self.payload)
        encap = m.submodules.encap = Srv6Encap(W, counter_width=0)
        m.d.comb += gen.run.eq(up & ~con.pause)
        wiring.connect(m, gen.req, sel.req)
        wiring.connect(m, sel.rsp, gen.rsp)
        wiring.connect(m, gen.desc, encap.desc)
        wiring.connect(m, gen.m_axis, encap.s_axis)

        loops, checks = [], []
        for p in range(P):
            lp = PlaneLoop(W, depth=max(64, 2 * self.frame_beats), frame_beats=self.frame_beats,
                           seed=0xACE1 + 0x1F3 * p)
            dec = Srv6Decap(W, counter_width=0)
            chk = SprayCheck(W, p, P, self.qps, self.ev_count, self.payload)
            m.submodules[f"loop{p}"], m.submodules[f"decap{p}"] = lp, dec
            m.submodules[f"check{p}"] = chk
            loops.append(lp)
            checks.append(chk)
            wiring.connect(m, lp.m_axis, dec.s_axis)
            wiring.connect(m, dec.m_axis, chk.s_axis)
            wiring.connect(m, dec.meta, chk.meta)
            m.d.comb += [lp.fail.eq(con.fail[p]), lp.loss.eq(con.loss)]
        done = frame_demux(m, encap.m_axis, gen.plane.payload.plane, gen.plane.valid,
                           [lp.s_axis for lp in loops])
        m.d.comb += gen.plane.ready.eq(done)
        ups = Cat(lp.port_up for lp in loops)
        m.d.comb += [sel.port_up.eq(ups), sel.credit.eq(Cat(lp.credit for lp in loops))]

        good = sum(c.good for c in checks)
        bad = sum(c.bad for c in checks)
        m.d.comb += [self.sent.eq(gen.sent), self.good.eq(good),
                     self.bad.eq((bad != 0) | script.error),
                     con.progress.eq(self.good), con.bad.eq(self.bad), con.up.eq(up),
                     con.ports_up.eq(ups)]
        line = con.line
        m.d.comb += [line.v_sent.eq(gen.sent), line.v_good.eq(good), line.v_bad.eq(bad),
                     line.v_stall.eq(gen.stalls),
                     con.script.eq(script.step), con.script_error.eq(script.error)]
        for p, lp in enumerate(loops):
            m.d.comb += [con.frames[p].eq(lp.frames), con.lost[p].eq(lp.lost + lp.failed)]
        return m

