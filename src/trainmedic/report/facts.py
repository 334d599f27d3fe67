"""A finding's evidence for a person: a few facts in words, with units.

A rule keeps every value it measured or compared in the finding's evidence -
20 to 70 of them for an input finding (each stack-sampled share with its
interval, the bars it was judged against, what a fix would need). The JSON
keeps them all; a person reads the few that make the case. :func:`facts`
picks them and says them:

* the finding family's *lead* keys first (:data:`LEADS`: for slow input the
  wait, the cores, where the loading time went, what the fix would gain), then
  the rule's own order;
* a share's bars (``*_warning_share``/``*_error_share``) go on the first
  share's line, and each sampled share's interval (``*_interval``) on its own
  line, not on lines of their own;
* a split measured by stack samples (``loader_*_share``, ``outside_*_share``,
  ...) is one line: its states largest first, the ones never seen left out;
* the job's cores are one line (used, usable, other processes);
* bookkeeping (minimums, what more samples would settle, ``settled``) stays
  in the JSON.

Values are formatted by the unit their key ends in (:func:`format_value`):
``_share`` and ``_pct`` as percentages, ``_s``/``_ms`` as times,
``_mib_per_s``, ``_bytes``, ``_gib``, ``_cores``, ``_mhz``, ``_w``, ``_c``,
so that ``0.000324`` MiB/s reads "<0.01 MiB/s" and ``0.000176`` s "0.176 ms".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_FACTS = 4
"""Facts shown per finding; the rest are in the JSON (and the HTML's full table)."""
MAX_FACT_CHARS = 120
"""A fact longer than this is cut (top frames, long commands)."""
MAX_LIST_ITEMS = 3

# --- formatting by unit ---------------------------------------------------------------


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, with thousands separators and no
    exponent (``1,234``, ``12.3``, ``0.0123``)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_percent(share: float) -> str:
    """A share of 0..1 as a percentage: ``59%``; ``<1%`` and ``>99%`` at the edges,
    so that nothing measured reads as exactly none or all."""
    pct = share * 100.0
    if pct == 0 or pct == 100:
        return f"{pct:.0f}%"
    if 0 < pct < 0.5:
        return "<1%"
    if 99.5 <= pct < 100:
        return ">99%"
    if -0.5 < pct < 0:
        return ">-1%"
    return f"{pct:.0f}%"


def format_seconds_short(seconds: float) -> str:
    """``0.176 ms``, ``41 ms``, ``1.07 s``, ``12m 05s``."""
    s = abs(seconds)
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if s < 1.0:
        return f"{significant(seconds * 1000)} ms"
    if s < 120:
        return f"{significant(seconds)} s"
    minutes, secs = divmod(round(s), 60)
    hours, minutes = divmod(minutes, 60)
    sign = "-" if seconds < 0 else ""
    return f"{sign}{hours}h {minutes:02d}m" if hours else f"{sign}{minutes}m {secs:02d}s"


def _cores_text(cores: float) -> str:
    """Cores to 2 digits (``0.62``, ``1``, ``13``); ``<0.01`` for a trace of one."""
    return "<0.01" if 0 < cores < 0.005 else significant(cores, 2)


def _cores_with_unit(cores: float) -> str:
    """``0.0075 cores``, ``1 core``."""
    text = _cores_text(cores)
    return f"{text} {'core' if text == '1' else 'cores'}"


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``15.8 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{significant(value)} {unit}"
        value /= 1024
    return f"{value} TiB"  # not reached


def _rate(unit: str) -> Callable[[float], str]:
    def fmt(v: float) -> str:
        if v == 0:
            return f"0 {unit}"
        if 0 < abs(v) < 0.01:
            return f"<0.01 {unit}"
        return f"{significant(v)} {unit}"

    return fmt


def _with(unit: str) -> Callable[[float], str]:
    return lambda v: f"{significant(v)} {unit}"


_BY_SUFFIX: tuple[tuple[str, Callable[[float], str]], ...] = (
    ("_ms_per_step", lambda v: format_seconds_short(v / 1000.0) + " a step"),
    ("_mib_per_s", _rate("MiB/s")),
    ("_bytes_per_s", lambda v: format_bytes(v) + "/s"),
    ("gb_per_s", _rate("GB/s")),  # decimal GB/s, as GPU datasheets state bandwidth
    ("_samples_per_s", _with("samples/s")),
    ("samples_per_s", _with("samples/s")),
    ("steps_per_s", _with("steps/s")),
    ("_share", format_percent),
    ("_pct", lambda v: format_percent(v / 100.0)),
    ("_ms", lambda v: format_seconds_short(v / 1000.0)),
    ("_s", format_seconds_short),
    ("_bytes", format_bytes),
    ("_gib", _with("GiB")),
    ("_mib", _with("MiB")),
    ("_cores", lambda v: f"{_cores_text(v)} core" + ("" if v == 1 else "s")),
    ("_mhz", lambda v: f"{v:,.0f} MHz"),
    ("_w", lambda v: f"{v:,.0f} W"),
    ("_c", lambda v: f"{v:.0f} °C"),
    ("speedup", lambda v: f"{significant(v)}x"),
)
"""How a number reads, by how its key ends (first match wins)."""


def format_value(key: str, value: Any) -> str:
    """One evidence value for a person, in the unit its key names."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        for suffix, fmt in _BY_SUFFIX:
            if key.endswith(suffix):
                return fmt(float(value))
        return f"{value:,}" if isinstance(value, int) else significant(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        items = list(value.items())
        shown = ", ".join(f"{k} {format_value(str(k), v)}" for k, v in items[:MAX_LIST_ITEMS])
        return shown + (f" (+{len(items) - MAX_LIST_ITEMS} more)" if len(items) > 3 else "")
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and key.endswith("_interval"):
            return f"{format_value(key[:-9], value[0])}-{format_value(key[:-9], value[1])}"
        if "pairs" in key and value and all(_is_pair(v) for v in value):
            # Ordered pairs (GPU 0 to GPU 3): one arrow each, not four flat numbers.
            shown = ", ".join(f"{a}->{b}" for a, b in value[:MAX_LIST_ITEMS])
            more = len(value) - MAX_LIST_ITEMS
            return shown + (f" (+{more} more)" if more > 0 else "")
        shown = "; ".join(format_value(key, v) for v in value[:MAX_LIST_ITEMS])
        more = len(value) - MAX_LIST_ITEMS
        return shown + (f" (+{more} more)" if more > 0 else "")
    return "-" if value is None else str(value)


def _is_pair(value: Any) -> bool:
    """``[0, 3]``: two integers, as an ordered pair is kept in the evidence."""
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    )


# --- what each key says ---------------------------------------------------------------

LABELS: Mapping[str, str] = {
    "data_wait_share": "waiting for the next batch: {v} of step time",
    "data_wait_exposed_share": "waiting for data while the GPU had nothing to do: {v} of step time",
    "outside_step_share": "outside forward, backward and the optimizer: {v} of step time",
    "host_compute_share": "inside forward, backward and the optimizer: {v} of step time",
    "step_time_median_s": "median step: {v}",
    "step_time_s": "step time: {v}",
    "steady_steps": "steady steps: {v}",
    "steps_per_s": "{v} per process",
    "samples_per_s": "{v} for the job",
    "recommended_collective_timeout_s": "a collective timeout that fits this job: {v}",
    "longest_step_s": "longest step: {v}",
    "nccl_default_timeout_s": "NCCL's default: {v}",
    "trainmedic_hang_bound_s": "trainmedic's hang bound: {v}",
    "memory_total_gib": "GPU memory: {v}",
    "predicted_speedup": "expected with the fix: {v} the speed",
    "predicted_step_s": "expected step with the fix: {v}",
    "speedup_limited_by": "the gain is then limited by {v}",
    "recommended_num_workers": "recommended num_workers: {v}",
    "num_workers": "num_workers now: {v}",
    "train_cpu_wait_share": "the training thread waited for a CPU {v} of its time",
    "train_cpu_wait_max_share": "the training thread waited for a CPU up to {v} of its time",
    "tool_cpu_wait_share": "{v} of its time went to trainmedic's own CPU",
    "loading_cpu_wait_share": "the loading processes waited for a CPU {v} of their time",
    "contended_steps_slowdown_share": "steps during the contention ran {v} slower",
    "throttled_time_share": "clocks held down {v} of the time",
    "clock_deficit_mean": "clock below its maximum by {v} on average",
    "temperature_max_c": "hottest reading: {v}",
    "power_draw_mean_w": "power draw: {v} on average",
    "goodput_share": "goodput: {v} of the wall time went to steps kept",
    "hang_summary": "{v}",
    "location": "at {v}",
    "failure_class": "failure class: {v}",
    "exit_code": "exit code {v}",
    "signal": "ended by {v}",
    "lost_s": "time lost: {v}",
    "detect_s": "detected after {v}",
    "hang_detected_after_s": "detected after {v} without progress",
    "disk_read_mib_per_s": "disk reads: {v}",
    "net_recv_mib_per_s": "network received: {v}",
    "iowait_pct": "CPU iowait: {v}",
    "sample_latency_ms": "each sample took {v} to arrive",
    "sample_fetch_ms": "fetching a sample: {v}",
    "samples_in_flight_needed": "samples in flight needed: {v}",
    "gpu_utilization_pct": "GPU utilization: {v}",
    "gpu_busy_share": "GPU busy {v} of the step",
    "gpu_idle_share": "GPU idle {v} of the step",
    "memory_peak_share": "peak GPU memory: {v} of capacity",
    "memory_used_max_gib": "most used: {v}",
    "steal_pct": "hypervisor steal: {v}",
    "cgroup_throttled_share": "the container's CPU quota stopped it {v} of the time",
    "straggler_data_wait_s": "the straggler's data wait: {v} a step",
    "others_data_wait_s": "the other ranks' data wait: {v} a step",
    "others_wait_share": "the other ranks waited {v} of their step for it",
    "rank": "rank {v}",
    "stalls": "stalls: {v}",
    "stall_longest_s": "longest stall: {v}",
    "time_lost_s": "time lost to them: {v}",
    "top_frames": "where: {v}",
    "helper_top_frames": "the helpers' frames: {v}",
    "reasons": "the GPU's reasons: {v}",
    "tfdata_pipeline": "the pipeline: {v}",
    "data_server": "the data server: {v}",
    "handoff_wait_per_step_ms": "waiting on the helpers: {v} a step",
    "server_wait_per_step_ms": "waiting on the server: {v} a step",
    "exposed_nccl_share": "communication not overlapped: {v} of step time",
    "foreign_time_share": "other processes on the GPU {v} of the time",
    "ooms": "out-of-memory errors: {v}",
    "requested_bytes": "the failed allocation asked for {v}",
    "free_bytes": "free on the GPU then: {v}",
}
"""Words for the keys that make most cases; ``{v}`` is the value in its unit. Other
keys read as their name in words: ``sample_fetch_ms`` -> "sample fetch: 0.2 ms"."""

LEADS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input.", ("data_wait_share", "@cores", "@split:loader", "predicted_speedup",
                "@split:helper", "@split:server")),
    ("host.", ("outside_step_share", "@split:outside", "step_time_median_s", "top_frames")),
    ("contention.cpu", ("train_cpu_wait_share", "@cores", "contended_steps_slowdown_share")),
    ("cpu.", ("train_cpu_wait_share", "train_cpu_wait_max_share", "@cores",
              "cgroup_throttled_share")),
    ("thermal.", ("throttled_time_share", "clock_deficit_mean", "reasons", "temperature_max_c",
                  "power_draw_mean_w")),
    ("failure.", ("hang_summary", "location", "failure_class", "signal", "exit_code",
                  "hang_detected_after_s")),
    ("restart.", ("goodput_share", "attempts", "restarts", "lost_s", "detect_s")),
    ("distributed.straggler", ("rank", "straggler_data_wait_s", "others_wait_share",
                               "@split:outside")),
    ("stall.", ("stalls", "stall_longest_s", "time_lost_s")),
    ("memory.", ("memory_peak_share", "memory_used_max_gib", "memory_total_gib")),
    ("gpu.", ("gpu_busy_share", "gpu_idle_share", "exposed_nccl_share")),
    ("distributed.collective_timeout", ("recommended_collective_timeout_s", "longest_step_s",
                                        "nccl_default_timeout_s", "trainmedic_hang_bound_s")),
)  # fmt: skip
"""Per finding family (id prefix): the keys that make its case, in order. ``@cores`` is
the job's cores in one line; ``@split:PREFIX`` a stack-sampled split in one line."""

SPLITS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "loader": ("the loading time", ("loader_stack_samples",)),
    "outside": ("the time between steps", ("outside_stack_samples",)),
    "helper": ("the helpers' time", ("helper_observations",)),
    "server": ("the data server's time", ("server_observations",)),
}
"""Stack-sampled splits: prefix -> (what is split, the keys counting its samples)."""

