"""Where the bytes of a .dlpt profile go: rows and payload per table, the largest source
snapshots, and the frame kinds of the tree's nodes.

    python bench/profile_size.py run.dlpt
"""

from __future__ import annotations

import collections
import os
import sqlite3
import sys


def main(path: str) -> None:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    print(f"{path}: {os.path.getsize(path):,} bytes")
    for t in ("frames", "nodes", "activity", "sources", "meta", "arrays"):
        n = con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        print(f"  {t:<10} {n:>10,} rows")
    print("  arrays:", [(nm, len(d)) for nm, d in con.execute("SELECT name, data FROM arrays")][:3])
    src = con.execute("SELECT file, length(text) FROM sources ORDER BY 2 DESC").fetchall()
    print(f"  sources: {len(src)} files, {sum(s for _, s in src):,} chars; largest:", src[:5])
    kinds = collections.Counter(k for (k,) in con.execute(
        "SELECT f.kind FROM nodes n JOIN frames f ON f.id = n.frame"))
    print("  node kinds:", dict(kinds))
    tops = collections.Counter(f.split("/site-packages/")[-1].split("/")[0] for (f,) in con.execute(
        "SELECT f.file FROM nodes n JOIN frames f ON f.id = n.frame WHERE f.file != ''"))
    print("  node files by package:", tops.most_common(12))


if __name__ == "__main__":
    main(sys.argv[1])
