"""dlpt in Jupyter: a notebook that loads the extension and records a cell with `%%dlpt`,
executed headlessly (nbclient, a real ipykernel): the cell's output is the HTML view, `_dlpt`
is the profile and its repr is one line."""

from __future__ import annotations

import html as html_mod
import json
import os

import pytest


def test_cell_magic_records_and_shows_the_view(tmp_path):
    # Imported here, not as the suite collects this file: nbformat's import builds its JSON
    # schema's grammars (seconds), which every worker would pay.
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat, nbclient and ipykernel (the test extra)")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient (the test extra)")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (the test extra)")
    pytest.importorskip("torch", reason="recording a cell needs torch")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext dlpt"),
        nbformat.v4.new_code_cell("%%dlpt\nimport torch, time\nx = torch.randn(64, 64)\nfor _ in range(3):\n"
                                  "    y = (x @ x).relu().sum()\n    time.sleep(0.05)"),
        nbformat.v4.new_code_cell("print(repr(_dlpt))\nprint(_dlpt.path)\nprint(_dlpt.meta['command'])\n"
                                  "print(any('(x @ x).relu()' in t for t in _dlpt.sources.values()))"),
        # Host time by where it sits, read from the tree as saved: the cell's lines (and what they
        # call), the kernel's threads, and frames of the kernel's machinery.
        nbformat.v4.new_code_cell(
            "import dlpt as _d\nfrom dlpt.metrics import COL as _C\n_p = _d.load(_dlpt.path)\n"
            "_h = _p.cct.inclusive[:, _C['host_time']]\n"
            "_cell = sum(int(_h[i]) for i in range(1, len(_p.cct)) if _p.cct.parent[i] == 0\n"
            "            and _p.frames[int(_p.cct.frame[i])].file.endswith('.py')\n"
            "            and 'ipykernel_' in _p.frames[int(_p.cct.frame[i])].file)\n"
            "_used = [_p.frames[int(x)] for x in set(_p.cct.frame.tolist())]\n"
            "_threads = sum(1 for f in _used if f.kind == 'thread')\n"
            "_kernel = sum(1 for f in _used if f.kind == 'python' and ('/ipykernel/' in f.file or '/IPython/' in f.file))\n"
            "print(int(_h[0]), _cell, _threads, _kernel)"),
    ]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[1].outputs
    html = [o["data"]["text/html"] for o in outputs if o.get("output_type") == "display_data" and "text/html" in o["data"]]
    assert len(html) == 1 and html[0].startswith('<iframe class="dlpt-view" srcdoc="')
    page = html_mod.unescape(html[0].split('srcdoc="', 1)[1].split('"', 1)[0])
    data = json.loads(page.split('id="dlpt-data">', 1)[1].split("</script>", 1)[0])
    ops = {f[1] for f in data["frames"].values() if f[0] == "op"}
    assert {"aten::mm", "aten::matmul"} & ops, ops  # the cell's matrix product is in the view
    assert any(f[0] == "python" and f[3] == 4 for f in data["frames"].values())  # under its line of the cell
    text = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    line, path, command, has_code = text.strip().splitlines()
    assert line.startswith("<dlpt.Profile ") and "_time " in line and len(line) < 200
    assert path.endswith(".dlpt")
    # Issue #34: the run is the cell (not `ipykernel_launcher.py -f …`), the cell's lines carry its
    # code (IPython keeps it in linecache only), and its temporary profile goes with the kernel.
    assert command == "%%dlpt cell [2]", command
    assert has_code == "True"
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path)), path
    # Issue #34: the cell's lines lead the profile, not the kernel's threads (asyncio loops, a
    # heartbeat, pipe readers) or the IPython frames that called into the cell; the 3 × 50 ms
    # sleeps alone are on the cell's lines. The callers' own time while the cell ran (IPython's
    # magic machinery, compiling the cell: 0.4-0.6 ms measured) goes to the root, not to any line.
    total, cell, threads, kernel = map(int, "".join(o.get("text", "") for o in nb.cells[3].outputs).split())
    assert threads == 0 and kernel == 0, (threads, kernel)
    assert 0.9 * total <= cell <= total and cell >= 150_000_000, (cell, total)
