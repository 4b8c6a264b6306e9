"""The MRC headers after the UDP header as the two other public implementations lay them out,
written by hand with literal byte and bit positions (nothing from ``mrcnic.base.proto``):
the ns-3 model (``HanGuTalker/uet-simulator``, ``src/mrc/model/mrc-header.cc`` and
``src/roce/model/roce-v2-header.cc``) and the scapy client (``anichol67/MRC-Client``,
``core/mrc_headers.py``). Where the two agree, that layout is here; where they disagree, the
field is ours and says so (the BTH rtx bit: MRC-Client's byte 8 bit 5, the ns-3 model's bit
6). The interop tests and the packet model's tests build and read frames with it, so a field
moved in ``proto`` fails them.

:func:`encode` and :func:`decode` take and give ``{field: value}`` dicts with the packet
model's field names, one header at a time.
"""

import struct

__all__ = ["SIZES", "encode", "decode", "bth_encode", "bth_decode", "erth_encode",
           "erth_decode", "eeth_encode", "eeth_decode"]

SIZES = {"meth": 4, "tseth": 4, "reth": 16, "immdt": 4, "aeth": 4, "seth": 28,
         "cc_state": 8, "neth": 20, "peth": 16}


def bth_encode(b):
    """The 12-byte BTH: RoCEv2's, and in byte 8 A at bit 7, rtx at bit 5 (MRC-Client), ts at
    bit 4 (TSETH present)."""
    return struct.pack(">BBHBBHBBH", b["opcode"],
                       b["se"] << 7 | b["m"] << 6 | b["pad"] << 4 | b["tver"], b["pkey"],
                       b["fecn"] << 7 | b["becn"] << 6, b["dest_qp"] >> 16,
                       b["dest_qp"] & 0xFFFF,
                       b["ack_req"] << 7 | b["rtx"] << 5 | b["ts"] << 4, b["psn"] >> 16,
                       b["psn"] & 0xFFFF)


def bth_decode(buf):
    op, b1, pkey, b4, qhi, qlo, b8, phi, plo = struct.unpack(">BBHBBHBBH", bytes(buf[:12]))
    return {"opcode": op, "se": b1 >> 7, "m": b1 >> 6 & 1, "pad": b1 >> 4 & 3,
            "tver": b1 & 0xF, "pkey": pkey, "fecn": b4 >> 7, "becn": b4 >> 6 & 1,
            "dest_qp": qhi << 16 | qlo, "ack_req": b8 >> 7, "rtx": b8 >> 5 & 1,
            "ts": b8 >> 4 & 1, "psn": phi << 16 | plo}


def erth_encode(f):
    """An endpoint request's 16-byte ERTH (MRC-Client): op at byte 1 bits 1:0, vendor info
    at byte 3, the port mask at 4-7, bytes 8-11 reserved there (our QP ids: src_id, dst_id),
    a TSETH-like word at 12-15."""
    return struct.pack(">BBBBIHHHH", 0, f["op"], 0, f["vendor"], f["ports"], f["src_id"],
                       f["dst_id"], f["timestamp"], f["tsr"] << 15 | f["type"])


def erth_decode(buf):
    _, b1, _, vendor, ports, src, dst, ts, word = struct.unpack(">BBBBIHHHH", bytes(buf[:16]))
    return {"op": b1 & 3, "vendor": vendor, "ports": ports, "src_id": src, "dst_id": dst,
            "timestamp": ts, "tsr": word >> 15, "type": word & 0xF}


def eeth_encode(f):
    """An endpoint response's 36-byte EETH (MRC-Client): op at byte 1 bits 5:4, the
    request's timestamp echoed at 28-29, the rest reserved (bytes 8-11: our QP ids, src_id
    and dst_id, as in the ERTH)."""
    return struct.pack(">BB6xHH16xH6x", 0, f["op"] << 4, f.get("src_id", 0),
                       f.get("dst_id", 0), f["timestamp"])


def eeth_decode(buf):
    _, b1, src, dst, ts = struct.unpack(">BB6xHH16xH6x", bytes(buf[:36]))
    return {"op": b1 >> 4 & 3, "src_id": src, "dst_id": dst, "timestamp": ts}


