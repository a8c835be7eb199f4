"""Regenerate the sample outputs in README.md from the files the repository ships.

Every sample is a fenced block right after a comment that names the command which prints it:

    <!-- sample: dlpt report tests/data/gpu_train_small.dlpt --view flat --top 5 -->
    ```
    ...what that command prints...
    ```

Options follow the command, separated by `;`:
  `stderr`            the block shows stderr before stdout (dlpt's notes go there)
  `from "TEXT"`       the block starts at the first line that contains TEXT
  `lines N`           the block holds N lines

    python docs/readme_samples.py            rewrite README.md's samples
    python docs/readme_samples.py --check    exit 1 and show the difference when they drifted

Commands run as `python -m dlpt ...` from the repository root, so the samples show what this
checkout prints; `tests/test_readme.py` runs the check.
"""

from __future__ import annotations

import difflib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

_SAMPLE = re.compile(r"(<!-- sample: (?P<spec>.*?) -->\n```[^\n]*\n)(?P<body>.*?)(```)", re.S)


@dataclass
class Sample:
    command: list[str]
    stderr: bool = False
    start: str | None = None
    lines: int | None = None


def parse(spec: str) -> Sample:
    """`dlpt report X --top 5; stderr; from "x.py:35"; lines 7` → a Sample."""
    parts = [p.strip() for p in spec.split(";")]
    argv = shlex.split(parts[0])
    if not argv or argv[0] != "dlpt":
        raise ValueError(f"a sample's command starts with dlpt: {spec!r}")
    s = Sample(argv[1:])
    for opt in parts[1:]:
        words = shlex.split(opt)
        if words == ["stderr"]:
            s.stderr = True
        elif len(words) == 2 and words[0] == "from":
            s.start = words[1]
        elif len(words) == 2 and words[0] == "lines":
            s.lines = int(words[1])
        else:
            raise ValueError(f"unknown sample option {opt!r} in {spec!r}")
    return s


def run(sample: Sample) -> str:
    """What the sample's command prints, cut as its options say."""
    r = subprocess.run([sys.executable, "-m", "dlpt", *sample.command], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"dlpt {shlex.join(sample.command)} failed ({r.returncode}): {r.stderr.strip()}")
    out = (r.stderr if sample.stderr else "") + r.stdout
    lines = out.splitlines()
    if sample.start is not None:
        at = next((i for i, ln in enumerate(lines) if sample.start in ln), None)
        if at is None:
            raise RuntimeError(f"dlpt {shlex.join(sample.command)} printed no line with {sample.start!r}")
        lines = lines[at:]
    if sample.lines is not None:
        lines = lines[: sample.lines]
    return "\n".join(ln.rstrip() for ln in lines) + "\n"


def regenerate(text: str) -> str:
    """README text with every sample block replaced by what its command prints now."""
    return _SAMPLE.sub(lambda m: m.group(1) + run(parse(m.group("spec"))) + m.group(4), text)


def samples(text: str) -> list[str]:
    return [m.group("spec") for m in _SAMPLE.finditer(text)]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    old = README.read_text(encoding="utf-8")
    new = regenerate(old)
    if check:
        if new == old:
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                   "README.md", "README.md (regenerated)"))
        print("README.md's samples differ from what dlpt prints: run python docs/readme_samples.py", file=sys.stderr)
        return 1
    if new != old:
        README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
