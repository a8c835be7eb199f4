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
    from dlpt.collectors.torch_recorder import Recorder
    from dlpt.profile import Profile


def _parse_steps(steps: str | tuple[int, int] | None) -> tuple[int, int] | None:
    from dlpt.errors import DlptError

    if steps is None:
        return None
    if isinstance(steps, str):
        a, sep, b = steps.partition(":")
        try:
            lo, hi = int(a or 0), int(b)
        except ValueError:
            raise DlptError(f"steps {steps!r}: write A:B, for example 10:15 (steps 10 to 14)") from None
        if not sep:
            raise DlptError(f"steps {steps!r}: write A:B, for example 10:15 (steps 10 to 14)")
    else:
        lo, hi = int(steps[0]), int(steps[1])
    if lo < 0 or hi <= lo:
        raise DlptError(f"steps {lo}:{hi}: need 0 <= A < B")
    return lo, hi


class profile:  # noqa: N801 - reads like torch.profiler.profile on purpose
    """Record the code inside the `with` block; save to `path` (if given) when it ends.

    `steps="A:B"` records steps A..B-1 only, counting optimizer steps or `dlpt.step()` calls;
    `window` restarts the profiler every that many steps so memory stays bounded.
    After the block, `.result` is the `Profile` (also when the block raised).
    """

    def __init__(self, path: str | None = None, *, steps: str | tuple[int, int] | None = None,
                 window: int | None = 20, force: bool = True, quiet: bool = False) -> None:
        self.path = path
        self.steps = _parse_steps(steps)
        self.window = window
        self.force = force
        self.quiet = quiet
        self.result: Profile | None = None
        self._rec: Recorder | None = None

    def __enter__(self) -> profile:
        from dlpt.collectors.torch_recorder import Recorder

        if self.path is not None and not self.force:
            import os

            from dlpt.errors import DlptError

            if os.path.exists(self.path):
                raise DlptError(f"{self.path} exists; pass force=True to overwrite it")
        self._rec = Recorder(command=" ".join(sys.argv), name=self.path or "dlpt.profile",
                             steps=self.steps, window=self.window, quiet=self.quiet)
        self._rec.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        rec, self._rec = self._rec, None
        if rec is None:
            return
        self.result = rec.stop()
        if self.path is not None:
            from dlpt.store import save

            self.result.path = self.path
            save(self.result, self.path, force=True)


def step() -> None:
    """Mark the end of a step (a training or inference iteration) for `--steps` and windows.

    Once called, optimizer steps no longer count: the program's own marks decide. Outside a
    recording it does nothing, so it may stay in the code.
    """
    from dlpt.collectors.torch_recorder import active

    rec = active()
    if rec is not None:
        rec.step(explicit=True)
