"""EV profiles and expansion (mrcnic.model.ev) against spec §3, and the ev-expand CLI."""

import itertools

import pytest

from testkit.simtools import seeded

from mrcnic import cli
from mrcnic.base.proto import EvMode
from mrcnic.model import ev
from mrcnic.model.ev import (EvConfigError, EvField, EvFormatProfile, EvProfile, EV_BITS,
                             deposit, expand, expand_int, field_values, generate, count)


def spec_profile(mode="explicit"):
    """§3 example: STEV, two 16-bit fields, init 0x1000 / 0x2000, mask 0x0F0F."""
    fmt = EvFormatProfile(EvMode.STEV, [16, 16])
    return EvProfile(fmt, [EvField(16, 0x1000, 0, 0, 0x0F0F),
                           EvField(16, 0x2000, 0, 0, 0x0F0F)], mode)


SPEC_ARGS = ["ev-expand", "--format-widths", "16,16",
             "--field", "width=16,init=0x1000,min=0,max=0,mask=0x0f0f",
             "--field", "width=16,init=0x2000,min=0,max=0,mask=0x0f0f"]


def run_cli(capsys, *args):
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# --- An independent formulation: everything as strings of '0'/'1' -------------------------

def ref_expand(widths, fields, raw):
    """Expanded EV as an int, computed on bit strings, walking each mask from its LSB end."""
    stream = "".join(format(b, "08b") for b in raw)
    out = ""
    pos = 0
    for f, fw in zip(fields, widths):
        value = list(format(f.init_val, f"0{f.width}b"))      # index 0 = MSB
        mask = format(f.mask, f"0{f.width}b")
        taken = stream[pos:pos + mask.count("1")]
        pos += len(taken)
        assert len(taken) == mask.count("1"), "raw EV too short for the reference"
        src = len(taken) - 1                                   # LSB of the taken number
        for j in reversed(range(f.width)):
            if mask[j] == "1":
                value[j] = taken[src]
                src -= 1
        out += "0" * (fw - f.width) + "".join(value)
    return int(out.ljust(256, "0"), 2)


