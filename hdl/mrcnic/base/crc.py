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


__all__ = ["POLY", "crc32_raw", "matrix_of", "mat_apply", "mat_mul", "mat_inverse",
           "zero_bytes_matrix", "field_matrix", "gf2_apply", "CrcShiftPipeline", "correction",
           "CrcStream", "ICRC_SKIP", "ICRC_ONES", "icrc_stream"]

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


def mat_inverse(rows):
    """Rows of the inverse of the invertible 32 x 32 matrix ``rows`` (Gauss-Jordan)."""
    n = len(rows)
    aug = [rows[i] | (1 << (n + i)) for i in range(n)]    # [M | I], row i
    for col in range(n):
        pivot = next(r for r in range(col, n) if (aug[r] >> col) & 1)
        aug[col], aug[pivot] = aug[pivot], aug[col]
        for r in range(n):
            if r != col and (aug[r] >> col) & 1:
                aug[r] ^= aug[col]
    return [a >> n for a in aug]


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
    """``out = A^k . v`` (``A^-k . v`` with ``inverse``), pipelined two bits of ``k`` per stage.

    Advances a CRC-32 register value ``v`` over ``k`` zero bytes (``inverse``: takes it back
    over them), ``k`` given at run time. Stage ``i`` multiplies by one of ``A^(c * 4^i)``,
    ``c`` (bits ``2i``, ``2i + 1`` of ``k``) in 0..3: three 32 x 32 XOR maps and a 4:1 mux,
    so every stage is a few LUT levels deep whatever ``k_bits`` is.

    Parameters
    ----------
    k_bits : int
        Width of ``k``, 1 .. 24.
    tag_width : int
        Width of ``tag``, carried alongside. Default 1.
    inverse : bool
        Keyword only. Take the register back over ``k`` zero bytes (``A^-k``) instead of
        forward. Default False.

    Attributes
    ----------
    en : Signal(1), in
        Advance every stage (a stall-all pipeline's enable).
    v : Signal(32), in
        The register value; sampled when ``en``.
    k : Signal(k_bits), in
        Zero bytes to advance over; sampled when ``en``.
    tag : Signal(tag_width), in
        Carried unchanged to ``out_tag``; sampled when ``en``.
    out : Signal(32), out
        ``A^k . v`` (``A^-k . v``), :attr:`latency` enabled cycles after ``v``.
    out_tag : Signal(tag_width), out
        The ``tag`` sampled with that ``v``.
    latency : int
        ``ceil(k_bits / 2)``: the pipeline's stages.

    Latency
    -------
    :attr:`latency` = ``ceil(k_bits / 2)`` enabled cycles.

    Throughput
    ----------
    One new ``(v, k)`` every enabled cycle.

    Raises
    ------
    ValueError
        If ``k_bits`` is outside 1 .. 24.
    """

    def __init__(self, k_bits, tag_width=1, *, inverse=False):
        if not 1 <= k_bits <= 24:
            raise ValueError(f"k_bits = {k_bits} is outside 1..24")
        self.k_bits = k_bits
        self.inverse = inverse
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
            step = mat_inverse if self.inverse else (lambda rows: rows)
            options = [v] + [gf2_apply(step(zero_bytes_matrix(n << (2 * i))), v)
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


# --- A frame's CRC from a beat stream ---------------------------------------------------------

def _icrc_ones():
    from mrcnic.base import proto         # proto sits below this module; imported here to keep the
    head = proto.ETH.size        # GF(2) helpers above free of protocol knowledge
    ones = (proto.IPV6.pack(dscp=0x3F, ecn=3, flow_label=(1 << 20) - 1, hop_limit=0xFF)
            + proto.UDP.pack(checksum=0xFFFF)
            + proto.BTH.pack(fecn=1, becn=1, _rsvd4=0x3F))
    return head, bytes(head) + ones


# The ICRC of a RoCEv2 frame that starts with its Ethernet header (spec §2.1): the Ethernet
# header is not covered, and these bytes of the inner IPv6, UDP and BTH headers count as ones.
ICRC_SKIP, ICRC_ONES = _icrc_ones()
_ICRC_START = crc32_raw(0xFFFFFFFF, b"\xff" * 8)   # the register after the 8 bytes of ones
# The register after a message followed by its own CRC (LSB first) is the same for every
# message: a receiver checks the ICRC by running over it and comparing with this constant.
ICRC_RESIDUE = crc32_raw(0xFFFFFFFF, b"\0\0\0\0" + (0xFFFFFFFF ^ crc32_raw(
    0xFFFFFFFF, b"\0\0\0\0")).to_bytes(4, "little"))


def icrc_stream(frame):
    """Reference for :class:`CrcStream` with the ICRC constants: the ICRC of ``frame`` (the
    Ethernet frame up to, not including, its ICRC), as ``zlib.crc32`` gives it."""
    covered = bytes(b | (ICRC_ONES[i] if i < len(ICRC_ONES) else 0)
                    for i, b in enumerate(frame))[ICRC_SKIP:]
    return crc32_raw(_ICRC_START, covered) ^ 0xFFFFFFFF


class CrcStream(wiring.Component):
    """The CRC-32 of every frame of a beat stream (the RoCEv2 ICRC by default).

    Beats come in with ``valid`` (sampled when ``en``). The first ``skip`` bytes of a frame
    are not covered (the Ethernet header); the frame's bytes are OR-ed with ``ones`` (byte
    i of the frame with ``ones[i]``: the ICRC's masked fields). The register starts from
    the ICRC's: CRC-32 run over 8 bytes of ones. :func:`icrc_stream` is the reference.

    How: the uncovered bytes are zeroed and the register starts ``skip`` zero bytes
    *before* the ICRC's start value (``A^-skip``), so the zeros bring it there; a beat
    updates it as ``A^B . s ^ M . data`` with ``M . data`` worked out in the two stages
    before (a 64-bit lane's matrix, then the XOR of the lanes), so the loop is one
    32 x 32 map; a last beat of n bytes runs with its tail zeroed, and the register is
    then taken back over the B - n zeros (``A^-(B-n)``, :class:`CrcShiftPipeline`).

    Parameters
    ----------
    data_width : int
        Bus width in bits, a power of two 64 .. 4096 (B = ``data_width / 8`` bytes a beat).
    skip : int
        Keyword only. Bytes at the head of each frame not covered, >= 0. Default
        :data:`ICRC_SKIP` (the Ethernet header).
    ones : bytes
        Keyword only. OR-ed into the frame's first ``len(ones)`` bytes (at most 4096).
        Default :data:`ICRC_ONES` (the ICRC's masked IPv6, UDP and BTH fields).
    tag_width : int
        Keyword only. Width of ``tag``, carried to ``out_tag``. Default 1.

    Attributes
    ----------
    en : Signal(1), in
        Every stage advances (a stall-all pipeline's enable).
    valid : Signal(1), in
        A beat is present; sampled when ``en``.
    data : Signal(data_width), in
        The beat, byte 0 of it in ``data[7:0]``.
    keep : Signal(B), in
        One bit a byte, contiguous from byte 0; partial only on a ``last`` beat.
    first, last : Signal(1), in
        The beat is a frame's first, its last.
    tag : Signal(tag_width), in
        Carried to ``out_tag`` with a frame's last beat.
    done : Signal(1), out
        One cycle for each frame's last beat, :attr:`latency` enabled cycles after it.
    crc : Signal(32), out
        With ``done``: the frame's CRC as ``zlib.crc32`` gives it (sent LSB first). A frame
        no longer than ``skip`` gets a meaningless CRC (a receiver refuses it as truncated
        before it asks).
    residue_ok : Signal(1), out
        With ``done``: the frame ended with its own correct CRC (what a receiver checks).
    out_tag : Signal(tag_width), out
        With ``done``: the ``tag`` of the frame's last beat.
    latency : int
        See Latency; also :meth:`latency_of`, without building one.

    Latency
    -------
    :attr:`latency` = 3 + ceil(log2(B) / 2) enabled cycles (5 at 64 and 128 bits, 6 at
    256 and 512, 7 at 1024 and 2048, 8 at 4096).

    Throughput
    ----------
    One beat a cycle, frames back to back.

    Raises
    ------
    TypeError
        If ``data_width`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 4096, ``skip`` is negative or
        ``ones`` is longer than 4096 bytes.
    """

    def __init__(self, data_width, *, skip=ICRC_SKIP, ones=ICRC_ONES, tag_width=1):
        from mrcnic.base.stream import check_data_width
        check_data_width(data_width, minimum=64, power_of_two=True)
        if skip < 0 or len(ones) > 4096:
            raise ValueError(f"skip = {skip} and {len(ones)} bytes of ones are out of range")
        self.data_width = data_width
        self.B = data_width // 8
        self.skip = skip
        self.ones = bytes(ones)
        self.k_bits = (self.B - 1).bit_length()
        self.latency = self.latency_of(data_width)
        super().__init__({
            "en": In(1), "valid": In(1), "data": In(data_width), "keep": In(self.B),
            "first": In(1), "last": In(1), "tag": In(tag_width),
            "done": Out(1), "crc": Out(32), "residue_ok": Out(1), "out_tag": Out(tag_width),
        })

    @staticmethod
    def latency_of(data_width):
        """:attr:`latency` of a CrcStream of ``data_width`` bits, without building one."""
        return 3 + ((data_width // 8 - 1).bit_length() + 1) // 2

    def _beat_masks(self):
        """Per beat index k of the frame's head: ``(and_mask, or_mask)`` as ints."""
        B = self.B
        head = max(self.skip, len(self.ones))
        masks = []
        for k in range((head + B - 1) // B):
            and_m = or_m = 0
            for i in range(B):
                pos = k * B + i
                and_m |= (0x00 if pos < self.skip else 0xFF) << (8 * i)
                or_m |= (self.ones[pos] if pos < len(self.ones) else 0) << (8 * i)
            masks.append((and_m, or_m))
        return masks

    def elaborate(self, platform):
        from mrcnic.base.stream import keep_count
        m = Module()
        B, W = self.B, self.data_width
        en = self.en

        # Stage 0: the head's masks by beat index, the tail of a last beat zeroed, k = B - n.
        masks = self._beat_masks()
        beat = Signal(range(len(masks) + 1))
        index = Mux(self.first, 0, beat)
        with m.If(en & self.valid):
            m.d.sync += beat.eq(Mux(self.last, 0, Mux(index == len(masks), index, index + 1)))
        masked = Signal(W)
        m.d.comb += masked.eq(self.data)
        for k, (and_m, or_m) in enumerate(masks):
            with m.If(index == k):
                m.d.comb += masked.eq((self.data & and_m) | or_m)
        keep_bits = Cat(*[Mux(self.keep[i], 0xFF, 0x00) for i in range(B)])
        d1 = Signal(W)
        k1 = Signal(self.k_bits)
        f1, l1, v1 = Signal(), Signal(), Signal()
        t1 = Signal.like(self.tag)
        with m.If(en):
            m.d.sync += [d1.eq(masked & keep_bits), f1.eq(self.first), l1.eq(self.last),
                         v1.eq(self.valid), t1.eq(self.tag),
                         k1.eq(Mux(self.last, B - keep_count(self.keep), 0))]

        # Stage 1: one 32-bit part per 64-bit lane; stage 2: their XOR.
        lane = 8
        s8 = matrix_of(lambda v: crc32_raw(0, v.to_bytes(lane, "little")), 8 * lane)
        parts = []
        for j in range(B // lane):
            rows = mat_mul(zero_bytes_matrix(B - lane * (j + 1)), s8)
            p = Signal(32, name=f"part{j}")
            with m.If(en):
                m.d.sync += p.eq(gf2_apply(rows, d1[64 * j:64 * (j + 1)]))
            parts.append(p)
        f2, l2, v2 = Signal(), Signal(), Signal()
        k2 = Signal(self.k_bits)
        t2 = Signal.like(self.tag)
        d3 = Signal(32)
        f3, l3, v3 = Signal(), Signal(), Signal()
        k3 = Signal(self.k_bits)
        t3 = Signal.like(self.tag)
        with m.If(en):
            m.d.sync += [f2.eq(f1), l2.eq(l1), v2.eq(v1), k2.eq(k1), t2.eq(t1),
                         d3.eq(_xor_all(parts)),
                         f3.eq(f2), l3.eq(l2), v3.eq(v2), k3.eq(k2), t3.eq(t2)]

        # Stage 3: the loop, one 32 x 32 map and a XOR.
        start = mat_apply(mat_inverse(zero_bytes_matrix(self.skip)), _ICRC_START)
        state = Signal(32)
        cur = Mux(f3, start, state)
        nxt = Signal(32)
        m.d.comb += nxt.eq(gf2_apply(zero_bytes_matrix(B), cur) ^ d3)
        with m.If(en & v3):
            m.d.sync += state.eq(nxt)

        # Stages 4..: back over the zeroed tail.
        m.submodules.back = back = CrcShiftPipeline(self.k_bits, len(self.tag) + 1,
                                                    inverse=True)
        m.d.comb += [back.en.eq(en), back.v.eq(nxt), back.k.eq(k3),
                     back.tag.eq(Cat(v3 & l3, t3))]
        m.d.comb += [self.done.eq(en & back.out_tag[0]), self.out_tag.eq(back.out_tag[1:]),
                     self.crc.eq(back.out ^ 0xFFFFFFFF),
                     self.residue_ok.eq(back.out == ICRC_RESIDUE)]
        return m


def _xor_all(values):
    acc = values[0]
    for v in values[1:]:
        acc = acc ^ v
    return acc