STATE_WORDS: Mapping[str, str] = {
    "transform": "dataset code",
    "file_read": "file reads",
    "file_write": "file writes",
    "socket_wait": "network waits",
    "ipc_wait": "waits on other processes",
    "python": "Python",
    "sleep": "sleeping",
    "log": "logging",
    "sync": "host-device syncs",
    "cpu": "computing",
    "idle": "idle",
    "poll": "polling",
    "wait": "waiting",
    "socket": "network",
    "file": "files",
    "step_data": "preparing data",
    "other": "other",
}
NOT_STATES = frozenset({"step", "resource", "part"})
"""``<prefix>_<word>_share`` keys that are not a state of a split."""

_BOOKKEEPING = ("_needed", "_min_samples", "min_", "settled", "_interval", "_warning_share",
                "_error_share", "_threshold_s", "_floor_s", "_factor", "_measured_by")  # fmt: skip
"""Key parts of values that say how a finding was judged, not what was measured."""


def _is_bookkeeping(key: str) -> bool:
    if key in LABELS:
        return False
    return any(part in key for part in _BOOKKEEPING)


def _words(key: str) -> str:
    """A key's name in words, its unit suffix dropped (the value carries it)."""
    name = key
    for suffix in ("_ms_per_step", "_mib_per_s", "_bytes_per_s", "_per_s", "_share", "_pct",
                   "_ms", "_s", "_bytes",
                   "_gib", "_mib", "_cores", "_mhz", "_w", "_c"):  # fmt: skip
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ")


