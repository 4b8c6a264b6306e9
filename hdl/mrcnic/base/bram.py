"""A block RAM whose reads leave a register: :class:`BlockRam`.

A block RAM read without an output register is slow on every FPGA (ECP5's DP16KD leaves a
fast stage little time for anything after it: docs/blocks/psn-tracker.md has the figures);
with the register the RAM already has, the data leaves it with about a flip-flop's delay. Yosys' ECP5 memory mapping never uses that register, and its emulation
of a read that sees the write of the same cycle puts a multiplexer after the RAM's output.
:class:`BlockRam` therefore instantiates DP16KD itself when elaborated for an ECP5 platform,
output register on, and does any forwarding of writes after that register, from registers of
its own. Elsewhere (simulation, Verilog export, other devices) it is Amaranth's synchronous
read and a flip-flop stage: the same cycles, the same data.
"""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["BlockRam", "FORWARD"]

# What a read port forwards (``forward``): 0, nothing; 1, the write at the clock edge that
# takes the read's address; 2, that write and the one at the next edge.
FORWARD = (0, 1, 2)
# DP16KD in its 36-bit (pseudo dual-port) mode: 512 words, the address on pins 5 to 13 and
# the write enables of its four 9-bit bytes on pins 0 to 3 of port A.
_DP16KD_WIDTH = 36
_DP16KD_DEPTH = 512
# Its narrower modes, one port writing (A) and one reading (B), for deeper RAMs: (words, bits
# a word, the lowest address pin). The address sits on the pins from that one to 13; below
# it, in the 18-bit mode, pins 0 and 1 of port A enable its two 9-bit bytes (the rest 0);
# the word on DIA and DOB from bit 0 (Yosys' ECP5 mapping wires them so).
_DP16KD_MODES = ((1024, 18, 4), (2048, 9, 3), (4096, 4, 2), (8192, 2, 1), (16384, 1, 0))
_DP16KD_MAX_DEPTH = _DP16KD_MODES[-1][0]
# Decision: a RAM of at most 16 words (one distributed RAM's depth) stays generic on ECP5:
# Yosys makes it distributed RAM or flip-flops, which read fast without a primitive, rather
# than tying up a DP16KD a read port (the board self-test's PSN tracker keeps 2 words).
_DP16KD_MIN_DEPTH = 17


