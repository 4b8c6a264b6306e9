"""Reference model of the receive parser (``RoceRx``), one frame at a time.

:func:`receive` takes one frame as ``Srv6Decap`` leaves it (Ethernet | inner IPv6 | UDP |
BTH | ... | ICRC, no FCS), its ``DECAP_META`` record (a dict), the ``tuser`` bad flag and
the register values (:class:`RxRegs`), and returns what the block does with it
(:class:`RxResult`): the drop cause, or the record it emits (``pkt``, ``ack``, ``nak``,
``peer`` or ``ev_probe``)
and, for a data packet, the payload it holds until its verdict. A probe's ``timestamp`` is
its PETH's, a data or trimmed packet's its TSETH's (0 without one).

It works on bytes with :mod:`mrcnic.base.proto`'s headers, and decodes every frame it accepts
untrimmed with :func:`mrcnic.model.packet.decode` (ICRC and length rules included), which
must agree. Checks, in priority order (the first that fails names the drop):

1. ``in_bad``: ``tuser`` or ``meta["bad"]``;
2. ``not_roce``: on the bytes the frame has, Ethernet type not IPv6, IP version not 6, next
   header not UDP, UDP destination port not ``udp_dport``;
3. ``truncated``: shorter than Ethernet + IPv6 + UDP + BTH (74 bytes); a trimmed WRITE that
   ends before the end of its RETH; any other frame shorter than its headers + ICRC;
4. ``opcode``: not WRITE_*, ACK, SACK, NACK, probe or endpoint request; an endpoint request
   to a QP other than ``ENDPOINT_QP`` or whose body is neither a port status update nor an
   EV probe; a trimmed frame that is not a WRITE (a switch trims data packets only);
5. ``length`` (not on trimmed frames): IPv6 payload length + 54 or UDP length not the frame's
   length; payload + pad not a multiple of 4, or pad larger than it (WRITE); bytes after the
   headers or a pad count on ACK, SACK, NACK, probe, endpoint request;
6. ``icrc`` (not on trimmed frames);
7. ``too_long``: a WRITE payload longer than ``min(pmtu, pmtu_max)``.

``no_room`` depends on the state of the block's payload buffer, not on the frame: the model
never reports it (the tests allow the block to drop accepted data packets for it, and count
them). Trimming is recognised from the DSCP (the outer one, from ``meta``, in SRv6 modes; the
inner header's in PASS mode) before checks 5-7. Reserved bits, BTH tver, P_Key, TSETH type
and pad byte values are not checked (the ICRC covers them); :func:`receive` raises
:class:`ModelDomainError` for an accepted frame that :func:`~mrcnic.model.packet.decode`
refuses for one of those.
"""

from dataclasses import dataclass

from mrcnic.base import proto
from mrcnic.base.proto import (
    BTH, CC_STATE, IPV6, NETH, PETH, ERTH, RETH, SETH, TSETH, UDP, AETH, EvMode,
    NackCode, Opcode)
from mrcnic.model import packet as pk

__all__ = ["RxRegs", "RxResult", "ModelDomainError", "receive", "match_pkts",
           "expected_place", "CAUSES", "KINDS", "header_length", "meta_of", "data_frame",
           "control_frame", "trimmed_frame", "bad_frame", "random_mix", "BAD_KINDS"]

CAUSES = ("in_bad", "not_roce", "truncated", "opcode", "length", "icrc", "too_long",
          "no_room")
KINDS = ("data", "trimmed", "probe", "sack", "nack", "ack", "nak", "port_status", "ev_probe")
# The endpoint operations the block takes (ERTH op): the others are dropped as an opcode.
EP_OPS = (proto.EP_PORT_STATUS, proto.EP_EV_PROBE)

IP, UDP_AT, BTH_AT, EXT_AT = 14, 54, 62, 74
WRITES = tuple(range(Opcode.WRITE_FIRST, Opcode.WRITE_ONLY_IMM + 1))
CONTROL_HEADERS = {Opcode.ACK: AETH.size, Opcode.SACK: SETH.size + CC_STATE.size,
                   Opcode.NACK: NETH.size, Opcode.PROBE: PETH.size,
                   Opcode.EP_REQUEST: ERTH.size}


class ModelDomainError(ValueError):
    """An accepted frame that breaks a rule the block does not check (reserved bits...)."""


@dataclass
class RxRegs:
    udp_dport: int = proto.UDP_DPORT_DEFAULT
    pmtu: int = 4096
    trim_dscp: int = proto.DSCP_TRIMMED
    trim_lasthop_dscp: int = proto.DSCP_TRIMMED_LASTHOP
    stev_swap: int = 0


