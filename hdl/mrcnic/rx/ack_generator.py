"""SACK, NACK, AETH NAK and EV probe answer frames: :class:`AckGenerator` (``ack-generator``).

The last step of the receive side's answer to the sender, in
:class:`~mrcnic.rx.mrc_rx.MrcRx`: each SACK or NACK descriptor of the
:class:`~mrcnic.rx.psn_tracker.PsnTracker`, each access error of the
:class:`~mrcnic.rx.memory_protect.MemoryProtect` and each EV probe request the receive parser
finds becomes one complete control frame, Ethernet to ICRC, ready for the MAC. The addresses
and the remote QP number come from a per-QP context table and a few registers; the ICRC is
computed in line, as an affine map of the variable fields (:func:`affine_icrc` is its Python
form).

Operation, decisions (:data:`BTH_PSN_SOURCE`, :data:`NAK_MSN`, the two inputs) and measured
figures: docs/blocks/ack-generator.md.
"""

import functools
import zlib

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mrcnic.base import proto

from mrcnic.base.records import ACK_DESC, EV_PROBE, QP_INDEX_BITS, NAK
from mrcnic.base.crc import crc32_raw, matrix_of
from mrcnic.base.csr import (
    AxiLiteSignature, CsrBlock, Field, Register, RegisterMap, check_counter_width,
    event_counters, ipv6_registers, mac_registers)
from mrcnic.base.proto import (AETH, BTH, CC_STATE, EETH, ETH, ICRC_LEN, IPV6, NETH, SETH, UDP,
                               Opcode)
from mrcnic.base.stream import (AxiStreamSignature, MetaSkidBuffer, SkidBuffer, check_data_width,
                     drive_axis, meta_stream)


__all__ = ["AckGenerator", "ACK_REGS", "ACK_CTX", "LATENCY", "FRAME_LEN", "HOP_LIMIT_DEFAULT",
           "BTH_PSN_SOURCE", "NAK_MSN", "SACK", "NACK", "AETH_NAK", "EV_ANSWER", "KINDS",
           "inner_delta",
           "affine_icrc"]

# The four kinds of frame, as the Python helpers below and the tests number them: EV_ANSWER
# is the endpoint response (0xD9, EETH) that answers an EV probe request.
SACK, NACK, AETH_NAK, EV_ANSWER = 0, 1, 2, 3
KINDS = (SACK, NACK, AETH_NAK, EV_ANSWER)


HDR_LEN = ETH.size + IPV6.size + UDP.size + BTH.size          # 74: bytes before SETH/NETH
WINDOW = IPV6.size + UDP.size + BTH.size                      # 60: ICRC-covered, before them
TAIL = {SACK: SETH.size + CC_STATE.size, NACK: NETH.size, AETH_NAK: AETH.size,
        EV_ANSWER: EETH.size}                                  # 36, 20, 4, 36
FRAME_LEN = {t: HDR_LEN + TAIL[t] + ICRC_LEN for t in TAIL}   # 114, 98, 82, 114
OPCODE = {SACK: Opcode.SACK, NACK: Opcode.NACK, AETH_NAK: Opcode.ACK,
          EV_ANSWER: Opcode.EP_RESPONSE}
# Decision (module docstring): the record field a control frame's BTH PSN carries (an EV
# probe answer's: its request's PSN).
BTH_PSN_SOURCE = {SACK: "cack", NACK: "psn", AETH_NAK: "psn", EV_ANSWER: "psn"}
# The kinds whose context and register ICRC parts the serial engines compute (each the
# SACK's bytes cut at its length); an EV answer's parts are derived from the SACK's
# (_answer_ctx_crc: same length, no remote QP in it).
SERIAL_KINDS = (SACK, NACK, AETH_NAK)
# Decision (module docstring): the MSN of an AETH NAK. The receive side keeps no AETH
# message count (MRC acknowledges with SACKs), so it sends 0.
NAK_MSN = 0
HOP_LIMIT_DEFAULT = 64      # the same default as the packet model's DEFAULT_HOP_LIMIT
LATENCY = 4                 # R0, S1, F, output register slice
CHUNK_BITS = 64             # descriptor bits per ICRC partial (4 LUT levels as mapped)

ACK_CTX = data.StructLayout({
    "mac":       48,        # Ethernet destination
    "ip":        128,       # IPv6 destination
    "remote_qp": 24,        # BTH dest_qp; low 16 bits = SETH/NETH dst_id
    "crc_sack":  32,        # this entry's part of a SACK's ICRC
    "crc_nack":  32,        # ... of a NACK's
    "crc_nak":   32,        # ... of an AETH NAK's
    "crc_ans":   32,        # ... and of an EV probe answer's
})
CTX_CRC = {SACK: "crc_sack", NACK: "crc_nack", AETH_NAK: "crc_nak", EV_ANSWER: "crc_ans"}

ACK_COUNTERS = ["sacks", "nacks", "bad_qp", "naks", "answers"]


ACK_REGS = RegisterMap("ack_generator", [
    *mac_registers("local", "Source (this NIC)"),
    *ipv6_registers("local", "Source (this NIC)"),
    Register("config", [
        Field("udp_dport", 16, "rw", reset=proto.UDP_DPORT_DEFAULT,
              desc="UDP destination port of every control frame"),
        Field("pkey", 16, "rw", reset=proto.PKEY_DEFAULT, desc="BTH P_Key"),
    ]),
    Register("ipv6", [
        Field("dscp", 6, "rw", desc="IPv6 DSCP of control frames"),
        Field("ecn", 2, "rw", desc="IPv6 ECN of control frames"),
        Field("hop_limit", 8, "rw", reset=HOP_LIMIT_DEFAULT, desc="IPv6 hop limit"),
        Field("stev_swap", 1, "rw",
              desc="1: a frame's STEV carries EV[31:16] in the UDP source port and EV[15:0] "
                   "in the flow label (as the receive parser's stev_swap); 0: the other way "
                   "round"),
    ]),
    Register("ctx_qp", [Field("qp", QP_INDEX_BITS, "rw",
                              desc="Local QP index of the context entry ctx_write writes")]),
    *mac_registers("ctx", "Context: destination (the peer)"),
    *ipv6_registers("ctx", "Context: destination (the peer)"),
    Register("ctx_remote_qp", [Field("qpn", proto.PSN_BITS, "rw",
                                     desc="Context: remote QP number (BTH dest_qp; its low "
                                          "16 bits are SETH/NETH dst_id)")]),
    Register("control", [
        Field("ctx_write", 1, "w1p",
              desc="Write the ctx_* registers (as they are now) into the context of QP "
                   "ctx_qp; nothing when ctx_qp is not below qps"),
        Field("clear", 1, "w1p", desc="Zero every counter"),
    ]),
    Register("status", [
        Field("cfg_pending", 1, "ro",
              desc="1 while frames do not yet use the values of the local_*, config and "
                   "ipv6 registers (at most 2 x 89 cycles after a write), and while any "
                   "write's response is pending"),
        Field("ctx_busy", 1, "ro",
              desc="1 from ctx_write until the entry is in the table (73 cycles)"),
        Field("ctx_dropped", 1, "w1c",
              desc="A ctx_write came while ctx_busy and was ignored"),
    ]),
    Register("info", [Field("qps", 17, "ro", desc="QP contexts (the qps parameter)")]),
    *[Register(name, [Field("count", 32, "ro")], desc=desc) for name, desc in [
        ("sacks", "SACK frames sent"),
        ("nacks", "NACK frames sent"),
        ("bad_qp", "Records dropped, desc, nak or probe: qp not below qps"),
        ("naks", "AETH NAK frames sent (nak records)"),
        ("answers", "EV probe answers sent (probe records)"),
    ]],
])


# --- The ICRC as an affine map (Python side: rows of the matrices, and a reference) --------

# Fields that vary from frame to frame, named as inner_delta() takes them, with their widths
# (``syndrome``: the nak record's; ``sport``: the UDP source port, one half of ``entropy``
# chosen by ``stev_swap``; ``peer_id``: the probe record's).
VARIABLES = {
    "src_ip": 128, "dst_ip": 128, "dport": 16, "pkey": 16, "dest_qp": 24, "dst_id": 16,
    "sport": proto.STEV_PORT_BITS,
    **{name: ACK_DESC[name].width
       for name in ("entropy", "cack", "psn", "qp", "m", "pr", "ack_psn_offset", "mpr",
                    "sack_offset", "bitmap", "timestamp", "ooo_count", "rcvd_bytes",
                    "reason")},
    "syndrome": NAK["syndrome"].width,
    "peer_id": EV_PROBE["peer_id"].width,
}


def inner_delta(kind, **v):
    """The ICRC-covered bytes (inner IPv6 header to the end of SETH/CC_STATE, NETH or AETH)
    of a frame of ``kind`` (:data:`KINDS`) with every constant field zero and the variables
    ``v`` (:data:`VARIABLES`, missing ones 0; those the kind does not carry ignored) in
    place. Linear in ``v``: the gateware's matrices are its columns, one bit of one variable
    at a time."""
    g = {name: v.get(name, 0) for name in VARIABLES}
    # An AETH NAK echoes no EV: its UDP source port (and flow label) is 0. The flow label is
    # outside the ICRC.
    # An EV answer goes to ENDPOINT_QP, a constant (in its base).
    sport = 0 if kind == AETH_NAK else g["sport"]
    psn = g[BTH_PSN_SOURCE[kind]]
    dest_qp = 0 if kind == EV_ANSWER else g["dest_qp"]
    head = (IPV6.pack(src=g["src_ip"], dst=g["dst_ip"])
            + UDP.pack(src_port=sport, dst_port=g["dport"])
            + BTH.pack(pkey=g["pkey"], dest_qp=dest_qp, psn=psn))
    if kind == EV_ANSWER:
        tail = EETH.pack(src_id=g["qp"], dst_id=g["peer_id"], timestamp=g["timestamp"])
    elif kind == AETH_NAK:
        tail = AETH.pack(syndrome=g["syndrome"])
    elif kind == NACK:
        tail = NETH.pack(reason=g["reason"], entropy=g["entropy"], src_id=g["qp"],
                         dst_id=g["dst_id"], nack_psn=g["psn"], timestamp=g["timestamp"])
    else:
        tail = (SETH.pack(m=g["m"], pr=g["pr"], ack_psn_offset=g["ack_psn_offset"],
                          entropy=g["entropy"], src_id=g["qp"], dst_id=g["dst_id"],
                          cack_psn=g["cack"], mpr=g["mpr"], sack_offset=g["sack_offset"],
                          bitmap=g["bitmap"])
                + CC_STATE.pack(timestamp=g["timestamp"], ooo_count=g["ooo_count"],
                                rcvd_bytes=g["rcvd_bytes"]))
    return head + tail


def _icrc_base(kind):
    """ICRC of the frame of ``kind`` with every variable field zero, by the RoCEv2 rule
    (spec 2.1): 8 bytes of ones, then the inner packet with traffic class, flow label, hop
    limit, UDP checksum and BTH byte 4 replaced by ones."""
    length = UDP.size + BTH.size + TAIL[kind] + ICRC_LEN
    inner = (IPV6.pack(version=proto.IPV6_VERSION, dscp=0x3F, ecn=0x3, flow_label=0xFFFFF,
                       payload_length=length, next_header=proto.IPPROTO_UDP, hop_limit=0xFF)
             + UDP.pack(length=length, checksum=0xFFFF)
             + BTH.pack(opcode=OPCODE[kind], tver=proto.BTH_TVER, fecn=1, becn=1,
                        _rsvd4=0x3F, dest_qp=proto.ENDPOINT_QP if kind == EV_ANSWER else 0)
             + {AETH_NAK: AETH.pack(msn=NAK_MSN),
                EV_ANSWER: EETH.pack(op=proto.EP_EV_PROBE)}.get(kind, bytes(TAIL[kind])))
    return zlib.crc32(b"\xff" * 8 + inner)


ICRC_BASE = {t: _icrc_base(t) for t in TAIL}


def affine_icrc(kind, **v):
    """The ICRC the gateware computes, in Python: ``c_t ^ raw(0, inner_delta(...))``."""
    return ICRC_BASE[kind] ^ crc32_raw(0, inner_delta(kind, **v))


@functools.lru_cache(maxsize=None)
def _rows(kind, names):
    """Rows of the GF(2) map from ``Cat(*values of names)`` (first name least significant)
    to the raw CRC of :func:`inner_delta`."""
    rows, shift = [0] * 32, 0
    for name in names:
        def column(x, name=name):
            return crc32_raw(0, inner_delta(kind, **{name: x}))
        sub = matrix_of(column, VARIABLES[name])
        rows = [r | s << shift for r, s in zip(rows, sub)]
        shift += VARIABLES[name]
    return tuple(rows)


def _gf2(rows, x):
    """Gateware: matrix ``rows`` applied to ``x``, each bit the parity of ``x`` AND a
    constant (the same XOR tree as :func:`mrcnic.base.crc.gf2_apply` once synthesised, and one
    expression a bit for the simulator instead of one term a bit of ``x``)."""
    x = Value.cast(x)
    return Cat(*((x & r).xor() if r else Const(0, 1) for r in rows))


def _crc_map(kind, terms):
    """Gateware: the CRC part of ``terms`` (``[(variable, Value)]``), one XOR tree a bit."""
    names = tuple(n for n, _ in terms)
    return _gf2(_rows(kind, names), Cat(*(v for _, v in terms)))


def _chunks(names, limit=CHUNK_BITS):
    """``names`` in order, grouped so that each group has at most ``limit`` bits."""
    groups, size = [[]], 0
    for name in names:
        if groups[-1] and size + VARIABLES[name] > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += VARIABLES[name]
    return groups


# Record fields each kind's frame carries (its ICRC's record part).
DESC_VARS = {
    SACK: ["entropy", "cack", "m", "pr", "qp", "ack_psn_offset", "sack_offset", "timestamp",
           "bitmap", "mpr", "ooo_count", "rcvd_bytes"],
    NACK: ["entropy", "psn", "reason", "qp", "timestamp"],
    AETH_NAK: ["psn", "syndrome"],
    EV_ANSWER: ["psn", "qp", "peer_id", "timestamp"],
}
# A SACK and an EV answer have the same length and carry ``qp`` (src_id) and ``timestamp``
# at the same bytes (SETH's src_id and EETH's at 8-9 of the tail, CC_STATE's timestamp and
# EETH's at 28-29), so those fields' part is the same matrix for both: the SACK's first
# chunk, which an EV answer takes too (its own chunk: ``psn`` and ``peer_id``).
SHARED = ["qp", "timestamp"]
CHUNKS = {
    SACK: [SHARED] + _chunks([n for n in DESC_VARS[SACK] if n not in SHARED]),
    NACK: _chunks(DESC_VARS[NACK]),
    AETH_NAK: _chunks(DESC_VARS[AETH_NAK]),
    EV_ANSWER: [[n for n in DESC_VARS[EV_ANSWER] if n not in SHARED]],
}
assert _rows(SACK, tuple(SHARED)) == _rows(EV_ANSWER, tuple(SHARED))


# The registers' and the contexts' parts are computed a byte a cycle over the covered bytes
# (the SACK's 96; a NACK's are its first 80, an AETH NAK's its first 64): the kinds share
# these fields' bytes, since SETH and NETH carry dst_id at the same offset, the AETH NAK
# carries no dst_id (it would sit beyond its 64 bytes) and the rest of these fields sit
# before the kind's own header.
COVERED = WINDOW + TAIL[0]
assert SETH.offset("dst_id") == NETH.offset("dst_id")
# One CRC step: the register after one more byte, a linear map of (register, byte).
STEP_ROWS = tuple(matrix_of(lambda x: crc32_raw(x & 0xFFFFFFFF, bytes([x >> 32])), 40))
SERIAL_VARS = ("src_ip", "dst_ip", "dport", "pkey", "dest_qp", "dst_id")


def _positions(names):
    """Byte indices (in the covered bytes) where the variables ``names`` land."""
    ones = {n: (1 << VARIABLES[n]) - 1 for n in names}
    found = {t: {i for i, b in enumerate(inner_delta(t, **ones)) if b} for t in SERIAL_KINDS}
    for t in SERIAL_KINDS:  # each kind's bytes: the SACK's, cut at the kind's length
        assert found[t] == {i for i in found[SACK] if i < WINDOW + TAIL[t]}
    assert max(found[SACK]) < WINDOW + TAIL[NACK]
    return sorted(found[SACK])


def _variable_bytes(values):
    """``{byte index: 8-bit Value}`` of the covered bytes that ``values`` (a ``{variable:
    Value}`` dict of :data:`SERIAL_VARS`) make non-zero, in the gateware's own bus order."""
    v = {n: values.get(n, 0) for n in SERIAL_VARS}
    bus = Cat(IPV6.assemble({"src": v["src_ip"], "dst": v["dst_ip"]}),
              UDP.assemble({"dst_port": v["dport"]}),
              BTH.assemble({"pkey": v["pkey"], "dest_qp": v["dest_qp"]}),
              NETH.assemble({"dst_id": v["dst_id"]}))
    return {i: bus[8 * i:8 * i + 8] for i in _positions(tuple(values))}


def _serial_crc(m, name, start, src_bytes, held_bytes):
    """A byte-serial CRC engine: on ``start`` (while not busy) it runs over the covered bytes
    from the first variable one, reading them from ``src_bytes`` at the start and from
    ``held_bytes`` (the caller's copy, taken on the starting edge) after it; zeros
    elsewhere. Returns ``(busy, done, crc)``: ``done`` pulses in the cycle after the last
    byte, when ``crc`` holds the raw CRC of the first 64 (``crc[AETH_NAK]``), 80
    (``crc[NACK]``) and 96 (``crc[SACK]``) bytes. The next byte is read a cycle ahead, so a
    step is one byte mux or one CRC step deep, not both."""
    first = min(src_bytes)
    k = Signal(range(COVERED), name=f"{name}_k")
    busy = Signal(name=f"{name}_busy")
    done = Signal(name=f"{name}_done")
    state = Signal(32, name=f"{name}_state")
    byte = Signal(8, name=f"{name}_byte")
    next_byte = Signal(8, name=f"{name}_next_byte")
    crc = {t: Signal(32, name=f"{name}_{t}") for t in SERIAL_KINDS}
    with m.Switch(k):
        for i in held_bytes:
            if i - 1 >= first:
                with m.Case(i - 1):
                    m.d.comb += next_byte.eq(held_bytes[i])
    step = _gf2(STEP_ROWS, Cat(state, byte))
    m.d.sync += done.eq(0)
    with m.If(busy):
        m.d.sync += [state.eq(step), byte.eq(next_byte), k.eq(k + 1)]
        for t in SERIAL_KINDS:
            with m.If(k == WINDOW + TAIL[t] - 1):
                m.d.sync += crc[t].eq(step)
        with m.If(k == COVERED - 1):
            m.d.sync += [busy.eq(0), done.eq(1)]
    with m.Elif(start):
        m.d.sync += [busy.eq(1), k.eq(first), state.eq(0), byte.eq(src_bytes[first])]
    return busy, done, crc


# --- Gateware ------------------------------------------------------------------------------

_CFG = data.StructLayout({"mac": 48, "ip": 128, "dport": 16, "pkey": 16, "dscp": 6,
                          "ecn": 2, "hop_limit": 8, "stev_swap": 1})
_CFG_REGS = {"dport": ("config", "udp_dport"), "pkey": ("config", "pkey"),
             "dscp": ("ipv6", "dscp"), "ecn": ("ipv6", "ecn"),
             "hop_limit": ("ipv6", "hop_limit"), "stev_swap": ("ipv6", "stev_swap")}
CFG_RESET = {n: ACK_REGS[r].field(fd).reset for n, (r, fd) in _CFG_REGS.items()}
CFG_RESET.update(mac=0, ip=0)
CFG_CRC_RESET = {t: crc32_raw(0, inner_delta(t, dport=CFG_RESET["dport"],
                                              pkey=CFG_RESET["pkey"])) for t in SERIAL_KINDS}
# An EV answer's register part is the SACK's: the same length, the registers' fields at the
# same bytes.
_CFG_ONES = {n: (1 << VARIABLES[n]) - 1 for n in ("src_ip", "dport", "pkey")}
assert inner_delta(EV_ANSWER, **_CFG_ONES) == inner_delta(SACK, **_CFG_ONES)


def _answer_ctx_crc(crc_sack, remote_qp):
    """Gateware: an EV answer's context part from the SACK's. The same length and the same
    destination address bytes, but no remote QP (its BTH goes to ENDPOINT_QP, its dst_id is
    the record's): the SACK's part less what the remote QP adds to it, a linear map of the
    24-bit remote QP (its BTH dest_qp and, low 16 bits, dst_id: their columns combined)."""
    rq_bits = VARIABLES["dest_qp"]
    both = _rows(SACK, ("dest_qp", "dst_id"))
    rows = [(r ^ (r >> rq_bits)) & ((1 << rq_bits) - 1) for r in both]
    return crc_sack ^ _gf2(rows, remote_qp)


# R0 and S1 hold a record of any input: a descriptor; (``aeth``) a nak record in the
# descriptor's fields (qp, psn, its syndrome in reason, nack and entropy 0; the others are
# desc's, and unread); or (``ans``) a probe record in them (qp, psn, entropy, timestamp,
# nack 0) with its ``peer_id`` beside them.
_R0 = data.StructLayout({"aeth": 1, "ans": 1, "peer_id": EV_PROBE["peer_id"].width,
                         "d": ACK_DESC})


def _by_kind(r, values):
    """Gateware: ``values[kind]`` of the kind that the flags of ``r`` (an :data:`_R0`
    record, or any view with ``aeth``, ``ans`` and ``nack``) name."""
    nack = r.d.nack if hasattr(r, "d") else r.nack
    return Mux(r.aeth, values[AETH_NAK],
               Mux(r.ans, values[EV_ANSWER], Mux(nack, values[NACK], values[SACK])))


def _ip(f, prefix):
    """Gateware: the IPv6 address in registers ``prefix``0..3 (register 0 holds the address's
    first bytes)."""
    return Cat(*(f[f"{prefix}{i}"]["ip"] for i in reversed(range(4))))


