"""The catalogue of exportable blocks.

A block module registers a factory with :func:`register`; the CLI, the Verilog exporter, the
cocotb harness and the synthesis flow look blocks up here by name (``skid-buffer``,
``srv6-encap``, ...). Block modules are imported lazily from :data:`BLOCK_MODULES`, so this
module sits at the bottom of the package and imports nothing of it.
"""

import importlib
import re
from dataclasses import dataclass, field


__all__ = ["register", "blocks", "get", "parse_params", "module_name"]

# Modules that register blocks when imported; a new block module adds its name here.
BLOCK_MODULES = [
    "mrcnic.stream",
    "mrcnic.srv6",
    "mrcnic.srv6_decap",
    "mrcnic.ack_generator",
    "mrcnic.psn_tracker",
    "mrcnic.reorder_buffer",
    "mrcnic.path_selector",
    "mrcnic.retransmit_tracker",
    "mrcnic.roce_rx",
    "mrcnic.roce_tx",
    "mrcnic.tx_segmenter",
    "mrcnic.mrc_rx",
    "mrcnic.memory_protect",
    "mrcnic.mrc_tx",
    "mrcnic.mrc_nic",
]

_BLOCKS = {}


@dataclass(frozen=True)
class Block:
    name: str
    summary: str
    factory: object
    defaults: dict = field(default_factory=dict)

    def build(self, params):
        return self.factory(**{**self.defaults, **params})


def register(name, summary, *, defaults):
    """Decorator: register ``factory(**params) -> wiring.Component`` as block ``name``."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise ValueError(f"block name {name!r} must be lower-case words joined by '-'")

    def decorate(factory):
        if name in _BLOCKS and _BLOCKS[name].factory is not factory:
            raise ValueError(f"block {name!r} is registered twice")
        _BLOCKS[name] = Block(name, summary, factory, dict(defaults))
        return factory
    return decorate


def blocks():
    for mod in BLOCK_MODULES:
        importlib.import_module(mod)
    return dict(sorted(_BLOCKS.items()))


def get(name):
    all_blocks = blocks()
    if name not in all_blocks:
        raise ValueError(f"unknown block {name!r}; blocks: {', '.join(all_blocks)}")
    return all_blocks[name]


def _convert(name, text, default):
    try:
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes"):
                return True
            if text.lower() in ("0", "false", "no"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(text, 0)
        return type(default)(text)
    except ValueError:
        raise ValueError(f"parameter {name}={text!r}: expected "
                         f"{type(default).__name__} like {default!r}") from None


def parse_params(block_name, assignments=(), data_width=None):
    """Parameters of ``block_name`` from ``NAME=VALUE`` strings (and ``--data-width``)."""
    block = get(block_name)
    params = {}
    for text in assignments:
        if "=" not in text:
            raise ValueError(f"--param {text!r}: expected NAME=VALUE")
        key, value = text.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in block.defaults:
            raise ValueError(f"block {block_name!r} has no parameter {key!r}; "
                             f"parameters: {', '.join(block.defaults)}")
        params[key] = _convert(key, value.strip(), block.defaults[key])
    if data_width is not None:
        if "data_width" not in block.defaults:
            raise ValueError(f"block {block_name!r} has no data width")
        params["data_width"] = data_width
    return {**block.defaults, **params}


def module_name(block_name, params):
    """Verilog module name: the block name and every parameter, e.g.
    ``mrcnic_skid_buffer_data_width_64_user_width_1``."""
    parts = ["mrcnic", block_name.replace("-", "_")]
    for key in sorted(params):
        value = params[key]
        if isinstance(value, bool):
            value = int(value)
        parts.append(f"{key}_{value}")
    name = "_".join(str(p) for p in parts)
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name