def encode(name, f):
    """The bytes of header ``name`` with fields ``f``."""
    if name == "meth":
        return struct.pack(">HH", f["rqmsn"], f["msn"])
    if name == "tseth":
        return struct.pack(">HH", f["timestamp"], f["tsr"] << 15 | f["type"])
    if name == "reth":
        return struct.pack(">QII", f["va"], f["rkey"], f["dma_length"])
    if name == "immdt":
        return struct.pack(">I", f["imm"])
    if name == "aeth":
        return struct.pack(">I", f["syndrome"] << 24 | f["msn"])
    if name == "seth":
        # Byte 1: M at bits 6:5, pr at bit 1 (ns-3: flags (M << 5) | 0x02; MRC-Client alike).
        # Byte 16: cc_type in the high nibble, flags in the low one.
        return (struct.pack(">BBHIHHI", 0, f["m"] << 5 | f["pr"] << 1, f["ack_psn_offset"],
                            f["entropy"], f["src_id"], f["dst_id"], f["cack_psn"])
                + struct.pack(">BBHQ", f["cc_type"] << 4 | f["flags"], f["mpr"],
                              f["sack_offset"], f["bitmap"]))
    if name == "cc_state":
        return struct.pack(">HHI", f["timestamp"], f["ooo_count"],
                           f["restore_cwnd"] << 31 | f["rcv_cwnd_pen"] << 24 | f["rcvd_bytes"])
    if name == "neth":
        # Byte 2 reason, byte 3 vendor, the NACK PSN at 13-15, cc_type/flags at byte 16 as in
        # SETH, the timestamp at 18-19.
        return struct.pack(">HBBIHHIBBH", 0, f["reason"], f["vendor"], f["entropy"],
                           f["src_id"], f["dst_id"], f["nack_psn"],
                           f["cc_type"] << 4 | f["flags"], 0, f["timestamp"])
    if name == "peth":
        # Vendor info at byte 3, the probe id at 4-5, 6-7 reserved, the PDC ids at 8-11, a
        # TSETH-like word (timestamp, tsr, format type) at 12-15.
        return struct.pack(">IHHHHHH", f["vendor"], f["probe_id"], 0, f["src_id"],
                           f["dst_id"], f["timestamp"], f["tsr"] << 15 | f["type"])
    raise ValueError(f"no header {name!r}")


def decode(name, buf):
    """The fields of header ``name`` at the start of ``buf``."""
    buf = bytes(buf[:SIZES[name]])
    if name == "meth":
        rqmsn, msn = struct.unpack(">HH", buf)
        return {"rqmsn": rqmsn, "msn": msn}
    if name == "tseth":
        ts, word = struct.unpack(">HH", buf)
        return {"timestamp": ts, "tsr": word >> 15, "type": word & 0xF}
    if name == "reth":
        va, rkey, n = struct.unpack(">QII", buf)
        return {"va": va, "rkey": rkey, "dma_length": n}
    if name == "immdt":
        return {"imm": struct.unpack(">I", buf)[0]}
    if name == "aeth":
        word = struct.unpack(">I", buf)[0]
        return {"syndrome": word >> 24, "msn": word & 0xFFFFFF}
    if name == "seth":
        _, b1, apo, ent, src, dst, cack = struct.unpack(">BBHIHHI", buf[:16])
        b16, mpr, so, bitmap = struct.unpack(">BBHQ", buf[16:])
        return {"m": b1 >> 5 & 3, "pr": b1 >> 1 & 1, "ack_psn_offset": apo, "entropy": ent,
                "src_id": src, "dst_id": dst, "cack_psn": cack & 0xFFFFFF,
                "cc_type": b16 >> 4, "flags": b16 & 0xF, "mpr": mpr, "sack_offset": so,
                "bitmap": bitmap}
    if name == "cc_state":
        ts, ooo, word = struct.unpack(">HHI", buf)
        return {"timestamp": ts, "ooo_count": ooo & 0x7FFF, "restore_cwnd": word >> 31,
                "rcv_cwnd_pen": word >> 24 & 0x7F, "rcvd_bytes": word & 0xFFFFFF}
    if name == "neth":
        _, reason, vendor, ent, src, dst, psn, b16, _, ts = struct.unpack(">HBBIHHIBBH", buf)
        return {"reason": reason, "vendor": vendor, "entropy": ent, "src_id": src,
                "dst_id": dst, "nack_psn": psn & 0xFFFFFF, "cc_type": b16 >> 4,
                "flags": b16 & 0xF, "timestamp": ts}
    if name == "peth":
        vendor, probe_id, _, src, dst, ts, word = struct.unpack(">IHHHHHH", buf)
        return {"vendor": vendor & 0xFF, "probe_id": probe_id, "src_id": src, "dst_id": dst,
                "timestamp": ts, "tsr": word >> 15, "type": word & 0xF}
    raise ValueError(f"no header {name!r}")
