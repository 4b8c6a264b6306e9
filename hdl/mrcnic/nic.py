"""The NIC datapath: :class:`MrcNic` (``mrc-nic``), the transmit and receive halves on
shared plane ports.

The top of the datapath: the transmit half (:class:`~mrcnic.tx.mrc_tx.MrcTx`) and the receive
half (:class:`~mrcnic.rx.mrc_rx.MrcRx`) joined, their plane ports shared through a frame mux
per plane, their registers behind one AXI4-Lite port.

Operation, decisions and measured figures: docs/blocks/mrc-nic.md.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr import AxiLiteSignature
from mrcnic.base.csr.bus import CsrBus
from mrcnic.rx.mrc_rx import MrcRx
from mrcnic.tx.mrc_tx import MrcTx
from mrcnic.base.stream import AxiStreamSignature, FramePriorityMux

__all__ = ["MrcNic"]


def _passed(name, half):
    """Whether a port of a half is a port of MrcNic under the same name: not the register
    port, not the peer's SACK/NACKs and port status between the halves, not the plane
    ports."""
    if name in ("s_axil", "ack", "peer"):
        return False
    plane_port = name.endswith("_axis") and name[1:-5].isdigit() and name[0] in "msa"
    return not plane_port


def _forward(m, member, outer, inner):
    if member.is_port:
        m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
    elif member.flow == In:
        wiring.connect(m, wiring.flipped(outer), inner)
    else:
        wiring.connect(m, inner, wiring.flipped(outer))


class MrcNic(wiring.Component):
    """The NIC datapath: the transmit and receive halves on shared plane ports.

    Frames from the network on ``s{p}_axis`` go to the receive half; frames to the network
    on ``m{p}_axis`` are the receive half's control frames (SACK, NACK, AETH NAK) and the
    transmit half's data, probe and port status frames, whole frames, control first
    (:class:`~mrcnic.base.stream.FramePriorityMux`). The SACKs and NACKs the receive half
    takes from the peer (``ack``) go to the transmit half's retransmit tracker, the peer's
    port status updates (``peer``) to its path selector. Every other port of each half is
    a port of MrcNic under the same name.

    Parameters
    ----------
    planes : int
        Planes (ports), one of 1, 2, 4, 8. Default 4.
    data_width : int
        Bus width in bits, a power of two 64 .. 2048. Default 64.
    qps : int
        Queue pairs, 1 .. 1024. Default 8.
    ev_count : int
        EVs per profile of the path selector, a power of two 2 .. 256, at least ``planes``.
        Default 32.
    msgs : int
        Messages in flight per QP in the segmenter, a power of two 2 .. 256. Default 16.
    buffer_bytes : int
        RoceRx's payload buffer per plane, a power of two of at least 2 x (``pmtu_max`` +
        the longest header). Default 16384.
    regions : int
        Memory regions of MemoryProtect, 1 .. 256. Default 16.
    outstanding : int
        PSNs outstanding per QP in the retransmit tracker, a power of two 128 .. 16384.
        Default 1024.
    mpr_max : int
        Keyword only. The PSN tracker's largest MPR, a power of two 1 .. 64 (1 suits
        ``outstanding`` 128). Default 8.
    window_chunks : int
        Keyword only. The PSN tracker's window in chunks, 2 or 3. Default 3.
    max_wimm_dest : int
        Keyword only. Completions the PSN tracker holds, 1 .. 32. Default 8.
    pending : int
        Keyword only. Entries of the retransmit tracker's pending table, 1 .. 64.
        Default 16.
    counter_width : int
        Keyword only. Width of every block's event counters: 32, 16 or 0 (no counters;
        they read 0). Default 32.
    pmtu_max : int
        Keyword only. The longest payload received, 256 .. 16384 (8192 for a jumbo PMTU,
        with ``buffer_bytes`` raised to match). Default 4096.

    The board-size options (``mpr_max`` .. ``pmtu_max``) are what a board's self-test sets.

    Attributes
    ----------
    s{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), in
        Frames from the network on plane p.
    m{p}_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit), out
        Frames to the network on plane p.
    wr, done, preq, s_axis, event, cwnd, port_up, credit : in and out
        The transmit half's (:class:`~mrcnic.tx.mrc_tx.MrcTx`): work requests, send
        completions, payload requests and payloads, EV state changes, congestion windows,
        per-plane port up and credit.
    pl{p}_axis, place{p}, cpl, nak, access_nak : out
        The receive half's (:class:`~mrcnic.rx.mrc_rx.MrcRx`): the payload of each placed
        packet with its :data:`~mrcnic.base.records.PLACE` record per plane,
        WRITE-with-immediate completions (:data:`~mrcnic.base.records.COMPLETION`), the
        peer's AETH NAKs and this NIC's access-error records (both
        :data:`~mrcnic.base.records.NAK`; ``access_nak`` must be read, or its ready tied
        high).
    s_axil : AXI4-Lite, in
        Registers: a :class:`~mrcnic.base.csr.bus.CsrBus` of two nested buses (type
        ``csr-bus``), the transmit half's at window 1 and the receive half's at window 2,
        each with its own directory (:func:`mrcnic.host.bringup.find_blocks` walks both).

    Latency
    -------
    As the halves, plus one cycle on each plane's output (the frame mux).

    Throughput
    ----------
    As the halves; each plane's frame mux passes one beat a cycle.

    Raises
    ------
    ValueError
        At construction, if a half refuses a parameter: ``planes``, ``qps``, ``msgs``,
        ``ev_count``, ``outstanding``, ``pending``, ``window_chunks``, ``max_wimm_dest``,
        ``counter_width`` (the ranges above). ``data_width``, ``buffer_bytes``,
        ``regions``, ``mpr_max`` and ``pmtu_max`` are checked when the receive half
        elaborates its blocks; ``data_width`` by the transmit half at construction too.
    TypeError
        If ``data_width`` is not an int.
    """

    def __init__(self, planes=4, data_width=64, qps=8, ev_count=32, msgs=16,
                 buffer_bytes=16384, regions=16, outstanding=1024, *, mpr_max=8,
                 window_chunks=3, max_wimm_dest=8, pending=16, counter_width=32,
                 pmtu_max=4096):
        self.planes, self.data_width, self.qps = planes, data_width, qps
        self.tx = MrcTx(planes, data_width, qps, msgs, ev_count, outstanding=outstanding,
                        pending=pending, counter_width=counter_width)
        self.rx = MrcRx(planes, data_width, qps, mpr_max=mpr_max, buffer_bytes=buffer_bytes,
                        regions=regions, window_chunks=window_chunks,
                        max_wimm_dest=max_wimm_dest, counter_width=counter_width,
                        pmtu_max=pmtu_max)
        self.bus = CsrBus([("csr-bus", self.tx.bus.addr_width),
                           ("csr-bus", self.rx.bus.addr_width)])
        axis = AxiStreamSignature(data_width)
        members = {"s_axil": In(AxiLiteSignature(self.bus.addr_width))}
        for half in (self.tx, self.rx):
            for name, member in half.signature.members.items():
                if _passed(name, half):
                    members[name] = member
        for p in range(planes):
            members[f"s{p}_axis"] = In(axis)
            members[f"m{p}_axis"] = Out(axis)
        super().__init__(members)

    def csr_buses(self, base=0):
        """``[(base, CsrBus)]`` of every register bus, the nested ones at their bases (for
        :class:`~mrcnic.boards.csr_script.ScriptRecorder`)."""
        wb = self.bus.window_bits
        return [(base, self.bus), (base + (1 << wb), self.tx.bus), (base + (2 << wb), self.rx.bus)]

    def elaborate(self, platform):
        m = Module()
        m.submodules.bus = bus = self.bus
        m.submodules.tx = tx = self.tx
        m.submodules.rx = rx = self.rx
        wiring.connect(m, wiring.flipped(self.s_axil), bus.s_axil)
        wiring.connect(m, bus.m_axil[0], tx.s_axil)
        wiring.connect(m, bus.m_axil[1], rx.s_axil)
        for half in (tx, rx):
            for name, member in half.signature.members.items():
                if _passed(name, half):
                    _forward(m, member, getattr(self, name), getattr(half, name))
        wiring.connect(m, rx.ack, tx.ack)
        wiring.connect(m, rx.peer, tx.peer)
        for p in range(self.planes):
            wiring.connect(m, wiring.flipped(getattr(self, f"s{p}_axis")),
                           getattr(rx, f"s{p}_axis"))
            mux = FramePriorityMux(self.data_width, 2)
            m.submodules[f"out{p}"] = mux
            wiring.connect(m, getattr(rx, f"a{p}_axis"), mux.s_axis[0])
            wiring.connect(m, getattr(tx, f"m{p}_axis"), mux.s_axis[1])
            wiring.connect(m, mux.m_axis, wiring.flipped(getattr(self, f"m{p}_axis")))
        return m


