"""`dlpt export -f html`, `dlpt diff -f html`, `dlpt record --html` and the notebook view: the page
holds what the text report says, stands alone, and works in a real browser (headless Chromium
from Debian's package, driven over the DevTools pipe: tests/browser.py)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from browser import Browser, chromium
from conftest import DATA, dlpt_in_process, synthetic_profile, trace_path

from dlpt.cct import CCT
from dlpt.frames import Frame
from dlpt.loader import open_profiles
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile, default_metric
from dlpt.scope import Scope
from dlpt.viewers.exporters import ExportOptions, get_exporter
from dlpt.viewers.exporters.html import page_data, render_page
from dlpt.viewers.format import short_kernel_name
from dlpt.viewers.report import ReportOptions, diagnosis_lines, flat_rows, header

PROFILES = {"gpu": DATA / "gpu_train_small.dlpt", "cpu": DATA / "cpu_train_small.dlpt",
            "kineto": trace_path("gpt_train")}
HOSTILE = ['<script>alert("x")</script>', "it's \"quoted\" & <b>bold</b>", "naïve_ü_日本語_🔥", "</script><img src=x>"]
NO_BROWSER = chromium() is None


def dlpt(*args: str) -> subprocess.CompletedProcess:
    # A reading command, in this process (conftest.dlpt_in_process): a process each was most of
    # this file's time; `python -m dlpt` itself, its exit codes and tracebacks are tested in processes
    # elsewhere (tests/test_cli.py, tests/test_bad_input.py).
    return dlpt_in_process(*args)


def data_of(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="dlpt-data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def top_rows(data: dict, by: str, metric: str, n: int = 5) -> list[str]:
    """The table's first rows as the page sorts them: by self, ties in group order."""
    tab = data["views"][0]["tables"][by]
    self_, total = tab["self"][metric], tab["total"][metric]
    order = sorted((i for i in range(len(self_)) if self_[i] > 0 or total[i] > 0), key=lambda i: (-self_[i], i))
    return [tab["rows"][i][0] for i in order[:n]]


def shown(prof: Profile) -> Profile:
    """What `dlpt report` and the page hold of a profile by default: library frames hidden and
    torch.compile's one-off work left out (dlpt.scope)."""
    return Scope().apply(prof)


def report_top(prof: Profile, by: str, metric: str, n: int = 5) -> list[str]:
    p = shown(prof)
    rows = flat_rows(p, ReportOptions(view="flat", by=by, metric=metric, top=n, min_percent=0))
    def name(r: dict) -> str:  # as render_flat names rows: kernels shortened, lines by their label
        if by == "kernel" and r["frame"].kind == "kernel":
            return short_kernel_name(r["frame"].name, 70)
        return r["frame"].label() if by == "line" else r["name"]

    return [name(r) for r in rows]


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("pages")
    paths = {}
    for name, src in PROFILES.items():
        paths[name] = out / f"{name}.html"
        r = dlpt("export", str(src), "-f", "html", "-o", str(paths[name]))
        assert r.returncode == 0, r.stderr
    return paths


@pytest.mark.parametrize("name", list(PROFILES))
def test_page_holds_the_report(pages, name):
    """Self-contained, with the report's headline and diagnosis, every metric the profile has,
    and the same top lines, functions and kernels as `dlpt report --view flat`."""
    page = pages[name].read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=", page), "the page loads something"
    data = data_of(page)
    prof = open_profiles([str(PROFILES[name])])
    metric = default_metric(prof)
    view = shown(prof)
    assert data["metric"] == metric and data["header"] == header(view, metric)
    assert data["diagnosis"] == [ln for ln in diagnosis_lines(view) if ln.strip()]
    tot = view.cct.exclusive.sum(axis=0)
    assert {m["name"] for m in data["metrics"]} == {m for m in METRICS if tot[COL[m]] > 0}
    for by in ("line", "function", "kernel", "op"):
        for m in [x["name"] for x in data["metrics"]][:4]:
            assert top_rows(data, by, m) == report_top(prof, by, m), (by, m)
    assert top_rows(data, "line", metric), "no line rows"


@pytest.mark.parametrize("name", list(PROFILES))
def test_flame_tree_keeps_inclusive_values(pages, name):
    """The flame graph's tree is the CCT: each drawn node's value is its inclusive value, and a
    node holds at least the sum of its drawn children."""
    data = data_of(pages[name].read_text(encoding="utf-8"))
    view = shown(open_profiles([str(PROFILES[name])]))
    tree = data["views"][0]["tree"]
    assert tree["folded"] == 0 and tree["nodes"] == len(view.cct)
    for m, vals in tree["values"].items():
        v = np.array(vals)
        assert v[0] == int(view.cct.exclusive[:, COL[m]].sum())
        kids = np.zeros(len(v), dtype=np.int64)
        par = np.array(tree["parent"])
        np.add.at(kids, par[1:], v[1:])
        assert (v >= kids).all(), m


