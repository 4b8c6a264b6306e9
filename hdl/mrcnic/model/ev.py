"""EV format profiles, EV profiles and EV expansion (spec §3): the bit-exact reference.

An *entropy value* (EV) names one path. The controller describes EVs with two profiles:

* :class:`EvFormatProfile` ``(mode, widths)``: how the expanded EV is laid out on the wire, as
  up to 16 *format fields* of 1..32 bits, first field most significant.
* :class:`EvProfile` ``(format, fields, mode)``: one :class:`EvField`
  ``(width, init_val, min_val, max_val, mask)`` per format field (there may be fewer), and
  whether the raw EVs are written by the controller (``"explicit"``) or enumerated by the NIC
  from ``min_val``..``max_val`` (``"generated"``).

Both check the rules of §3 when built and raise :class:`EvConfigError` (a ``ValueError``)
naming the field, the value and the rule broken.

Expansion, as the gateware must do it
-------------------------------------
The raw EV is at most 32 bytes, read as a bit string starting at bit 7 of byte 0. For field
``i`` (in order) with ``k_i = popcount(mask_i)``:

1. ``n_i`` = the next ``k_i`` bits of the string (string offset ``sum(k_j for j < i)``), the
   first of them the most significant bit of ``n_i``. A mask of 0 takes no bits.
2. ``value_i = (init_val_i & ~mask_i) | deposit(n_i, mask_i)``, where :func:`deposit` puts bit
   ``b`` of ``n_i`` at the ``b``-th lowest set bit of the mask (the x86 ``PDEP`` operation).
3. ``value_i`` is right-aligned, zero-filled, in format field ``i``'s width ``fw_i``.

The expanded EV is the concatenation of the format fields, field 0 first, then zeros: as a
256-bit big-endian number, format field ``i`` occupies bits ``255 - P_i`` down to
``256 - P_i - fw_i`` with ``P_i = sum(fw_j for j < i)``. :func:`expand` returns it as 32 bytes
(byte 0 first on the wire), :func:`expand_int` as that 256-bit integer. Format fields past the
last EV field are zero. The EV of the mode is the first ``EV_BITS[mode]`` bits
(:func:`ev_value`): 32 for STEV, 16 for UDP, 128 for SRv6, 256 for SRv6 with SRH.

Decisions where §3 is silent:

* A raw EV shorter than the bits the profile takes (``EvProfile.raw_bits``) is an error, not
  zero-extended: the CLI user or controller who wrote it most likely meant another profile.
  Bits past ``raw_bits`` are ignored.
* In an explicit profile, ``min_val``/``max_val`` do not limit the ``n_i`` of raw EVs: they only
  drive generation. They are still checked against the rules.

Generated mode (:func:`generate`, :func:`count`): every field's ``n_i`` runs over
``min_val..max_val`` (a mask-0 field has only ``n_i = 0``); the raw EV is the concatenation of
the ``n_i`` (``k_i`` bits each) as a bit string, zero-padded at its end to whole bytes; the
fields vary like an odometer with the last field fastest, so the raw EVs come out in ascending
numeric order. ``count`` is the product of ``max_val - min_val + 1`` over the fields.

Accessors: :func:`stev_split` gives the UDP source port and flow label of a 32-bit STEV EV
(§2.3), :func:`srv6_parts` the outer destination address and the SRH segment of a 256-bit EV.

``add_cli`` adds the ``mrcnic ev-expand`` subcommand (see its help).
"""

import dataclasses
import itertools
import operator
import sys

from mrcnic.base import proto
from mrcnic.base.proto import EvMode


__all__ = [
    "EvConfigError", "EvFormatProfile", "EvField", "EvProfile",
    "EXPLICIT", "GENERATED", "EV_BITS", "EXPANDED_BITS", "EXPANDED_BYTES",
    "MAX_FORMAT_FIELDS", "MAX_FIELD_WIDTH",
    "popcount", "deposit", "field_values", "expand", "expand_int", "ev_value",
    "generate", "count", "stev_split", "srv6_parts", "add_cli",
]


MAX_FORMAT_FIELDS = proto.MAX_FORMAT_FIELDS
MAX_FIELD_WIDTH = proto.MAX_FIELD_WIDTH

# The EV each mode carries on the wire (§2.3).
EV_BITS = proto.EV_BITS
EXPANDED_BITS = proto.EV_MAX_BITS          # 256: the longest EV, and the raw EV's limit
EXPANDED_BYTES = EXPANDED_BITS // 8

