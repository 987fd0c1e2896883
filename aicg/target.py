"""The target an instance is built for: its profile's, another hwdb entry, or the GPU present.

`doit build target=<entry>` builds a profile's instance (its preservation level, rules and
workload) for another entry of hwdb/; `target=auto` for this machine's GPU, whose entry is
found as `doit probe` finds it: by the device's name and compute capability, as the entry's
[identity] states them. The target is resolved once, here, and everything downstream reads
the hardware record of the entry.

An instance built for a target that is not its profile's is named `<target>-<profile file
stem>` (rulesets/profiles/default.toml for h100-sxm: build/h100-sxm-default), so that the
instances of several profiles for one GPU sit side by side; for its own target a profile's
instance keeps the profile's name, and the same keys.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

import tomli_w

from . import hw, suggest, tomlfile
from .errors import InputError
from .probe import record

AUTO = "auto"
SOURCE = "command line"   # where target= is given: the "file" of its errors


class Device(Protocol):
    """What resolution reads of a GPU (aicg.runtime.driver.DeviceInfo has it)."""
    name: str
    compute_capability: tuple[int, int]


class TargetError(InputError):
    """A target= that names no entry; the message ends with what would fix it."""

    def __init__(self, expected: str, found: str, hint: str = ""):
        super().__init__(SOURCE, "target", expected, found)
        if hint:
            self.args = (f"{self.args[0]}. {hint}",)


def present_device() -> Device | None:
    """This machine's first GPU, or None without a driver or device."""
    from .runtime import driver
    return driver.probe_device()


def known(hwdb_dir: Path) -> list[str]:
    """The entries of hwdb/, by the name profiles and target= use (the file stem)."""
    return sorted(p.stem for p in Path(hwdb_dir).glob("*.toml"))


def describe(device: Device) -> str:
    major, minor = device.compute_capability
    return f"{device.name} (sm_{major}{minor})"


def _identity(path: Path) -> tuple[str | None, tuple[int, ...]]:
    identity = tomlfile.read(path).data.get("identity", {})
    if not isinstance(identity, dict):
        return None, ()
    capability = identity.get("compute_capability", ())
    return identity.get("name"), tuple(capability) if isinstance(capability, list) else ()


def entry_of(hwdb_dir: Path, device: Device) -> str | None:
    """The entry whose identity is `device`, found as `doit probe` finds it; None where none is."""
    capability = tuple(device.compute_capability)
    path = record.entry_for(hwdb_dir, device.name, capability)
    # entry_for names the file a new entry would get where none matches: it may not exist, or be another GPU's
    return path.stem if path.exists() and _identity(path) == (device.name, capability) else None


def _no_entry(hwdb_dir: Path, device: Device) -> str:
    major, minor = device.compute_capability
    new = record.entry_for(hwdb_dir, device.name, (major, minor))
    if new.exists():   # the file name a probe would take is another GPU's entry
        return (f"This machine's GPU, {describe(device)}, has no entry in {hwdb_dir}/ (none has its name and "
                f"compute capability in [identity]; {new.name} is another GPU's): give it an entry of its own, "
                f"with [identity] name = \"{device.name}\" and compute_capability = [{major}, {minor}], its "
                f"datasheet facts (aicg/hw.py REQUIRED_FACTS, each with its source), then `doit probe` on it")
    return (f"This machine's GPU, {describe(device)}, has no entry in {hwdb_dir}/ (none has its name and "
            f"compute capability in [identity]): `doit probe` on it creates {hwdb_dir}/{new.name}, with the facts "
            f"its CUDA driver reports (the peak rates where aicg/probe/architectures.toml knows its compute "
            f"capability) and what the probes measure")


def resolve(requested: str, hwdb_dir: Path, device: Device | None) -> str:
    """The entry `target=requested` names: `requested` itself where hwdb/ has it, or for "auto" the
    entry of `device` (None: no GPU here). A TargetError says what was looked for otherwise."""
    entries = known(hwdb_dir)
    listed = ", ".join(entries)
    if requested == AUTO:
        if device is None:
            raise TargetError(f"auto only on a machine with a CUDA GPU (the CUDA driver, asked for device 0, "
                              f"reports none here), or an entry of {hwdb_dir}/ (one of: {listed})", requested)
        entry = entry_of(hwdb_dir, device)
        if entry is None:
            raise TargetError(f"auto only for a GPU that {hwdb_dir}/ has an entry for (one of: {listed})",
                              requested, _no_entry(hwdb_dir, device))
        return entry
    if requested not in entries:
        raise TargetError(f"auto or an entry of {hwdb_dir}/ (one of: {listed})", requested,
                          suggest.did_you_mean(requested, entries))
    return requested


