"""mrcnic.base.proto: header declarations, the byte-order mapping, and its gateware side."""

import pytest
from amaranth.hdl import Module, Signal

from mrcnic.base import proto
from mrcnic.base.proto import BTH, HEADERS, IPV6, NETH, PETH, SETH, Header
from testkit.simtools import run, seeded


def test_spec_byte_positions():
    # Spec §2.2, byte offsets of the fields the decisions fix.
    assert SETH.offset("ack_psn_offset") == (2, 0)
    assert SETH.offset("entropy") == (4, 0)
    assert SETH.offset("cack_psn") == (13, 0)
    assert SETH.offset("mpr") == (17, 0)
    assert SETH.offset("sack_offset") == (18, 0)
    assert SETH.offset("bitmap") == (20, 0)
    assert NETH.offset("reason") == (2, 0)
    assert NETH.offset("nack_psn") == (13, 0)
    assert NETH.offset("timestamp") == (18, 0)
    # SETH byte 1: M in bits 6:5, pr in bit 1 (bit 7 of a byte is offset 0), as both public
    # MRC implementations lay it out; NETH byte 16: cc_type in the high nibble.
    assert SETH.offset("m") == (1, 7 - 6) and SETH.offset("pr") == (1, 7 - 1)
    assert NETH.offset("cc_type") == (16, 0) and NETH.width("cc_type") == 4
    assert NETH.offset("flags") == (16, 4)
    # PETH: probe id at 4, PDC ids at 8 and 10, timestamp at 12, format type in 14-15.
    assert [PETH.offset(f) for f in ("vendor", "probe_id", "src_id", "dst_id", "timestamp",
                                     "tsr", "type")] == [(3, 0), (4, 0), (8, 0), (10, 0),
                                                         (12, 0), (14, 0), (15, 4)]
    assert proto.UDP_DPORT_DEFAULT == 4971
    # BTH byte 8: A = bit 7, rtx = bit 5, ts = bit 4.
    assert BTH.offset("ack_req") == (8, 0)
    assert BTH.offset("rtx") == (8, 7 - proto.BTH_RTX_BIT)
    assert BTH.offset("ts") == (8, 7 - proto.BTH_TS_BIT)
    assert BTH.pack(rtx=1)[8] == 1 << proto.BTH_RTX_BIT
    assert SETH.pack(m=proto.SackMode.ALWAYS_SKIP, pr=1)[1] == 0b0100_0010


def test_pack_unpack_round_trip_and_big_endian():
    rng = seeded()
    for h in HEADERS.values():
        for _ in range(50):
            values = {f: rng.randrange(1 << w) for f, (_, w) in h.fields.items()}
            raw = h.pack(**values)
            assert len(raw) == h.size
            assert h.unpack(raw, reserved=True) == values
    assert IPV6.pack(version=6, payload_length=0x1234)[:6] == bytes([0x60, 0, 0, 0, 0x12, 0x34])


def test_pack_refuses_bad_values():
    with pytest.raises(ValueError, match=r"BTH.psn = 0x1000000 does not fit 24 bits"):
        BTH.pack(psn=1 << 24)
    with pytest.raises(ValueError, match="has no field 'nope'"):
        BTH.pack(nope=1)
    with pytest.raises(ValueError, match="needs 12 bytes, got 3"):
        BTH.unpack(b"abc")
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        Header("odd", [("a", 3)])
    with pytest.raises(ValueError, match="duplicate field"):
        Header("dup", [("a", 8), ("a", 8)])


def test_psn_arithmetic_wraps():
    assert proto.psn_add(0xFFFFFF, 2) == 1
    assert proto.psn_diff(1, 0xFFFFFF) == 2
    assert proto.psn_after(1, 0xFFFFFF)
    assert not proto.psn_after(0xFFFFFF, 1)
    assert not proto.psn_after(5, 5)
    assert not proto.psn_after(5 + (1 << 23), 5)       # exactly half the space: not after
    assert proto.psn_after(4 + (1 << 23), 5)          # 2^23 - 1 ahead: after
    assert proto.psn_after(5 + (1 << 23) - 1, 5)


def test_stev_split_and_join():
    assert proto.stev_split(0x13032102) == (0x2102, 0x1303)
    assert proto.stev_join(0x2102, 0x1303) == 0x13032102
    with pytest.raises(ValueError, match="does not fit 32 bits"):
        proto.stev_split(1 << 32)


@pytest.mark.parametrize("header", [BTH, IPV6, SETH], ids=lambda h: h.name)
@pytest.mark.parametrize("byte_offset", [0, 3])
def test_gateware_get_and_assemble_match_python(header, byte_offset):
    """Header.get on an AXI-ordered bus and Header.assemble agree with pack/unpack."""
    rng = seeded()
    bus_bytes = header.size + byte_offset + 2
    bus = Signal(8 * bus_bytes)
    got = {f: Signal(w, name=f"get_{f}") for f, (_, w) in header.fields.items()}
    ins = {f: Signal(w, name=f"in_{f}") for f, (_, w) in header.fields.items()}
    built = Signal(8 * header.size)
    m = Module()
    m.d.comb += [got[f].eq(header.get(bus, f, byte_offset)) for f in got]
    m.d.comb += built.eq(header.assemble(ins))

    async def tb(ctx):
        for _ in range(30):
            values = {f: rng.randrange(1 << w) for f, (_, w) in header.fields.items()}
            raw = header.pack(**values)
            frame = rng.randbytes(byte_offset) + raw + rng.randbytes(2)
            ctx.set(bus, int.from_bytes(frame, "little"))     # byte 0 in bits 7:0
            for f, v in values.items():
                ctx.set(ins[f], v)
            for f, v in values.items():
                assert ctx.get(got[f]) == v, f"{header.name}.{f}"
            assert ctx.get(built).to_bytes(header.size, "little") == raw

    run(m, tb, clock=None)


def test_gateware_refuses_a_header_past_the_bus():
    with pytest.raises(ValueError, match="does not fit a 8-byte bus"):
        BTH.get(Signal(64), "psn")
    with pytest.raises(ValueError, match="9-bit value for a 8-bit field"):
        BTH.assemble({"opcode": Signal(9)})


def test_srv6_entropy_keeps_the_source_port_dynamic():
    """SRv6 modes: the EV index over 0xC000 in both halves, so the UDP source port is in the
    dynamic range whichever half the STEV split (or its swap) puts there."""
    for ev in (0, 7, 13, 255, (1 << 14) - 1):
        e = proto.srv6_entropy(ev)
        port, flow = proto.stev_split(e)
        assert port == flow == 0xC000 | ev and port >= 0xC000
        assert e & 0xFF == ev & 0xFF
    with pytest.raises(ValueError):
        proto.srv6_entropy(1 << 14)