def say(key: str, value: Any, interval: Any = None) -> str:
    """One key's fact: its words and its value in its unit (and its sampled interval)."""
    shown = format_value(key, value)
    if isinstance(interval, (list, tuple)) and len(interval) == 2:
        shown += f" ({format_value(key + '_interval', interval)})"
    template = LABELS.get(key)
    if template is not None:
        return template.format(v=shown)
    return f"{_words(key)}: {shown}"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FACT_CHARS else text[: MAX_FACT_CHARS - 1] + "…"


# --- picking the facts ----------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _cores(ev: Mapping[str, Any], used: set[str]) -> str | None:
    """The job's cores in one line: used of usable, other processes, idle."""
    job, usable = _number(ev.get("job_cpu_cores")), _number(ev.get("usable_cores"))
    if job is None or usable is None:
        return None
    parts = [f"the job used {_cores_text(job)} of {_cores_text(usable)} usable cores"]
    used.update(("job_cpu_cores", "usable_cores"))
    others = _number(ev.get("others_cpu_cores"))
    if others is not None:
        parts.append(f"other processes {_cores_with_unit(others)}")
        used.add("others_cpu_cores")
    spare = _number(ev.get("spare_cores"))
    if spare is not None:
        parts.append(f"{_cores_with_unit(spare)} idle" if spare > 0 else "none idle")
        used.add("spare_cores")
    return "; ".join(parts)