EXPLICIT = "explicit"
GENERATED = "generated"


class EvConfigError(ValueError):
    """A profile, raw EV or CLI argument that breaks a rule; the message says which and why."""


def popcount(x):
    return int(x).bit_count()


def deposit(n, mask):
    """Scatter the low bits of ``n`` into the set bits of ``mask``, LSB to the lowest set bit.

    Written as the bit-serial loop the hardware unrolls (one mux per mask bit), not as a trick.
    """
    value = 0
    src = 0                                # next bit of n to place
    pos = 0
    while mask >> pos:
        if (mask >> pos) & 1:
            value |= ((n >> src) & 1) << pos
            src += 1
        pos += 1
    return value


def _index(value, what):
    # operator.index refuses floats and strings, which int() would quietly accept.
    try:
        return operator.index(value)
    except TypeError:
        raise EvConfigError(f"{what} must be an integer, not {value!r}") from None


def _mode(mode):
    try:
        if isinstance(mode, str):         # "stev", "SRV6_SRH", "srv6-srh"
            mode = EvMode[mode.upper().replace("-", "_")]
        else:
            mode = EvMode(_index(mode, "EV format profile mode"))
    except (KeyError, ValueError):
        raise EvConfigError(f"EV format profile: mode {mode!r} is not an EvMode") from None
    if mode not in EV_BITS:
        raise EvConfigError(f"EV format profile: mode {mode.name} carries no EV; "
                            f"use one of {', '.join(m.name for m in EV_BITS)}")
    return mode


# --- Profiles -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EvFormatProfile:
    """Wire layout of the expanded EV: ``mode`` and format field widths, first most significant.

    ``mode`` is an :class:`~mrcnic.base.proto.EvMode` other than PASS (or its name: ``"srv6-srh"``).

    Rules: 1..16 format fields, each 1..32 bits wide, and, as a decision of ours, the widths
    sum to no more than the mode's EV (``EV_BITS``: STEV 32, UDP 16, SRV6 128, SRV6_SRH 256):
    bits past the mode's EV would never reach the wire. This also keeps every expanded EV
    within 256 bits (32 bytes), although 16 fields of 32 bits could describe 512.
    """

    mode: EvMode
    widths: tuple

    def __post_init__(self):
        mode = _mode(self.mode)
        widths = tuple(_index(w, "EV format field width") for w in self.widths)
        if not 1 <= len(widths) <= MAX_FORMAT_FIELDS:
            raise EvConfigError(f"EV format profile: {len(widths)} format fields, "
                                f"must be 1..{MAX_FORMAT_FIELDS}")
        for i, w in enumerate(widths):
            if not 1 <= w <= MAX_FIELD_WIDTH:
                raise EvConfigError(f"EV format profile: format field {i} width {w} is "
                                    f"outside 1..{MAX_FIELD_WIDTH}")
        if sum(widths) > EV_BITS[mode]:
            raise EvConfigError(f"EV format profile: format widths sum to {sum(widths)} bits, "
                                f"more than the {EV_BITS[mode]}-bit EV of mode {mode.name}")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "widths", widths)

    @property
    def total_width(self):
        return sum(self.widths)

    @property
    def ev_bits(self):
        return EV_BITS[self.mode]


@dataclasses.dataclass(frozen=True)
class EvField:
    """One EV profile field. Checked against the rules by the :class:`EvProfile` holding it,
    so that errors can name the field's index."""

    width: int
    init_val: int = 0
    min_val: int = 0
    max_val: int = 0
    mask: int = 0

    def __post_init__(self):
        for name in ("width", "init_val", "min_val", "max_val", "mask"):
            object.__setattr__(self, name, _index(getattr(self, name), f"EV field {name}"))

    @property
    def k(self):
        """Raw EV bits the field takes: popcount(mask)."""
        return popcount(self.mask)