def gpu_target(hwdb_dir: Path, device: Device | None) -> tuple[hw.Hardware | None, str]:
    """(the hardware record of `device`'s entry, "") or (None, why there is none): what GPU tests
    and benchmarks run for, and why they skip."""
    if device is None:
        return None, "no CUDA GPU on this machine"
    entry = entry_of(hwdb_dir, device)
    if entry is None:
        return None, _no_entry(hwdb_dir, device)
    try:
        return hw.load_target(hwdb_dir, entry), ""
    except InputError as err:
        return None, (f"the entry of this machine's GPU, {describe(device)}, cannot be built for: {err} (its "
                      f"datasheet facts, aicg/hw.py REQUIRED_FACTS, go above the measured section)")


def instance_name(profile_name: str, profile_target: str, profile_stem: str, target: str) -> str:
    """The instance a profile gives for `target`: its own name for its own target, else
    `<target>-<profile file stem>`."""
    return profile_name if target == profile_target else f"{target}-{profile_stem}"


def instance_of(profile_path: Path, target: str | None) -> str:
    """The name of the instance `doit build profile=<profile_path>` gives for `target` (an entry of
    hwdb/; None: the profile's own), read from the profile's [instance] table alone."""
    path = Path(profile_path)
    instance = tomlfile.read(path).data.get("instance")
    if not isinstance(instance, dict) or not isinstance(instance.get("target"), str):
        raise InputError(path, "instance", "a table with target (and name)", instance)
    name, own = instance.get("name", path.stem), instance["target"]
    return instance_name(name, own, path.stem, target or own)


def retarget(prof, target: str):
    """The profile `prof` (aicg.profile.Profile) with `target` in place of its own, named after it."""
    if target == prof.target:
        return prof
    name = instance_name(prof.name, prof.target, Path(prof.path).stem, target)
    return dataclasses.replace(prof, target=target, name=name)


def snapshot_profile(profile_path: Path, prof) -> bytes:
    """The profile as an instance carries it for its JIT (source/profile.toml): the file's bytes,
    or, built for another target, its settings with the instance's name and target."""
    doc = tomlfile.read(profile_path).data
    if doc["instance"]["target"] == prof.target:
        return Path(profile_path).read_bytes()
    doc["instance"] = {**doc["instance"], "name": prof.name, "target": prof.target}
    head = (f"# {Path(profile_path).name}, built for {prof.target} (doit build target=...): the profile's "
            f"settings, with the instance's name and target\n")
    return (head + tomli_w.dumps(doc)).encode()


def notes(hardware: hw.Hardware, has_realisation: bool, prior: str, hwdb_dir: Path,
          has_matrix_profile: bool | str | None = None) -> list[str]:
    """What the target's entry lacks for planning, what the build uses instead, and what would add it
    (has_matrix_profile: None where the profile has no matrix multiplies; the file's name where the
    matrix plan borrows another GPU's profile)."""
    found = []
    if not any(f.source == "measured" for f in hardware.facts.values()):
        found.append(f"{hwdb_dir}/{hardware.target}.toml has no measured section: plans read its datasheet facts "
                     f"and prior constants; `doit probe` on the GPU ({hardware.name}) measures bandwidths, latencies, "
                     f"clocks and launch overhead into it")
    if prior == "measured" and not has_realisation:
        found.append(f"{hardware.target} has no realisation profile ({hwdb_dir}/{hardware.target}.realisation.json): "
                     f"candidates are ranked by the structural cost model alone; `doit primitives` on the GPU "
                     f"({hardware.name}) times every realisation of the row primitives, and plans are then calibrated "
                     f"by those timings")
    measure = (f"`doit primitives family=matrix` on the GPU ({hardware.name}) times the ones the space tries, and "
               f"the matrix plan is then calibrated by those timings")
    if has_matrix_profile is False:
        found.append(f"{hardware.target} has no matrix profile ({hwdb_dir}/{hardware.target}.matrix.json): matrix "
                     f"realisations are ranked by the structural cost model alone; {measure}")
    elif isinstance(has_matrix_profile, str):
        found.append(f"{hardware.target} has no matrix profile of its own: the matrix plan is calibrated by "
                     f"{has_matrix_profile}, measured on a GPU of the same compute capability and SM count; {measure}")
    return found