def ref_generate(fields):
    """Generated raw EVs, from per-field lists of bit strings."""
    choices = [[format(n, f"0{f.mask.bit_count()}b") if f.mask else ""
                for n in range(f.min_val, f.max_val + 1)] for f in fields]
    out = []
    for combo in itertools.product(*choices):
        bits = "".join(combo)
        bits = bits.ljust(-(-len(bits) // 8) * 8, "0")
        out.append(int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b"")
    return out


def random_mask(rng, width):
    full = (1 << width) - 1
    kind = rng.randrange(6)
    if kind == 0:
        return 0
    if kind == 1:
        return full
    if kind == 2:
        return 1 << rng.randrange(width)                      # one bit
    if kind == 3:
        return rng.getrandbits(width) & rng.getrandbits(width)  # sparse
    if kind == 4:                                             # contiguous run
        lo = rng.randrange(width)
        hi = rng.randrange(lo, width)
        return ((1 << (hi + 1)) - 1) & ~((1 << lo) - 1)
    return rng.getrandbits(width)


def random_profile(rng, small_ranges=False):
    mode = rng.choice(list(EV_BITS))
    budget = EV_BITS[mode]
    nfmt = rng.randint(1, 16)
    widths = []
    for i in range(nfmt):
        hi = min(32, budget - (nfmt - i - 1))     # leave at least 1 bit for each later one
        if hi < 1:
            break
        widths.append(rng.choice([1, hi, rng.randint(1, hi)]))
        budget -= widths[-1]
    fields = []
    for fw in widths[:rng.randint(0, len(widths))]:
        w = rng.choice([fw, rng.randint(1, fw)])
        mask = random_mask(rng, w)
        top = (1 << mask.bit_count()) - 1
        lo = rng.randint(0, top)
        hi = min(top, lo + rng.randint(0, 2)) if small_ranges else rng.randint(lo, top)
        fields.append(EvField(w, rng.getrandbits(w), lo, hi, mask))
    return EvProfile(EvFormatProfile(mode, widths), fields,
                     "generated" if small_ranges else "explicit")


# --- The spec example ----------------------------------------------------------------------

def test_spec_example_model():
    p = spec_profile()
    assert p.raw_bits == 16
    assert field_values(p, b"\x33\x12") == [0x1303, 0x2102]
    assert expand_int(p, b"\x33\x12") == 0x13032102 << 224
    e = expand(p, bytes([0x33, 0x12]))
    assert e == bytes.fromhex("13032102") + bytes(28)
    assert ev.ev_value(EvMode.STEV, e) == 0x13032102
    assert ev.stev_split(0x13032102) == (0x2102, 0x1303)


def test_spec_example_cli(capsys):
    rc, out, err = run_cli(capsys, *SPEC_ARGS, "--ev", "0x3312")
    assert rc == 0 and err == ""
    assert out == "0x13032102" + "0" * 56 + "\n"
    assert len(out.strip()) == 2 + 64


# --- Format profile rules ------------------------------------------------------------------

@pytest.mark.parametrize("mode, widths, message", [
    (EvMode.STEV, [], r"0 format fields, must be 1\.\.16"),
    (EvMode.SRV6_SRH, [8] * 17, r"17 format fields, must be 1\.\.16"),
    (EvMode.STEV, [16, 0], r"format field 1 width 0 is outside 1\.\.32"),
    (EvMode.SRV6, [33], r"format field 0 width 33 is outside 1\.\.32"),
    (EvMode.STEV, [32, 1], r"sum to 33 bits, more than the 32-bit EV of mode STEV"),
    (EvMode.UDP, [17], r"sum to 17 bits, more than the 16-bit EV of mode UDP"),
    (EvMode.SRV6, [32] * 4 + [1], r"sum to 129 bits, more than the 128-bit EV of mode SRV6"),
    (EvMode.SRV6_SRH, [32] * 8 + [1],
     r"sum to 257 bits, more than the 256-bit EV of mode SRV6_SRH"),
    (EvMode.PASS, [16], r"mode PASS carries no EV"),
    (9, [16], r"mode 9 is not an EvMode"),
    ("bogus", [16], r"mode 'bogus' is not an EvMode"),
    (EvMode.STEV, [1.5], r"width must be an integer, not 1\.5"),
])
def test_format_profile_rules(mode, widths, message):
    with pytest.raises(EvConfigError, match=message):
        EvFormatProfile(mode, widths)


@pytest.mark.parametrize("mode, widths", [
    (EvMode.STEV, [32]), (EvMode.UDP, [16]), (EvMode.UDP, [1] * 16),
    (EvMode.SRV6, [32] * 4), (EvMode.SRV6_SRH, [32] * 8), (EvMode.SRV6_SRH, [16] * 16),
    ("srv6-srh", [32, 16, 16]),
])
def test_format_profile_limits_accepted(mode, widths):
    fmt = EvFormatProfile(mode, widths)
    assert fmt.widths == tuple(widths)
    assert fmt.total_width == sum(widths) <= fmt.ev_bits
    assert isinstance(fmt.mode, EvMode)


def test_ev_config_error_is_value_error():
    assert issubclass(EvConfigError, ValueError)


# --- EV profile rules ----------------------------------------------------------------------

FMT = EvFormatProfile(EvMode.STEV, [16, 16])


@pytest.mark.parametrize("fields, message", [
    ([EvField(8), EvField(8), EvField(8)],
     r"3 fields, more than the 2 format fields \(rule: fields <= format fields\)"),
    ([EvField(20), EvField(16)],
     r"field widths sum to 36 bits, more than the 32 bits .*rule: sum of widths"),
    ([EvField(20), EvField(8)],
     r"field 0: width 20 is wider than format field 0 \(16 bits\)"),
    ([EvField(8), EvField(0)], r"field 1: width 0 is outside 1\.\.32"),
    ([EvField(16, init_val=0x10000)],
     r"field 0: init_val 0x10000 does not fit width 16 \(rule: init_val and mask fit"),
    ([EvField(16), EvField(4, init_val=-1)], r"field 1: init_val -0x1 does not fit width 4"),
    ([EvField(16), EvField(12, mask=0x1000)], r"field 1: mask 0x1000 does not fit width 12"),
    ([EvField(16, mask=0x0F0F, max_val=0x100)],
     r"field 0: max_val 0x100 is not below 2\^popcount\(mask 0xf0f\) = 0x100 "
     r"\(rule: max_val < 2\^popcount\(mask\)\)"),
    ([EvField(16, mask=0, max_val=1)], r"field 0: max_val 0x1 is not below .* = 0x1"),
    ([EvField(16), EvField(16, mask=0xFF, min_val=5, max_val=4)],
     r"field 1: min_val 0x5 is not in 0\.\.max_val 0x4 \(rule: 0 <= min_val <= max_val\)"),
    ([EvField(16, mask=0xFF, min_val=-1, max_val=4)], r"field 0: min_val -0x1 is not in"),
    ([EvField(16), (16, 0, 0, 0, 0)], r"field 1: must be an EvField, not tuple"),
])
def test_profile_rules(fields, message):
    with pytest.raises(EvConfigError, match=message):
        EvProfile(FMT, fields)


def test_profile_rule_other_arguments():
    with pytest.raises(EvConfigError, match=r"mode 'random' is neither 'explicit' nor"):
        EvProfile(FMT, [EvField(16)], "random")
    with pytest.raises(EvConfigError, match=r"format must be an EvFormatProfile, not list"):
        EvProfile([16, 16], [EvField(16)])
    with pytest.raises(EvConfigError, match=r"EV field init_val must be an integer"):
        EvField(16, init_val="0x10")


def test_profile_limits_accepted():
    # Every value at the edge of its rule.
    p = EvProfile(FMT, [EvField(16, 0xFFFF, 0xFF, 0xFF, 0x0F0F), EvField(1, 1, 0, 1, 1)],
                  "GENERATED")
    assert p.mode == "generated"
    assert p.raw_bits == 9 and p.raw_bytes == 2
    assert EvProfile(FMT, []).raw_bits == 0


# --- Mask deposit and expansion edge cases -------------------------------------------------

@pytest.mark.parametrize("n, mask, expected", [
    (0xFFFF, 0, 0),
    (0xDEADBEEF, 0xFFFFFFFF, 0xDEADBEEF),
    (0b101, 0b10101, 0b10001),
    (0b10, 0x80000001, 0x80000000),
    (0b01, 0x80000001, 0x00000001),
    (0x33, 0x0F0F, 0x0303),
    (0b1111, 0b1111 << 28, 0xF0000000),
    (0b110, 0b1011, 0b1010),               # n's LSB at the lowest set bit
])
def test_deposit(n, mask, expected):
    assert deposit(n, mask) == expected


def test_mask_zero_consumes_nothing():
    fmt = EvFormatProfile(EvMode.STEV, [8, 8, 16])
    p = EvProfile(fmt, [EvField(8, 0xAB), EvField(8, 0, 0, 0, 0xFF), EvField(16, 0xCDEF)])
    assert p.raw_bits == 8
    assert expand_int(p, b"\x5a") >> 224 == 0xAB5ACDEF


def test_init_bits_outside_mask_survive():
    p = EvProfile(EvFormatProfile("stev", [32]), [EvField(32, 0xFFFFFFFF, 0, 0, 0x00FF00F0)])
    # 12 raw bits, all zero: only the masked positions clear.
    assert field_values(p, b"\x00\x00") == [0xFF00FF0F]
    assert field_values(p, b"\xab\xc0") == [0xFFABFFCF]


def test_32_bit_fields_full_and_sparse():
    fmt = EvFormatProfile(EvMode.SRV6, [32, 32])
    p = EvProfile(fmt, [EvField(32, 0, 0, 0, 0xFFFFFFFF), EvField(32, 0x12345678, 0, 0,
                                                                     0x80000001)])
    raw = bytes.fromhex("deadbeef") + bytes([0b10000000])
    assert field_values(p, raw) == [0xDEADBEEF, 0x92345678]
    assert expand(p, raw)[:8] == bytes.fromhex("deadbeef92345678")
    assert expand(p, raw)[8:] == bytes(24)


def test_field_right_aligned_in_wider_format_field_and_tail_zero():
    fmt = EvFormatProfile(EvMode.SRV6, [32, 16, 16, 16])
    p = EvProfile(fmt, [EvField(32, 0xCAFECAFE), EvField(4, 0, 0, 0, 0xF),
                        EvField(4, 0, 0, 0, 0xF)])
    e = expand(p, b"\x9c")
    assert e[:8] == bytes.fromhex("cafecafe" "0009" "000c")
    assert e[8:] == bytes(24)           # format field 3 has no EV field: zero
    outer, segment = ev.srv6_parts(e)
    assert outer == 0xCAFECAFE_0009_000C << 64 and segment == 0


def test_raw_ev_of_32_bytes():
    rng = seeded()
    raw = bytes(rng.getrandbits(8) for _ in range(32))
    fmt = EvFormatProfile(EvMode.SRV6_SRH, [32] * 8)
    p = EvProfile(fmt, [EvField(32, 0, 0, 0, 0xFFFFFFFF)] * 8)
    assert p.raw_bits == 256
    assert expand(p, raw) == raw          # full masks, full widths: the identity
    outer, segment = ev.srv6_parts(expand(p, raw))
    assert outer == int.from_bytes(raw[:16], "big")
    assert segment == int.from_bytes(raw[16:], "big")
    # Sixteen 16-bit fields with a mask of the low byte each take the raw EV's first 16 bytes.
    p16 = EvProfile(EvFormatProfile(EvMode.SRV6_SRH, [16] * 16),
                    [EvField(16, 0xA500, 0, 0, 0xFF)] * 16)
    assert expand(p16, raw) == b"".join(bytes([0xA5, b]) for b in raw[:16])


def test_raw_ev_length_errors():
    p = spec_profile()
    with pytest.raises(EvConfigError, match=r"raw EV has 8 bits \(1 bytes\), the profile "
                                            r"takes 16 \(the popcounts of its masks: 8, 8\)"):
        expand(p, b"\x33")
    with pytest.raises(EvConfigError, match=r"raw EV has 33 bytes, at most 32"):
        expand(p, bytes(33))
    with pytest.raises(EvConfigError, match=r"raw EV must be bytes, not int"):
        expand(p, 0x3312)
    # Bits past the ones the profile takes are ignored.
    assert expand(p, b"\x33\x12" + b"\xff" * 30) == expand(p, b"\x33\x12")


def test_ev_value_per_mode():
    e = bytes(range(32))
    assert ev.ev_value(EvMode.UDP, e) == 0x0001
    assert ev.ev_value(EvMode.STEV, e) == 0x00010203
    assert ev.ev_value(EvMode.SRV6, e) == int.from_bytes(e[:16], "big")
    assert ev.ev_value(EvMode.SRV6_SRH, e) == int.from_bytes(e, "big")
    with pytest.raises(EvConfigError, match=r"expanded EV has 4 bytes, must be 32"):
        ev.ev_value(EvMode.STEV, e[:4])


def test_stev_split_and_srv6_parts_errors():
    assert ev.stev_split(0xFFFF0000) == (0, 0xFFFF)
    assert ev.stev_split(0x0000FFFF) == (0xFFFF, 0)
    with pytest.raises(EvConfigError, match=r"STEV EV 0x100000000 does not fit 32 bits"):
        ev.stev_split(1 << 32)
    with pytest.raises(EvConfigError, match=r"SRv6 EV has 16 bytes, must be 32"):
        ev.srv6_parts(bytes(16))


def test_expand_matches_bit_string_reference():
    rng = seeded()
    nonzero_tails = 0
    for _ in range(3000):
        p = random_profile(rng)
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(p.raw_bytes, 32)))
        expected = ref_expand(p.format.widths, p.fields, raw)
        got = expand(p, raw)
        assert int.from_bytes(got, "big") == expand_int(p, raw) == expected, (p, raw.hex())
        assert expected < 1 << 256
        # Nothing may leak past the format widths (the mode's EV holds all of them).
        assert expected & ((1 << (256 - p.format.total_width)) - 1) == 0
        nonzero_tails += p.format.total_width < 256
    assert nonzero_tails > 2000            # the profiles were not all full-width


