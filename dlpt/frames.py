"""Interned frames: the nodes of a call path, and which of them are library code."""

from __future__ import annotations

import re
import sys
from typing import NamedTuple

from dlpt.layout import is_own_file

# The kinds of the frames that device activities are leaves of (dlpt.metrics.ACTIVITY_KIND_INFO
# maps each activity kind onto one). The other kinds: `root` and `rank` head the tree;
# `thread`, `python`, `module`, `op`, `backward` and `unattributed` are the model's (docs/ARCHITECTURE.md).
ACTIVITY_KINDS = ("kernel", "memcpy", "memset")
# A compiled kernel's share on one of the source lines it was generated from is a node of this
# frame beneath that line (dlpt/compiled/fused.py makes them; viewers explain them).
FUSED_PREFIX = "[fused "



class Frame(NamedTuple):
    kind: str
    name: str
    file: str = ""
    line: int = 0
    function: str = ""

    @property
    def has_source(self) -> bool:
        return self.kind == "python" and bool(self.file) and self.line > 0

    def label(self) -> str:
        """How the frame reads in trees and tables: `file:line function` for source frames."""
        if self.kind == "python" and self.file:
            return f"{short_path(self.file)}:{self.line} {self.function}"
        return self.name


# The functions Dynamo makes to resume a frame after a graph break are named
# `torch_dynamo_resume_in_forward_at_46`; their code is the user's own `forward`, lines and all.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")


def source_frame(file: str, line: int, function: str) -> Frame:
    """The frame of one source line, the one form both a recording and compiled code's
    provenance give it, so their paths merge. A resume function after a graph break is named
    for the function it resumes (what the user wrote, and what the same line is under eager)."""
    m = _RESUME.match(function)
    if m:
        function = m.group(1)
    return Frame("python", f"{function} ({file}:{line})", file, line, function)


def fused_frame(kernel: str) -> Frame:
    return Frame("op", f"{FUSED_PREFIX}{kernel}]")


# The marker between a forward op's context and the backward work linked to it.
BACKWARD_FRAME = Frame("backward", "[backward]")


def unattributed_frame(reason: str) -> Frame:
    """Where work that cannot be placed goes, so that totals are conserved."""
    return Frame("unattributed", f"<unattributed: {reason}>")


class FrameTable:
    """Interns frames so that a path is a tuple of small integers."""

    def __init__(self, frames: list[Frame] | None = None) -> None:
        self.frames: list[Frame] = []
        self._index: dict[Frame, int] = {}
        for f in frames or ():
            self.intern(f)

    @classmethod
    def keeping_ids(cls, frames: list[Frame]) -> FrameTable:
        """A table that extends `frames` in place of interning them: every existing id stays (a
        profile's frame list may name one frame twice; the first id is the one looked up)."""
        t = cls()
        t.frames = list(frames)
        for i in range(len(t.frames) - 1, -1, -1):
            t._index[t.frames[i]] = i
        return t

    def intern(self, frame: Frame) -> int:
        i = self._index.get(frame)
        if i is None:
            i = self._index[frame] = len(self.frames)
            self.frames.append(frame)
        return i

    def __getitem__(self, i: int) -> Frame:
        return self.frames[i]

    def __len__(self) -> int:
        return len(self.frames)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PY_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")


def python_frame(text: str) -> Frame:
    """A frame from a trace's `python_function` name: `file(line): func`, `<built-in ...>`
    or `nn.Module: Name_0`."""
    if " at 0x" in text:
        # `<built-in method sum of Tensor object at 0x7f..>`: the address differs per object and
        # would split one call site into many nodes.
        text = _ADDRESS.sub("", text)
    if text.startswith("nn.Module: "):
        return Frame("module", text[len("nn.Module: "):])
    m = _PY_FRAME.match(text)
    if m:
        file, line, func = m.group(1), int(m.group(2)), m.group(3)
        return Frame("python", f"{func} ({file}:{line})", file, line, func)
    return Frame("python", text)


def short_path(path: str) -> str:
    """The last two components of a path: enough to tell files apart in a narrow column."""
    parts = path.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 else path


_STDLIB = frozenset(sys.stdlib_module_names)
# torch's own packages, and the packages torch runs on (imported by `import torch` or by
# torch.compile: symbolic shapes, graphs, templates, locks): their frames are the machinery
# beneath the user's line, as torch's are. Model code in other packages (transformers, timm,
# torchvision) stays source.
_LIBRARY_PACKAGES = frozenset({"torch", "torchgen", "triton", "functorch", "dlpt", "_pytest", "pluggy",
                               "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec",
                               "typing_extensions", "importlib_metadata", "pkg_resources", "setuptools",
                               "_distutils_hack", "packaging", "numpy"})
# dlpt's own runner frames in a profile recorded where dlpt lived elsewhere (another machine,
# another checkout): its package layout is recognisable wherever it was installed.
_DLPT_FILE = re.compile(r"/dlpt/(?:cli|api|__main__)\.py$|/dlpt/(?:commands|collectors|viewers)/[^/]+\.py$"
                        r"|/collectors/record/[^/]+\.py$")
_SITE = re.compile(r"/(?:site|dist)-packages/([^/]+)")
_STDLIB_DIR = re.compile(r"/lib/python3(?:\.\d+)?/")
def _top_module(rel: str) -> str:
    head = rel.split("/", 1)[0]
    return head[:-3] if head.endswith(".py") else head


def is_library_file(path: str) -> bool:
    """True for torch (and its generated Inductor code), the standard library and dlpt itself.

    Traces hold paths relative to their `sys.path` entry (`torch/nn/modules/module.py`,
    `threading.py`) while recordings hold absolute ones; both are recognised. Model code in other
    packages (torchvision, transformers, timm) stays source: that is where users look for lines.
    """
    if not path or path.startswith("<"):
        return True
    p = path.replace("\\", "/")
    if "/torchinductor_" in p or is_own_file(p) or _DLPT_FILE.search(p):
        return True
    m = _SITE.search(p)
    if m:
        return _top_module(m.group(1)) in _LIBRARY_PACKAGES
    if _STDLIB_DIR.search(p):
        return True
    if p.startswith("/"):
        return False
    mod = _top_module(p)
    return mod in _STDLIB or mod in _LIBRARY_PACKAGES


def is_library(frame: Frame) -> bool:
    """Library frames are hidden by default: python frames in library files and C builtins."""
    if frame.kind != "python":
        return False
    return not frame.file or is_library_file(frame.file)


def short_kernel_name(name: str, width: int = 60) -> str:
    """`void at::native::elementwise_kernel<128, 2, ...>(int, ...)` → `at::native::elementwise_kernel<128, 2, …>`.

    The parameter list and nested template arguments make names hundreds of characters long,
    while what people recognise is the qualified name and its first template arguments (for
    `cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nt_align1>` they are the whole story)."""
    s = name.strip().replace("(anonymous namespace)", "{anonymous}")
    if s.startswith("void "):
        s = s[5:]
    depth = 0
    out = []
    for ch in s:
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<")
            elif depth == 2:
                out.append("…")
        elif ch == ">":
            depth = max(depth - 1, 0)
            if depth == 0:
                out.append(">")
        elif depth == 0 and ch == "(":
            break  # the parameter list
        elif depth <= 1:
            out.append(ch)
    short = ("".join(out).strip() or s).replace("{anonymous}", "(anonymous)")
    if len(short) > width:
        short = short[: width - 1] + "…"
    return short
