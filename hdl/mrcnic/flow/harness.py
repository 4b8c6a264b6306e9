"""The block harness: :class:`BlockHarness`, the top that ``mrcnic build --block`` places and
routes around one block (:func:`mrcnic.flow.ecp5.build_block`; on a Xilinx board, the top of
the Vivado build plan, :func:`mrcnic.flow.xilinx.plan_only`): the block's inputs driven
from an LFSR, its outputs folded into one LED, so that nothing in the block is trimmed and
fmax is the block's. How, and the harness's cost: the class docstring; measured figures:
``docs/synthesis.md``.
"""

from functools import reduce
from operator import xor

from amaranth.build import ResourceError
from amaranth.hdl import Cat, Elaboratable, Module, Signal, Value
from amaranth.lib import io, wiring

from mrcnic.base.clocking import pll_sync_domain
from mrcnic.flow.export import flat_ports

__all__ = ["BlockHarness", "LFSR_WIDTH", "LFSR_TAPS"]


# x^32 + x^22 + x^2 + x + 1, a maximal-length polynomial: the stimulus never repeats within
# any build or simulation anyone will run, and its feedback is a single 4-input LUT.
LFSR_WIDTH = 32
LFSR_TAPS = (31, 21, 1, 0)

# The block's instance name in the harness: nextpnr's cell names start with "block." for the
# block's own cells, which is how a critical path is told to be in the block or the harness.
BLOCK_INSTANCE = "block"