def split_states(ev: Mapping[str, Any], prefix: str) -> list[tuple[str, float, str]]:
    """The states of the stack-sampled split ``prefix``: (state, share, share key),
    largest first; a state is a ``PREFIX_STATE_share`` with an interval beside it."""
    out = []
    head = prefix + "_"
    for key, value in ev.items():
        if not (key.startswith(head) and key.endswith("_share")):
            continue
        state = key[len(head) : -len("_share")]
        share = _number(value)
        if state in NOT_STATES or share is None or f"{key}_interval" not in ev:
            continue
        out.append((state, share, key))
    return sorted(out, key=lambda s: -s[1])


def _split(ev: Mapping[str, Any], prefix: str, used: set[str]) -> str | None:
    """A stack-sampled split in one line: ``the loading time (37 stack samples): dataset
    code 97% (89%-99%), other 3%``; states never seen are left out."""
    states = split_states(ev, prefix)
    if not states:
        return None
    what, count_keys = SPLITS.get(prefix, (prefix.replace("_", " "), ()))
    counts = [ev[k] for k in count_keys if _number(ev.get(k)) is not None]
    said: list[str] = []
    for i, (state, share, key) in enumerate(states):
        used.update((key, f"{key}_interval"))
        if share <= 0 or len(said) >= MAX_LIST_ITEMS:
            continue
        text = f"{STATE_WORDS.get(state, state.replace('_', ' '))} {format_percent(share)}"
        interval = ev.get(f"{key}_interval")
        if i == 0 and isinstance(interval, (list, tuple)) and len(interval) == 2:
            text += f" ({format_value(key + '_interval', interval)})"
        said.append(text)
    used.update(count_keys)
    if not said:
        return None
    samples = f" ({int(counts[0]):,} samples)" if counts else ""
    return f"{what}{samples}: " + ", ".join(said)


def _bars(ev: Mapping[str, Any], used: set[str]) -> str:
    """The bars a share was judged against: `` (warning from 20%, error from 50%)``."""
    said = []
    for key, value in ev.items():
        for kind in ("warning", "error"):
            if key.endswith(f"_{kind}_share") and _number(value) is not None:
                said.append(f"{kind} from {format_percent(float(value))}")
                used.add(key)
    return f" ({', '.join(said)})" if said else ""


def _leads(finding_id: str) -> tuple[str, ...]:
    for prefix, keys in LEADS:
        if finding_id.startswith(prefix):
            return keys
    return ()


def facts(finding_id: str, evidence: Mapping[str, Any], limit: int = MAX_FACTS) -> list[str]:
    """At most ``limit`` facts that make the case of finding ``finding_id``, in words."""
    ev = evidence
    used: set[str] = set()
    out: list[str] = []
    shares: set[tuple[tuple[str, ...], str]] = set()
    bars_said = False

    def add(key: str) -> None:
        nonlocal bars_said
        if key == "@cores":
            line = _cores(ev, used)
        elif key.startswith("@split:"):
            line = _split(ev, key.split(":", 1)[1], used)
        elif key in ev and key not in used and ev[key] is not None:
            used.update((key, f"{key}_interval"))
            shown = format_value(key, ev[key])
            stem = tuple(key.split("_")[:2])
            if key.endswith("_share") and (stem, shown) in shares:
                return  # the same figure said already (the wait, and its exposed part)
            shares.add((stem, shown))
            line = say(key, ev[key], ev.get(f"{key}_interval"))
            if key.endswith("_share") and not bars_said:
                line += _bars(ev, used)
                bars_said = True
        else:
            line = None
        if line:
            out.append(_cut(line))

    for key in _leads(finding_id):
        if len(out) >= limit:
            return out
        add(key)
    members = {key: p for p in SPLITS for _, _, key in split_states(ev, p)}
    for prefix in set(members.values()):  # its sample count is said on its line
        members.update((key, prefix) for key in SPLITS[prefix][1])
    for key in ev:
        if len(out) >= limit:
            break
        if key in used or _is_bookkeeping(key):
            continue
        if key in members:  # a split met in the rule's order is still one line
            add(f"@split:{members[key]}")
            continue
        add(key)
    return out


def fact_lines(finding_id: str, evidence: Mapping[str, Any], where: str | None) -> list[str]:
    """The facts, then where the full evidence is (``where``: a file or a command)."""
    lines = facts(finding_id, evidence)
    rest = len(evidence)
    if where and rest > len(lines):
        lines.append(f"all {rest} values: {where}")
    return lines
