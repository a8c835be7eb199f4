"""Run a program as `python PROGRAM ARGS...` would, collecting dlpt's compiled-code provenance,
and write it as JSON to $DLPT_PROVENANCE_OUT when the program ends.

For benchmarks on a recorder that does not collect provenance itself:
`dlpt record -o run.dlpt -- bench/with_provenance.py train.py ARGS`, then
`attribute_compiled(load("run.dlpt"), Provenance.from_dict(json))`. Without `dlpt record` in
front it measures what collecting provenance costs a compile.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from dlpt.collectors.record.provenance import Provenance


def main() -> None:
    out = os.environ.get("DLPT_PROVENANCE_OUT", "provenance.json")
    prov = Provenance()
    prov.start()
    target = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.realpath(target))
    try:
        runpy.run_path(target, run_name="__main__")
    finally:
        prov.stop()
        with open(out, "w") as fh:
            json.dump(prov.to_dict(), fh)


if __name__ == "__main__":
    main()
