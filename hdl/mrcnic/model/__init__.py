"""Bit-exact Python reference models, independent of the gateware."""