@dataclasses.dataclass(frozen=True)
class EvProfile:
    """``fields`` applied to a ``format``, in ``mode`` ``"explicit"`` or ``"generated"``.

    Rules (§3 and ours), checked in this order; the first broken one raises:

    1. no more fields than format fields;
    2. the field widths sum to no more than the format widths;
    3. each field is 1..32 bits wide and, our reading of §3, no wider than *its* format
       field: the value is right-aligned in the format field, and a wider one would lose its
       top bits on the wire;
    4. ``init_val`` and ``mask`` fit the field's width;
    5. ``max_val < 2**popcount(mask)`` (a mask-0 field therefore has ``max_val = 0``);
    6. ``0 <= min_val <= max_val``.
    """

    format: EvFormatProfile
    fields: tuple
    mode: str = EXPLICIT

    def __post_init__(self):
        if not isinstance(self.format, EvFormatProfile):
            raise EvConfigError(f"EV profile: format must be an EvFormatProfile, "
                                f"not {type(self.format).__name__}")
        fields = tuple(self.fields)
        for i, f in enumerate(fields):
            if not isinstance(f, EvField):
                raise EvConfigError(f"EV profile field {i}: must be an EvField, "
                                    f"not {type(f).__name__}")
        mode = str(self.mode).lower()
        if mode not in (EXPLICIT, GENERATED):
            raise EvConfigError(f"EV profile: mode {self.mode!r} is neither "
                                f"{EXPLICIT!r} nor {GENERATED!r}")
        object.__setattr__(self, "fields", fields)
        object.__setattr__(self, "mode", mode)
        self._check()

    def _check(self):
        fmt = self.format.widths
        if len(self.fields) > len(fmt):
            raise EvConfigError(f"EV profile: {len(self.fields)} fields, more than the "
                                f"{len(fmt)} format fields (rule: fields <= format fields)")
        total = sum(f.width for f in self.fields)
        if total > sum(fmt):
            raise EvConfigError(f"EV profile: field widths sum to {total} bits, more than the "
                                f"{sum(fmt)} bits of the format fields (rule: sum of widths "
                                f"<= sum of format widths)")
        for i, (f, fw) in enumerate(zip(self.fields, fmt)):
            where = f"EV profile field {i}"
            if not 1 <= f.width <= MAX_FIELD_WIDTH:
                raise EvConfigError(f"{where}: width {f.width} is outside 1..{MAX_FIELD_WIDTH}")
            if f.width > fw:
                raise EvConfigError(f"{where}: width {f.width} is wider than format field {i} "
                                    f"({fw} bits) (rule: field width <= its format width)")
            limit = (1 << f.width) - 1
            for name in ("init_val", "mask"):
                v = getattr(f, name)
                if not 0 <= v <= limit:
                    raise EvConfigError(f"{where}: {name} {v:#x} does not fit width {f.width} "
                                        f"(rule: init_val and mask fit the width, "
                                        f"0..{limit:#x})")
            if not 0 <= f.max_val < (1 << f.k):
                raise EvConfigError(f"{where}: max_val {f.max_val:#x} is not below "
                                    f"2^popcount(mask {f.mask:#x}) = {1 << f.k:#x} "
                                    f"(rule: max_val < 2^popcount(mask))")
            if not 0 <= f.min_val <= f.max_val:
                raise EvConfigError(f"{where}: min_val {f.min_val:#x} is not in "
                                    f"0..max_val {f.max_val:#x} (rule: 0 <= min_val <= max_val)")

    @property
    def raw_bits(self):
        """Raw EV bits one expansion takes: the sum of popcount(mask) over the fields."""
        return sum(f.k for f in self.fields)

    @property
    def raw_bytes(self):
        return (self.raw_bits + 7) // 8


# --- Expansion ------------------------------------------------------------------------------

