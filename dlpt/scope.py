"""What a command's views hold, decided once per command: library frames (`--include-library`)
and torch.compile's one-off work (`--include-compile`). A command builds one `Scope` from its
switches and applies it to the profile it opened; everything below takes the profile as given."""

from __future__ import annotations

from dataclasses import dataclass

from dlpt.compile_time import compile_apart
from dlpt.profile import Profile
from dlpt.transforms import hide_library_unless


@dataclass(frozen=True)
class Scope:
    include_library: bool = False  # False: library frames hidden (dlpt.transforms.hide_library)
    include_compile: bool = False  # False: compile subtrees dropped (flat views, hotspots, diff)

    def for_trees(self) -> Scope:
        """The scope a tree view uses: trees keep torch.compile's work in place, on its own lines."""
        return Scope(self.include_library, True)

    def apply(self, profile: Profile) -> Profile:
        # compile_apart first: it reads Dynamo's frames, which are library frames.
        return hide_library_unless(compile_apart(profile, self.include_compile), self.include_library)


__all__ = ["Scope"]
