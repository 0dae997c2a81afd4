"""The compiled launcher: tkaot/_launch.c -> tkaot/_launch.abi3.so with the system C compiler.

    python -m build_tools.ext              # `make ext`: build it if the source is newer
    python -m build_tools.ext --optional   # skip with a note where there is no compiler or Python headers

The .so uses only the CPython Limited API of 3.11 (abi3: one file serves 3.11 and
later), links no Python library, no libcuda and no libtorch: the runtime hands it
cuLaunchKernel's address. Fixed flags, relative file names and no debug info make
a rebuild with the same compiler byte-identical. The runtime works without it
(the ABI launcher), so a machine without a compiler loses speed, not function.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tkaot" / "_launch.c"
TARGET = ROOT / "tkaot" / "_launch.abi3.so"
ABI3_SINCE = "cp311"  # the Py_LIMITED_API version in tkaot/_launch.c (tests/test_launcher.py holds them together)
CFLAGS = ("-O2", "-fPIC", "-shared", "-std=c11", "-Wall", "-Wextra")


class ExtError(RuntimeError):
    """The extension cannot be built here; the message says why."""


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc or gcc on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def python_include() -> Path:
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise ExtError(f"no Python.h in {include}: install this Python's development headers")
    if sys.version_info < (3, 11):
        raise ExtError(f"the abi3 launcher needs Python >= 3.11 headers to build, this is {sys.version.split()[0]}")
    return include


def build(out: Path = TARGET, source: Path = SOURCE) -> Path:
    """Compile `source` into `out` (atomically: compiled beside, then renamed)."""
    cc = compiler()
    if cc is None:
        raise ExtError("no C compiler (set CC, or install cc/gcc)")
    include = python_include()
    out = Path(out)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".ext-") as tmp:
        # compiled from inside a copy, under fixed names, so no path of this machine reaches the binary
        shutil.copy(source, Path(tmp) / "_launch.c")
        argv = [*cc.split(), *CFLAGS, f"-I{include}", "_launch.c", "-o", "_launch.so"]
        proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ExtError(f"{' '.join(argv)} failed:\n{proc.stderr.strip()}")
        os.replace(Path(tmp) / "_launch.so", out)
    return out


def stale(out: Path = TARGET) -> bool:
    return not out.exists() or out.stat().st_mtime < max(SOURCE.stat().st_mtime, Path(__file__).stat().st_mtime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optional", action="store_true", help="no compiler or headers: say so and exit 0")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    if not args.force and not stale():
        return
    try:
        path = build()
    except ExtError as exc:
        if args.optional and "failed:" not in str(exc):
            print(f"compiled launcher not built: {exc}; tkaot will use the ABI launcher")
            return
        raise SystemExit(f"error: {exc}") from None
    print(f"{path.relative_to(ROOT)}  {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
