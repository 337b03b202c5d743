"""The pre-launch estimate ``respawn submit`` and ``respawn run`` show before anything is uploaded.

One row per zone of the spec and model of its provisioning list, in the order the controller
tries them (each model in turn; under ``placement: capacity``, its zones ranked as
``controller.core.placement`` ranks them from the same advice): what the whole job costs per
hour there (nodes x accelerators: for Spot, Compute's capacity-history list price where advice
gave one, else respawn's price table, and ``policy.prices`` over both, each row saying which),
how obtainable capacity is now (``advice.capacity``), how much of the region's GPU quota is
left against what the job needs (``regions.get``), and the expected goodput placement weighed
the zone by (``placement.Worth``: at the zone's estimated Spot uptime, before the run has
measured its own save and boot). ``gather`` asks Google through the ports, every source on its own:
one that fails (an API turned off, no permission, no answer in time) leaves its cells "—"
with a note saying why, and never stops a submit. ``rows`` and ``render`` are pure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from controller.core import prices, quotas
from controller.render.amounts import counted
from controller.core.placement import region_of, shapes, worths, zone_order
from controller.core.ports import CapacityAdvisor, QuotaReader, ZoneAdvice
from controller.core.quotas import QuotaLeft, QuotaUse
from controller.core.spec import JobSpec

NONE = "—"
_TPU_QUOTA = "Cloud TPU quota is the TPU API's, not in Compute's regions.get"


@dataclass(frozen=True)
class Sources:
    """Where the estimate asks; None: not available (``why`` says so)."""

    advisor: CapacityAdvisor | None = None
    quotas: QuotaReader | None = None
    why: Mapping[str, str] = field(default_factory=dict)  # "advice" | "quotas" -> why it is None


@dataclass(frozen=True)
class Gathered:
    advice: dict[str, dict[str, ZoneAdvice]]  # model -> zone -> advice
    region_quotas: dict[str, dict[str, QuotaUse]]  # region -> metric -> use
    notes: list[str]  # why a column has "—"


@dataclass(frozen=True)
class Row:
    zone: str
    model: str
    per_hour: float | None  # the whole job, dollars
    price_from: str
    obtainability: float | None
    quota: QuotaLeft | None
    quota_note: str  # what the quota cell says when ``quota`` is None
    goodput: float | None = None  # expected goodput placement weighed (capacity placement with advice only)


def sources(build_advisor: Callable[[], CapacityAdvisor], build_quotas: Callable[[], QuotaReader]) -> Sources:
    """Both sources, each built on its own: one that cannot be built (no credentials) is None."""
    built: dict[str, Any] = {}
    why: dict[str, str] = {}
    for key, build in (("advice", build_advisor), ("quotas", build_quotas)):
        try:
            built[key] = build()
        except Exception as e:  # noqa: BLE001 - an estimate goes without it, never stops a submit
            why[key] = _reason(e)
    return Sources(built.get("advice"), built.get("quotas"), why)


ESTIMATE_WAIT = 15.0  # seconds the whole estimate may wait for Google: a submit is never held longer


def _asked(asks: list[tuple[str, Any]], wait: float) -> dict[str, Any]:
    """Each question on a thread of its own (a daemon: one that hangs never holds the process),
    answers (or the exception raised) by key, for those that answered within ``wait`` seconds."""
    answers: dict[str, Any] = {}
    lock = threading.Lock()

    def ask(key: str, call: Any) -> None:
        try:
            answer: Any = call()
        except Exception as e:  # noqa: BLE001 - handed back as this question's answer
            answer = e
        with lock:
            answers[key] = answer

    threads = [threading.Thread(target=ask, args=(key, call), daemon=True, name=f"respawn-estimate-{key}")
               for key, call in asks]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + wait
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        return dict(answers)


def gather(spec: JobSpec, project: str, found: Sources, wait: float = ESTIMATE_WAIT) -> Gathered:
    """Ask capacity advice (per model and region) and quotas (per region) at once, each
    question on its own thread and each failure its own note; what has not answered within
    ``wait`` seconds is a "—" too."""
    notes: list[str] = []
    advice: dict[str, dict[str, ZoneAdvice]] = {m: {} for m in spec.provisioning}
    region_quotas: dict[str, dict[str, QuotaUse]] = {}
    regions = list(dict.fromkeys(region_of(z) for z in spec.zones))
    asks: list[tuple[str, Any]] = []
    if spec.tpu is not None:
        notes.append("obtainability: capacity advice does not cover Cloud TPU" if spec.tpu.api == "tpu" else
                     "obtainability: capacity advice does not cover TPU machine types (Google: 'you can't view the "
                     "availability of TPUs')")
    elif found.advisor is None:
        notes.append(f"obtainability and Spot prices from Compute: capacity advice unavailable "
                     f"({found.why.get('advice', 'not configured')})")
    else:
        advisor = found.advisor
        asks += [(f"advice:{model}", (lambda s=s: advisor.advise(s)))
                 for model in spec.provisioning for s in shapes(spec, model, project)]
    gpus = spec.gpus_per_node
    if spec.tpu is not None:
        notes.append(f"quota: {_TPU_QUOTA}")
    elif gpus is None:
        notes.append("quota: no GPU in this machine type (CPU quotas are not shown)")
    elif found.quotas is None:
        notes.append(f"quota: Compute's regions.get unavailable ({found.why.get('quotas', 'not configured')})")
    else:
        reader = found.quotas
        asks += [(f"quotas:{r}", (lambda r=r: reader.region_quotas(project, r))) for r in regions]
    answers = _asked(asks, wait)
    failed: dict[str, str] = {}
    for key, _ in asks:
        kind, _, what = key.partition(":")
        answer = answers.get(key)
        if answer is None:
            failed.setdefault(f"{kind}:{what}", f"no answer within {wait:g} s")
            continue
        if isinstance(answer, BaseException):  # this source's cells say "—", the rest stand
            failed.setdefault(f"{kind}:{what}", _reason(answer))
            continue
        if kind == "advice":
            advice[what].update(answer)
        else:
            region_quotas[what] = answer
    for key, reason in failed.items():
        kind, _, what = key.partition(":")
        notes.append(f"obtainability ({what}): capacity advice failed: {reason}" if kind == "advice"
                     else f"quota ({what}): regions.get failed: {reason}")
    return Gathered(advice, region_quotas, notes)


def rows(spec: JobSpec, gathered: Gathered) -> list[Row]:
    """The table's rows: each model in turn, its zones in the order the controller tries them."""
    gpus = spec.gpus_per_node
    override = dict(spec.policy.prices) if spec.policy.prices else None
    out = []
    for model in spec.provisioning:
        advised = gathered.advice.get(model) or {}
        ranked = advised if spec.placement_for(model) == "capacity" else {}
        weighed = worths(spec, model, ranked) if ranked else {}
        for zone in zone_order(spec, model, ranked):
            region = region_of(zone)
            advice = advised.get(zone)
            rate = prices.rate(model=model, nodes=1 if spec.tpu else spec.nodes, gpus=gpus,
                               machine_type=spec.machine_type, tpu_type=spec.tpu.accelerator if spec.tpu else None,
                               override=override, spot_price=advice.spot_price_h if advice and model == "spot" else None)
            known = rate.source != prices.UNKNOWN
            quota, note = None, NONE
            if gpus is not None and spec.tpu is None and region in gathered.region_quotas:
                quota = quotas.left_for(gpus[0], model, spec.total_gpus, gathered.region_quotas[region])
                if quota is None:
                    note = f"{NONE} (no quota listed for {gpus[0]})"
            out.append(Row(zone, model, rate.per_hour if known else None, _source(rate.source, model),
                           advice.obtainability if advice else None, quota, note,
                           weighed[zone].goodput if zone in weighed else None))
    return out


