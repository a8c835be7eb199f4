"""What a command's views hold, decided once per command: library frames (`--include-library`)
and torch.compile's one-off work (`--include-compile`). A command builds one `Scope` from its
switches and applies it to the profile it opened; everything below takes the profile as given."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dlpt.compile_time import compile_apart
from dlpt.findings import findings
from dlpt.header import Stragglers
from dlpt.phases import ALL, STEADY, has_phases, select_phase
from dlpt.profile import Profile
from dlpt.ranks import is_multi_rank, stragglers
from dlpt.transforms import def_lines_to_callers, library_mask


@dataclass(frozen=True)
class Scope:
    include_library: bool = False  # False: library frames hidden (dlpt.transforms.hide_library)
    include_compile: bool = False  # False: compile subtrees dropped (flat views, hotspots, diff)
    phase: str = ALL  # which phase the views show (dlpt/phases.py): all, steady, compile, start-up

    def for_trees(self) -> Scope:
        """The scope a tree view uses: trees keep torch.compile's work in place, on its own lines."""
        return replace(self, include_compile=True)

    def apply(self, profile: Profile) -> Profile:
        """The profile the views show. The diagnosis is judged first, on the profile as opened (it
        reads the steady state from the phase table, which the views' transformations leave
        behind), and kept in meta for them (`diagnosis`, dlpt.findings). So is the straggler
        verdict of several ranks, in each metric (`stragglers`: {"phase", "verdicts"},
        dlpt.ranks.stragglers): of the steady state, whatever phase the views show, since the
        start-up (DDP's rendezvous, one rank building the model or loading a checkpoint) would
        name a rank that is slow only there."""
        found = [f.to_json() for f in findings(profile)]
        verdicts: Stragglers | None = None
        shown = select_phase(profile, self.phase)
        prof = self._views(shown)
        if is_multi_rank(profile):
            phased = has_phases(profile)
            judged = select_phase(profile, STEADY) if phased else profile
            # The steady state's views are the shown ones where both are the same profile (no
            # phases, or --phase steady): transformed once.
            steady = prof if judged is shown else self._views(judged)
            verdicts = {"phase": STEADY if phased else ALL, "verdicts": stragglers(steady)}
        meta = replace(prof.meta, diagnosis=found, stragglers=verdicts or prof.meta.stragglers)
        return replace(prof, meta=meta)

    def _views(self, prof: Profile) -> Profile:
        # compile_apart first: it reads Dynamo's frames, which are library frames. One collapse
        # hides library frames and moves a frame standing on its `def` line onto its caller's.
        prof = compile_apart(prof, self.include_compile)
        return def_lines_to_callers(prof, None if self.include_library else library_mask(prof))


__all__ = ["Scope"]