# --- Generated mode ------------------------------------------------------------------------

def test_generated_enumeration_order():
    fmt = EvFormatProfile(EvMode.STEV, [16, 16])
    p = EvProfile(fmt, [EvField(16, 0x1000, 1, 2, 0x0F0F), EvField(16, 0x2000, 3, 5, 0x0F0F)],
                  "generated")
    raws = list(generate(p))
    assert raws == [bytes([a, b]) for a in (1, 2) for b in (3, 4, 5)]
    assert count(p) == 6
    assert [expand_int(p, r) >> 224 for r in raws[:4]] == [
        0x10012003, 0x10012004, 0x10012005, 0x10022003]


def test_generated_pads_and_skips_fixed_fields():
    fmt = EvFormatProfile(EvMode.STEV, [8, 8, 8, 8])
    p = EvProfile(fmt, [EvField(3, 0, 6, 7, 0b111), EvField(8, 0x42),
                        EvField(2, 0, 0, 2, 0b11)], "generated")
    assert p.raw_bits == 5 and p.raw_bytes == 1
    # 3 bits of field 0, then 2 of field 2, then three zero pad bits.
    assert list(generate(p)) == [bytes([(a << 5) | (b << 3)]) for a in (6, 7) for b in (0, 1, 2)]
    assert expand_int(p, bytes([(7 << 5) | (2 << 3)])) >> 224 == 0x07420200


