"""scapy for MRC frames: scapy's RoCEv2 dissector binds its BTH to UDP port 4791 only; MRC
frames go to :data:`mrcnic.base.proto.UDP_DPORT_DEFAULT` (4971). Importing this module binds
the BTH there too, so ``Ether(frame)[BTH]`` parses an MRC frame."""

from scapy.contrib.roce import BTH
from scapy.layers.inet import UDP
from scapy.packet import bind_layers

from mrcnic.base import proto

__all__ = ["BTH"]

bind_layers(UDP, BTH, dport=proto.UDP_DPORT_DEFAULT)
