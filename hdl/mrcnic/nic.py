"""The NIC datapath: :class:`MrcNic` (``mrc-nic``), the transmit and receive halves on
shared plane ports.

Operation
    * Transmit: :class:`~mrcnic.tx.mrc_tx.MrcTx` (work requests, payload requests and
      payloads, send completions, EV events, the path selector's port inputs).
    * Receive: :class:`~mrcnic.rx.mrc_rx.MrcRx` (per-plane placement ``pl{p}_axis`` with
      ``place{p}``, WRITE-with-immediate completions ``cpl``, the peer's AETH NAKs
      ``nak``, and the receive half's other outputs under their own names).
    * The SACKs and NACKs the receive half takes from the peer (``ack``) go to the
      transmit half's retransmit tracker; the peer's port status updates (``peer``) to its
      path selector.
    * Plane p: frames from the network on ``s{p}_axis`` go to the receive half; frames to
      the network on ``m{p}_axis`` are the receive half's control frames (SACK, NACK, AETH)
      and the transmit half's data frames, whole frames, control first
      (:class:`~mrcnic.base.stream.FramePriorityMux`).
    * Registers: one AXI4-Lite port, a :class:`~mrcnic.base.csr.bus.CsrBus` of two nested buses
      (type ``csr-bus``): the transmit half's at window 1, the receive half's at window 2,
      each with its own directory (:func:`mrcnic.host.bringup.find_blocks` walks both).

Parameters
    ``planes`` 1, 2, 4 or 8 (default 4); ``data_width`` (default 64); ``qps`` (default 8);
    ``ev_count`` (default 32); ``msgs`` (default 16); ``buffer_bytes`` per plane (default
    16384); ``regions`` (default 16); ``outstanding`` PSNs per QP in the retransmit
    tracker (default 1024). Board-size options (a board's self-test takes them all):
    ``mpr_max`` of the PSN tracker (default 8; 1 suits ``outstanding`` 128),
    ``window_chunks`` of the PSN tracker (3 or 2, default 3), its ``max_wimm_dest`` held
    completions (default 8), ``pending`` entries of the
    retransmit tracker's table (default 16), ``counter_width`` of every block's counters
    (32, 16 or 0: none, default 32). ``pmtu_max``: the longest payload received (default
    4096; 8192 for a jumbo PMTU, with ``buffer_bytes`` at least 4 x PMTU).

Latency, throughput
    As the halves, plus one cycle on each plane's output (the frame mux).
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr.regs import AxiLiteSignature
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
    """See the module docstring: the NIC datapath, ``mrc-nic``."""

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


