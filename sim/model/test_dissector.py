"""The Wireshark dissector (``tools/wireshark/mrc.lua``): shipped as generated from proto, and
through tshark, every field of every header of every opcode equal to the packet model's
decode (skipped without tshark: ``make tools`` installs it as root)."""

import shutil
import subprocess

import pytest

from mrcnic.base import proto
from mrcnic.base.proto import Opcode
from mrcnic.model import packet as pk
from mrcnic.model.packet.dissector import HEADERS, SIGNED, field_names, lua
from mrcnic.model.rx.roce_rx import trimmed_frame
from mrcnic.netsim.pcap import write_pcap
from testkit import ROOT
from testkit.simtools import seeded

PLUGIN = ROOT / "tools" / "wireshark" / "mrc.lua"
needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None,
                                  reason="tshark not installed (make tools installs it as root)")


def test_shipped_plugin_is_generated():
    assert PLUGIN.read_text() == lua(), \
        "tools/wireshark/mrc.lua is stale: mrcnic packet dissector --out tools/wireshark/mrc.lua"


def _tshark_fields(pcap, fields, *options):
    out = subprocess.run(
        ["tshark", "-X", f"lua_script:{PLUGIN}", "-r", str(pcap), *options, "-T", "fields",
         "-E", "separator=|", "-E", "occurrence=f", *sum((["-e", f] for f in fields), [])],
        capture_output=True, text=True, check=True)
    assert "Lua" not in out.stderr, out.stderr
    return [line.split("|") for line in out.stdout.splitlines()]


def _value(text, signed):
    if text == "":
        return None
    value = int(text, 0)
    return value & 0xFFFF if signed else value


def _frames(rng):
    """``(frame, packet)`` of every opcode, several times each: random fields (UDP source port
    in the dynamic range, which Wireshark tries after the MRC port), with and without TSETH,
    bare, in IPv6-in-IPv6, behind a one-segment SRH and over IPv4 (UDP mode); port status
    requests, and endpoint responses long enough for their EETH."""
    out = []
    for op in Opcode:
        for k in range(7):
            pkt = pk.rng_packet(rng, opcode=op, encap=(("none", "outer") * 3 + ("ipv4",))[k])
            pkt.udp["src_port"] |= 0xC000
            if k in (4, 5):
                pkt = pk.encapsulate(
                    pk.decapsulate(pkt) if pkt.outer else pkt,
                    outer_src=rng.getrandbits(128),
                    outer_dst=pk.make_usid_address(0xFC000000, [1, 2]),
                    srh_segment=pk.make_usid_address(0xFC000000, [3]))
            pkt = pk.finalize(pkt)
            out.append((pk.encode(pkt), pkt))
    for _ in range(3):
        pkt = pk.endpoint_packet(Opcode.EP_RESPONSE, rng.randbytes(36 + rng.randrange(8)))
        pkt.udp["src_port"] = 0xC000 | rng.getrandbits(14)
        pkt = pk.finalize(pkt)
        out.append((pk.encode(pkt), pkt))
        pkt = pk.port_status_packet(rng.getrandbits(32), src_id=rng.getrandbits(16),
                                    dst_id=rng.getrandbits(16), timestamp=rng.getrandbits(16),
                                    psn=rng.getrandbits(24))
        pkt.udp["src_port"] = 0xC000 | rng.getrandbits(14)
        pkt = pk.finalize(pkt)
        out.append((pk.encode(pkt), pkt))
    return out


@needs_tshark
def test_tshark_decodes_every_field_as_the_model(tmp_path):
    rng = seeded()
    frames = _frames(rng)
    pcap = tmp_path / "mrc.pcap"
    write_pcap(pcap, [(1000 * i, f) for i, (f, _) in enumerate(frames)])
    columns = [(name, field) for name in HEADERS for field in field_names(name)]
    rows = _tshark_fields(pcap, ["_ws.col.Protocol", "mrc.icrc", "mrc.payload",
                                 *[f"mrc.{n}.{f}" for n, f in columns]])
    assert len(rows) == len(frames)
    seen = set()
    endpoint = {Opcode.EP_REQUEST: ("erth", proto.ERTH), Opcode.EP_RESPONSE: ("eeth", proto.EETH)}
    for (frame, pkt), row in zip(frames, rows):
        assert row[0] == "MRC", row
        assert _value(row[1], False) == pkt.icrc
        # An endpoint packet's header is the packet model's payload.
        ep, payload = {}, pkt.payload
        name, header = endpoint.get(pkt.opcode, (None, None))
        if name and len(payload) >= header.size:
            ep[name], payload = header.unpack(payload), payload[header.size:]
        assert bytes.fromhex(row[2].replace(":", "")) == payload
        for (name, field), text in zip(columns, row[3:]):
            values = ep.get(name) if name in ("erth", "eeth") else getattr(pkt, name, None)
            want = None if values is None else values[field]
            assert _value(text, (name, field) in SIGNED) == want, (pkt.bth, name, field, text)
            if want is not None:
                seen.add(name)
    assert seen == set(HEADERS), "every header decoded at least once"


@needs_tshark
def test_tshark_trimmed_and_sack_summary(tmp_path):
    """A trimmed write ends after its RETH: the dissector shows every header up to there, no
    ICRC, and says the frame is cut short only when it ends inside a header. A SACK's Info
    column carries its CACK; a NACK's its reason. Display filters name the headers."""
    rng = seeded()
    trimmed, _ = trimmed_frame(rng, proto.EvMode.PASS)
    sack = pk.sack_packet(0x1234, 1000, bitmap=0xF0F0, sack_offset=1,
                          m=proto.SackMode.SKIP_ONCE)
    nack = pk.nack_packet(0x99, 77, reason=proto.NackCode.PSN_OUT_OF_WINDOW)
    cut = pk.encode(sack)[:-20]
    pcap = tmp_path / "trim.pcap"
    write_pcap(pcap, [(0, trimmed), (1, pk.encode(sack)), (2, pk.encode(nack)), (3, cut)])
    rows = _tshark_fields(pcap, ["mrc.reth.va", "mrc.icrc", "mrc.seth.m", "mrc.seth.cack_psn",
                                 "mrc.seth.bitmap", "_ws.col.Info", "_ws.expert.message"])
    assert rows[0][0] != "" and rows[0][1] == ""
    assert int(rows[1][2]) == proto.SackMode.SKIP_ONCE and int(rows[1][3]) == 1000
    assert int(rows[1][4], 0) == 0xF0F0 and "SACK" in rows[1][5] and "CACK 1000" in rows[1][5]
    assert "PSN_OUT_OF_WINDOW" in rows[2][5]
    assert "cut short" in rows[3][5]
    # Each header is a field of its own, for display filters.
    assert _tshark_fields(pcap, ["frame.number"], "-Y", "mrc.seth and mrc.cc_state") == [["2"]]
    assert _tshark_fields(pcap, ["frame.number"], "-Y", "mrc.reth") == [["1"]]