def render(spec: JobSpec, job: str, table_rows: list[Row], notes: list[str]) -> Group:
    """The table, with a title saying what one row prices, and a note under it for each "—"."""
    gpus = spec.gpus_per_node
    if spec.tpu is not None:
        what = (f"1 TPU node {spec.tpu.type}" if spec.tpu.type else
                f"1 TPU slice of {counted(spec.tpu.hosts, 'host')} {spec.tpu.machine_type}") + \
            f" ({prices.tpu_chips(spec.tpu.accelerator)} chips)"
    else:
        what = f"{spec.nodes} × {spec.machine_type}" + (f", {gpus[1]} {gpus[0]} each" if gpus else "")
    needs = f" (needs {spec.total_gpus})" if gpus and spec.tpu is None else ""
    table = _Fitted(Text(f"estimate for {job}: {what}"), needs, table_rows)
    metrics = dict.fromkeys(f"{row.model} {row.quota.metric}" for row in table_rows if row.quota is not None)
    lines = [Text(f"quota: {', '.join(metrics)} (Compute regions.get: limit − usage)", style="dim")] if metrics else []
    lines += [Text(f"{NONE} {note}", style="dim") for note in dict.fromkeys(notes)]
    if any(row.per_hour is None for row in table_rows):
        lines.append(Text(f"{NONE} $/hour: no price for {spec.tpu.accelerator if spec.tpu else spec.machine_type} in "
                          "respawn's table; set policy.prices (dollars an hour, by model)", style="dim"))
    if any(row.goodput is None for row in table_rows):
        lines.append(Text(f"{NONE} est. goodput: weighed only under placement: capacity, from capacity advice "
                          "(otherwise the spec's order); for Spot, only where the advice gave an estimated uptime",
                          style="dim"))
    return Group(table, *lines)


