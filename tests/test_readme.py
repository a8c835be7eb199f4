"""README.md's sample outputs are what dlpt prints on the files the repository ships: a change
that alters an output fails here until `python docs/readme_samples.py` rewrites the samples."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _samples_module():
    """docs/readme_samples.py, the script that writes the samples (docs/ is not a package)."""
    mod = sys.modules.get("readme_samples")
    if mod is None:
        spec = importlib.util.spec_from_file_location("readme_samples", ROOT / "docs" / "readme_samples.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["readme_samples"] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        # Each sample's command runs once per test session (a dlpt subprocess each): the check
        # and the rewrite below read the same shipped files with the same dlpt.
        run, ran = mod.run, {}

        def run_once(sample):
            key = (tuple(sample.command), sample.stderr, sample.start, sample.lines)
            if key not in ran:
                ran[key] = run(sample)
            return ran[key]

        mod.run = run_once
    return mod


def test_readme_samples_are_what_dlpt_prints(capsys) -> None:
    rs = _samples_module()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(rs.samples(text)) >= 5
    rc = rs.main(["--check"])
    drift = capsys.readouterr().out
    assert rc == 0, "README.md drifted from dlpt's output; run python docs/readme_samples.py\n" + drift


def test_samples_read_only_shipped_files() -> None:
    rs = _samples_module()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for spec in rs.samples(text):
        for word in shlex.split(spec.split(";")[0])[2:]:
            if "/" in word or word.endswith((".dlpt", ".gz", ".json")):
                assert not Path(word).is_absolute(), spec
                assert (ROOT / word).exists(), f"{word} (in the sample {spec!r}) is not in the repository"


def test_sample_outputs_name_no_developer_paths() -> None:
    # The blocks are what dlpt prints (the first test holds that), so reading them is enough.
    rs = _samples_module()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [m.group("body") for m in rs._SAMPLE.finditer(text)]
    assert blocks and all(blocks)
    for body in blocks:
        for marker in ("/work/", "/home/", "/root/", "/tmp/", "/Users/"):
            assert marker not in body, (marker, body)


def test_check_notices_a_changed_sample(tmp_path, monkeypatch) -> None:
    rs = _samples_module()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    spec = rs.samples(text)[0]
    opening = text.index("\n", text.index(f"<!-- sample: {spec} -->")) + 1
    body = text.index("\n", opening) + 1  # the line after the opening fence
    changed = text[:body] + "a line dlpt does not print\n" + text[body:]
    readme = tmp_path / "README.md"
    readme.write_text(changed, encoding="utf-8")
    monkeypatch.setattr(rs, "README", readme)
    assert rs.main(["--check"]) == 1
    assert rs.main([]) == 0 and readme.read_text(encoding="utf-8") == text
