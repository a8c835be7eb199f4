"""Options shared by the subcommands (their output goes through `dlpt.output.write_output`)."""

from __future__ import annotations

import argparse

from dlpt.errors import notice
from dlpt.metrics import METRICS
from dlpt.phases import ALL, PHASE_CHOICES
from dlpt.profile import Profile, default_metric, unknown_device_events, unknown_device_text


def add_metric(p: argparse.ArgumentParser) -> None:
    # No short form: `-m` is `python -m MODULE` in `dlpt record`, and must not mean two things.
    p.add_argument("--metric", default=None, choices=METRICS, metavar="M",
                   help="what to rank and show: " + ", ".join(METRICS) + " (default: gpu_time, or for a "
                   "profile without GPU activity host_time, the host's wall-clock time on each line, "
                   "where recorded, else cpu_time, the host ops' self time)")


def choose_metric(metric: str | None, *profiles: Profile) -> str:
    """The metric asked for, else the model's default (`default_metric`), said on stderr when
    it is not gpu_time so that a user who expected GPU time knows why."""
    if metric:
        return metric
    chosen = default_metric(*profiles)
    # Device events of kinds dlpt does not read are the likely reason for "no GPU activity":
    # say so here, where the user learns that there is none.
    unknown = unknown_device_events(*profiles)
    none = (f"no GPU activity that dlpt reads in this profile ({unknown_device_text(unknown)})" if unknown
            else "no GPU activity in this profile")
    if chosen == "cpu_time":
        notice(f"{none}; showing host op time (--metric cpu_time)")
    elif chosen == "host_time":
        notice(f"{none}; showing the host's time on each line (--metric host_time)")
    return chosen


def add_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", nargs="+", metavar="PROFILE",
                   help="a .dlpt profile, a Kineto trace, or a directory of them; several (one per "
                   "rank) are merged, each rank's tree under a `rank N` node")
    add_rank(p)
    add_as_ranks(p)


def add_as_ranks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--as-ranks", action="store_true",
                   help="merge several inputs as ranks 0..N-1 in the order given, even where they do "
                   "not look like the ranks of one run (the same rank twice, different world sizes or "
                   "run ids, one process, or profiled seconds or more apart), which is refused otherwise")


def add_rank(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rank", type=positive_int, default=None, metavar="R",
                   help="of several ranks, look at rank R alone")


def add_library(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include-library", action="store_true",
                   help="show frames inside torch, the standard library and dlpt (hidden by default)")


def add_compile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include-compile", action="store_true",
                   help="rank torch.compile's one-off work (compiling, autotuning) with the rest "
                   "(left out of flat views, hotspots and diffs by default; trees always show it)")


def add_phase(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phase", default=ALL, choices=PHASE_CHOICES, metavar="P",
                   help="which part of the run to show: steady (the steps after start-up and compiling), "
                   "compile (torch.compile's compiling, autotuning and CUDA-graph capture), startup (before "
                   "the first step), or all (default: all). The diagnosis always reads the steady state")


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return v


def percent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 0 and 100")
    return v