@dataclass
class RxResult:
    cause: str | None = None          # drop cause (one of CAUSES), None when accepted
    kind: str | None = None           # one of KINDS when accepted
    pkt: dict | None = None           # RX_PKT fields (tag 0: the block numbers slot records)
    ack: dict | None = None           # ACK_DESC fields
    nak: dict | None = None           # {qp, psn, syndrome}
    peer: dict | None = None          # {qp, ports}: a port status update (PEER_STATUS)
    ev_probe: dict | None = None      # EV_PROBE fields: an EV probe request to answer
    payload: bytes | None = None      # held for a verdict (data packets)


def header_length(opcode, ts):
    """Bytes from the frame's start to the end of the headers of ``opcode`` (None: not one
    the block accepts)."""
    if opcode in WRITES:
        imm = opcode in (Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM)
        return EXT_AT + 4 + 4 * ts + RETH.size + 4 * imm
    if opcode in CONTROL_HEADERS:
        return EXT_AT + CONTROL_HEADERS[opcode]
    return None


def _u(frame, pos, n):
    return int.from_bytes(frame[pos:pos + n], "big")


def _pkt_fields():
    from mrcnic.base.records import PKT_IN
    names = [n for n, _ in PKT_IN]
    return names + ["va", "rkey", "dma_length", "slot"]


def receive(frame, meta, regs=None, *, tuser=0, pmtu_max=4096):
    """What the block does with one frame (see the module docstring)."""
    regs = regs or RxRegs()
    frame = bytes(frame)
    n = len(frame)
    if tuser or meta.get("bad", 0):
        return RxResult(cause="in_bad")
    if ((n >= 14 and _u(frame, 12, 2) != proto.ETHERTYPE_IPV6)
            or (n >= 15 and frame[IP] >> 4 != proto.IPV6_VERSION)
            or (n >= 21 and frame[20] != proto.IPPROTO_UDP)
            or (n >= 58 and _u(frame, 56, 2) != regs.udp_dport)):
        return RxResult(cause="not_roce")
    if n < EXT_AT:
        return RxResult(cause="truncated")

    inner = IPV6.unpack(frame[IP:IP + IPV6.size])
    if meta["mode"] == EvMode.PASS:
        dscp, ecn = inner["dscp"], inner["ecn"]
    else:
        dscp, ecn = meta["dscp"], meta["ecn"]
    trimmed = dscp in (regs.trim_dscp, regs.trim_lasthop_dscp)
    udp = UDP.unpack(frame[UDP_AT:UDP_AT + UDP.size])
    bth = BTH.unpack(frame[BTH_AT:BTH_AT + BTH.size])
    op, ts = bth["opcode"], bth["ts"]
    hdr = header_length(op, ts)
    base = {name: 0 for name in _pkt_fields()}
    base.update(qp=bth["dest_qp"] & 0xFFFF, psn=bth["psn"], opcode=op,
                ack_req=bth["ack_req"], rtx=bth["rtx"], ce=int(ecn == proto.ECN_CE),
                entropy=proto.stev_join(udp["src_port"], inner["flow_label"], regs.stev_swap))

    if trimmed:
        if op not in WRITES:
            return RxResult(cause="opcode")
        reth_at = EXT_AT + 4 + 4 * ts
        if n < reth_at + RETH.size:
            return RxResult(cause="truncated")
        rec = dict(base, trimmed=1, lasthop=int(dscp == regs.trim_lasthop_dscp),
                   **RETH.unpack(frame[reth_at:]))
        if ts:
            rec["timestamp"] = TSETH.unpack(frame[EXT_AT + 4:])["timestamp"]
        return RxResult(kind="trimmed", pkt=rec)

    if hdr is None:
        return RxResult(cause="opcode")
    if n < hdr + proto.ICRC_LEN:
        return RxResult(cause="truncated")
    if op == Opcode.EP_REQUEST and (bth["dest_qp"] != proto.ENDPOINT_QP
                                    or ERTH.unpack(frame[EXT_AT:])["op"] not in EP_OPS):
        return RxResult(cause="opcode")
    rest = n - proto.ICRC_LEN - hdr
    pad = bth["pad"]
    plen = inner["payload_length"]
    if plen + IP + IPV6.size != n or udp["length"] != plen:
        return RxResult(cause="length")
    if op in WRITES:
        if rest % 4 or pad > rest:
            return RxResult(cause="length")
    elif rest or pad:
        return RxResult(cause="length")
    if int.from_bytes(frame[-4:], "little") != pk.icrc(frame[IP:n - proto.ICRC_LEN]):
        return RxResult(cause="icrc")
    payload_len = rest - pad
    if op in WRITES and payload_len > min(regs.pmtu, pmtu_max):
        return RxResult(cause="too_long")

    try:
        p = pk.decode(frame, udp_dport=regs.udp_dport)
    except pk.PacketError as e:
        raise ModelDomainError(f"the block accepts this frame, the codec does not: {e}") \
            from None
    assert p.bth["psn"] == base["psn"] and pk.stev_ev(p, regs.stev_swap) == base["entropy"]
    if op in WRITES:
        rec = dict(base, length=len(p.payload), slot=1, **p.reth)
        if p.tseth is not None:
            rec["timestamp"] = p.tseth["timestamp"]
        if p.immdt is not None:
            rec["imm"] = p.immdt["imm"]
        return RxResult(kind="data", pkt=rec, payload=p.payload)
    if op == Opcode.PROBE:
        return RxResult(kind="probe", pkt=dict(base, timestamp=p.peth["timestamp"]))
    if op == Opcode.EP_REQUEST:
        erth = pk.endpoint_request(p)
        if erth["op"] == proto.EP_EV_PROBE:
            # Answered on the request's own EV (its STEV as a data packet's is read), from
            # the context of the QP it names (dst_id), to the requester's QP (src_id).
            return RxResult(kind="ev_probe", ev_probe={
                "qp": erth["dst_id"], "peer_id": erth["src_id"], "psn": base["psn"],
                "entropy": base["entropy"], "timestamp": erth["timestamp"]})
        return RxResult(kind="port_status",
                        peer={"qp": erth["dst_id"], "ports": erth["ports"]})
    qp = base["qp"]
    if op == Opcode.ACK:
        if p.aeth["syndrome"] == 0:
            return RxResult(kind="ack")
        return RxResult(kind="nak", nak={"qp": qp, "psn": base["psn"],
                                         "syndrome": p.aeth["syndrome"]})
    from mrcnic.base.records import ack_desc_fields
    ack = {name: 0 for name in ack_desc_fields()}
    ack["qp"] = qp
    if op == Opcode.SACK:
        s, c = p.seth, p.cc_state
        ack.update(cack=s["cack_psn"], ack_psn_offset=s["ack_psn_offset"],
                   sack_offset=s["sack_offset"], bitmap=s["bitmap"], m=s["m"], pr=s["pr"],
                   mpr=s["mpr"], ooo_count=c["ooo_count"], rcvd_bytes=c["rcvd_bytes"],
                   entropy=s["entropy"], timestamp=c["timestamp"])
        return RxResult(kind="sack", ack=ack)
    nk = p.neth
    ack.update(nack=1, reason=nk["reason"], psn=nk["nack_psn"], entropy=nk["entropy"],
               timestamp=nk["timestamp"])
    return RxResult(kind="nack", ack=ack)


