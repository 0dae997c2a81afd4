"""Several variants through one nvcc front-end pass, each cubin still its own and the same bytes as alone.

Most of nvcc's time on a generated kernel (about 2 of 2.5 CPU-s) goes to preprocessing and parsing the TileLang
template headers every kernel includes; the kernel itself is a small part. Sources that share the text before their
kernel (helpers and includes: most kernels' are one of a few) are compiled to PTX together: one translation unit, each
kernel and its extern shared arrays renamed apart by a tag. The PTX is then cut back into each kernel's module as a
lone compile writes it (the tag removed, its labels numbered as the module's first function), and ptxas turns each
into its cubin. The cut takes only what it knows (kernel entries and their extern shared arrays); a module holding
anything else (a device function left out of line, a global, a string) returns None and the caller compiles those
variants one at a time.
"""

from __future__ import annotations

import re

KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(')
EXTERN_SHARED = re.compile(r"extern __shared__ [^;\[]*?(\w+)\[\]")
TAG = "_tkvb{}_"
_TAGS = re.compile(r"_tkvb(\d+)_")
_ENTRY = re.compile(r"\.visible \.entry (\w+)\(")


def preamble(source: str) -> str:
    """The text before the kernel: what variants must share to be compiled together."""
    match = KERNEL.search(source)
    if match is None:
        raise ValueError('no extern "C" __global__ kernel in the source')
    return source[: match.start()]


def batch_source(sources: list[str]) -> str:
    """One translation unit of the sources (one shared preamble): variant i's kernel and extern shared arrays tagged i."""
    head = preamble(sources[0])
    parts = [head]
    for i, source in enumerate(sources):
        if preamble(source) != head:
            raise ValueError("the sources differ before their kernels")
        body = source[len(head) :]
        for name in {KERNEL.search(body).group(1), *EXTERN_SHARED.findall(body)}:
            body = re.sub(rf"\b{name}\b", name + TAG.format(i), body)
        parts.append(body)
    return "".join(parts)


def split_ptx(ptx: str, count: int) -> list[str] | None:
    """The batch's PTX cut into each variant's, as a lone compile of it writes it; None if the module holds
    anything but tagged kernel entries and their tagged extern shared arrays."""
    if re.search(r"_Z\w*_tkvb\d+_", ptx):
        return None  # a tagged name inside a mangled one: its length prefix would change with the tag
    lines = ptx.split("\n")
    start = next((n for n, line in enumerate(lines) if line.startswith(".address_size")), None)
    if start is None:
        return None
    header = lines[: start + 2]  # through the blank line after .address_size
    shared: dict[int, list[str]] = {i: [] for i in range(count)}
    entries: dict[int, list[str]] = {}
    order: list[int] = []  # the variants' entries in module order: their label numbers
    n = start + 2
    while n < len(lines):
        line = lines[n]
        if not line.strip() or line.startswith("\t// .globl\t"):
            n += 1
            continue
        tags = {int(t) for t in _TAGS.findall(line)}
        if len(tags) != 1 or max(tags) >= count:
            return None
        i = tags.pop()
        if line.startswith(".extern .shared ") and i not in entries:
            shared[i].append(line)
            n += 1
            continue
        if not _ENTRY.match(line) or i in entries:
            return None
        end = lines.index("}", n)
        body = lines[n : end + 1]
        if any({int(t) for t in _TAGS.findall(b)} - {i} for b in body):
            return None
        entries[i] = body
        order.append(i)
        n = end + 1
    if sorted(entries) != list(range(count)):
        return None
    modules = []
    for i in range(count):
        tag, index = TAG.format(i), order.index(i)
        body = "\n".join(entries[i]).replace(tag, "")
        if index:
            body = body.replace(f"$L__BB{index}_", "$L__BB0_").replace(f"__local_depot{index}", "__local_depot0")
        name = _ENTRY.match(entries[i][0]).group(1).replace(tag, "")
        decls = "".join(line.replace(tag, "") + "\n" for line in shared[i])
        modules.append("\n".join(header) + f"\n\t// .globl\t{name}\n{decls}\n{body}\n\n")
    return modules
