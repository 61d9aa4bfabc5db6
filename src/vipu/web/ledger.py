"""The link ledger as the dashboard shows it: a link in one line (a cable's hover text), and a
link's kept history as charts of how much its counters grew, drawn on the server as SVG (no
script draws them, and no charting library is needed).

A chart plots running totals, not each point's own growth: the ledger keeps a reading only when
it changes something (or hourly), and its older history is hourly and daily summaries, so the
points are unevenly spaced and one point's growth would not compare with another's; the slope of
a total is the rate whatever the spacing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vipu.api.protos import admin_pb2
from vipu.model.linkhealth import growth
from vipu.model.times import utc_text

WIDTH, HEIGHT = 720, 150
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 12, 24  # room for the values left of the plot and the times under it
SERIES = (("corrected", "Corrected errors grown"), ("recoveries", "Recoveries grown"))


def described(name: str, link: admin_pb2.Link | None) -> str:
    """One end of a cable in a line of its hover text: the link's health and the ledger's reason
    (which says its trend: in how many of the last windows its counters grew), since when, and its
    last reading's counters; or that the ledger has not read it."""
    if link is None:
        return f"link ledger: {name} not read yet"
    line = f"link ledger: {link.name} {link.health}: {link.reason}, since {utc_text(link.changed_at)}"
    if link.HasField("last"):
        last = link.last
        line += (f"; last reading {last.corrected_errors} corrected errors, {last.recovery_events} recoveries, "
                 f"{'up' if last.up else 'down'}, at {utc_text(last.at)}")
    return line


def replaced(link: admin_pb2.Link) -> str:
    """The serial of the cable that the one in the link's port now replaced; "" for the first one seen there."""
    return next((c.replaced for c in link.cables if c.serial == link.cable.serial), "")


@dataclass(frozen=True)
class Point:
    """A moment of a link's kept history: how much its counters had grown by then since the first
    point shown, and whether the link was found down then (in a summary: at any of its readings)."""

    at: float
    corrected: int
    recoveries: int
    down: bool


def grown(link: admin_pb2.Link) -> list[Point]:
    """The link's kept history as running totals: each summary (oldest first) at its end, then
    each reading, which grew by the model's `growth()` from the reading before (a counter that went
    down was reset, and all it reads grew since). The first reading after the summaries counts
    from nothing: a summary does not carry the counters it ended at."""
    corrected = recoveries = 0
    points = []
    for summary in link.summaries:
        corrected, recoveries = corrected + summary.corrected_growth, recoveries + summary.recovery_growth
        points.append(Point(summary.end, corrected, recoveries, summary.down > 0))
    previous = None
    for sample in link.samples:
        counters = (sample.corrected_errors, sample.recovery_events)
        more_corrected, more_recoveries = growth(previous, counters)
        corrected, recoveries = corrected + more_corrected, recoveries + more_recoveries
        points.append(Point(sample.at, corrected, recoveries, not sample.up))
        previous = counters
    return points


@dataclass(frozen=True)
class Chart:
    """One counter's running total as an SVG line in a box of WIDTH by HEIGHT; empty when the
    ledger kept nothing in the span asked for."""

    title: str
    points: tuple[tuple[float, float], ...]  # (x, y) in the box, oldest first
    top: int  # the value at the top of the plot (at the bottom: 0)
    total: int  # how much the counter grew over the span
    down: tuple[float, ...]  # the x of each point that found the link down
    start: str  # the span's first and last times, under the plot
    end: str

    # The box, and the plot's edges in it, for the template (class attributes: the same for every chart).
    width, height, left, right, plot_top, bottom = WIDTH, HEIGHT, LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM

    @property
    def polyline(self) -> str:
        return " ".join(f"{x:g},{y:g}" for x, y in self.points)

    @property
    def caption(self) -> str:
        if not self.points:
            return "The ledger kept no readings of this link in this span: nothing to draw."
        return f"{self.total} in all from {self.start} to {self.end}, over {len(self.points)} points"


def charts(points: Sequence[Point]) -> list[Chart]:
    """A chart of each counter's running total (corrected errors, recoveries), on one time axis."""
    return [_chart(title, [getattr(p, counter) for p in points], points) for counter, title in SERIES]


def _chart(title: str, values: list[int], points: Sequence[Point]) -> Chart:
    if not points:
        return Chart(title, (), 1, 0, (), "", "")
    first, span = points[0].at, points[-1].at - points[0].at
    top = _axis_top(max(values))
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at: float) -> float:
        return round(LEFT + (at - first) / span * plot_width if span > 0 else LEFT, 1)

    placed = tuple((x(p.at), round(TOP + plot_height * (1 - value / top), 1)) for p, value in zip(points, values, strict=True))
    return Chart(title, placed, top, values[-1], tuple(x(p.at) for p in points if p.down), utc_text(first), utc_text(points[-1].at))


def _axis_top(value: int) -> int:
    """The least of 1, 2, 5, 10, 20, 50, ... at or above `value`: a round number to label the plot's top."""
    decade = 1
    while True:
        for step in (1, 2, 5):
            if decade * step >= value:
                return decade * step
        decade *= 10