def as_text(spec: JobSpec, job: str, table_rows: list[Row], notes: list[str], width: int = 120) -> str:
    """``render`` as plain text (what a test or a log reads)."""
    console = Console(width=width, record=True, file=_Null(), color_system=None)
    console.print(render(spec, job, table_rows, notes))
    return console.export_text()


class _Fitted:
    """The table, drawn with its full box where it fits and, in a narrower terminal (80 columns),
    with no lines between the columns and the zone kept whole: the zone is what the user confirms
    (issue 39: every row read ``us-central…``); the other cells wrap under their header."""

    def __init__(self, title: Text, needs: str, table_rows: list[Row]) -> None:
        self.title, self.needs, self.rows = title, needs, table_rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table(box.HEAVY_HEAD)
        if Measurement.get(console, options.update_width(10_000), table).maximum > options.max_width:
            table = self.table(box.SIMPLE_HEAD, options.max_width)
        yield table

    def table(self, lines: box.Box, room: int | None = None) -> Table:
        """The full box, or (``room``: the width there is) one space between columns, each column
        as wide as its longest word and then, the narrowest needs first, as its longest line."""
        table = Table(title=self.title, title_justify="left", box=lines, show_edge=room is None,
                      padding=(0, 1) if room is None else 0)
        cells = [self.cells(row) for row in self.rows]
        headers = ("zone", "model", "$/hour (job)", "price from", "obtainable now", f"GPU quota left{self.needs}",
                   "est. goodput")
        texts = [[header, *(c[i].plain for c in cells)] for i, header in enumerate(headers)]
        least = [max(len(w) for t in column for w in (t.split() if i > 1 else [t])) for i, column in enumerate(texts)]
        most = [max(len(t) for t in column) for column in texts]
        widths = list(least)
        if room is not None:
            spare = room - sum(least) - (len(headers) - 1)
            for i in sorted(range(len(headers)), key=lambda i: most[i] - least[i]):
                grown = min(most[i] - least[i], max(0, spare))
                widths[i], spare = widths[i] + grown, spare - grown
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i in (0, 1, 3, 5) else "right", no_wrap=i < 2,
                             min_width=least[i], width=widths[i] if room is not None else None)
        for row in cells:
            table.add_row(*row)
        return table

    @staticmethod
    def cells(row: Row) -> tuple[Text, ...]:
        return (Text(row.zone), Text(row.model), Text(NONE if row.per_hour is None else f"${row.per_hour:,.2f}"),
                Text(row.price_from, style="dim"),
                Text(NONE if row.obtainability is None else f"{row.obtainability:.2f}",
                     style="red" if row.obtainability == 0 else ""),
                _quota_cell(row), Text(NONE if row.goodput is None else f"{row.goodput:.0%}"))


def _quota_cell(row: Row) -> Text:
    if row.quota is None:
        return Text(row.quota_note)
    q = row.quota
    text = f"{q.left:g} of {q.limit:g}"
    return Text(text + ("" if q.enough else " short"), style="" if q.enough else "red")


def _source(source: str, model: str) -> str:
    if source == "capacityHistory priceHistory":
        return "capacity history"
    if source == "policy.prices":
        return "policy.prices"
    if source == prices.SOURCE:
        return "respawn's table" + (" (as on-demand)" if model == "flex-start" else "")
    return "no price known"


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass
