"""Open MRC NIC datapath: gateware and bit-exact reference models."""

__version__ = "0.1.0"
