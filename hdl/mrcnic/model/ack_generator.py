"""Reference model of the ACK generator (``AckGenerator``): the control frame one descriptor
becomes, built with the packet model from the descriptor, the QP's context and the
registers."""

from . import packet as pk

__all__ = ["frame"]


def _s16(x):
    return x - 0x10000 if x & 0x8000 else x


def frame(d, ctx, cfg):
    """The frame for descriptor ``d`` (ACK_DESC fields), QP context ``ctx`` (``mac``, ``ip``,
    ``remote_qp``) and registers ``cfg`` (``mac``, ``ip``, ``dscp``, ``ecn``, ``hop_limit``,
    ``dport``, ``pkey``)."""
    net = dict(src_mac=cfg["mac"], dst_mac=ctx["mac"], src_ip=cfg["ip"], dst_ip=ctx["ip"],
               ev=d["entropy"], dscp=cfg["dscp"], ecn=cfg["ecn"],
               hop_limit=cfg["hop_limit"], udp_dport=cfg["dport"], pkey=cfg["pkey"])
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