def test_generated_no_bits():
    p = EvProfile(FMT, [EvField(16, 0x1234)], "generated")
    assert list(generate(p)) == [b""] and count(p) == 1
    assert expand_int(p, b"") >> 240 == 0x1234


def test_generate_needs_generated_profile():
    with pytest.raises(EvConfigError, match=r"EV profile is 'explicit': only a 'generated'"):
        next(generate(spec_profile()))
    with pytest.raises(EvConfigError, match=r"EV profile is 'explicit'"):
        count(spec_profile())


def test_generated_matches_reference():
    rng = seeded()
    checked = 0
    for _ in range(600):
        p = random_profile(rng, small_ranges=True)
        if count(p) > 300:
            continue
        raws = list(generate(p))
        assert raws == ref_generate(p.fields), p
        assert len(raws) == count(p)
        assert raws == sorted(raws)
        assert all(len(r) == p.raw_bytes for r in raws)
        # Distinct raw EVs expand to distinct EVs: the deposit is one-to-one.
        assert len({expand(p, r) for r in raws}) == len(raws)
        checked += 1
    assert checked > 300


# --- CLI -----------------------------------------------------------------------------------

def test_cli_several_evs_and_fewer_fields(capsys):
    rc, out, _ = run_cli(capsys, "ev-expand", "--format-widths", "32,16,16", "--mode", "srv6",
                         "--field", "width=32,init=0xfc000000",
                         "--field", "width=16,mask=0xffff", "--ev", "0x0102", "--ev", "FFFF")
    assert rc == 0
    assert out.split() == ["0xfc0000000102" + "0" * 52, "0xfc000000ffff" + "0" * 52]