def _without_tag(rec):
    return {k: v for k, v in rec.items() if k != "tag"}


def match_pkts(results, got, first_tag=0):
    """Align the ``pkt`` records the block gave (``got``, dicts) with the model's
    (``results``, :class:`RxResult` in frame order). The block may leave out data packets it
    dropped for ``no_room``; everything else must match field for field, and the block's
    slot records must carry consecutive tags from ``first_tag``. Returns
    ``(matched, skipped)``: ``[(result, record)]`` of the data packets the block kept, and
    how many it left out. Raises AssertionError naming the first difference."""
    want = [r for r in results if r.pkt is not None]
    matched, skipped, j, tag = [], 0, 0, first_tag
    for i, r in enumerate(want):
        if j < len(got) and _without_tag(got[j]) == _without_tag(r.pkt):
            rec = got[j]
            if rec["slot"]:
                assert rec["tag"] == tag, f"pkt {j}: tag {rec['tag']}, expected {tag}"
                tag = (tag + 1) & 0xFFFF
                matched.append((r, rec))
            j += 1
        elif r.kind == "data":
            skipped += 1
        else:
            got_j = got[j] if j < len(got) else "nothing"
            raise AssertionError(f"pkt record {j}: got {got_j}, model {r.pkt} ({r.kind})")
    assert j == len(got), f"{len(got) - j} pkt records more than the model's"
    return matched, skipped


def expected_place(result, tag, place):
    """``(place record or None, payload or None)`` for a verdict on a held data packet."""
    if not place:
        return None, None
    rec = {"qp": result.pkt["qp"], "psn": result.pkt["psn"], "va": result.pkt["va"],
           "length": len(result.payload), "tag": tag}
    return rec, (result.payload or None)


