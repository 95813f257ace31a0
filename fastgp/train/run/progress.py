"""A live progress bar (rich, on stderr) with the latest losses and input-gradient norm stats."""

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def describe(record: dict[str, Any]) -> str:
    """Short text of a metrics record: losses, norm mean [min, max], non-finite, quality."""

    def num(name: str, spec: str) -> str:
        v = record.get(name)
        return "null" if v is None else format(v, spec)

    text = (
        f"D {num('critic_loss', '+.3f')}  W {num('wasserstein', '+.3f')}  "
        f"GP {num('penalty', '.3f')}  G {num('generator_loss', '+.3f')}"
    )
    if record.get("norm_mean") is not None:
        means = [v for v in record["norm_mean"] if v is not None]
        lows = [v for v in record["norm_min"] if v is not None]
        highs = [v for v in record["norm_max"] if v is not None]
        if means:
            text += f"  |g| {sum(means) / len(means):.2f} [{min(lows):.2f}, {max(highs):.2f}]"
    if sum(record.get("nonfinite", [])):
        text += f"  non-finite {sum(record['nonfinite'])}"
    if "modes" in record:
        text += (
            f"  modes {record['modes']}/{record['total_modes']} hq {record['high_quality']:.1f}%"
        )
    if "c2st_accuracy" in record:
        text += (
            f"  C2ST {record['c2st_accuracy']:.3f} (floor {record['c2st_floor']:.3f}, "
            f"sigma {record['c2st_sigma']:.3f}) FD {record['frechet_distance']:.2f} "
            f"classes {record['classes_covered']}/10"
        )
    return text


class RunProgress:
    """``with RunProgress(total, start, enabled) as bar: bar.update(step, record)``."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True):
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=Console(stderr=True),
            disable=not enabled,
            # What it shows changes once a chunk; rich's default of 10 redraws a second costs
            # a measurable share of a core that training could use.
            refresh_per_second=2,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self) -> "RunProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, step: int, record: dict[str, Any]) -> None:
        self._progress.update(self._task, completed=step, stats=describe(record))


__all__ = ["RunProgress", "describe"]
