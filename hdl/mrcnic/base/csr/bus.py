"""Many register blocks behind one AXI4-Lite port, with a map that describes itself:
:class:`CsrBus`.

The directory
    Window 0 of the bus (:func:`directory` gives its words), 32-bit words at byte address
    4 x word:

    ====== ==================================================================
    word   contents
    ====== ==================================================================
    0      :data:`MAGIC` ("MRCN")
    1      bits 15:0 the number of blocks n, bits 23:16 ``window_bits``
    2      :data:`MAP_VERSION`
    3      byte address of the first entry (16)
    4k+4   entry k: bits 31:16 block type (:data:`BLOCK_TYPES`), bits 15:0 its version
    4k+5   entry k: the block's base byte address (its window)
    4k+6   entry k: the bytes its registers span (2^its address width)
    4k+7   entry k: byte address of the next entry, 0 after the last
    ====== ==================================================================

    So software finds every block by walking the entries from word 3, and a block's
    registers by its type and the offsets of its register map (``docs/blocks/*.md``).
"""

from amaranth.hdl import Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mrcnic.base.csr.gateware import AxiLiteSignature
from mrcnic.base.csr.regs import RESP_OKAY, RESP_SLVERR, CsrError

__all__ = ["CsrBus", "BLOCK_TYPES", "MAGIC", "MAP_VERSION", "directory"]

MAGIC = 0x4D52434E                # "MRCN"
MAP_VERSION = 1
DIRECTORY_FIRST = 16              # byte address of the first entry
# Decision: a block's type number in the directory; a block keeps its number for ever.
BLOCK_TYPES = {
    "skid-buffer": 0x0001, "srv6-encap": 0x0002, "srv6-decap": 0x0003,
    "ack-generator": 0x0004, "psn-tracker": 0x0005, "reorder-buffer": 0x0006,
    "path-selector": 0x0007, "retransmit-tracker": 0x0008, "roce-rx": 0x0009,
    "roce-tx": 0x000A, "tx-segmenter": 0x000B, "memory-protect": 0x000C, "mrc-tx": 0x000D,
    "csr-bus": 0x0100,              # a nested bus: its own directory at its base
}
BLOCK_VERSION = 1


def directory(blocks, window_bits):
    """The directory's words (a list of ints), as the bus answers them."""
    n = len(blocks)
    words = [MAGIC, n | window_bits << 16, MAP_VERSION, DIRECTORY_FIRST if n else 0]
    for k, (name, aw) in enumerate(blocks):
        nxt = DIRECTORY_FIRST + 16 * (k + 1) if k + 1 < n else 0
        words += [BLOCK_TYPES[name] << 16 | BLOCK_VERSION, (k + 1) << window_bits, 1 << aw,
                  nxt]
    return words


