"""The exceptions tkaot raises. Each names what went wrong and how to fix it."""

from __future__ import annotations


class TkaotError(RuntimeError):
    """Base class of tkaot's own errors."""


class VariantNotBuilt(TkaotError, LookupError):
    """No artifact set holds a kernel for this op's static key."""

    def __init__(self, op: str, kernel: str, key: str, nearest: list[str], command: str, searched: list[str]):
        self.op, self.kernel, self.key, self.nearest, self.command, self.searched = op, kernel, key, nearest, command, searched
        near = "\n".join(f"    {k}" for k in nearest) or "    (none: no variant of this kernel is built)"
        where = ", ".join(searched) or "no artifact set was found"
        super().__init__(
            f"{op}: no prebuilt {kernel} kernel for {key}\n"
            f"  nearest built keys:\n{near}\n"
            f"  searched: {where}\n"
            f"  build it with:\n    {command}\n"
            f"  then put the output directory on TKAOT_PATH."
        )


class NoGPUError(TkaotError):
    """CUDA is not available to torch, or the driver library cannot be loaded."""


class UnsupportedArchError(TkaotError):
    """The device's architecture has no artifact set."""


class ArtifactError(TkaotError):
    """A manifest or cubin is missing, corrupt or of an incompatible version."""


class ManifestError(ArtifactError):
    """A manifest does not follow the schema (including grid expressions outside the grammar)."""


class CudaDriverError(TkaotError):
    """A CUDA driver call failed; carries the driver's error name and text."""

    def __init__(self, call: str, code: int, name: str, text: str):
        self.call, self.code, self.name, self.text = call, code, name, text
        super().__init__(f"{call} failed: {name} ({code}): {text}")


class GenericVariantWarning(UserWarning):
    """A call runs on its kernel's generic variant because the specialised one is not built (once per variant)."""