def _xor_tree_levels(width):
    """Register counts per level of the 4-input XOR tree folding ``width`` bits to one."""
    levels = []
    while width > 1:
        width = -(-width // 4)
        levels.append(width)
    return levels


def _request_led(platform):
    """An output pin to drive: LED 0, or the red part of RGB LED 0 on boards that have only
    RGB LEDs (ECPIX-5, OrangeCrab, iCESugar-Pro, ButterStick). Raw port, buffered by the
    caller, so that inverted (PinsN) LEDs and bidirectional pins all work the same way."""
    for name, sub in (("led", None), ("rgb_led", "r"), ("rgb_leds_muxed", "r")):
        try:
            port = platform.request(name, 0, dir="-")
        except ResourceError:        # not on this board
            continue
        return port if sub is None else getattr(port, sub)
    raise ValueError(f"{type(platform).__name__} has no LED to drive")


class BlockHarness(Elaboratable):
    """A top that clocks ``block`` at ``freq_mhz`` and registers every one of its ports.

    Clock: the board's default oscillator through an ``EHXPLLL`` set by
    :func:`~mrcnic.base.clocking.find_pll` to ``freq_mhz`` (an MMCM on a Xilinx board,
    :func:`~mrcnic.base.clocking.pll_sync_domain`); the PLL output carries the clock
    constraint. Reset: PLL lock, synchronised. Inputs: bit ``i`` of the concatenated input
    ports is stage ``i`` of a shift register whose head is a free-running 32-bit LFSR
    (:data:`LFSR_TAPS`), so each input is a distinct, never constant sequence. Outputs: all
    output bits are captured in flip-flops, then XORed four at a time (one LUT and one
    register per level) down to :attr:`led`, which drives LED 0 (or the red part of RGB
    LED 0). So nothing in the block is constant or unobserved (Yosys cannot trim it), no
    pins but the clock and the LED are needed, and every path the harness adds is one LUT
    deep at most: fmax is the block's. The block is instance ``block`` of the top.

    Cost, exactly (:meth:`cost`): ``in_bits + out_bits + tree_ffs + 34`` flip-flops (32
    LFSR, 2 reset synchroniser) and ``tree_luts + 2`` LUT4s (LFSR feedback, lock
    inverter), both tree counts about ``out_bits / 3``; one PLL, two I/O; nextpnr's packer
    adds 2 LUTs of its own.

    Without a platform (simulation) there is no PLL and no pin: the harness runs in the
    simulator's ``sync`` domain and :attr:`led` is the reduced bit.

    Parameters
    ----------
    block : wiring.Component
        The block, using the ``sync`` domain only; its ports are found by
        :func:`~mrcnic.flow.export.flat_ports`.
    freq_mhz : float
        The clock to ask of the PLL. Default 100.0.

    Attributes
    ----------
    led : Signal(1), out
        The XOR of all the block's output bits, through the tree; on a board, the LED.
    inputs, outputs : list of (str, Value)
        The block's input and output ports (zero-width ones left out), flattened.
    in_bits, out_bits : int
        Their total widths.
    pll : PllConfig or MmcmConfig or None
        The clock setting, once elaborated for a platform.

    Latency
    -------
    A block output reaches :attr:`led` after ``1 + L`` cycles: the capture register and
    one per XOR level, ``L = ceil(log4(out_bits))``.

    Raises
    ------
    ValueError
        At construction, if two of the block's port names collide once flattened. At
        elaboration for a platform, if the PLL cannot reach ``freq_mhz`` within 1 % or the
        board has no LED to drive.
    """

    def __init__(self, block, freq_mhz=100.0):
        self.block = block
        self.freq_mhz = freq_mhz
        ports = [(n, f, Value.cast(v)) for n, f, v in flat_ports(block)]
        self.inputs = [(n, v) for n, f, v in ports if f == wiring.In and len(v)]
        self.outputs = [(n, v) for n, f, v in ports if f == wiring.Out and len(v)]
        self.in_bits = sum(len(v) for _, v in self.inputs)
        self.out_bits = sum(len(v) for _, v in self.outputs)
        self.pll = None              # PllConfig, known once elaborated for a platform
        self.led = Signal()

    def cost(self):
        """What the harness adds to the block, counted from its structure:
        ``{"ffs", "luts", "plls"}``. On a real board the clock input and LED output buffers
        come on top (two TRELLIS_IO)."""
        levels = _xor_tree_levels(self.out_bits)
        widths = [self.out_bits] + levels
        # A tree register whose group has one bit is a plain copy: no LUT.
        tree_luts = sum(w // 4 + (1 if w % 4 > 1 else 0) for w in widths[:-1])
        ffs = LFSR_WIDTH + self.in_bits + self.out_bits + sum(levels) + 2   # 2: reset sync
        # + 1 LUT for the LFSR feedback, + 1 inverting PLL lock into the reset synchroniser.
        return {"ffs": ffs, "luts": tree_luts + 2, "plls": 1}

    def elaborate(self, platform):
        m = Module()

        if platform is not None:
            self.pll = pll_sync_domain(m, platform, self.freq_mhz, "clk_block")
            m.submodules.led_buf = led_buf = io.Buffer("o", _request_led(platform))
            m.d.comb += led_buf.o.eq(self.led)

        m.submodules[BLOCK_INSTANCE] = self.block

        # Stimulus. The LFSR is reset so that it can never sit at zero; the shift register
        # behind it is not, it fills with LFSR bits within in_bits cycles of reset.
        lfsr = Signal(LFSR_WIDTH, init=1, name="stim_lfsr")
        feedback = reduce(xor, (lfsr[t] for t in LFSR_TAPS))
        m.d.sync += lfsr.eq(Cat(feedback, lfsr[:-1]))
        if self.in_bits:
            chain = Signal(self.in_bits, name="stim_chain", reset_less=True)
            m.d.sync += chain.eq(Cat(lfsr[-1], chain[:-1]))
            offset = 0
            for _, value in self.inputs:
                m.d.comb += value.eq(chain[offset:offset + len(value)])
                offset += len(value)

        # Observation: capture, then fold.
        if self.out_bits:
            capture = Signal(self.out_bits, name="obs_capture", reset_less=True)
            m.d.sync += capture.eq(Cat(v for _, v in self.outputs))
            level = list(capture)
            depth = 0
            while len(level) > 1:
                nxt = []
                for i in range(0, len(level), 4):
                    r = Signal(name=f"obs_xor{depth}_{i // 4}", reset_less=True)
                    m.d.sync += r.eq(reduce(xor, level[i:i + 4]))
                    nxt.append(r)
                level, depth = nxt, depth + 1
            m.d.comb += self.led.eq(level[0])
        return m