def test_hostile_names_are_text():
    paths = [([Frame("python", f"{n} (m.py:{i + 1})", "m.py", i + 1, n), Frame("kernel", n)], 1000 * (i + 1))
             for i, n in enumerate(HOSTILE)]
    page = render_page(page_data(synthetic_profile(paths), "gpu_time"))
    assert page.count("<script") == 3  # the data, the libraries, the page's own
    block = page.split('id="dlpt-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in block  # escaped in the data, so no name can end the script element
    names = {f[1] for f in data_of(page)["frames"].values() if f[0] == "python"}
    assert names == {f"m.py:{i + 1} {n}" for i, n in enumerate(HOSTILE)}  # and read back whole, unicode included
    assert "alert(" not in page.split("<title>")[1].split("</title>")[0]


def test_diff_page(tmp_path):
    out = tmp_path / "diff.html"
    r = dlpt("diff", str(PROFILES["gpu"]), str(DATA / "gpu_nanogpt_b8.dlpt"), "-f", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    data = data_of(out.read_text(encoding="utf-8"))
    js = dlpt("diff", str(PROFILES["gpu"]), str(DATA / "gpu_nanogpt_b8.dlpt"), "-f", "json")
    assert data["diff"] == json.loads(js.stdout)
    assert any(r["delta"] > 0 for r in data["diff"]["rows"])


def synthetic_million(n: int = 1_000_000, seed: int = 1) -> Profile:
    """A random calling-context tree of n nodes in preorder over 3,000 source lines and 400
    kernels, GPU and host time on every node."""
    rng = np.random.default_rng(seed)
    frames = [Frame("root", "synthetic")]
    frames += [Frame("python", f"f{i} (m{i % 40}.py:{i})", f"m{i % 40}.py", i + 1, f"f{i}") for i in range(3000)]
    frames += [Frame("kernel", f"kernel_{i}<float>") for i in range(400)]
    parent = np.zeros(n, dtype=np.int64)
    parent[0] = -1
    steps = rng.integers(-3, 2, n)  # depth change from the previous node: down one, or up to three back
    stack = [0]
    for i in range(1, n):
        back = min(-int(steps[i]), len(stack) - 1) if steps[i] < 0 else 0
        if back:
            del stack[-back:]
        parent[i] = stack[-1]
        if steps[i] >= 0 or len(stack) < 2:
            stack.append(i)
    frame = np.concatenate([[0], rng.integers(1, len(frames), n - 1)])
    exc = np.zeros((n, len(METRICS)), dtype=np.int64)
    exc[:, COL["gpu_time"]] = rng.integers(0, 50_000, n)
    exc[:, COL["kernel_time"]] = exc[:, COL["gpu_time"]]
    exc[:, COL["cpu_time"]] = rng.integers(0, 20_000, n)
    return Profile(frames, CCT(parent, frame, exc), meta={"source": "record"})


@pytest.fixture(scope="module")
def million_page(tmp_path_factory) -> tuple[Path, dict]:
    prof = synthetic_million()
    out = tmp_path_factory.mktemp("million") / "million.html"
    t0 = time.monotonic()
    with open(out, "w", encoding="utf-8") as f:
        get_exporter("html").export(prof, f, ExportOptions())
    seconds = time.monotonic() - t0
    return out, {"export_s": seconds, "prof": prof}


def test_million_nodes_under_10_mb(million_page):
    path, info = million_page
    size = path.stat().st_size
    print(f"1M-node page: {size / 1e6:.2f} MB, written in {info['export_s']:.1f} s")
    assert size < 10e6
    data = data_of(path.read_text(encoding="utf-8"))
    tree = data["views"][0]["tree"]
    assert tree["nodes"] == 1_000_000 and tree["folded"] > 0 and tree["shown"] <= 40_000
    assert top_rows(data, "line", "gpu_time") == report_top(info["prof"], "line", "gpu_time")


# ---- in a real browser ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if NO_BROWSER:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the page is not tried in a browser")
    b = Browser(chromium())
    try:
        b.open_page()
        yield b
    finally:
        b.close()


def _open(b: Browser, path: Path) -> float:
    b.events.clear()
    b.navigate(path.as_uri())
    assert b.eval("document.body.dataset.ready") == "1"
    return b.eval("performance.getEntriesByType('navigation')[0].loadEventEnd") / 1000.0


@pytest.mark.parametrize("name", list(PROFILES))
def test_page_in_browser(browser, pages, name, tmp_path):
    b = browser
    seconds = _open(b, pages[name])
    print(f"{name}: {pages[name].stat().st_size / 1e6:.2f} MB, loaded in {seconds:.2f} s")
    assert seconds < 2.0
    assert b.errors() == []
    prof = open_profiles([str(PROFILES[name])])
    metric = default_metric(prof)
    top = report_top(prof, "line", metric)
    # The table's first row and a flame-graph frame are the report's top line.
    assert b.eval("document.querySelector('#table tbody tr td.name').textContent") == top[0]
    assert b.eval("Array.from(document.querySelectorAll('#table tbody tr td.name')).slice(0, 5)"
                  ".map(td => td.textContent)") == top
    time.sleep(0.6)  # the frames grow into place
    box = b.eval(f"""(() => {{ const g = Array.from(document.querySelectorAll('#flame g.frame'))
        .filter(g => g.getAttribute('name').startsWith({json.dumps(top[0])}))
        .sort((a, b) => b.getBoundingClientRect().width - a.getBoundingClientRect().width)[0];
      g.scrollIntoView({{block: 'center'}});
      const r = g.getBoundingClientRect(), s = document.querySelector('#flame svg').getBoundingClientRect();
      return [r.x + Math.min(r.width / 2, 5), r.y + r.height / 2, r.width, s.width]; }})()""")
    x, y, width, full = box
    assert 0 < width < full - 2
    b.click(x, y)
    time.sleep(0.6)
    widest = b.eval(f"""Math.max(...Array.from(document.querySelectorAll('#flame g.frame'))
        .filter(g => g.getAttribute('name').startsWith({json.dumps(top[0])}))
        .map(g => g.getBoundingClientRect().width))""")
    assert widest > full - 2, "a click on the frame zooms it to the whole width"
    # The click selected the line: the source pane shows its file there, or says it has no text.
    fr = flat_rows(shown(prof), ReportOptions(view="flat", metric=metric, top=1))[0]["frame"]
    assert b.eval("document.getElementById('source-name').textContent") == f"{fr.file}:{fr.line}"
    if fr.file in prof.sources:
        hot = b.eval("document.querySelector('#source .src.hot').textContent")
        assert hot.rstrip().endswith(prof.source_line(fr.file, fr.line))
    else:
        assert "no text" in b.eval("document.getElementById('source').textContent")
    # Search: the second line is found in the flame graph and the table.
    term = top[1].split(" ")[0]
    b.eval("document.getElementById('reset').click()")
    time.sleep(0.4)
    b.eval("document.getElementById('search').focus()")
    b.type_text(term)
    time.sleep(0.5)
    assert b.eval("document.querySelectorAll('#flame rect[fill=\"#e600e6\"]').length") > 0
    assert "match" in b.eval("document.getElementById('found').textContent")
    names = b.eval("Array.from(document.querySelectorAll('#table tbody tr td.name')).map(td => td.textContent)")
    assert names and all(term in n for n in names)
    b.screenshot(str(tmp_path / f"{name}.png"))
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    assert b.errors() == []


def test_hostile_names_in_browser(browser, tmp_path):
    paths = [([Frame("python", f"{n} (m.py:{i + 1})", "m.py", i + 1, n), Frame("kernel", n)], 1000 * (i + 1))
             for i, n in enumerate(HOSTILE)]
    out = tmp_path / "hostile.html"
    out.write_text(render_page(page_data(synthetic_profile(paths), "gpu_time")), encoding="utf-8")
    _open(browser, out)
    assert browser.errors() == []
    browser.eval("document.getElementById('by').value = 'kernel'; document.getElementById('by').onchange()")
    cells = browser.eval("Array.from(document.querySelectorAll('#table tbody td.name')).map(td => td.textContent)")
    assert sorted(cells) == sorted(short_kernel_name(n, 70) for n in HOSTILE)
    browser.eval("document.getElementById('by').value = 'function'; document.getElementById('by').onchange()")
    cells = browser.eval("Array.from(document.querySelectorAll('#table tbody td.name')).map(td => td.textContent)")
    assert sorted(cells) == sorted(f"{n} (m.py)" for n in HOSTILE)
    assert browser.eval("document.scripts.length") == 3 and browser.eval("document.images.length") == 0
    assert browser.eval("document.querySelectorAll('#table b').length") == 0


def test_million_nodes_open_under_2_s(browser, million_page, tmp_path):
    path, _ = million_page
    seconds = _open(browser, path)
    print(f"1M-node page loaded in {seconds:.2f} s")
    assert seconds < 2.0
    assert browser.errors() == []
    assert "pruned for drawing" in browser.eval("document.getElementById('flame-note').textContent")
    browser.screenshot(str(tmp_path / "million.png"))


def test_diff_page_in_browser(browser, tmp_path):
    out = tmp_path / "diff.html"
    r = dlpt("diff", str(PROFILES["gpu"]), str(DATA / "gpu_nanogpt_b8.dlpt"), "-f", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    _open(browser, out)
    assert browser.errors() == []
    up = browser.eval("document.querySelectorAll('#diff tbody tr.up').length")
    down = browser.eval("document.querySelectorAll('#diff tbody tr.down').length")
    rows = data_of(out.read_text(encoding="utf-8"))["diff"]["rows"]
    assert (up, down) == (sum(r["delta"] > 0 for r in rows), sum(r["delta"] < 0 for r in rows))


def test_names_wrap_between_words_and_the_diff_page_has_no_source_pane(browser, pages, tmp_path):
    """Issue #34: file names in the line column wrapped mid-word; the diff page showed a lone
    "Source" heading. In a narrow column, a name breaks only at a space or after a path's `/`
    (each character's line read from the layout); the diff page shows no source box."""
    b = browser
    _open(b, pages["gpu"])
    b.eval("document.getElementById('table-box').style.flex = 'none';"
           "document.getElementById('table-box').style.width = '420px'")
    breaks = b.eval("""(() => { const out = [];
      for (const td of Array.from(document.querySelectorAll('#table tbody td.name')).slice(0, 20)) {
        const text = td.textContent, r = document.createRange(); let prev = null, top = null;
        const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT); let node, k = 0;
        while ((node = walker.nextNode())) for (let i = 0; i < node.length; i++, k++) {
          r.setStart(node, i); r.setEnd(node, i + 1); const y = r.getBoundingClientRect().top;
          if (top !== null && y > top + 2 && prev !== ' ' && prev !== '/' && text[k] !== ' ')
            out.push(text.slice(Math.max(0, k - 12), k) + '|' + text.slice(k, k + 12));
          top = y; prev = text[k]; }
      } return out; })()""")
    wrapped = b.eval("Array.from(document.querySelectorAll('#table tbody td.name')).slice(0, 20)"
                     ".some(td => td.getBoundingClientRect().height > 24)")
    assert wrapped, "the narrow column makes some names wrap: the check above has lines to read"
    assert breaks == [], breaks
    out = tmp_path / "diff.html"
    r = dlpt("diff", str(PROFILES["gpu"]), str(DATA / "gpu_nanogpt_b8.dlpt"), "-f", "html", "-o", str(out))
    assert r.returncode == 0, r.stderr
    _open(b, out)
    assert b.eval("document.getElementById('source-box').getClientRects().length") == 0
    assert b.eval("document.getElementById('diff-box').getClientRects().length") > 0
    assert b.errors() == []


def test_stall_bars_beside_a_kernels_lines(browser, tmp_path):
    """A `--pc-samples` recording (H200, tests/data/gpu_pc_triton.dlpt): the kernel's memory-loop
    line selected in the table, the source pane draws its samples by reason as one bar, each
    part as wide as its share of the line's samples (the shares by hand from the flat view)."""
    from dlpt.metrics import COL, PC_PARTS
    from dlpt.views import flat

    src = Path(__file__).parent / "data" / "gpu_pc_triton.dlpt"
    mem_line = json.loads((Path(__file__).parent / "data" / "gpu_pc_triton.json").read_text())["mem_line"]
    page = tmp_path / "pc.html"
    r = dlpt("export", str(src), "-f", "html", "--metric", "pc_samples", "-o", str(page))
    assert r.returncode == 0, r.stderr
    prof = open_profiles([str(src)])
    fv = flat(shown(prof), "line")
    (g,) = [g for g, fr in enumerate(fv.frame) if fr.function == "mixed" and fr.line == mem_line]
    row = fv.inclusive[g]
    want = {m: 60 * int(row[COL[m]]) / int(row[COL["pc_samples"]]) for m in PC_PARTS if row[COL[m]]}
    b = browser
    _open(b, page)
    b.eval("""Array.from(document.querySelectorAll('#table tbody tr'))
        .find(tr => tr.querySelector('td.name').textContent.includes(':' + arguments_line + ' mixed')).click()"""
           .replace("arguments_line", json.dumps(str(mem_line))))
    time.sleep(0.3)
    got = b.eval("""Object.fromEntries(Array.from(document.querySelectorAll('#source .src.hot .stalls i'))
        .map(i => [i.dataset.part, i.getBoundingClientRect().width]))""")
    assert set(got) == set(want)
    assert all(abs(got[m] - want[m]) < 0.6 for m in want), (got, want)
    title = b.eval("document.querySelector('#source .src.hot .stalls').title")
    n = int(row[COL["pc_samples"]])
    share = f"{100 * int(row[COL['stall_long_scoreboard']]) / n:.0f}%"
    assert title.startswith(f"PC samples {n:,}: ") and f"stalled, global memory {share}" in title
    assert b.errors() == []
