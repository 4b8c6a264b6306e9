"""The register layer: maps declared as data (:mod:`.regs`), their AXI4-Lite gateware
(:mod:`.gateware`), event counters in distributed RAM (:mod:`.counters`), the register
crossbar and directory (:mod:`.bus`) and Markdown tables (:mod:`.markdown`). The host's
driver is :mod:`mrcnic.host.driver`.

The names a block needs are importable from here."""

from mrcnic.base.csr.regs import (ACCESS, COUNTER_WIDTHS, RESP_OKAY, RESP_SLVERR, CsrError,
                                  Field, Register, RegisterMap, check_counter_width,
                                  ipv6_registers, mac_registers)
from mrcnic.base.csr.gateware import (COUNTER_STORAGE, AxiLiteSignature, CsrBlock,
                                      event_counters, ipv6_value)
from mrcnic.base.csr.counters import CounterBank

__all__ = [
    "ACCESS", "COUNTER_WIDTHS", "RESP_OKAY", "RESP_SLVERR", "CsrError", "Field", "Register",
    "RegisterMap", "check_counter_width", "ipv6_registers", "ipv6_value", "mac_registers",
    "AxiLiteSignature", "CsrBlock", "event_counters", "COUNTER_STORAGE", "CounterBank",
]