# --- Random frames as Srv6Decap leaves them (for the tests) ------------------------------

WRITE_OPS = [Opcode(op) for op in WRITES]
PLAIN_DSCP = [proto.DSCP_DATA, proto.DSCP_RTX, proto.DSCP_CONTROL, 0]
SRV6_MODES = [EvMode.SRV6, EvMode.SRV6_SRH]


def meta_of(mode=EvMode.PASS, dscp=0, ecn=0, bad=0):
    return {"mode": int(mode), "dscp": dscp, "ecn": ecn, "flow_label": 0, "hop_limit": 0,
            "srh": int(mode == EvMode.SRV6_SRH), "residue": 0, "bad": bad}



def net(rng, ecn=None):
    return {"ev": rng.getrandbits(32), "dscp": rng.choice(PLAIN_DSCP),
            "ecn": rng.randrange(4) if ecn is None else ecn,
            "ack_req": rng.getrandbits(1), "rtx": rng.getrandbits(1)}


def with_meta(rng, frame, mode=None):
    """A meta record for ``frame``: PASS, or an SRv6 mode whose outer DSCP/ECN are random."""
    mode = rng.choice([EvMode.PASS] + SRV6_MODES) if mode is None else mode
    if mode == EvMode.PASS:
        return meta_of()
    return meta_of(mode, rng.choice(PLAIN_DSCP), rng.randrange(4))


def data_frame(rng, max_payload=300, *, length=None, op=None, ts=None):
    op = op or rng.choice(WRITE_OPS)
    n = rng.randrange(max_payload + 1) if length is None else length
    if length is None and rng.random() < 0.3:
        n = rng.randrange(min(max_payload, 12) + 1)      # pad and one-beat cases
    imm = rng.getrandbits(32) if op.has_immdt else None
    ts = (rng.getrandbits(16) if rng.getrandbits(1) else None) if ts is None else ts
    return pk.encode(pk.write_packet(op, rng.getrandbits(24), rng.getrandbits(24),
                                     rng.getrandbits(64), rng.getrandbits(32),
                                     rng.getrandbits(32), rng.randbytes(n), imm=imm, ts=ts,
                                     rqmsn=rng.getrandbits(16), msn=rng.getrandbits(16),
                                     **net(rng)))


def control_frame(rng, kind=None):
    kind = kind or rng.choice(["sack", "nack", "probe", "ack", "nak", "port_status",
                               "ev_probe"])
    qp, psn = rng.getrandbits(24), rng.getrandbits(24)
    if kind == "sack":
        p = pk.sack_packet(qp, rng.getrandbits(24), rng.getrandbits(64),
                           sack_offset=rng.randrange(-100, 100),
                           ack_psn_offset=rng.randrange(-100, 100), m=rng.randrange(3),
                           pr=rng.getrandbits(1), entropy=rng.getrandbits(32),
                           src_id=rng.getrandbits(16), dst_id=rng.getrandbits(16),
                           cc_type=rng.getrandbits(4), flags=rng.getrandbits(4),
                           mpr=rng.getrandbits(8), cc_timestamp=rng.getrandbits(16),
                           ooo_count=rng.getrandbits(15), restore_cwnd=rng.getrandbits(1),
                           rcv_cwnd_pen=rng.getrandbits(7), rcvd_bytes=rng.getrandbits(24),
                           psn=psn, **net(rng))
    elif kind == "nack":
        p = pk.nack_packet(qp, rng.getrandbits(24), rng.choice(list(NackCode)),
                           vendor=rng.getrandbits(8), entropy=rng.getrandbits(32),
                           timestamp=rng.getrandbits(16), cc_type=rng.getrandbits(4), flags=rng.getrandbits(4),
                           psn=psn, **net(rng))
    elif kind == "probe":
        p = pk.probe_packet(qp, rng.getrandbits(16), timestamp=rng.getrandbits(16), psn=psn,
                            **net(rng))
    elif kind == "port_status":
        p = pk.port_status_packet(rng.getrandbits(32), src_id=rng.getrandbits(16),
                                  dst_id=rng.getrandbits(16), psn=psn, **net(rng))
    elif kind == "ev_probe":
        p = pk.ev_probe_packet(rng.getrandbits(16), src_id=rng.getrandbits(16),
                               dst_id=rng.getrandbits(16), psn=psn, **net(rng))
    else:
        syndrome = 0 if kind == "ack" else rng.choice([proto.AETH_SYNDROME_ACCESS_ERROR,
                                                        0x60, 0x20])
        p = pk.ack_packet(qp, psn, rng.getrandbits(24), syndrome=syndrome, **net(rng))
    return pk.encode(p)


