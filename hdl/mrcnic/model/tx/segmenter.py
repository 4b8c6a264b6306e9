"""Reference model of :class:`mrcnic.tx.segmenter.TxSegmenter`: work requests, retransmit
requests and releases in, packets and send completions out, one operation at a time.

It keeps per QP the next PSN, the message counters and the list of messages in flight,
with no ring arithmetic beyond what the tag must carry.
"""

from mrcnic.base import proto
from mrcnic.base.proto import Opcode, psn_add, psn_diff

__all__ = ["SegmenterModel"]


def _opcode(first, last, with_imm):
    if first and last:
        return Opcode.WRITE_ONLY_IMM if with_imm else Opcode.WRITE_ONLY
    if first:
        return Opcode.WRITE_FIRST
    if last:
        return Opcode.WRITE_LAST_IMM if with_imm else Opcode.WRITE_LAST
    return Opcode.WRITE_MIDDLE


class _Qp:
    def __init__(self, psn):
        self.psn, self.rqmsn, self.msn = psn, 0, 0
        self.pos = 0                 # ring position of the next message (mod 512)
        self.flight = []             # (position, message dict), oldest first


class SegmenterModel:
    def __init__(self, qps, msgs, pmtu_log2=12):
        self.qps, self.msgs = qps, msgs
        self.slot_bits = msgs.bit_length() - 1
        self.pmtu = 1 << pmtu_log2
        self.q = {n: _Qp(0) for n in range(qps)}
        self.counters = dict.fromkeys(["wrs", "packets", "retransmissions", "rtx_bad", "done",
                                       "release_bad", "wr_bad"], 0)

    def open(self, qp, psn):
        if qp < self.qps:
            self.q[qp] = _Qp(psn)

    def full(self, qp):
        return qp < self.qps and len(self.q[qp].flight) == self.msgs

    def _npk(self, length):
        return max(1, -(-length // self.pmtu))

    def _tag(self, pos):
        sb = self.slot_bits
        return (pos & (self.msgs - 1)) | (pos >> sb) << 8

    def _packet(self, qp, msg, k, rtx, tag, avoid):
        n = self._npk(msg["length"])
        off = k * self.pmtu
        last = k == n - 1
        return {"qp": qp, "psn": psn_add(msg["psn"], k),
                "opcode": int(_opcode(k == 0, last, msg["with_imm"])), "ack_req": int(last),
                "rtx": rtx, "va": (msg["va"] + off) & ((1 << 64) - 1), "rkey": msg["rkey"],
                "dma_length": msg["length"],
                "length": msg["length"] - off if last else self.pmtu,
                "imm": msg["imm"], "rqmsn": msg["rqmsn"], "msn": msg["msn"], "tag": tag,
                "wr_id": msg["wr_id"], "offset": off, "avoid": avoid}

    def wr(self, w):
        """Packets of work request ``w`` (the caller waits while :meth:`full`)."""
        qp = w["qp"]
        if qp >= self.qps:
            self.counters["wr_bad"] += 1
            return []
        s = self.q[qp]
        assert len(s.flight) < self.msgs
        msg = {**w, "psn": s.psn, "rqmsn": s.rqmsn, "msn": s.msn}
        tag = self._tag(s.pos)
        s.flight.append((s.pos, msg))
        n = self._npk(w["length"])
        pkts = [self._packet(qp, msg, k, 0, tag, 0) for k in range(n)]
        s.psn = psn_add(s.psn, n)
        s.msn = (s.msn + 1) & 0xFFFF
        s.rqmsn = (s.rqmsn + w["with_imm"]) & 0xFFFF
        s.pos = (s.pos + 1) & 0x1FF
        self.counters["wrs"] += 1
        self.counters["packets"] += n
        return pkts

    def rtx(self, r):
        """The packet rebuilt for retransmit request ``r``, or None (counted rtx_bad)."""
        qp = r["qp"]
        if qp < self.qps:
            sb = self.slot_bits
            pos = (r["tag"] & (self.msgs - 1)) | ((r["tag"] >> 8) & ((1 << (9 - sb)) - 1)) << sb
            for p, msg in self.q[qp].flight:
                if p == pos:
                    k = psn_diff(r["psn"], msg["psn"])
                    if k < self._npk(msg["length"]):
                        self.counters["retransmissions"] += 1
                        return self._packet(qp, msg, k, 1, r["tag"], r["ev"])
        self.counters["rtx_bad"] += 1
        return None

    def release(self, rel):
        """Send completions of the messages acknowledged up to ``rel['last']``."""
        qp = rel["qp"]
        if qp >= self.qps:
            self.counters["release_bad"] += 1
            return []
        s = self.q[qp]
        done = []
        while s.flight:
            _, msg = s.flight[0]
            last = psn_add(msg["psn"], self._npk(msg["length"]) - 1)
            if psn_diff(rel["last"], last) >= 1 << (proto.PSN_BITS - 1):
                break
            s.flight.pop(0)
            done.append({"qp": qp, "wr_id": msg["wr_id"]})
        self.counters["done"] += len(done)
        return done