class CsrBus(wiring.Component):
    """Register blocks behind one AXI4-Lite port, with a directory that describes them.

    The port's address space is cut into equal windows of ``2^window_bits`` bytes. Window 0
    is the directory (read only; its words: the module docstring, :func:`directory`);
    window k (1 .. n) is the k-th block's, whose own address is the offset in the window.
    One transaction at a time in each direction: a write is taken when AW and W are both
    valid, forwarded to its block, and its B response returned; a read likewise with AR
    and R. An address in no window, or a write to the directory, answers SLVERR (reads
    return 0) and touches nothing. Data is 32 bits.

    Parameters
    ----------
    blocks : list of (str, int)
        One ``(name, addr_width)`` per block, at least one: the block's name in
        :data:`BLOCK_TYPES` and the address width of its own AXI4-Lite port, 2 .. 24.

    Attributes
    ----------
    s_axil : AXI4-Lite (``addr_width``, 32-bit data), in
        The bus's port.
    m<k>_axil : AXI4-Lite (block k's own ``addr_width``, 32-bit data), out
        One per block, k from 0; ``wiring.connect`` it to block k's ``s_axil``.
    m_axil : list
        The ``m<k>_axil`` ports, in block order.
    window_bits : int
        log2 of a window's bytes: the largest block address width, or more if the directory
        needs it.
    addr_width : int
        Width of ``s_axil``'s addresses: ``window_bits`` + the bits of n.
    words : list of int
        The directory's words, as the bus answers them.

    Latency
    -------
    A write answers (``bvalid``) 4 cycles after AW and W are both valid with a
    :class:`~mrcnic.base.csr.gateware.CsrBlock` behind (taken, forwarded, the block's two
    cycles, returned); a read likewise. A read of
    the directory, and an error, answers in the cycle after the handshake.

    Throughput
    ----------
    One write and one read in flight at a time, independently; the next is taken in the
    cycle after its predecessor's response handshake.

    Raises
    ------
    CsrError
        A ``ValueError``: if ``blocks`` is empty, names a block not in
        :data:`BLOCK_TYPES`, or gives an address width outside 2 .. 24.
    """

    def __init__(self, blocks):
        blocks = [(str(name), int(aw)) for name, aw in blocks]
        if not blocks:
            raise CsrError("a register bus needs at least one block")
        for name, aw in blocks:
            if name not in BLOCK_TYPES:
                raise CsrError(f"block {name!r} has no type number in BLOCK_TYPES")
            if not 2 <= aw <= 24:
                raise CsrError(f"block {name!r}: address width {aw} is outside 2 .. 24")
        self.blocks = blocks
        self.words = directory(blocks, 0)          # sized below, once window_bits is known
        dir_bytes = 4 * (4 + 4 * len(blocks))
        self.window_bits = max(max(aw for _, aw in blocks), (dir_bytes - 1).bit_length())
        self.words = directory(blocks, self.window_bits)
        self.index_bits = len(blocks).bit_length()
        self.addr_width = self.window_bits + self.index_bits
        super().__init__({
            "s_axil": In(AxiLiteSignature(self.addr_width)),
            **{f"m{k}_axil": Out(AxiLiteSignature(aw)) for k, (_, aw) in enumerate(blocks)},
        })
        self.m_axil = [getattr(self, f"m{k}_axil") for k in range(len(blocks))]

    def elaborate(self, platform):
        m = Module()
        s = self.s_axil
        wb, n = self.window_bits, len(self.blocks)

        def window(addr):
            return addr[wb:]

        def beyond(addr):
            # No compare when every window has a block (a constant compare fails lint).
            if n == (1 << self.index_bits) - 1:
                return Const(0, 1)
            return window(addr) > n

        # --- Writes ---------------------------------------------------------------------
        w_addr, w_data, w_strb = Signal(wb), Signal(32), Signal(4)
        w_sel = Signal(range(n + 1))
        w_aw_done, w_w_done = Signal(), Signal()
        bresp = Signal(2)
        with m.FSM(name="write"):
            with m.State("IDLE"):
                with m.If(s.awvalid & s.wvalid):
                    m.d.comb += [s.awready.eq(1), s.wready.eq(1)]
                    m.d.sync += [w_addr.eq(s.awaddr[:wb]), w_data.eq(s.wdata),
                                 w_strb.eq(s.wstrb), w_sel.eq(window(s.awaddr)),
                                 w_aw_done.eq(0), w_w_done.eq(0)]
                    with m.If((window(s.awaddr) == 0) | beyond(s.awaddr)):
                        m.d.sync += bresp.eq(RESP_SLVERR)
                        m.next = "RESP"
                    with m.Else():
                        m.next = "FORWARD"
            with m.State("FORWARD"):
                done_b = Signal()
                for k in range(n):
                    p = self.m_axil[k]
                    m.d.comb += [p.awaddr.eq(w_addr[:len(p.awaddr)]), p.wdata.eq(w_data),
                                 p.wstrb.eq(w_strb)]
                    with m.If(w_sel == k + 1):
                        m.d.comb += [p.awvalid.eq(~w_aw_done), p.wvalid.eq(~w_w_done),
                                     p.bready.eq(1)]
                        with m.If(p.awready):
                            m.d.sync += w_aw_done.eq(1)
                        with m.If(p.wready):
                            m.d.sync += w_w_done.eq(1)
                        with m.If(p.bvalid):
                            m.d.comb += done_b.eq(1)
                            m.d.sync += bresp.eq(p.bresp)
                with m.If(done_b):
                    m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += [s.bvalid.eq(1), s.bresp.eq(bresp)]
                with m.If(s.bready):
                    m.next = "IDLE"

        # --- Reads ----------------------------------------------------------------------
        r_addr = Signal(wb)
        r_sel = Signal(range(n + 1))
        r_ar_done = Signal()
        rdata, rresp = Signal(32), Signal(2)
        dir_word = Signal(32)
        with m.Switch(s.araddr[2:wb]):
            for i, word in enumerate(self.words):
                with m.Case(i):
                    m.d.comb += dir_word.eq(word)
        with m.FSM(name="read"):
            with m.State("IDLE"):
                with m.If(s.arvalid):
                    m.d.comb += s.arready.eq(1)
                    m.d.sync += [r_addr.eq(s.araddr[:wb]), r_sel.eq(window(s.araddr)),
                                 r_ar_done.eq(0)]
                    with m.If(window(s.araddr) == 0):
                        m.d.sync += [rdata.eq(dir_word), rresp.eq(RESP_OKAY)]
                        m.next = "RESP"
                    with m.Elif(beyond(s.araddr)):
                        m.d.sync += [rdata.eq(0), rresp.eq(RESP_SLVERR)]
                        m.next = "RESP"
                    with m.Else():
                        m.next = "FORWARD"
            with m.State("FORWARD"):
                done_r = Signal()
                for k in range(n):
                    p = self.m_axil[k]
                    m.d.comb += p.araddr.eq(r_addr[:len(p.araddr)])
                    with m.If(r_sel == k + 1):
                        m.d.comb += [p.arvalid.eq(~r_ar_done), p.rready.eq(1)]
                        with m.If(p.arready):
                            m.d.sync += r_ar_done.eq(1)
                        with m.If(p.rvalid):
                            m.d.comb += done_r.eq(1)
                            m.d.sync += [rdata.eq(p.rdata), rresp.eq(p.rresp)]
                with m.If(done_r):
                    m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += [s.rvalid.eq(1), s.rdata.eq(rdata), s.rresp.eq(rresp)]
                with m.If(s.rready):
                    m.next = "IDLE"
        return m
