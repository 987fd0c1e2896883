"""The head of a new hwdb entry, for a GPU hwdb/ has never seen: what `doit probe` writes above
the measured section when no entry has the GPU's identity, so that the entry builds at once.

Each fact hw.REQUIRED_FACTS asks for comes from the CUDA driver (source "driver"): read from its
device attributes, or, for the peak rates, computed from what it reports (SM count, maximum clock,
memory clock and bus width) and the compute capability's per-SM rates in architectures.toml. Its
`ref` says which attributes and which formula. A fact the driver leaves out (a zero clock) or the
architecture table does not know (a compute capability not listed) is left out, and the head's
comment names it: hw.load then refuses the entry naming the first, as for any entry.

An entry that exists is never rewritten here: people's datasheet facts, with their references,
stay as they are; only the measured section below them is `doit probe`'s."""
from __future__ import annotations

import json
from pathlib import Path

import tomli_w

from .. import hw, tomlfile
from . import attributes as attributes_probe

ARCHITECTURES = Path(__file__).with_name("architectures.toml")

# hwdb fact <- driver attribute (CUdevice_attribute without its prefix): what the attributes probe reads
FROM_ATTRIBUTE = {name: attribute for name, (attribute, _) in attributes_probe.FROM_ATTRIBUTE.items()}


def _attribute(name: str) -> str:
    return f"cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{name})"


def architecture(compute_capability: tuple[int, int], path: Path = ARCHITECTURES) -> dict | None:
    """The per-SM rates of `compute_capability`, or None where architectures.toml has none."""
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    major, minor = compute_capability
    table = doc.table("compute_capability").data.get(f"{major}.{minor}")
    if table is None:
        return None
    arch = tomlfile.Table(path, table, f"compute_capability.{major}.{minor}")
    found = {key: arch.get(key, int) for key in ("max_registers_per_thread", "fp32_lanes_per_sm",
                                                  "bf16_tensor_flop_per_clock_per_sm")}
    found["ref"] = arch.get("ref", str)
    arch.done()
    return found


def facts(attributes: dict[str, int], total_memory: int,
          compute_capability: tuple[int, int]) -> tuple[dict[str, dict], list[str]]:
    """({fact: {value, unit, source, ref}}, the required facts left out) for a GPU whose driver
    reports `attributes` (by CUdevice_attribute names without their prefix, as ProbeGPU.attributes
    holds them) and `total_memory` bytes."""
    found: dict[str, dict] = {}

    def put(name: str, value, ref: str) -> None:
        found[name] = {"value": value, "unit": hw.REQUIRED_FACTS[name], "source": "driver", "ref": ref}

    for name, attribute in FROM_ATTRIBUTE.items():
        if attributes.get(attribute, 0) > 0:
            put(name, int(attributes[attribute]), _attribute(attribute))
    if total_memory > 0:
        put("dram_capacity", int(total_memory), "cuDeviceTotalMem")
    memory_khz, bus_bits = attributes.get("MEMORY_CLOCK_RATE", 0), attributes.get("GLOBAL_MEMORY_BUS_WIDTH", 0)
    if memory_khz > 0 and bus_bits > 0:
        put("dram_bandwidth", 2.0 * memory_khz * 1e3 * bus_bits / 8,
            f"the interface's peak: 2 (double data rate) x {_attribute('MEMORY_CLOCK_RATE')} ({memory_khz} kHz) x "
            f"{_attribute('GLOBAL_MEMORY_BUS_WIDTH')} ({bus_bits} bits) / 8")
    clock_khz, sms = attributes.get("CLOCK_RATE", 0), attributes.get("MULTIPROCESSOR_COUNT", 0)
    if clock_khz > 0:
        put("boost_clock", clock_khz / 1e3, f"{_attribute('CLOCK_RATE')}: the driver's maximum SM clock")
    arch = architecture(compute_capability)
    if arch is not None:
        major, minor = compute_capability
        table = f"aicg/probe/architectures.toml, compute capability {major}.{minor}: {arch['ref']}"
        put("max_registers_per_thread", arch["max_registers_per_thread"],
            f"aicg/probe/architectures.toml, compute capability {major}.{minor} (the CUDA C++ Programming Guide's "
            "limit)")
        if clock_khz > 0 and sms > 0:
            clock = f"{sms} SMs x {{}} x {clock_khz / 1e3:g} MHz (the driver's maximum clock); {table}"
            put("fp32_flops", sms * arch["fp32_lanes_per_sm"] * 2.0 * clock_khz * 1e3,
                clock.format(f"{arch['fp32_lanes_per_sm']} FP32 lanes x 2 FLOP"))
            put("bf16_tensor_flops", sms * arch["bf16_tensor_flop_per_clock_per_sm"] * clock_khz * 1e3,
                clock.format(f"{arch['bf16_tensor_flop_per_clock_per_sm']} dense BF16 FLOP a clock"))
    missing = [name for name in hw.REQUIRED_FACTS if name not in found]
    return {name: found[name] for name in hw.REQUIRED_FACTS if name in found}, missing


def head(device_name: str, compute_capability: tuple[int, int], found: dict[str, dict], missing: list[str]) -> str:
    """The new entry's text above its measured section: identity and the driver's facts."""
    major, minor = compute_capability
    lines = [f"# {device_name}: created by `doit probe` from what the CUDA driver reports (source = \"driver\"; each",
             "# fact's ref says how). Replace any with the datasheet's (source = \"datasheet\", ref = where it says so)."]
    if missing:
        lines.append(f"# Not known here, to add before building for it: {', '.join(missing)} (units in aicg/hw.py "
                     "REQUIRED_FACTS).")
    identity = (f"schema = 1\n\n[identity]\nname = {json.dumps(device_name)}\narch = \"sm_{major}{minor}\"\n"
                f"compute_capability = [{major}, {minor}]\n\n")
    return "\n".join(lines) + "\n" + identity + tomli_w.dumps({"facts": found})

