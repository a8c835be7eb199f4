"""Who this process is among a job's ranks, and where its profile goes (`dlpt record` and
`dlpt.profile` under torchrun): read from the process group or the launcher's environment when a
recording is saved. The analysis of merged ranks is the model's (dlpt/ranks.py)."""

from __future__ import annotations

import os
import re
import socket
import sys
from typing import Any


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


def rank_info() -> dict[str, Any]:
    """{rank, world_size, local_rank, host} of this process, and torchrun's run_id where it gave
    one: from an initialised torch.distributed process group when there is one, else from the
    RANK / WORLD_SIZE / LOCAL_RANK that torchrun (and most launchers) set; a lone process is
    rank 0 of 1.

    torch is not imported here: if the program has not imported torch.distributed, no process
    group can exist."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        except Exception:  # noqa: BLE001 - a broken process group must not cost the profile
            pass
    local = _env_int("LOCAL_RANK")
    info: dict[str, Any] = {"rank": rank if rank is not None else 0, "world_size": world if world is not None else 1,
                            "local_rank": local if local is not None else (rank if rank is not None else 0),
                            "host": socket.gethostname()}
    # torchrun's run id, the same in every rank of one job (a uuid with --standalone, --rdzv-id
    # otherwise); "none" is its default when no id was given, and tells nothing.
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        info["run_id"] = run_id
    return info


_SUFFIX = re.compile(r"(\.dlpt)$", re.IGNORECASE)


def rank_output(out: str, rank: int, world: int) -> str:
    """Where rank `rank` of `world` writes when asked for `out`: `{rank}` in OUT is replaced by
    the number; otherwise, with several ranks, `run.dlpt` becomes `run.rank<R>.dlpt` (`run`
    becomes `run.rank<R>`), so no rank ever writes another's file. One rank: `out` as given."""
    if "{rank}" in out:
        return out.replace("{rank}", str(rank))
    if world <= 1:
        return out
    head, tail = os.path.split(out)
    if _SUFFIX.search(tail):
        tail = _SUFFIX.sub(f".rank{rank}\\1", tail)
    else:
        tail = f"{tail}.rank{rank}"
    return os.path.join(head, tail)


def default_output(name: str, info: dict[str, Any]) -> str:
    """`dlpt-<name>.<pid>.dlpt`; with several ranks `dlpt-<name>.<launcher pid>.rank<R>.dlpt`:
    the ranks of one node are children of one launcher (torchrun), so its pid groups a run's
    files together where each rank's own pid would scatter them."""
    world = int(info.get("world_size") or 1)
    pid = os.getppid() if world > 1 else os.getpid()
    return rank_output(f"dlpt-{name}.{pid}.dlpt", int(info.get("rank") or 0), world)
