"""What a cubin says of its own kernels: registers and stack frame of each entry, read from the
ELF's `.nv.info` section (the attributes the driver reads when it loads the module).

For where ptxas' verbose log says nothing of an entry: with the CUDA driver's compute cache on
(another library in the process started NVRTC before aicg could turn it off), an entry compiled
before, by any process on the machine, comes back from the cache and ptxas never reports it. The
cubin still holds what the driver needs. Spills live in the stack frame, so an entry with a frame
of zero bytes spills nothing; a frame of more cannot tell spills from a stack, and reads as a
stack frame.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")   # ELF64: name, type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")               # ELF64: name, info, other, section, value, size
_SYMTAB = 2
# .nv.info attributes (format byte 0x04: a 16-bit length, then (symbol index, value) as two u32)
_FORMAT_SIZED = 0x04
_REGISTER_COUNT = 0x2F
_FRAME_SIZE = 0x11


class NotACubin(ValueError):
    pass


def entry_resources(cubin: bytes) -> dict[str, dict]:
    """{function name: {"registers": n, "stack_bytes": frame}} for every function `.nv.info` lists
    a register count for (the entries and any device function kept apart)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise NotACubin("not a 64-bit ELF image")
    try:
        sections = _sections(cubin)
        symbols = _symbols(cubin, sections)
        info = next((s for s in sections if s.name == ".nv.info"), None)
        found: dict[str, dict] = {}
        for attribute, index, value in _sized_attributes(cubin, info.offset, info.size) if info else ():
            if attribute in (_REGISTER_COUNT, _FRAME_SIZE):
                entry = found.setdefault(symbols[index], {"stack_bytes": 0})
                entry["registers" if attribute == _REGISTER_COUNT else "stack_bytes"] = value
    except (struct.error, IndexError, StopIteration, ValueError) as err:
        raise NotACubin(f"a malformed cubin ({err!r})") from None
    return {name: r for name, r in found.items() if "registers" in r}


class _Section(NamedTuple):
    name: str
    kind: int
    offset: int
    size: int
    link: int


def _sections(cubin: bytes) -> list[_Section]:
    (offset,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [_SECTION_HEADER.unpack_from(cubin, offset + i * entry_size) for i in range(count)]
    names_offset = headers[names_index][4]
    return [_Section(_string(cubin, names_offset + name), kind, at, size, link)
            for name, kind, _, _, at, size, link, *_ in headers]


def _symbols(cubin: bytes, sections: list[_Section]) -> list[str]:
    """The symbol table's names, by symbol index."""
    table = next(s for s in sections if s.kind == _SYMTAB)
    strings = sections[table.link].offset
    return [_string(cubin, strings + _SYMBOL.unpack_from(cubin, table.offset + i * _SYMBOL.size)[0])
            for i in range(table.size // _SYMBOL.size)]


def _sized_attributes(cubin: bytes, offset: int, size: int):
    """(attribute, symbol index, value) of each 8-byte sized attribute of a `.nv.info` section."""
    at, end = offset, offset + size
    while at < end:
        form, attribute = cubin[at], cubin[at + 1]
        if form == _FORMAT_SIZED:
            (length,) = struct.unpack_from("<H", cubin, at + 2)
            if length == 8:
                yield (attribute, *struct.unpack_from("<II", cubin, at + 4))
            at += 4 + length
        else:
            at += 4     # the other formats: the attribute and a value of at most two bytes


def _string(cubin: bytes, at: int) -> str:
    return cubin[at:cubin.index(b"\0", at)].decode()