class BlockRam(wiring.Component):
    """A simple dual-port RAM in block RAM: one write port and ``reads`` read ports, each
    read's data out of a register.

    Parameters
    ----------
    width : int
        Bits a word, 1 or more.
    depth : int
        Words, 2 or more.
    forward : tuple of int
        One entry a read port (their number), each of :data:`FORWARD`: the writes after its
        address is taken whose data it shows. 0: none; a write to the word at the edge that
        takes the address gives an undefined word (the user must never make one). 1: the
        write at that edge (the word a transparent read gives). 2: that write and the one
        at the next edge (the word as it stands in the cycle its data leaves).

    Ports
    -----
    w_addr, w_data, w_en : In
        The write: ``w_data`` into word ``w_addr`` at the clock edge, when ``w_en``.
    r_addr : In(ArrayLayout(ceil_log2(depth), len(forward)))
        Each read port's address, taken at the clock edge.
    r_data : Out(ArrayLayout(width, len(forward)))
        Each read port's word, two cycles after its address (the cycle after the edge that
        takes it, the RAM reads; the next, the word leaves the output register): in cycle
        t + 2 the word addressed in cycle t, with the writes up to the edge ending cycle
        t - 1, and those its ``forward`` names. A read port forwarding writes has one more
        level of logic after the register: a 3:1 multiplexer (2) or 2:1 (1).

    Throughput: a read a cycle on every port and a write a cycle; nothing stalls.

    Storage: on an ECP5 platform (``platform.family == "ecp5"``) and 17 to 512 words,
    ceil(``width`` / 36) DP16KD a read port in their 36-bit mode, output register on
    (``REGMODE`` ``OUTREG``); 513 to 16384 words, the narrowest mode as deep (1024 x 18,
    2048 x 9, 4096 x 4, 8192 x 2, 16384 x 1), ceil(``width`` / its bits) a read port, port
    B's output register on; elsewhere, shallower or deeper, an Amaranth :class:`Memory` with a
    synchronous read port per read port and a register after each (which Yosys maps to block
    RAM and flip-flops). The forwarding: the last two writes (address, enable, data), and
    per read port its address a cycle on and two hit flags.
    """

    def __init__(self, width, depth, forward=(0,)):
        if width < 1:
            raise ValueError(f"width must be 1 or more, not {width}")
        if depth < 2:
            raise ValueError(f"depth must be 2 or more, not {depth}")
        forward = tuple(forward)
        if not forward or any(f not in FORWARD for f in forward):
            raise ValueError(f"forward must be one or more of {FORWARD}, not {forward}")
        self.width, self.depth, self.forward = width, depth, forward
        abits = ceil_log2(depth)
        n = len(forward)
        super().__init__({
            "w_addr": In(abits), "w_data": In(width), "w_en": In(1),
            "r_addr": In(data.ArrayLayout(abits, n)),
            "r_data": Out(data.ArrayLayout(width, n)),
        })

    def elaborate(self, platform):
        m = Module()
        ecp5 = (getattr(platform, "family", None) == "ecp5" and
                _DP16KD_MIN_DEPTH <= self.depth <= _DP16KD_MAX_DEPTH)
        if not ecp5:
            read = self._generic_read
        elif self.depth <= _DP16KD_DEPTH:
            read = self._ecp5_read
        else:
            read = self._ecp5_deep_read
        raw = [read(m, i) for i in range(len(self.forward))]
        self._forwarding(m, raw)
        return m

    def _generic_read(self, m, i):
        """Read port ``i`` as Amaranth's synchronous read and a register (one Memory each
        port: Yosys makes a RAM a port anyway)."""
        if i == 0:
            self._mem = Memory(shape=self.width, depth=self.depth, init=[])
            m.submodules.mem = self._mem
            w = self._mem.write_port()
            m.d.comb += [w.addr.eq(self.w_addr), w.data.eq(self.w_data), w.en.eq(self.w_en)]
        rd = self._mem.read_port()
        out = Signal(self.width, name=f"r{i}_out")
        m.d.comb += rd.addr.eq(self.r_addr[i])
        m.d.sync += out.eq(rd.data)
        return out

    def _ecp5_read(self, m, i):
        """Read port ``i`` as DP16KD in the 36-bit mode with the output register on, the
        write port on each (the primitive's pins as Yosys' own ECP5 mapping wires them)."""
        out = Signal(self.width, name=f"r{i}_out")
        abits = len(self.w_addr)
        for t in range(-(-self.width // _DP16KD_WIDTH)):
            lo = t * _DP16KD_WIDTH
            n = min(_DP16KD_WIDTH, self.width - lo)
            di = Signal(_DP16KD_WIDTH, name=f"r{i}_t{t}_di")
            do = Signal(_DP16KD_WIDTH, name=f"r{i}_t{t}_do")
            m.d.comb += [di.eq(self.w_data[lo:lo + n]), out[lo:lo + n].eq(do[:n])]
            pins = {}
            for p in range(14):
                a = p - 5
                pins[f"i_ADA{p}"] = (self.w_en if p < 4 else
                                     self.w_addr[a] if 0 <= a < abits else Const(0, 1))
                pins[f"i_ADB{p}"] = self.r_addr[i][a] if 0 <= a < abits else Const(0, 1)
            for p in range(18):
                pins[f"i_DIA{p}"] = di[p]
                pins[f"i_DIB{p}"] = di[18 + p]
                pins[f"o_DOA{p}"] = do[p]
                pins[f"o_DOB{p}"] = do[18 + p]
            # In the 36-bit mode the read drives both ports' outputs: both registers on.
            m.submodules[f"r{i}_ram{t}"] = self._primitive(
                _DP16KD_WIDTH, "OUTREG", Const(1, 1), pins)
        return out

    def _ecp5_deep_read(self, m, i):
        """Read port ``i`` as DP16KD in the narrowest mode as deep as the RAM
        (:data:`_DP16KD_MODES`), port A writing and port B reading, port B's output register
        on."""
        words, bits, low = next(mode for mode in _DP16KD_MODES if mode[0] >= self.depth)
        out = Signal(self.width, name=f"r{i}_out")
        abits = len(self.w_addr)
        for t in range(-(-self.width // bits)):
            lo = t * bits
            n = min(bits, self.width - lo)
            di = Signal(18, name=f"r{i}_t{t}_di")
            do = Signal(18, name=f"r{i}_t{t}_do")
            m.d.comb += [di.eq(self.w_data[lo:lo + n]), out[lo:lo + n].eq(do[:n])]
            pins = {}
            for p in range(14):
                a = p - low
                pins[f"i_ADA{p}"] = (self.w_addr[a] if 0 <= a < abits else
                                     self.w_en if bits == 18 and p < 2 else Const(0, 1))
                pins[f"i_ADB{p}"] = self.r_addr[i][a] if 0 <= a < abits else Const(0, 1)
            for p in range(18):
                pins[f"i_DIA{p}"] = di[p]
                pins[f"i_DIB{p}"] = Const(0, 1)
                pins[f"o_DOB{p}"] = do[p]
            m.submodules[f"r{i}_ram{t}"] = self._primitive(bits, "NOREG", self.w_en, pins)
        return out

    def _primitive(self, bits, regmode_a, wea, pins):
        """One DP16KD in the ``bits``-wide mode with the data and address ``pins`` given:
        both ports clocked and enabled, chip selects and resets off, port B's output
        register on, port A's as ``regmode_a``, writing when ``wea``."""
        for port in "AB":
            pins.update({f"i_CLK{port}": ClockSignal("sync"), f"i_CE{port}": Const(1, 1),
                         f"i_OCE{port}": Const(1, 1), f"i_RST{port}": Const(0, 1),
                         **{f"i_CS{port}{k}": Const(0, 1) for k in range(3)}})
        return self._dp16kd(
            p_DATA_WIDTH_A=bits, p_DATA_WIDTH_B=bits,
            p_REGMODE_A=regmode_a, p_REGMODE_B="OUTREG",
            p_RESETMODE="SYNC", p_ASYNC_RESET_RELEASE="SYNC",
            p_CSDECODE_A="0b000", p_CSDECODE_B="0b000", p_GSR="AUTO",
            i_WEA=wea, i_WEB=Const(0, 1), **pins)

    @staticmethod
    def _dp16kd(**ports):
        """The DP16KD primitive with ``ports`` (Amaranth :class:`Instance` arguments); a test
        puts a model of it here to run the ECP5 elaboration on the simulator."""
        return Instance("DP16KD", **ports)

    def _forwarding(self, m, raw):
        """The writes the reads forward: the last two (``w1`` at the edge before, ``w2``
        the one before that), each read's address a cycle on compared with them and with
        the write of this cycle, the hits registered, the word picked after the RAM's
        register."""
        abits = len(self.w_addr)
        hist = [dict(addr=Signal(abits, name=f"w{k}_addr"), en=Signal(name=f"w{k}_en"),
                     data=Signal(self.width, name=f"w{k}_data")) for k in (1, 2)]
        if any(self.forward):
            m.d.sync += [hist[0]["addr"].eq(self.w_addr), hist[0]["en"].eq(self.w_en),
                         hist[0]["data"].eq(self.w_data),
                         *[hist[1][k].eq(hist[0][k]) for k in ("addr", "en", "data")]]
        for i, fwd in enumerate(self.forward):
            if not fwd:
                m.d.comb += self.r_data[i].eq(raw[i])
                continue
            addr1 = Signal(abits, name=f"r{i}_addr1")
            # In the cycle after the address: the write at its edge is in w1, the next
            # write on the port.
            at_edge = Signal(name=f"r{i}_hit_edge")
            at_next = Signal(name=f"r{i}_hit_next")
            m.d.sync += [addr1.eq(self.r_addr[i]),
                         at_edge.eq(hist[0]["en"] & (hist[0]["addr"] == addr1))]
            if fwd == 2:
                m.d.sync += at_next.eq(self.w_en & (self.w_addr == addr1))
            # In the cycle the word leaves: the write at the address's edge is in w2, the
            # next in w1.
            m.d.comb += self.r_data[i].eq(Mux(at_next, hist[0]["data"],
                                              Mux(at_edge, hist[1]["data"], raw[i])))
