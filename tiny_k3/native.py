"""The project's C kernels, built with the system C compiler and called through ctypes; and KDA's recurrence in C.

Four sources, all part of the opt-in compiled path (tiny_k3/compiled.py):
- `kda_native.c`: KDA's recurrence, which `kda_chunked_compiled` runs where no gradient is needed on the CPU
  (prefill, the TUI's steps, the benches). It equals `kda.kda_recurrent` to float rounding (tests/test_native.py);
  it has no backward, so a call whose inputs need gradients is refused here.
- `moe_native.c`: the latent MoE's expert products, forward and backward, the router's top-k selection and the
  backward of its chosen scores (wrapped by tiny_k3/moe_native.py).
- `norm_native.c`: RMSNorm, forward and backward, for training (wrapped in tiny_k3/norm.py).
- `conv_native.c`: KDA's short conv with its SiLU and q/k norms, forward and backward, for training (wrapped by
  tiny_k3/conv_native.py).

A build takes about a tenth of a second, once per machine: the library is kept under $TINY_K3_NATIVE_DIR (default
~/.cache/tiny_k3/native), named by a hash of the source, the compiler and the CPU, so a changed file or another
machine builds afresh. Where no C compiler is found or the build fails, `problem()` says why and the caller runs
eager (one line, never a crash).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCES = {name: Path(__file__).with_name(f"{name}_native.c") for name in ("kda", "moe", "norm", "conv")}
HEADER = Path(__file__).with_name("native_vec.h")   # included by every source: a change rebuilds them all
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu99")   # (gnu99: vector types;
#                                             no errno: sqrt is one instruction, no call into libm)
TYPES = {torch.float32: "float", torch.float64: "double"}   # one library per element type: its REAL


def build_dir() -> Path:
    """Where built libraries are kept: $TINY_K3_NATIVE_DIR, else $XDG_CACHE_HOME/tiny_k3/native (~/.cache/...)."""
    if os.environ.get("TINY_K3_NATIVE_DIR"):
        return Path(os.environ["TINY_K3_NATIVE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tiny_k3" / "native"


def c_compiler() -> str | None:
    """The C compiler to build with: $CC, else cc, gcc or clang, the first found on PATH; None when none is."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_name() -> str:
    """The CPU's model line (-march=native code may not run on another CPU sharing the same home folder)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line
    except OSError:
        pass
    return platform.processor()


_PROTOTYPE = re.compile(r"^void (\w+)\(([^)]*)\)", re.MULTILINE)   # an exported function: `void name(...)` at a line's start


def prototypes(source: str) -> dict[str, list[str]]:
    """The exported functions of a C source and their parameters' C types, in order: {name: ["long", "ptr",
    "REAL", ...]} ("ptr" for any pointer). Static helpers are not exported and not listed."""
    found = {}
    for name, params in _PROTOTYPE.findall(source):
        kinds = []
        for param in params.split(","):
            param = " ".join(param.split())
            kinds.append("ptr" if "*" in param else param.rsplit(" ", 1)[0].replace("const ", ""))
        found[name] = kinds
    return found


class Kernels:
    """A built library's exported functions, each with its argument types declared from its prototype in the source
    (ctypes would pass an undeclared argument as a C int: a pointer past the declared ones would lose its upper
    half) and its argument count checked before the call (ctypes lets extra arguments through)."""

    def __init__(self, lib: ctypes.CDLL, source: str, real):
        ctype = {"long": ctypes.c_long, "ptr": ctypes.c_void_p, "REAL": real}
        for name, kinds in prototypes(source).items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [ctype[kind] for kind in kinds], None
            setattr(self, name, functools.partial(_checked_call, fn, name, len(kinds)))
        self._lib = lib            # held: the functions live as long as the library stays loaded


def _checked_call(fn, name: str, count: int, *args) -> None:
    if len(args) != count:
        raise TypeError(f"the C function {name} takes {count} arguments, got {len(args)}.")
    fn(*args)


@functools.lru_cache(maxsize=None)
def _library(dtype: torch.dtype, name: str = "kda") -> Kernels | str:
    """The kernels of SOURCES[name] for `dtype`, built on first use; or a one-line reason why they cannot be had."""
    cc = c_compiler()
    if cc is None:
        return "no C compiler found ($CC, cc, gcc or clang)"
    source, real = SOURCES[name], TYPES[dtype]
    defines, text = (f"-DREAL={real}",), source.read_text()
    key = hashlib.sha256(b"\0".join(x.encode() for x in (text, HEADER.read_text(), cc, *FLAGS, *defines,
                                                           platform.machine(), _cpu_name()))).hexdigest()[:16]
    path = build_dir() / f"{source.stem}_{real}_{key}.so"
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:   # build aside, then move in at once
                built = Path(tmp) / path.name
                run = subprocess.run([cc, *FLAGS, *defines, str(source), "-o", str(built)],
                                     capture_output=True, text=True, timeout=120)
                if run.returncode != 0:
                    first = (run.stderr.strip().splitlines() or ["no message"])[0]
                    return f"{Path(cc).name} could not build {source.name}: {first}"[:300]
                os.replace(built, path)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"could not build {source.name} in {path.parent}: {exc}"[:300]
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return f"could not load {path}: {exc}"[:300]
    return Kernels(lib, text, ctypes.c_float if dtype == torch.float32 else ctypes.c_double)


def problem(dtype: torch.dtype = torch.float32, name: str = "kda") -> str | None:
    """Why the kernels of SOURCES[name] cannot run here for `dtype` (no compiler, a failed build), or None."""
    if dtype not in TYPES:
        return f"the C kernels take float32 or float64, not {dtype}"
    lib = _library(dtype, name)
    return lib if isinstance(lib, str) else None


def library(dtype: torch.dtype, name: str) -> Kernels:
    """The built kernels of SOURCES[name] for `dtype`; RuntimeError (the reason) where `problem` is not None."""
    reason = problem(dtype, name)
    if reason is not None:
        raise RuntimeError(reason)
    return _library(dtype, name)


def pointers(*tensors: torch.Tensor) -> list[int]:
    """The tensors' data addresses, for ctypes. The caller must hold every tensor until the C call returns."""
    return [t.data_ptr() for t in tensors]


def kda_recurrent_native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         S: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`kda_recurrent` by the C loop -> (o [B,T,H,V], final state [B,H,K,V]), both in S's dtype.

    q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H]; S [B,H,K,V] the initial state (not written); CPU tensors, and
    no gradient wanted (under torch.no_grad, or none of them requires one). They are brought to S's dtype (float32
    or float64) and made contiguous. Raises RuntimeError when `problem(S.dtype)` is not None.
    """
    tensors = (q, k, v, g, beta, S)
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if wants_grad or any(t.device.type != "cpu" for t in tensors):
        raise ValueError("kda_recurrent_native: takes CPU tensors and no gradient (it has no backward); "
                         "use kda_chunked where one is needed.")
    lib = library(S.dtype, "kda")
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v, beta = (t.to(S.dtype).contiguous() for t in (q, k, v, beta))
    alpha = g.to(S.dtype).exp()                   # e^g for every token at once: one vectorised pass, not K calls of exp
    state = S.to(copy=True, memory_format=torch.contiguous_format).reshape(B, H, K, V)
    o = q.new_empty(B, T, H, V)
    lib.kda_recurrent(B, T, H, K, V, *pointers(q, k, v, alpha, beta), scale, *pointers(state, o))
    return o, state
