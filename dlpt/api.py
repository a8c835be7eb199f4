"""The Python recording API:

    import dlpt
    with dlpt.profile("run.dlpt"):
        train_one_epoch()            # optimizer steps are counted for `steps=`
    for batch in loader:             # loops without an optimizer mark their steps
        infer(batch); dlpt.step()

torch is imported only when a recording starts.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlpt.collectors.record.recording import Recording
    from dlpt.profile import Profile


def parse_steps(steps: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """`"A:B"` (or `(A, B)`) → the steps to record, A..B-1; None records everything."""
    from dlpt.collectors.record.recording import parse_steps as parse

    return parse(steps)


class profile:  # noqa: N801 - reads like torch.profiler.profile on purpose
    """Record the code inside the `with` block; save to `path` (if given) when it ends.

    `name` is what the header calls the run (default: the process's command line).
    `steps="A:B"` records steps A..B-1 only, counting optimizer steps or `dlpt.step()` calls;
    with a `path`, the profile so far is also written there every few seconds while the block
    runs, so a crash keeps it. An existing file at `path` is an error before the block runs,
    as with `dlpt record`, unless `force=True`.
    After the block, `.result` is the `Profile` (also when the block raised).
    """

    def __init__(self, path: str | None = None, *, steps: str | tuple[int, int] | None = None,
                 force: bool = False, quiet: bool = False, name: str | None = None) -> None:
        self.path = path
        self.name = name  # what the profile's header calls the run (default: the command line)
        self.steps = parse_steps(steps)
        self.force = force
        self.quiet = quiet
        self.result: Profile | None = None
        self._rec: Recording | None = None

    def __enter__(self) -> profile:
        from dlpt.collectors.record.recording import Recording, output_path

        # Under torchrun every rank records: each writes its own file (run.rank1.dlpt).
        self.path = output_path(self.path)
        rec = Recording(self.path, command=self.name or " ".join(sys.argv), name=self.name or self.path or "dlpt.profile",
                        owns_process=False, steps=self.steps, force=self.force, quiet=self.quiet,
                        hint="pass force=True to overwrite it")
        rec.start()
        self._rec = rec
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        rec, self._rec = self._rec, None
        if rec is None:
            return
        rec.program_ended()
        try:
            rec.finish()
        finally:
            self.result = rec.result


def step() -> None:
    """Mark the end of a step (a training or inference iteration) for `--steps`.

    Once called, optimizer steps no longer count: the program's own marks decide. Outside a
    recording it does nothing, so it may stay in the code.
    """
    from dlpt.collectors.record.session import active

    rec = active()
    if rec is not None:
        rec.step(explicit=True)
