"""The report's PC-sampling lines (`dlpt record --pc-samples`): what was sampled and at what
cost in detail, and what the hottest kernels' stalls say (dlpt.stalls holds the rules)."""

from __future__ import annotations

from dlpt.metrics import COL
from dlpt.profile import Profile
from dlpt.stalls import kernel_samples, limiter

TOP_KERNELS = 3  # kernels the report names with their limiter


def pc_lines(profile: Profile) -> list[str]:
    """`PC samples: 2,740,632, one per 2,048 cycles per SM sub-partition, 0 dropped; 97.3% on
    kernels' own source lines` and one line per hot kernel with what limits it. [] when the
    recording did not sample; the reason when sampling was asked for and could not run."""
    pc = profile.meta.pc_sampling
    if not isinstance(pc, dict):
        return []
    if pc.get("error") and not pc.get("samples"):
        return [f"PC samples: none ({pc['error']})"]
    n = int(pc.get("samples") or 0)
    period = pc.get("period_cycles")
    every = f", one per {int(period):,} cycles per SM sub-partition" if period else ""
    with_line = int(pc.get("with_line") or 0)
    lines = [f"PC samples: {n:,}{every}, {int(pc.get('dropped') or 0):,} dropped; "
             f"{100.0 * with_line / n if n else 0:.1f}% on kernels' own source lines (--metric pc_samples, stall_*)"]
    for name, row in kernel_samples(profile)[:TOP_KERNELS]:
        lim = limiter(row)
        if lim is None:
            continue
        group, share = lim
        short = name if len(name) <= 60 else name[:57] + "..."
        lines.append(f"  {short}: {int(row[COL['pc_samples']]):,} samples, {group.name} "
                     f"({100 * share:.0f}% of them): {group.advice}")
    return lines
