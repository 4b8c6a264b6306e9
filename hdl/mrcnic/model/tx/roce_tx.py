"""Reference model of :class:`mrcnic.tx.roce_tx.RoceTx`: the frame one descriptor gives.

Written on the packet model (:mod:`mrcnic.model.packet`), not on the gateware: the frame is
``write_packet`` (or, for a PROBE descriptor, ``probe_packet``) of the descriptor's fields
with the QP's context and the registers, and the causes for which the block marks it bad.

A probe: BTH A = 0 and rtx = 0 whatever the descriptor says, so the first-transmission
DSCP; PETH probe_id = ``msn``, src_id = ``qp``, dst_id = the remote QP number's low 16
bits, timestamp = ``timestamp``; no payload, and a ``length`` other than 0 is
``too_long``. A write with ``ts`` carries a TSETH after its METH (BTH ts = 1) with
``timestamp`` (tsr 0, format type 1); without, none.
A port status update (EP_REQUEST): the same, with ``port_status_packet`` (ports = ``imm``,
src_id = ``qp``, dst_id = the remote QP number's low 16 bits, timestamp = ``timestamp``).
"""

from mrcnic.base import proto
from mrcnic.base.records import MAX_PAYLOAD
from mrcnic.model import packet as pk

__all__ = ["RoceTxModel", "DEFAULT_REGS"]

DEFAULT_REGS = {
    "local_mac": 0, "local_ip": 0, "udp_dport": proto.UDP_DPORT_DEFAULT,
    "pkey": proto.PKEY_DEFAULT, "dscp_data": proto.DSCP_DATA, "dscp_rtx": proto.DSCP_RTX,
    "ecn": proto.ECN_ECT0, "hop_limit": 64,
}
_WRITES = {int(op) for op in proto.Opcode if op.is_write}


class RoceTxModel:
    """``frame(desc, payload)`` -> ``(bytes, causes)`` for a block with ``qps`` contexts."""

    def __init__(self, qps, regs=None):
        self.qps = qps
        self.regs = dict(DEFAULT_REGS, **(regs or {}))
        self.ctx = {}                       # qp -> (mac, ip, remote_qp); unwritten: zeros

    def write_ctx(self, qp, mac, ip, remote_qp):
        if qp < self.qps:
            self.ctx[qp] = (mac, ip, remote_qp)

    def frame(self, desc, payload):
        """The frame for ``desc`` (a dict of TX_DESC fields) whose payload is ``payload``
        (``length`` bytes, none for a probe; the block's own handling of a mismatched
        payload frame is tested directly)."""
        r = self.regs
        causes = set()
        qp = desc["qp"]
        if qp >= self.qps:
            causes.add("bad_qp")
        mac, ip, rqp = self.ctx.get(qp, (0, 0, 0)) if qp < self.qps else (0, 0, 0)
        op = desc["opcode"]
        net = dict(src_mac=r["local_mac"], dst_mac=mac, src_ip=r["local_ip"], dst_ip=ip,
                   ev=desc["entropy"], ecn=r["ecn"], hop_limit=r["hop_limit"],
                   udp_dport=r["udp_dport"], pkey=r["pkey"])
        if op in (proto.Opcode.PROBE, proto.Opcode.EP_REQUEST):
            if desc["length"] != 0:
                causes.add("too_long")
            assert not payload, "a probe or port status update takes no payload"
            if op == proto.Opcode.PROBE:
                pkt = pk.probe_packet(rqp, desc["msn"], src_id=qp, dst_id=rqp & 0xFFFF,
                                      timestamp=desc["timestamp"], psn=desc["psn"],
                                      dscp=r["dscp_data"], ack_req=0, rtx=0, **net)
            else:
                pkt = pk.port_status_packet(desc["imm"], src_id=qp, dst_id=rqp & 0xFFFF,
                                            timestamp=desc["timestamp"], psn=desc["psn"], dscp=r["dscp_data"], ack_req=0,
                                            rtx=0, **net)
            return pk.encode(pkt), causes
        if op not in _WRITES:
            causes.add("bad_opcode")
        if desc["length"] > MAX_PAYLOAD:
            causes.add("too_long")
        assert len(payload) == desc["length"]
        if op in _WRITES:
            has_imm = proto.Opcode(op).has_immdt
            pkt = pk.write_packet(
                op, rqp, desc["psn"], desc["va"], desc["rkey"], desc["dma_length"], payload,
                imm=desc["imm"] if has_imm else None, rqmsn=desc["rqmsn"], msn=desc["msn"],
                ts=desc["timestamp"] if desc.get("ts") else None,
                dscp=r["dscp_rtx"] if desc["rtx"] else r["dscp_data"],
                ack_req=desc["ack_req"], rtx=desc["rtx"], **net)
            return pk.encode(pkt), causes
        return None, causes