def test_cli_mode_inference(capsys):
    args = ["ev-expand", "--format-widths", "32,32", "--field", "width=32,mask=0xff",
            "--ev", "7f"]
    rc, out, _ = run_cli(capsys, *args)       # 64 bits: inferred srv6
    assert rc == 0 and out == "0x0000007f" + "0" * 56 + "\n"
    rc, _, err = run_cli(capsys, *args, "--mode", "stev")
    assert rc == 2
    assert "more than the 32-bit EV of mode STEV" in err
    rc, _, err = run_cli(capsys, "ev-expand", "--format-widths", ",".join(["32"] * 9),
                         "--field", "width=8", "--ev", "")
    assert rc == 2 and "sum to 288 bits, more than the 256-bit SRv6+SRH EV" in err


def test_cli_generated(capsys):
    rc, out, err = run_cli(capsys, "ev-expand", "--format-widths", "16,16",
                           "--field", "width=16,init=0x1000,min=1,max=2,mask=0x0f0f",
                           "--field", "width=16,init=0x2000,min=0,max=0xff,mask=0x0f0f",
                           "--generated", "--limit", "3")
    assert rc == 0
    assert out.split() == [f"0x1001{v:04x}" + "0" * 56 for v in (0x2000, 0x2001, 0x2002)]
    assert "printed 3 of 512 generated EVs" in err
    rc, out, err = run_cli(capsys, "ev-expand", "--format-widths", "8",
                           "--field", "width=8,min=1,max=3,mask=0x3", "--generated")
    assert rc == 0 and err == ""
    assert out.split() == [f"0x{v:02x}" + "0" * 62 for v in (1, 2, 3)]


