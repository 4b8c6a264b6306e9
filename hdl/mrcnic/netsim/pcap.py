"""Minimal pcap files with nanosecond timestamps, for frames the simulations produce.

The format is libpcap's (magic 0xA1B23C4D: nanosecond resolution, version 2.4), link type 1
(Ethernet). Frames are written as given: the datapath's frames carry no FCS, and Wireshark
reads them as Ethernet without FCS.

``records`` are tuples whose first item is a time in nanoseconds and whose last item is the
frame, so that both ``(t_ns, frame)`` pairs and :attr:`mrcnic.netsim.fabric.Fabric.captures` entries
``(t_ns, host, plane, "tx"/"rx", frame)`` can be written directly.
"""

import os
import struct


__all__ = ["PCAP_MAGIC_NS", "LINKTYPE_ETHERNET", "write_pcap", "read_pcap"]


PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
SNAPLEN = 262144               # libpcap's default: larger than any frame the NIC sends

_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")


def write_pcap(path, records):
    """Write ``records`` (``(t_ns, ..., frame)`` tuples, in the order given) to ``path``.

    Times are rounded to whole nanoseconds and must not be negative. Returns the number of
    records written.
    """
    count = 0
    with open(os.fspath(path), "wb") as f:
        f.write(_GLOBAL.pack(PCAP_MAGIC_NS, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
        for record in records:
            t_ns, frame = record[0], bytes(record[-1])
            t = round(t_ns)
            if t < 0:
                raise ValueError(f"record {count}: negative time {t_ns} ns")
            if len(frame) > SNAPLEN:
                raise ValueError(f"record {count}: {len(frame)}-byte frame exceeds the "
                                 f"{SNAPLEN}-byte snapshot length")
            sec, nsec = divmod(t, 1_000_000_000)
            f.write(_RECORD.pack(sec, nsec, len(frame), len(frame)))
            f.write(frame)
            count += 1
    return count


def read_pcap(path):
    """``[(t_ns, frame)]`` of a file written by :func:`write_pcap` (either byte order)."""
    with open(os.fspath(path), "rb") as f:
        data = f.read()
    if len(data) < _GLOBAL.size:
        raise ValueError(f"{path}: {len(data)} bytes is too short for a pcap header")
    for order in "<>":
        if struct.unpack_from(order + "I", data)[0] == PCAP_MAGIC_NS:
            break
    else:
        raise ValueError(f"{path}: not a nanosecond pcap file (magic {data[:4].hex()})")
    head = struct.Struct(order + "IHHiIII")
    rec = struct.Struct(order + "IIII")
    linktype = head.unpack_from(data)[6]
    if linktype != LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: link type {linktype} is not Ethernet")
    out, pos = [], head.size
    while pos < len(data):
        if pos + rec.size > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        sec, nsec, incl, _ = rec.unpack_from(data, pos)
        pos += rec.size
        if pos + incl > len(data):
            raise ValueError(f"{path}: truncated record at byte {pos}")
        out.append((sec * 1_000_000_000 + nsec, data[pos:pos + incl]))
        pos += incl
    return out
