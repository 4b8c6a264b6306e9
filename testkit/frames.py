"""Random frames and encapsulation descriptors for the SRv6 inserter's and remover's tests."""

from mrcnic.base import proto
from mrcnic.base.proto import EvMode
from mrcnic.model import packet as pk

__all__ = ["MODES", "random_desc", "random_frame"]

MODES = list(EvMode)


def random_desc(rng, mode=None):
    """An ``ENCAP_DESC`` record as a dict: ``mode`` (random if None) and random fields."""
    return {"mode": int(mode if mode is not None else rng.choice(MODES)),
            "ev": rng.getrandbits(256), "entropy": rng.getrandbits(32),
            "outer_src": rng.getrandbits(128), "dscp": rng.getrandbits(6),
            "ecn": rng.getrandbits(2), "hop_limit": rng.getrandbits(8)}


def random_frame(rng, max_payload=300):
    """A RoCEv2 frame of a random opcode, not encapsulated."""
    op = rng.choice([o for o in proto.Opcode])
    return pk.encode(pk.rng_packet(rng, opcode=op, encap="none", max_payload=max_payload))