@pytest.mark.parametrize("extra, message", [
    (["--field", "width=16,init0x1000"], r"'init0x1000' is not KEY=VALUE"),
    (["--field", "width=16,colour=3"], r"unknown key 'colour'; keys are width, init"),
    (["--field", "width=16,mask=1,mask=2"], r"mask given twice"),
    (["--field", "init=1"], r"--field 0 \('init=1'\): width is required"),
    (["--field", "width=sixteen"], r"width: 'sixteen' is not an integer"),
    (["--field", "width=16,init=0x10000"], r"field 0: init_val 0x10000 does not fit width 16"),
    (["--field", "width=16,mask=3,max=4"], r"field 0: max_val 0x4 is not below"),
    (["--field", "width=16,mask=0xff", "--ev", "0x331"],
     r"--ev 0 \('0x331'\): 3 hex digits, must be whole bytes"),
    (["--field", "width=16,mask=0xff", "--ev", "0xzz"], r"--ev 0 \('0xzz'\): not hexadecimal"),
    (["--field", "width=16,mask=0xff", "--ev", "00" * 33], r"--ev 0 .*: 33 bytes, at most 32"),
    (["--field", "width=16,mask=0xffff", "--ev", "12"],
     r"raw EV has 8 bits \(1 bytes\), the profile takes 16"),
    (["--field", "width=16,mask=0xff"], r"give a raw EV with --ev, or --generated"),
    (["--field", "width=16,mask=0xff", "--generated", "--ev", "12"],
     r"--ev and --generated exclude each other"),
    (["--field", "width=16,mask=0xff", "--generated", "--limit", "-1"],
     r"--limit -1 is negative"),
])
def test_cli_errors(capsys, extra, message):
    import re
    rc, out, err = run_cli(capsys, "ev-expand", "--format-widths", "16,16", *extra)
    assert rc == 2
    assert out == ""
    assert err.startswith("mrcnic ev-expand: error: ")
    assert re.search(message, err), err
    assert "Traceback" not in err


def test_cli_bad_format_widths(capsys):
    rc, _, err = run_cli(capsys, "ev-expand", "--format-widths", "16,x", "--ev", "00")
    assert rc == 2 and "--format-widths item 1: 'x' is not an integer" in err
    rc, _, err = run_cli(capsys, "ev-expand", "--format-widths", "16,40", "--ev", "00")
    assert rc == 2 and "format field 1 width 40 is outside 1..32" in err


def test_cli_error_does_not_print_partial_output(capsys):
    # The second raw EV is short: nothing is printed, not even the first.
    rc, out, err = run_cli(capsys, *SPEC_ARGS, "--ev", "3312", "--ev", "33")
    assert rc == 2 and out == ""
    assert "raw EV has 8 bits" in err


def test_cli_missing_format_widths_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["ev-expand", "--ev", "3312"])
    assert exc.value.code == 2
    assert "--format-widths" in capsys.readouterr().err