def set_ip(frame, **fields):
    ip = IPV6.unpack(frame[14:54])
    ip.update(fields)
    return frame[:14] + IPV6.pack(**ip) + frame[54:]


def trimmed_frame(rng, mode, lasthop=False, max_payload=300):
    """Trimmed as the fabric does: cut after the inner RETH, the outermost header's DSCP
    (and payload length) rewritten, ICRC gone."""
    frame = data_frame(rng, max_payload)
    ts = frame[70] >> proto.BTH_TS_BIT & 1
    cut = frame[:94 + 4 * ts]
    code = proto.DSCP_TRIMMED_LASTHOP if lasthop else proto.DSCP_TRIMMED
    if mode == EvMode.PASS:
        return set_ip(cut, dscp=code, payload_length=len(cut) - 54), meta_of()
    return cut, meta_of(mode, code, rng.randrange(4))


def bad_frame(rng, kind):
    """``(frame, meta, tuser)`` broken in one way."""
    good = data_frame(rng) if rng.getrandbits(1) else control_frame(rng)
    meta = with_meta(rng, good)
    f = bytearray(good)
    if kind == "icrc":
        f[rng.randrange(len(f) - 4, len(f))] ^= 1 << rng.randrange(8)
    elif kind == "truncated":
        f = f[:rng.randrange(14, 78)]
    elif kind == "length":
        how = rng.randrange(3)
        if how == 0:
            f[18:20] = ((int.from_bytes(f[18:20], "big") + rng.choice([-4, 4, 1])) & 0xFFFF
                        ).to_bytes(2, "big")
        elif how == 1:
            f[58:60] = ((int.from_bytes(f[58:60], "big") + 4) & 0xFFFF).to_bytes(2, "big")
        else:
            f += bytes(4)
    elif kind == "udp_port":
        f[56:58] = (4791).to_bytes(2, "big")       # RoCEv2's port, not MRC's
    elif kind == "opcode":
        # Never the frame's own opcode. EP_REQUEST only where it is dropped for its opcode:
        # a frame too short for its header is "truncated" first, and one to the endpoint
        # QP with a port status or EV probe ERTH is a good request.
        own = BTH.unpack(f[BTH_AT:])
        ep = (len(f) >= header_length(Opcode.EP_REQUEST, 0) + proto.ICRC_LEN
              and not (own["dest_qp"] == proto.ENDPOINT_QP
                       and ERTH.unpack(f[EXT_AT:])["op"] in EP_OPS))
        f[62] = rng.choice([o for o in (0x04, 0x0A, 0xFF, 0xD0) if o != f[62]]
                           + ([Opcode.EP_REQUEST] if ep else []))
    elif kind == "ethertype":
        f[12:14] = b"\x08\x00"
    elif kind == "tuser":
        return bytes(f), meta, 1
    elif kind == "meta_bad":
        meta["bad"] = 1
    elif kind == "junk":
        f = bytearray(rng.randbytes(rng.randrange(1, 200)))
        if rng.getrandbits(1):
            f = bytearray(rng.randbytes(rng.randrange(60, 200)))
            f[12:14] = b"\x88\xb5"        # local experimental ethertype
    return bytes(f), meta, 0


BAD_KINDS = ("icrc", "truncated", "length", "udp_port", "opcode", "ethertype", "tuser",
             "meta_bad", "junk")


def random_mix(rng, n, *, max_payload=300, bad=0.25):
    """``n`` random ``(frame, meta, tuser)``: data packets of every WRITE opcode (TSETH or
    not, pad), SACK, NACK, probe, AETH ACK/NAK, port status, trimmed packets (PASS and SRv6), ECN marks,
    and a share ``bad`` of frames broken in one of :data:`BAD_KINDS`."""
    out = []
    for _ in range(n):
        r = rng.random()
        if r < bad:
            out.append(bad_frame(rng, rng.choice(BAD_KINDS)))
        elif r < bad + 0.1:
            mode = rng.choice([EvMode.PASS] + SRV6_MODES)
            f, meta = trimmed_frame(rng, mode, rng.getrandbits(1), max_payload)
            out.append((f, meta, 0))
        elif r < bad + 0.35:
            f = control_frame(rng)
            out.append((f, with_meta(rng, f), 0))
        else:
            f = data_frame(rng, max_payload)
            out.append((f, with_meta(rng, f), 0))
    return out
