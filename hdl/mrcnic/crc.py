"""CRC-32 (the Ethernet/zlib polynomial, as the RoCEv2 ICRC) as GF(2) linear algebra.

CRC-32 is affine in its input: ``crc32(M) = L(M) ^ c(len(M))``. So changing bytes of a
message changes its CRC by ``L(delta)``, the CRC register run from zero over the XOR of the
old and new messages, and the leading zero bytes of ``delta`` change nothing. A block that
rewrites a field in place (the UDP source port) can therefore patch the ICRC without reading
the whole packet again:

    correction = A^k . S . d

where ``d`` is the XOR of the old and new field, ``S`` runs the CRC register over those bytes
from zero, and ``A^k`` advances it over the ``k`` bytes between the field and the end of the
covered data. Every map is a constant binary matrix computed here; :func:`gf2_apply` turns
one into XOR gates. :class:`CrcShiftPipeline` applies ``A^k`` for a run-time ``k`` two bits
per stage.

Matrices are lists of row masks: output bit ``i`` is the parity of ``rows[i] & x``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = ["POLY", "crc32_raw", "matrix_of", "mat_apply", "mat_mul", "zero_bytes_matrix",
           "field_matrix", "gf2_apply", "CrcShiftPipeline", "correction"]

POLY = 0xEDB88320          # CRC-32, bit-reflected (zlib, Ethernet, RoCEv2 ICRC)


def _table():
    table = []
    for byte in range(256):
        r = byte
        for _ in range(8):
            r = (r >> 1) ^ (POLY if r & 1 else 0)
        table.append(r)
    return table


_TABLE = _table()


def crc32_raw(state, data):
    """The CRC register after ``data`` from ``state``, with no initial or final inversion.
    ``zlib.crc32(data) == crc32_raw(0xFFFFFFFF, data) ^ 0xFFFFFFFF``."""
    for b in data:
        state = (state >> 8) ^ _TABLE[(state ^ b) & 0xFF]
    return state


def matrix_of(fn, in_bits, out_bits=32):
    """Rows of the linear map ``fn`` (an int -> int function linear over GF(2))."""
    cols = [fn(1 << j) for j in range(in_bits)]
    return [sum(((cols[j] >> i) & 1) << j for j in range(in_bits)) for i in range(out_bits)]


def mat_apply(rows, x):
    return sum((bin(r & x).count("1") & 1) << i for i, r in enumerate(rows))


def mat_mul(a, b):
    """Rows of ``a . b`` (apply ``b`` first)."""
    n_in = max((r.bit_length() for r in b), default=0)
    cols_b = [mat_apply(b, 1 << j) for j in range(max(n_in, 32))]
    return [sum((bin(r & c).count("1") & 1) << j for j, c in enumerate(cols_b)) for r in a]


def _identity(n=32):
    return [1 << i for i in range(n)]


def zero_bytes_matrix(n):
    """``A^n``: the CRC register advanced over ``n`` zero bytes (by repeated squaring)."""
    result, power = _identity(), matrix_of(lambda s: crc32_raw(s, b"\0"), 32)
    while n:
        if n & 1:
            result = mat_mul(power, result)
        power = mat_mul(power, power)
        n >>= 1
    return result


def field_matrix(nbytes):
    """``S``: the CRC register from zero after an ``nbytes`` big-endian field value."""
    return matrix_of(lambda v: crc32_raw(0, v.to_bytes(nbytes, "big")), 8 * nbytes)


def correction(old, new, nbytes, k):
    """ICRC change (an int, XOR it into the CRC) when a ``nbytes`` field followed by ``k``
    covered bytes changes from ``old`` to ``new``; the reference for the gateware."""
    return mat_apply(zero_bytes_matrix(k), mat_apply(field_matrix(nbytes), old ^ new))


def gf2_apply(rows, x):
    """Gateware: the matrix ``rows`` applied to Value ``x`` (one XOR tree per output bit)."""
    x = Value.cast(x)
    bits = []
    for r in rows:
        terms = [x[j] for j in range(len(x)) if (r >> j) & 1]
        bits.append(Cat(*terms).xor() if terms else Const(0, 1))
    return Cat(*bits)


class CrcShiftPipeline(wiring.Component):
    """``out = A^k . v``, pipelined two bits of ``k`` per stage.

    Parameters
        ``k_bits``: width of ``k`` (1..24).
    Ports
        ``en`` (in): advance every stage (a stall-all pipeline's enable).
        ``v`` (in, 32), ``k`` (in, ``k_bits``), ``tag`` (in, ``tag_width``): sampled when
        ``en``; ``out``/``out_tag`` after :attr:`latency` enabled cycles.
    Latency
        ``ceil(k_bits / 2)`` enabled cycles; one new ``(v, k)`` every cycle.
    Each stage multiplies by one of ``A^(c * 4^i)``, ``c`` in 0..3: three 32x32 XOR maps and a
    4:1 mux, so every stage is a few LUT levels deep whatever ``k_bits`` is.
    """

    def __init__(self, k_bits, tag_width=1):
        if not 1 <= k_bits <= 24:
            raise ValueError(f"k_bits = {k_bits} is outside 1..24")
        self.k_bits = k_bits
        self.latency = (k_bits + 1) // 2
        super().__init__({
            "en": In(1), "v": In(32), "k": In(k_bits), "tag": In(tag_width),
            "out": Out(32), "out_tag": Out(tag_width),
        })

    def elaborate(self, platform):
        m = Module()
        v, k, tag = self.v, self.k, self.tag
        for i in range(self.latency):
            c = k[2 * i:2 * i + 2]          # one bit in the last stage when k_bits is odd
            options = [v] + [gf2_apply(zero_bytes_matrix(n << (2 * i)), v)
                             for n in range(1, 1 << len(c))]
            nv = Signal(32, name=f"v{i}")
            nk = Signal(self.k_bits, name=f"k{i}")
            nt = Signal(len(tag), name=f"tag{i}")
            with m.If(self.en):
                with m.Switch(c):
                    for n, opt in enumerate(options):
                        with m.Case(n):
                            m.d.sync += nv.eq(opt)
                m.d.sync += [nk.eq(k), nt.eq(tag)]
            v, k, tag = nv, nk, nt
        m.d.comb += [self.out.eq(v), self.out_tag.eq(tag)]
        return m