class AckGenerator(wiring.Component):
    """SACK, NACK, AETH NAK and EV probe answer frames: one complete frame, ICRC included,
    per descriptor, access-error or probe record.

    Each ``desc`` record becomes a SACK (BTH 0xDC, SETH, CC_STATE: 114 bytes) or, with
    ``desc.nack``, a NACK (0xDD, NETH: 98 bytes); each ``nak`` record an AETH NAK (0xD1,
    AETH: 82 bytes); each ``probe`` record an EV probe answer (an endpoint response, 0xD9
    to ENDPOINT_QP, EETH: 114 bytes) with BTH PSN the request's, EETH op EP_EV_PROBE,
    src_id the record's ``qp``, dst_id its ``peer_id`` and its timestamp echoed, on the
    record's ``entropy`` as a SACK; no FCS. The record gives the SETH, CC_STATE, NETH or
    AETH fields, the BTH PSN (:data:`BTH_PSN_SOURCE`: a SACK's CACK, a NACK's or AETH NAK's
    PSN) and, for a SACK or NACK, the frame's own STEV (``entropy`` in the IPv6 flow label and UDP source
    port; 0 for an AETH NAK, whose MSN is :data:`NAK_MSN`); the QP's context gives the
    Ethernet and IPv6 destinations and the remote QP number (BTH ``dest_qp``, its low 16
    bits SETH/NETH ``dst_id``); registers give the sources, the UDP port, the traffic class,
    the hop limit and the P_Key; everything else is 0. One record a cycle is taken, from
    ``nak`` when it holds one, else from ``probe``, else from ``desc``, and the frames leave
    in the order of the handshakes. A record whose ``qp`` is not below ``qps`` gives no
    frame and is counted in ``bad_qp``. To write QP n's context: ``ctx_qp`` = n, ``ctx_mac_*``, ``ctx_ip*``,
    ``ctx_remote_qp``, then ``control.ctx_write``; the entry is in the table, all of it at
    once, when ``status.ctx_busy`` reads 0 (73 cycles later); the table is not cleared by
    reset and cannot be read back. New values of the other registers are used once
    ``status.cfg_pending`` reads 0 (at most 178 cycles after the write).

    Parameters
    ----------
    data_width : int
        Bus width in bits (B = ``data_width`` / 8 bytes), one of 64, 128, 256, 512, 1024,
        2048. Default 512.
    qps : int
        QP contexts, 1 .. 65536; records of a ``qp`` not below ``qps`` are dropped.
        Default 64.
    counter_width : int
        Width of the event counters: 32, 16 or 0 (no counters; they read 0, see
        :func:`mrcnic.base.csr.gateware.event_counters`). Default 32.

    Attributes
    ----------
    desc : stream of :data:`~mrcnic.base.records.ACK_DESC`, in
        SACK and NACK descriptors, from the PSN tracker. ``desc.ready`` is a register gated
        by ``nak.valid`` and ``probe.valid``.
    nak : stream of :data:`~mrcnic.base.records.NAK`, in
        Access errors to report as AETH NAKs: ``qp``, ``psn``, ``syndrome`` (0x62,
        ``proto.AETH_SYNDROME_ACCESS_ERROR``; any value is sent as given). ``nak.ready`` is
        a register.
    probe : stream of :data:`~mrcnic.base.records.EV_PROBE`, in
        EV probe requests to answer, from the receive parser. ``probe.ready`` is a register
        gated by ``nak.valid``.
    m_axis : AXI-Stream (``data_width``, ``tuser`` 1 bit, always 0), out
        The frames, driven from registers; bytes of the last beat beyond ``tkeep`` are
        undefined.
    s_axil : AXI4-Lite, in
        Registers and the context table, :data:`ACK_REGS`.
    beats : dict
        ``{SACK: beats, NACK: beats, AETH_NAK: beats, EV_ANSWER: beats}``: each kind's
        frame at this width.
    latency : int
        Cycles from a record's handshake to its frame's first beat (:data:`LATENCY`).

    Latency
    -------
    :attr:`latency` = 4 cycles from a record's handshake (any input) to the frame's
    first beat on ``m_axis`` when the block is idle: R0 (the input register slice, whose
    output addresses the context table), S1, F (the frame) and the output register slice.

    Throughput
    ----------
    Frames back to back while records come and ``m_axis`` is ready: a SACK or an EV probe
    answer takes exactly ceil(114/B) beats, a NACK ceil(98/B) and an AETH NAK ceil(82/B)
    (:attr:`beats`), with no idle cycle between frames, whatever the mix (one frame per
    cycle from 1024 bits on). No path runs from ``m_axis.tready`` to any input's ready.

    Raises
    ------
    TypeError
        If ``data_width`` or ``qps`` is not an int.
    ValueError
        If ``data_width`` is not a power of two in 64 .. 2048, ``qps`` is outside
        1 .. 65536, or ``counter_width`` is not 0, 16 or 32.
    """

    def __init__(self, data_width=512, qps=64, counter_width=32):
        self.counter_width = check_counter_width(counter_width)
        self.data_width = check_data_width(data_width, minimum=64, maximum=2048,
                                           power_of_two=True)
        if not isinstance(qps, int) or isinstance(qps, bool):
            raise TypeError(f"qps must be an int, not {qps!r}")
        if not 1 <= qps <= 1 << QP_INDEX_BITS:
            raise ValueError(f"qps = {qps} is outside 1..{1 << QP_INDEX_BITS}")
        self.qps = qps
        B = data_width // 8
        self.beats = {t: -(-FRAME_LEN[t] // B) for t in TAIL}
        self.latency = LATENCY
        super().__init__({
            "desc": In(meta_stream(ACK_DESC)),
            "nak": In(meta_stream(NAK)),
            "probe": In(meta_stream(EV_PROBE)),
            "m_axis": Out(AxiStreamSignature(data_width)),
            "s_axil": In(AxiLiteSignature(ACK_REGS.addr_width)),
        })

    def elaborate(self, platform):
        m = Module()
        # Registers: the CSR block on s_axil; its fields
        f = self._registers(m)
        # Config: the copy of the registers frames use, and its ICRC parts
        cfg, cr = self._config(m, f)
        # Context table: entries written whole from the ctx_* registers, with ICRC parts
        rd = self._context_table(m, f)
        # R0: one record a cycle from nak, probe or desc, into a slice that addresses the
        # table
        en, r0, r0_valid, r0_ok = self._stage_r0(m, rd)
        # S1: the record and its ICRC parts, and the context as read
        v1, r1, part, sport_part, c1 = self._stage_s1(m, en, r0, r0_valid, r0_ok, rd)
        # F: the frame (every variable field, the ICRC's parts), held while its beats leave
        fv, fr = self._stage_f(m, en, v1, r1, part, sport_part, c1, cfg, cr)
        # Beats: F's beats into the output register slice; the pipeline enable
        handed, last = self._beats(m, en, fv, fr, r1)
        # Counters: frames sent by kind, records dropped for their qp
        self._counters(m, f, en, handed, last, fr, r0_valid, r0_ok)
        return m

    def _qp_below_qps(self, qp):
        """Gateware: ``qp`` (a QP index) has a context."""
        return Const(1, 1) if self.qps == 1 << QP_INDEX_BITS else qp < self.qps

    def _registers(self, m):
        """The register block on ``s_axil``; returns its fields."""
        m.submodules.csr = csr = CsrBlock(ACK_REGS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.s_axil)
        return csr.fields

    def _config(self, m, f):
        """Registers: a published copy and its ICRC parts, always of the same values.
        Returns ``(cfg, cr)``: the copy frames use and its parts, a signal per kind."""
        csr_cfg = {
            "mac": Cat(f["local_mac_lo"]["mac"], f["local_mac_hi"]["mac"]),
            "ip": _ip(f, "local_ip"),
            "dport": f["config"]["udp_dport"], "pkey": f["config"]["pkey"],
            "dscp": f["ipv6"]["dscp"], "ecn": f["ipv6"]["ecn"],
            "hop_limit": f["ipv6"]["hop_limit"], "stev_swap": f["ipv6"]["stev_swap"],
        }
        cfg_snap = Signal(_CFG)
        cfg = Signal(_CFG, init=CFG_RESET)          # what frames use
        cr = {t: Signal(32, init=CFG_CRC_RESET[t], name=f"cfg_crc_{t}") for t in SERIAL_KINDS}
        cfg_bus = {"src_ip": "ip", "dport": "dport", "pkey": "pkey"}
        busy, done, crc = _serial_crc(
            m, "cfg_crc", Const(1, 1),
            _variable_bytes({v: csr_cfg[n] for v, n in cfg_bus.items()}),
            _variable_bytes({v: cfg_snap[n] for v, n in cfg_bus.items()}))
        with m.If(~busy):
            m.d.sync += [cfg_snap[n].eq(v) for n, v in csr_cfg.items()]
        with m.If(done):
            m.d.sync += [cfg.eq(cfg_snap)] + [cr[t].eq(crc[t]) for t in SERIAL_KINDS]
        cr[EV_ANSWER] = cr[SACK]
        # Registered, so that the 224-bit compare does not sit in front of the read mux; a
        # read on the edge right after a write would see the compare of the old values, so
        # the pending B response of any write counts as pending too.
        differ = Signal()
        m.d.sync += differ.eq(Cat(*csr_cfg.values()) != Cat(*(cfg[n] for n in csr_cfg)))
        m.d.comb += [
            f["status"]["cfg_pending"].eq(differ | self.s_axil.bvalid),
            f["info"]["qps"].eq(self.qps),
        ]
        return cfg, cr

    def _context_table(self, m, f):
        """Context table: entries written whole, with their ICRC parts, by a serial engine
        from the ctx_* registers. Returns the table's read port (R0 drives it)."""
        # At least two entries: a one-entry memory has a zero-bit address, which Verilog
        # cannot declare. Entry 1 of such a table is never written nor used.
        m.submodules.ctx = ctx = Memory(shape=ACK_CTX, depth=max(self.qps, 2), init=[])
        wr = ctx.write_port()
        rd = ctx.read_port()
        ctx_qp = f["ctx_qp"]["qp"]
        csr_ctx = {"mac": Cat(f["ctx_mac_lo"]["mac"], f["ctx_mac_hi"]["mac"]),
                   "ip": _ip(f, "ctx_ip"),
                   "remote_qp": f["ctx_remote_qp"]["qpn"]}
        ctx_snap = Signal(data.StructLayout({"mac": 48, "ip": 128, "remote_qp": 24}))
        ctx_addr = Signal(QP_INDEX_BITS)
        strobe = f["control"]["ctx_write"]
        start = strobe & self._qp_below_qps(ctx_qp)

        def ctx_vars(c):
            return {"dst_ip": c["ip"], "dest_qp": c["remote_qp"],
                    "dst_id": c["remote_qp"][:16]}

        busy, done, crc = _serial_crc(m, "ctx_crc", start,
                                      _variable_bytes(ctx_vars(csr_ctx)),
                                      _variable_bytes(ctx_vars(ctx_snap)))
        with m.If(start & ~busy):
            m.d.sync += [ctx_snap[n].eq(v) for n, v in csr_ctx.items()]
            m.d.sync += ctx_addr.eq(ctx_qp)
        status = f["status"]
        m.d.comb += [
            status["ctx_busy"].eq(busy | start),
            status["ctx_dropped_set"].eq(strobe & busy),
            wr.en.eq(done), wr.addr.eq(ctx_addr),
            wr.data.mac.eq(ctx_snap.mac), wr.data.ip.eq(ctx_snap.ip),
            wr.data.remote_qp.eq(ctx_snap.remote_qp),
            *(wr.data[CTX_CRC[t]].eq(crc[t]) for t in SERIAL_KINDS),
            wr.data.crc_ans.eq(_answer_ctx_crc(crc[SACK], ctx_snap.remote_qp)),
        ]
        return rd

    def _stage_r0(self, m, rd):
        """R0: one record a cycle from nak, probe or desc, into a register slice whose
        output addresses the context table (``rd``). Returns ``(en, r0, r0_valid, r0_ok)``:
        the enable of the stall-all pipeline R0 -> S1 -> F (driven by :meth:`_beats`),
        R0's record (:data:`_R0`), valid and qp-in-range."""
        # Decision: a nak record goes first, then a probe record, then a descriptor (naks
        # are rare: at most one per QP error episode; probes come a few per EV and round
        # trip; a SACK waits a cycle). The choice is made in front of R0, so at most one
        # handshake happens in a cycle and frames leave in the order of the handshakes: a
        # user can tag each frame at the handshake (MrcRx keeps the frames' planes that
        # way). nak.ready is R0's registered ready; probe.ready that gated by nak.valid,
        # desc.ready by both valids.
        m.submodules.r0_skid = skid = MetaSkidBuffer(_R0)
        nak_in, probe_in, desc_in = self.nak.payload, self.probe.payload, self.desc.payload
        take_nak = self.nak.valid
        take_probe = self.probe.valid & ~take_nak
        i = skid.i.payload
        m.d.comb += [
            skid.i.valid.eq(take_nak | self.probe.valid | self.desc.valid),
            i.aeth.eq(take_nak), i.ans.eq(take_probe), i.peer_id.eq(probe_in.peer_id),
            i.d.eq(desc_in),
            self.nak.ready.eq(skid.i.ready),
            self.probe.ready.eq(skid.i.ready & ~take_nak),
            self.desc.ready.eq(skid.i.ready & ~take_nak & ~self.probe.valid),
        ]
        # A nak or probe record rides in the descriptor's fields (above); nack 0, and for a
        # nak record entropy 0 (the frame's STEV). The other fields keep desc's values: no
        # byte or ICRC part of those kinds reads them.
        with m.If(take_nak):
            m.d.comb += [i.d.qp.eq(nak_in.qp), i.d.psn.eq(nak_in.psn),
                         i.d.reason.eq(nak_in.syndrome), i.d.nack.eq(0), i.d.entropy.eq(0)]
        with m.Elif(take_probe):
            m.d.comb += [i.d.qp.eq(probe_in.qp), i.d.psn.eq(probe_in.psn),
                         i.d.entropy.eq(probe_in.entropy),
                         i.d.timestamp.eq(probe_in.timestamp), i.d.nack.eq(0)]
        r0, r0_valid = skid.o.payload, skid.o.valid
        en = Signal()                    # the stall-all pipeline R0 -> S1 -> F moves
        r0_ok = self._qp_below_qps(r0.d.qp)
        m.d.comb += [skid.o.ready.eq(en), rd.addr.eq(r0.d.qp), rd.en.eq(en)]
        return en, r0, r0_valid, r0_ok

    def _stage_s1(self, m, en, r0, r0_valid, r0_ok, rd):
        """S1: the record and its ICRC parts; the context is read meanwhile. Returns ``(v1,
        r1, part, sport_part, c1)``: valid, record (:data:`_R0`), the parts (a list of
        signals per kind), the UDP source port's part per kind for either STEV split (F
        picks one with the registers it takes) and the context entry (the table's read
        data)."""
        def r0_field(name):              # a VARIABLES name in R0's fields
            if name == "peer_id":
                return r0.peer_id
            return r0.d.reason if name == "syndrome" else r0.d[name]

        v1 = Signal()
        r1 = Signal(_R0)
        halves = (r0.d.entropy[:proto.STEV_PORT_BITS], r0.d.entropy[proto.STEV_PORT_BITS:])
        sport_part = {t: [Signal(32, name=f"sport_crc_{t}_{swap}") for swap in (0, 1)]
                      for t in (SACK, NACK, EV_ANSWER)}
        part = {t: [Signal(32, name=f"desc_crc_{t}_{i}") for i in range(len(CHUNKS[t]))]
                for t in TAIL}
        with m.If(en):
            m.d.sync += [v1.eq(r0_valid & r0_ok), r1.eq(r0)]
            for t, sigs in sport_part.items():
                m.d.sync += [sig.eq(_crc_map(t, [("sport", half)]))
                             for sig, half in zip(sigs, halves)]
            for t in TAIL:
                for sig, names in zip(part[t], CHUNKS[t]):
                    m.d.sync += sig.eq(_crc_map(t, [(n, r0_field(n)) for n in names]))
        c1 = rd.data
        return v1, r1, part, sport_part, c1

    def _stage_f(self, m, en, v1, r1, part, sport_part, c1, cfg, cr):
        """F: the frame, held while its beats leave: every variable field, the tail
        headers and the ICRC's parts. Returns ``(fv, fr)``: valid and the frame."""
        fv = Signal()
        fr = Signal(data.StructLayout({
            "nack": 1, "aeth": 1, "ans": 1, "cfg": _CFG, "mac": 48, "ip": 128,
            "remote_qp": 24, "sport": proto.STEV_PORT_BITS, "flow": proto.STEV_FLOW_BITS,
            "psn": proto.PSN_BITS, "tail": 8 * SETH.size + 8 * CC_STATE.size,
            "icrc_rest": 32, **{CTX_CRC[t]: 32 for t in TAIL},
        }))
        d1 = r1.d
        # The ICRC but for the table's part, selected by kind. The table's parts go into F
        # as read (a block RAM output is slow on ECP5: no logic after it) and are XORed in
        # at the output, where the ICRC's lanes have a LUT level to spare.
        rest = {t: Const(ICRC_BASE[t], 32) ^ cr[t] for t in TAIL}
        for t in TAIL:
            for p in part[t] + (part[SACK][:1] if t == EV_ANSWER else []):
                rest[t] = rest[t] ^ p
        # The UDP source port: the half of the echoed EV that the registers F takes name.
        for t, (lo, hi) in sport_part.items():
            rest[t] = rest[t] ^ Mux(cfg.stev_swap, hi, lo)
        dst_id = c1.remote_qp[:16]
        seth = SETH.assemble({"m": d1.m, "pr": d1.pr, "ack_psn_offset": d1.ack_psn_offset,
                                "entropy": d1.entropy, "src_id": d1.qp, "dst_id": dst_id,
                                "cack_psn": d1.cack, "mpr": d1.mpr,
                                "sack_offset": d1.sack_offset, "bitmap": d1.bitmap})
        cc = CC_STATE.assemble({"timestamp": d1.timestamp, "ooo_count": d1.ooo_count,
                                  "rcvd_bytes": d1.rcvd_bytes})
        neth = NETH.assemble({"reason": d1.reason, "entropy": d1.entropy, "src_id": d1.qp,
                                "dst_id": dst_id, "nack_psn": d1.psn,
                                "timestamp": d1.timestamp})
        aeth = AETH.assemble({"syndrome": d1.reason, "msn": NAK_MSN})
        eeth = EETH.assemble({"op": proto.EP_EV_PROBE, "src_id": d1.qp, "dst_id": r1.peer_id,
                              "timestamp": d1.timestamp})
        # The 36-byte tails (a SACK's SETH and CC_STATE, an answer's EETH) picked first.
        long_tail = Mux(r1.ans, eeth, Cat(seth, cc))
        n_neth, n_aeth = len(neth), len(aeth)
        with m.If(en):
            m.d.sync += [
                fv.eq(v1),
                fr.nack.eq(d1.nack), fr.aeth.eq(r1.aeth), fr.ans.eq(r1.ans),
                fr.cfg.eq(cfg),
                fr.mac.eq(c1.mac), fr.ip.eq(c1.ip), fr.remote_qp.eq(c1.remote_qp),
                # The frame's own STEV (0 for a nak record: no EV to echo).
                fr.sport.eq(Mux(cfg.stev_swap, d1.entropy[16:], d1.entropy[:16])),
                fr.flow.eq(Mux(cfg.stev_swap, d1.entropy[:16], d1.entropy[16:])),
                fr.psn.eq(_by_kind(r1, {t: d1[BTH_PSN_SOURCE[t]] for t in TAIL})),
                # The bytes after a frame's last header are its ICRC, placed at the
                # output; the rest of the register keeps another kind's bytes (beyond
                # tkeep, undefined).
                fr.tail.eq(Cat(Mux(r1.aeth, aeth,
                                   Mux(d1.nack, neth[:n_aeth], long_tail[:n_aeth])),
                               Mux(d1.nack, neth[n_aeth:], long_tail[n_aeth:n_neth]),
                               long_tail[n_neth:])),
                fr.icrc_rest.eq(_by_kind(r1, rest)),
                *(fr[CTX_CRC[t]].eq(c1[CTX_CRC[t]]) for t in TAIL),
            ]
        return fv, fr

    def _beats(self, m, en, fv, fr, r1):
        """The beats of F, one a cycle, into the output register slice (``m_axis``); drives
        ``en``: the pipeline moves when F is empty or hands on its last beat. Returns
        ``(handed, last)``: a beat handed on, and F's last beat."""
        B = self.data_width // 8
        fc = fr.cfg

        def kind_mux(values):
            return _by_kind(fr, values)
        # IPv6 payload length = UDP length: everything after the IPv6 header.
        length = kind_mux({t: FRAME_LEN[t] - ETH.size - IPV6.size for t in TAIL})
        sport, flow = fr.sport, fr.flow
        head = Cat(
            ETH.assemble({"dst": fr.mac, "src": fc.mac, "ethertype": proto.ETHERTYPE_IPV6}),
            IPV6.assemble({"version": proto.IPV6_VERSION, "dscp": fc.dscp, "ecn": fc.ecn,
                             "flow_label": flow, "payload_length": length,
                             "next_header": proto.IPPROTO_UDP, "hop_limit": fc.hop_limit,
                             "src": fc.ip, "dst": fr.ip}),
            UDP.assemble({"src_port": sport, "dst_port": fc.dport, "length": length}),
            BTH.assemble({"opcode": kind_mux({t: int(OPCODE[t]) for t in TAIL}),
                            "tver": proto.BTH_TVER, "pkey": fc.pkey,
                            "dest_qp": Mux(fr.ans, proto.ENDPOINT_QP, fr.remote_qp),
                            "psn": fr.psn}),
        )
        # The ICRC goes out least significant byte first: the bus order of its bits.
        n_neth, n_aeth = 8 * NETH.size, 8 * AETH.size
        icrc = fr.icrc_rest ^ kind_mux({t: fr[CTX_CRC[t]] for t in TAIL})
        frame = Cat(head, fr.tail[:n_aeth],
                    Mux(fr.aeth, icrc, fr.tail[n_aeth:n_aeth + 32]),
                    fr.tail[n_aeth + 32:n_neth],
                    Mux(fr.nack, icrc, fr.tail[n_neth:n_neth + 32]),
                    fr.tail[n_neth + 32:], icrc)
        assert len(frame) == 8 * FRAME_LEN[SACK] == 8 * FRAME_LEN[EV_ANSWER]
        nbeats = self.beats[SACK]
        frame_bus = Signal(8 * B * nbeats)
        m.d.comb += frame_bus.eq(frame)

        j = Signal(range(max(nbeats, 2)))
        # j is the frame's last beat: a register, so that the pipeline's enable is one LUT.
        last = Signal()
        last_j = kind_mux({t: self.beats[t] - 1 for t in TAIL})
        beat = Signal(8 * B)
        with m.Switch(j):
            for i in range(nbeats):
                with m.Case(i):
                    m.d.comb += beat.eq(frame_bus.word_select(i, 8 * B))
        tail_keep = {t: (1 << (FRAME_LEN[t] - (self.beats[t] - 1) * B)) - 1 for t in TAIL}
        keep = Mux(last, kind_mux(tail_keep), (1 << B) - 1)

        m.submodules.out_skid = out = SkidBuffer(self.data_width)
        wiring.connect(m, out.m_axis, wiring.flipped(self.m_axis))
        drive_axis(m, out.s_axis, valid=fv, data=beat, keep=keep, last=last, user=0)
        handed = fv & out.s_axis.tready
        with m.If(handed):
            m.d.sync += [j.eq(Mux(last, 0, j + 1)), last.eq(j + 1 == last_j)]
        with m.If(en):                   # a new frame (or none) in F
            m.d.sync += last.eq(_by_kind(r1, {t: self.beats[t] == 1 for t in TAIL}))
        m.d.comb += en.eq(~fv | (handed & last))
        return handed, last

    def _counters(self, m, f, en, handed, last, fr, r0_valid, r0_ok):
        """The event counters: frames sent by kind, records dropped for a ``qp`` not below
        ``qps``."""
        sent = handed & last
        events = Signal(data.StructLayout({n: 1 for n in ACK_COUNTERS}))
        m.d.comb += [
            events.sacks.eq(sent & ~fr.nack & ~fr.aeth & ~fr.ans),
            events.nacks.eq(sent & fr.nack),
            events.naks.eq(sent & fr.aeth),
            events.answers.eq(sent & fr.ans),
            events.bad_qp.eq(en & r0_valid & ~r0_ok),
        ]
        event_counters(m, f, events, ACK_COUNTERS, f["control"]["clear"], width=self.counter_width)