def _raw(profile, raw):
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise EvConfigError(f"raw EV must be bytes, not {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > EXPANDED_BYTES:
        raise EvConfigError(f"raw EV has {len(raw)} bytes, at most {EXPANDED_BYTES}")
    if 8 * len(raw) < profile.raw_bits:
        raise EvConfigError(f"raw EV has {8 * len(raw)} bits ({len(raw)} bytes), the profile "
                            f"takes {profile.raw_bits} (the popcounts of its masks: "
                            f"{', '.join(str(f.k) for f in profile.fields)})")
    return raw


def field_values(profile, raw):
    """The value of each EV field (steps 1 and 2 of the expansion), before placement."""
    raw = _raw(profile, raw)
    nbits = 8 * len(raw)
    word = int.from_bytes(raw, "big")     # bit string position p is bit nbits-1-p of word
    offset = 0
    values = []
    for f in profile.fields:
        n = (word >> (nbits - offset - f.k)) & ((1 << f.k) - 1)
        offset += f.k
        values.append((f.init_val & ~f.mask) | deposit(n, f.mask))
    return values


def expand_int(profile, raw):
    """The expanded EV as a 256-bit integer (the EV at its most significant end)."""
    word = 0
    used = 0
    for value, fw in zip(field_values(profile, raw), profile.format.widths):
        word = (word << fw) | value       # value fits its field's width <= fw: right-aligned
        used += fw
    return word << (EXPANDED_BITS - used)


def expand(profile, raw):
    """The expanded EV as 32 bytes, byte 0 first on the wire; the mode's EV leads."""
    return expand_int(profile, raw).to_bytes(EXPANDED_BYTES, "big")


def ev_value(mode, expanded):
    """The EV of ``mode`` (``EV_BITS[mode]`` bits) from a 32-byte expanded EV, as an integer."""
    mode = _mode(mode)
    expanded = bytes(expanded)
    if len(expanded) != EXPANDED_BYTES:
        raise EvConfigError(f"expanded EV has {len(expanded)} bytes, must be {EXPANDED_BYTES}")
    return int.from_bytes(expanded[:EV_BITS[mode] // 8], "big")


# --- Generated mode -------------------------------------------------------------------------

def _require_generated(profile):
    if profile.mode != GENERATED:
        raise EvConfigError(f"EV profile is {profile.mode!r}: only a {GENERATED!r} profile "
                            f"enumerates raw EVs")


def count(profile):
    """How many raw EVs :func:`generate` yields."""
    _require_generated(profile)
    total = 1
    for f in profile.fields:
        total *= f.max_val - f.min_val + 1
    return total


def generate(profile):
    """Raw EVs of a generated profile, ascending; each ``profile.raw_bytes`` long.

    Every field's k-bit number runs over min_val..max_val, last field fastest; the raw EV is
    those numbers concatenated, first field first, zero-padded at the end to whole bytes.
    """
    _require_generated(profile)
    pad = 8 * profile.raw_bytes - profile.raw_bits
    ranges = [range(f.min_val, f.max_val + 1) for f in profile.fields]
    for ns in itertools.product(*ranges):   # product varies its last range fastest
        word = 0
        for n, f in zip(ns, profile.fields):
            word = (word << f.k) | n
        yield (word << pad).to_bytes(profile.raw_bytes, "big")


# --- Accessors ------------------------------------------------------------------------------

def stev_split(ev32):
    """``(udp_src_port, flow_label)`` of a 32-bit STEV EV, split as decided in §2.3.

    EV[STEV_PORT_BITS-1:0] is the UDP source port; the next STEV_FLOW_BITS bits are the low
    bits of the 20-bit flow label, whose remaining top bits are zero.
    """
    try:
        return proto.stev_split(_index(ev32, "STEV EV"))
    except ValueError as e:
        raise EvConfigError(str(e)) from None


def srv6_parts(ev256):
    """``(outer_dst_addr, srh_segment)`` as 128-bit integers from a 32-byte SRv6 EV.

    The first 16 bytes are the outer IPv6 destination address, the next 16 the SRH segment
    (zero, and unused, in SRV6 mode without SRH).
    """
    ev256 = bytes(ev256)
    if len(ev256) != EXPANDED_BYTES:
        raise EvConfigError(f"SRv6 EV has {len(ev256)} bytes, must be {EXPANDED_BYTES}")
    dst = EV_BITS[EvMode.SRV6] // 8
    return int.from_bytes(ev256[:dst], "big"), int.from_bytes(ev256[dst:], "big")


# --- CLI ------------------------------------------------------------------------------------

_CLI_MODES = {m.name.lower().replace("_", "-"): m for m in EV_BITS}
_FIELD_KEYS = {"width": "width", "init": "init_val", "min": "min_val", "max": "max_val",
               "mask": "mask"}
LIMIT_DEFAULT = 256


def _cli_int(text, what):
    try:
        return int(text.strip(), 0)       # 0x.., 0b.., or decimal
    except ValueError:
        raise EvConfigError(f"{what}: {text!r} is not an integer") from None


def _parse_widths(text):
    parts = text.split(",")
    return [_cli_int(p, f"--format-widths item {i}") for i, p in enumerate(parts)]


def _parse_field(text, index):
    where = f"--field {index} ({text!r})"
    values = {}
    for item in text.split(","):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq:
            raise EvConfigError(f"{where}: {item!r} is not KEY=VALUE")
        if key not in _FIELD_KEYS:
            raise EvConfigError(f"{where}: unknown key {key!r}; keys are "
                                f"{', '.join(_FIELD_KEYS)}")
        if _FIELD_KEYS[key] in values:
            raise EvConfigError(f"{where}: {key} given twice")
        values[_FIELD_KEYS[key]] = _cli_int(val, f"{where} {key}")
    if "width" not in values:
        raise EvConfigError(f"{where}: width is required")
    return EvField(**values)


def _parse_ev(text, index):
    # Odd digit counts are refused rather than padded: the raw EV is a bit string read from
    # its first bit, and "0x331" could as well mean 0x0331 as 0x3310.
    where = f"--ev {index} ({text!r})"
    digits = text.strip()
    if digits[:2].lower() == "0x":
        digits = digits[2:]
    if len(digits) % 2:
        raise EvConfigError(f"{where}: {len(digits)} hex digits, must be whole bytes "
                            f"(an even number of digits)")
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        raise EvConfigError(f"{where}: not hexadecimal") from None
    if len(raw) > EXPANDED_BYTES:
        raise EvConfigError(f"{where}: {len(raw)} bytes, at most {EXPANDED_BYTES}")
    return raw


def _infer_mode(widths):
    # The smallest EV that holds the format; UDP only on request, since a 16-bit format fits
    # STEV as well and STEV is the spec's own example.
    total = sum(widths)
    for mode in (EvMode.STEV, EvMode.SRV6, EvMode.SRV6_SRH):
        if total <= EV_BITS[mode]:
            return mode
    raise EvConfigError(f"--format-widths sum to {total} bits, more than the "
                        f"{EXPANDED_BITS}-bit SRv6+SRH EV")


def _run_ev_expand(args):
    widths = _parse_widths(args.format_widths)
    mode = _CLI_MODES[args.mode] if args.mode else _infer_mode(widths)
    fmt = EvFormatProfile(mode, widths)
    fields = [_parse_field(text, i) for i, text in enumerate(args.field)]
    profile = EvProfile(fmt, fields, GENERATED if args.generated else EXPLICIT)
    if args.generated:
        if args.ev:
            raise EvConfigError("--ev and --generated exclude each other")
        if args.limit < 0:
            raise EvConfigError(f"--limit {args.limit} is negative")
        raws = itertools.islice(generate(profile), args.limit)
    else:
        if not args.ev:
            raise EvConfigError("give a raw EV with --ev, or --generated")
        raws = [_parse_ev(text, i) for i, text in enumerate(args.ev)]
        for raw in raws:                  # check all before printing any
            _raw(profile, raw)
    for raw in raws:
        print("0x" + expand(profile, raw).hex())
    if args.generated and count(profile) > args.limit:
        print(f"mrcnic ev-expand: printed {args.limit} of {count(profile)} generated EVs "
              f"(raise --limit for more)", file=sys.stderr)
    return 0


def add_cli(sub):
    """Add ``ev-expand`` to the argparse subparsers ``sub``."""
    p = sub.add_parser(
        "ev-expand", help="expand raw EVs through an EV profile (spec §3)",
        description="Expand raw EVs through an EV format profile and EV profile, and print "
                    "each expanded EV as 0x + 64 hex digits (32 bytes, the mode's EV first, "
                    "zero tail). Example: --format-widths 16,16 --field "
                    "width=16,init=0x1000,mask=0x0f0f --field width=16,init=0x2000,"
                    "mask=0x0f0f --ev 0x3312 prints 0x13032102 and 56 zeros.")
    p.add_argument("--format-widths", required=True, metavar="W,W,...",
                   help="format field widths, first most significant: 1..16 of 1..32 bits")
    p.add_argument("--field", action="append", default=[],
                   metavar="width=W,init=V,min=V,max=V,mask=V",
                   help="one EV field, in order (repeatable, at most one per format field); "
                        "width is required, the others default to 0; integers in decimal, "
                        "0x or 0b")
    p.add_argument("--mode", choices=sorted(_CLI_MODES),
                   help="EV format mode; default: the smallest of stev (32 bits), srv6 (128) "
                        "and srv6-srh (256) that holds the format widths")
    p.add_argument("--ev", action="append", default=[], metavar="HEX",
                   help="raw EV as hex bytes, first byte first (0x optional, an even number "
                        "of digits, at most 32 bytes); repeatable, one line out per --ev")
    p.add_argument("--generated", action="store_true",
                   help="print the EVs the NIC would generate from min..max, in order")
    p.add_argument("--limit", type=int, default=LIMIT_DEFAULT,
                   help=f"with --generated: print at most this many (default {LIMIT_DEFAULT})")
    p.set_defaults(func=_run_ev_expand)
