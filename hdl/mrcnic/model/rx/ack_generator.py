"""Reference model of the ACK generator (``AckGenerator``): the control frame one record
becomes, built with the packet model from the record, the QP's context and the registers.

:func:`frame` is the frame of an ACK_DESC descriptor (a SACK or a NACK), :func:`nak_frame`
the AETH NAK of a ``nak`` record (:data:`mrcnic.rx.roce_rx.NAK`): an ACK (0xD1) whose AETH
carries the record's syndrome and MSN 0, with no EV (UDP source port and flow label 0);
:func:`probe_frame` the answer to an EV probe request (an ``EV_PROBE`` record): an
endpoint response (0xD9) whose EETH echoes the request."""

from mrcnic.base import proto
from mrcnic.model import packet as pk

__all__ = ["frame", "nak_frame", "probe_frame"]


def _s16(x):
    return x - 0x10000 if x & 0x8000 else x


def _net(cfg, ctx, ev):
    sport, flow = pk.stev_split(ev, cfg.get("stev_swap", 0))
    return dict(src_mac=cfg["mac"], dst_mac=ctx["mac"], src_ip=cfg["ip"], dst_ip=ctx["ip"],
                udp_sport=sport, flow_label=flow, dscp=cfg["dscp"], ecn=cfg["ecn"],
                hop_limit=cfg["hop_limit"], udp_dport=cfg["dport"], pkey=cfg["pkey"])


def frame(d, ctx, cfg):
    """The frame for descriptor ``d`` (ACK_DESC fields), QP context ``ctx`` (``mac``, ``ip``,
    ``remote_qp``) and registers ``cfg`` (``mac``, ``ip``, ``dscp``, ``ecn``, ``hop_limit``,
    ``dport``, ``pkey``, and ``stev_swap``: which half of the echoed ``entropy`` the frame's
    UDP source port carries, 0 when absent)."""
    net = _net(cfg, ctx, d["entropy"])
    rqp = ctx["remote_qp"]
    if d["nack"]:
        pkt = pk.nack_packet(rqp, d["psn"], d["reason"], entropy=d["entropy"], src_id=d["qp"],
                             dst_id=rqp & 0xFFFF, timestamp=d["timestamp"], psn=d["psn"],
                             **net)
    else:
        pkt = pk.sack_packet(rqp, d["cack"], d["bitmap"], sack_offset=_s16(d["sack_offset"]),
                             ack_psn_offset=_s16(d["ack_psn_offset"]), m=d["m"], pr=d["pr"],
                             entropy=d["entropy"], src_id=d["qp"], dst_id=rqp & 0xFFFF,
                             mpr=d["mpr"], cc_timestamp=d["timestamp"],
                             ooo_count=d["ooo_count"], rcvd_bytes=d["rcvd_bytes"],
                             psn=d["cack"], **net)
    return pk.encode(pkt)


def nak_frame(r, ctx, cfg):
    """The AETH NAK for ``nak`` record ``r`` (``qp``, ``psn``, ``syndrome``), with ``ctx``
    and ``cfg`` as for :func:`frame`: BTH PSN = ``r["psn"]``, AETH syndrome =
    ``r["syndrome"]``, AETH MSN = 0."""
    pkt = pk.ack_packet(ctx["remote_qp"], r["psn"], 0, syndrome=r["syndrome"],
                        **_net(cfg, ctx, 0))
    return pk.encode(pkt)


def probe_frame(r, ctx, cfg):
    """The EV probe answer for ``probe`` record ``r`` (``qp``, ``peer_id``, ``psn``,
    ``entropy``, ``timestamp``), with ``ctx`` and ``cfg`` as for :func:`frame`: an endpoint
    response to ENDPOINT_QP with BTH PSN = ``r["psn"]``, on the STEV ``r["entropy"]``, whose
    EETH has op EP_EV_PROBE, src_id = ``r["qp"]``, dst_id = ``r["peer_id"]`` and the
    timestamp echoed."""
    body = proto.EETH.pack(op=proto.EP_EV_PROBE, src_id=r["qp"], dst_id=r["peer_id"],
                           timestamp=r["timestamp"])
    return pk.encode(pk.endpoint_packet(proto.Opcode.EP_RESPONSE, body, psn=r["psn"],
                                        **_net(cfg, ctx, r["entropy"])))
