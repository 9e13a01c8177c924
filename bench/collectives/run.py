"""Run the collectives benchmark in one lab: Gloo (cubic, BBR), all-to-all and the
wangate allreduce over the same emulated links, one after another, against the bound.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import wangate
from bench.collectives import bound
from bench.common import RESULTS
from bench.runner.gateways import process_cpu_s, start_gateways, stop_gateways
from bench.runner.run import machine_description
from bench.tree import THIS, Tree
from wangate.collective.plan import capacity_weights
from wangate.collective.routes import mesh_weights
from wangate.errors import WangateError
from wangate.lab import siteroutes
from wangate.lab.lab import Lab
from wangate.lab.scenario import Scenario

ELEMENTS = 8 * 1024 * 1024  # float32: 32 MiB
GLOO_PORT = 29500
READY_TIMEOUT_S = 60.0


@dataclass
class Variant:
    """One wangate allreduce configuration: extra gateway TOML and call options."""

    name: str
    gateway_config: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    tree: Tree = THIS  # whose gateways it runs on


def allreduce_variants(scenario: Scenario) -> tuple[Variant, ...]:
    """The wangate allreduce with the weights its measured plan would pick at the nominal
    link rates (``[collective] weights``), with those water-filling the sites' nominal
    capacities (``allreduce-site``), with equal shares (all weights 1),
    and with the shares the gateways derive from measured capacity (no weights)."""
    capacities = bound.site_capacities_bps(links_bps(scenario))

    def weights(value: dict[str, float]) -> str:
        table = ", ".join(f"{site} = {value[site]:g}" for site in scenario.sites)
        return f"[collective]\nweights = {{ {table} }}"

    # the weights the measured plan picks when it measures the nominal rates exactly
    nominal = mesh_weights(scenario.sites, {k: r / 1e6 for k, r in links_bps(scenario).items()})
    # what it picked before it saw the links: water-filling over the sites' capacities
    by_site = capacity_weights({s: c / 1e6 for s, c in capacities.items()})
    return (
        Variant("allreduce", weights(nominal)),
        Variant("allreduce-site", weights(by_site)),
        Variant("allreduce-equal", weights(dict.fromkeys(scenario.sites, 1.0))),
        Variant("allreduce-measured"),
        # run only when named: the best weights with a quarter of the default chunk
        Variant("allreduce-chunk256k", weights(nominal) + "\nchunk_bytes = 262144"),
        Variant("allreduce-measured-chunk256k", "[collective]\nchunk_bytes = 262144"),
        Variant("allreduce-measured-chunk512k", "[collective]\nchunk_bytes = 524288"),
    )


OPT_IN_VARIANTS = (
    "allreduce-chunk256k",
    "allreduce-measured-chunk256k",
    "allreduce-measured-chunk512k",
)


def links_bps(scenario: Scenario) -> dict[tuple[str, str], float]:
    """Rate per direction between each pair of sites (sum of their paths)."""
    rates: dict[tuple[str, str], float] = {}
    for path in scenario.paths:
        for src, dst in ((path.site_a, path.site_b), (path.site_b, path.site_a)):
            rates[(src, dst)] = rates.get((src, dst), 0.0) + path.params_from(src).rate_bps
    return rates


def bounds(scenario: Scenario, size_bytes: int) -> dict[str, Any]:
    links = links_bps(scenario)
    capacities = bound.site_capacities_bps(links)
    weighted = bound.capacity_shares(capacities)
    equal = bound.equal_shares(list(scenario.sites))
    best = bound.best_site_shares(capacities)
    mesh_w = mesh_weights(list(scenario.sites), {k: r / 1e6 for k, r in links.items()}, floor=0)
    mesh = {site: w / sum(mesh_w.values()) for site, w in mesh_w.items()}
    sites = list(scenario.sites)
    ring = [links[(sites[k], sites[(k + 1) % len(sites)])] for k in range(len(sites))]
    return {
        "size_bytes": size_bytes,
        "capacities_bps": capacities,
        "capacity_shares": weighted,
        "site_bound_s": bound.site_bound_s(size_bytes, capacities, weighted),
        "site_bound_equal_s": bound.site_bound_s(size_bytes, capacities, equal),
        "site_bound_best_s": bound.site_bound_s(size_bytes, capacities, best),
        "best_shares": best,
        "link_bound_s": bound.link_bound_s(size_bytes, links, weighted),
        "link_bound_equal_s": bound.link_bound_s(size_bytes, links, equal),
        "link_bound_best_site_s": bound.link_bound_s(size_bytes, links, best),
        "mesh_shares": mesh,
        "link_bound_mesh_s": bound.link_bound_s(size_bytes, links, mesh),
        "gloo_ring_bound_s": bound.ring_bound_s(size_bytes, ring),
    }


class _Workers:
    """One worker process per site; their stdout lines arrive on a queue per site."""

    def __init__(self, lab: Lab, specs: dict[str, dict[str, Any]], logs_dir: Path) -> None:
        self.lines: dict[str, queue.Queue[dict[str, Any] | None]] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        for site, spec in specs.items():
            log = (logs_dir / f"{spec['method']}-{spec.get('variant', '')}-{site}.log").open("wb")
            self._logs.append(log)
            process = lab.run_in(
                site,
                [sys.executable, "-m", "bench.collectives.worker", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"),
            )
            self.processes[site] = process
            self.lines[site] = queue.Queue()
            threading.Thread(target=self._read, args=(site, process), daemon=True).start()

    def _read(self, site: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines[site].put(json.loads(line))
        self.lines[site].put(None)

    def collect(self, deadline: float) -> dict[str, dict[str, Any]] | None:
        """The next line of every worker, or None if one fails or the deadline passes."""
        got = {}
        for site, lines in self.lines.items():
            try:
                item = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if item is None:
                return None
            got[site] = item
        return got

    def go(self) -> float:
        for process in self.processes.values():
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            process.stdin.flush()
        return time.monotonic()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self._logs:
            log.close()


def run_method(
    lab: Lab,
    specs: dict[str, dict[str, Any]],
    runs: int,
    timeout_s: float,
    logs_dir: Path,
    on_go: Any = None,
) -> dict[str, Any]:
    """Time ``runs`` collectives; a run that passes ``timeout_s`` ends the method."""
    workers = _Workers(lab, specs, logs_dir)
    stats_before = lab.link_stats()
    times: list[float | None] = []
    exact: list[bool] = []
    observed: list[Any] = []
    try:
        for run in range(runs):
            if workers.collect(time.monotonic() + READY_TIMEOUT_S + timeout_s) is None:
                raise WangateError(
                    f"{next(iter(specs.values()))['method']}: a worker failed "
                    f"before run {run} (see {logs_dir})"
                )
            go = workers.go()
            if on_go is not None:
                observed.append(on_go())
            done = workers.collect(go + timeout_s)
            if done is None:
                times.append(None)
                break
            times.append(max(r["end"] for r in done.values()) - go)
            rates = {site: r["rates_mbps"] for site, r in done.items() if r.get("rates_mbps")}
            if rates:  # the measured plan's inputs, as the leader held them, and its weights
                weights = {site: r["weights"] for site, r in done.items() if r.get("weights")}
                observed.append({"rates_mbps": rates, "weights": weights})
            exact.append(all(r["exact"] for r in done.values()))
    finally:
        workers.stop()
    return {
        "times_s": times,
        "exact": exact,
        "timeout_s": timeout_s,
        "observed": observed,
        "link_bytes": _link_deltas(stats_before, lab.link_stats()),
        # The machine is shared: the 1-minute load average when the method ended.
        "load_average_1min": os.getloadavg()[0],
    }


def _link_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per path and direction: bytes delivered and packets dropped during a method."""
    deltas = {}
    for path, stats in after.items():
        for direction in ("a_to_b", "b_to_a"):
            now, then = stats[direction], before[path][direction]
            deltas[f"{path} {direction}"] = {
                key: now[key] - then[key]
                for key in ("delivered_bytes", "dropped_queue", "dropped_loss")
            }
    return deltas


def start_variant_gateways(
    lab: Lab,
    configs: dict[str, tuple[Path, str]],
    extra_config: str,
    logs_dir: Path,
    name: str,
    tree: Tree = THIS,
) -> dict[str, subprocess.Popen[bytes]]:
    """Gateways of ``tree`` on the lab's configs (certificates made once) plus
    ``extra_config``."""
    for config, text in configs.values():
        config.write_text(text + "\n" + extra_config + "\n")
    paths = {site: config for site, (config, _) in configs.items()}
    return start_gateways(lab, paths, logs_dir, prefix=f"{name}-", tree=tree)[0]


def _cpu_s(processes: dict[str, subprocess.Popen[bytes]]) -> dict[str, float]:
    return {site: process_cpu_s(p.pid) or 0.0 for site, p in processes.items()}


def run_collectives(
    scenario: Scenario,
    *,
    runs: int,
    elements: int = ELEMENTS,
    methods: tuple[str, ...] = ("gloo-cubic", "gloo-bbr", "alltoall", "allreduce"),
    gloo_timeout_s: float = 120.0,
    cubic_timeout_s: float = 300.0,
    cubic_runs: int | None = None,
    wangate_timeout_s: float = 60.0,
    variants: tuple[str, ...] | None = None,
    trees: tuple[Tree, ...] = (THIS,),
    label: str = "",
    alternate: bool = False,
    warmup_runs: int = 0,
    warmup_elements: int | None = None,
    idle_s: float = 0.0,
    say: Any = print,
) -> dict[str, Any]:
    """Gloo (cubic, BBR) and every wangate method and variant in one lab; each wangate
    one again over the gateways of every other tree of ``trees``, as
    ``<name>@<tree>``."""
    size_bytes = 4 * elements
    record: dict[str, Any] = {
        "scenario": scenario.name,
        "sites": list(scenario.sites),
        "elements": elements,
        "runs": runs,
        "machine": machine_description(),
        "bounds": bounds(scenario, size_bytes),
        "trees": [tree.label for tree in trees],
        "alternate": alternate,
        "warmup_runs": warmup_runs,
        "warmup_elements": warmup_elements or elements,
        "idle_s": idle_s,
        "methods": {},
    }
    logs_dir = RESULTS / "collectives" / scenario.name / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    sites = list(scenario.sites)
    base = {"sites": sites, "elements": elements, "seed": scenario.seed, "runs": runs}
    with Lab(scenario) as lab:
        addresses = siteroutes.add_site_addresses(lab)
        say(f"{scenario.name}: lab {lab.run_id} up, site addresses {addresses}")
        for offset, cc in enumerate(("cubic", "bbr")):
            name = f"gloo-{cc}"
            if name not in methods:
                continue
            how = siteroutes.set_congestion_control(lab, cc)
            specs = {
                site: dict(
                    base,
                    method="gloo",
                    site=site,
                    address=addresses[site],
                    master=f"{addresses[sites[0]]}:{GLOO_PORT + offset}",
                    timeout_s=gloo_timeout_s + READY_TIMEOUT_S,
                )
                for site in sites
            }

            def seen_cc() -> dict[str, list[str]]:
                time.sleep(1.0)
                return {site: siteroutes.congestion_in_use(lab, site) for site in sites}

            timeout_s = cubic_timeout_s if cc == "cubic" else gloo_timeout_s
            method_runs = cubic_runs if cc == "cubic" and cubic_runs else runs
            for spec in specs.values():
                spec.update(runs=method_runs, timeout_s=timeout_s + READY_TIMEOUT_S)
            result = run_method(lab, specs, method_runs, timeout_s, logs_dir, seen_cc)
            result["congestion_control_set_by"] = how
            record["methods"][name] = result
            say(f"  {name}: {_fmt_times(result)}  (cc in use: {result['observed'][:1]})")
        shares = record["bounds"]
        runs_on_wangate: list[tuple[str, Variant]] = []
        if "alltoall" in methods:
            runs_on_wangate.append(("alltoall", Variant("alltoall")))
        if "rsag" in methods:
            for label, split in (("capacity", "capacity_shares"), ("equal", None)):
                chosen = shares[split] if split else bound.equal_shares(sites)
                variant = Variant(f"rsag-{label}", options={"shares": chosen, "chunks": 8})
                runs_on_wangate.append(("rsag", variant))
        if "allreduce" in methods:
            chosen_variants = [
                v
                for v in allreduce_variants(scenario)
                if (v.name in variants if variants else v.name not in OPT_IN_VARIANTS)
            ]
            runs_on_wangate += [("allreduce", v) for v in chosen_variants]
        # each again over the gateways of every other tree: "<name>@<tree>"
        runs_on_wangate += [
            (m, Variant(f"{v.name}@{tree.slug}", v.gateway_config, v.options, tree))
            for tree in trees[1:]
            for m, v in list(runs_on_wangate)
        ]
        configs = {
            site: (path, path.read_text()) for site, path in lab.write_gateway_configs().items()
        }
        # alternating: round after round, each variant once on fresh gateways, so that
        # the load of a shared machine falls on every variant alike
        blocks = (
            [(r, 1, m, v) for r in range(runs) for m, v in runs_on_wangate]
            if alternate
            else [(0, runs, m, v) for m, v in runs_on_wangate]
        )
        for offset, block_runs, method, variant in blocks:
            name = variant.name
            gateways = start_variant_gateways(
                lab, configs, variant.gateway_config, logs_dir, name, variant.tree
            )
            try:
                specs = {
                    site: dict(
                        base,
                        method=method,
                        variant=name,
                        site=site,
                        socket=str(lab.gateway_socket(site)),
                        timeout_s=wangate_timeout_s,
                        options=variant.options,
                        runs=block_runs,
                        run_offset=offset,
                        warmup_runs=warmup_runs,
                        warmup_elements=warmup_elements or elements,
                        idle_s=idle_s,
                    )
                    for site in sites
                }
                cpu_before = _cpu_s(gateways)
                result = run_method(lab, specs, block_runs, wangate_timeout_s, logs_dir)
                # Gateway CPU seconds over the method (set-up and warm-up included).
                result["gateway_cpu_s"] = {
                    site: cpu - cpu_before[site] for site, cpu in _cpu_s(gateways).items()
                }
                result["gateway_config"] = variant.gateway_config
                result["options"] = variant.options
                result = _merged(record["methods"].get(name), result)
                record["methods"][name] = result
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in result["gateway_cpu_s"].items())
                say(
                    f"  {name}: {_fmt_times(result)}  (gateway CPU-s: {cpu}; load "
                    f"{result['load_average_1min']:.1f})"
                )
            finally:
                stop_gateways(gateways)
    out = RESULTS / "collectives" / f"{scenario.name}{label}.json"
    out.write_text(json.dumps(record, indent=1))
    record["file"] = str(out)
    return record


def _merged(before: dict[str, Any] | None, block: dict[str, Any]) -> dict[str, Any]:
    """One variant's results over its blocks: runs, observations and loads appended,
    bytes and CPU summed."""
    block["load_averages_1min"] = [block["load_average_1min"]]
    if before is None:
        return block
    merged = dict(before)
    for key in ("times_s", "exact", "observed", "load_averages_1min"):
        merged[key] = before[key] + block[key]
    merged["load_average_1min"] = block["load_average_1min"]
    merged["gateway_cpu_s"] = {
        site: cpu + block["gateway_cpu_s"].get(site, 0.0)
        for site, cpu in before["gateway_cpu_s"].items()
    }
    merged["link_bytes"] = {
        path: {k: v + block["link_bytes"].get(path, {}).get(k, 0) for k, v in counts.items()}
        for path, counts in before["link_bytes"].items()
    }
    return merged


def _fmt_times(result: dict[str, Any]) -> str:
    timeout = result["timeout_s"]
    return ", ".join(f"> {timeout:.0f} s" if t is None else f"{t:.2f} s" for t in result["times_s"])


def summary(result: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(median, min, max) of the runs; the median is None if any run timed out."""
    times = result["times_s"]
    done = [t for t in times if t is not None]
    if not done:
        return None, None, None
    median = statistics.median(done) if len(done) == len(times) else None
    return median, min(done), max(done)


COLUMNS = (
    ("wangate allreduce", "allreduce"),
    ("Gloo cubic", "gloo-cubic"),
    ("Gloo BBR", "gloo-bbr"),
    ("all-to-all", "alltoall"),
)


def _cell(result: dict[str, Any] | None, bound_s: float) -> str:
    if result is None:
        return "not run"
    median, low, high = summary(result)
    if median is None:
        return f"> {result['timeout_s']:.0f} s (> {result['timeout_s'] / bound_s:.1f}x)"
    inexact = "" if all(result["exact"]) else ", INEXACT"
    return f"{median:.2f} s ({median / bound_s:.2f}x) [{low:.2f}-{high:.2f}]{inexact}"


def table(records: list[dict[str, Any]]) -> str:
    """Markdown, one row per scenario: median seconds (ratio to the site bound)
    [min-max over runs] per method, and wangate's speed-up over the others."""
    head = ["scenario", "runs", "bound (best shares / site / link)"]
    head += [title for title, _ in COLUMNS]
    head.append("wangate speed-up vs cubic / BBR / all-to-all")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for record in records:
        b = record["bounds"]
        methods = record["methods"]
        cells = [
            record["scenario"],
            str(record["runs"]),
            f"{b['site_bound_best_s']:.2f} s / {b['site_bound_s']:.2f} s / "
            f"{b['link_bound_s']:.2f} s",
        ]
        cells += [_cell(methods.get(key), b["site_bound_s"]) for _, key in COLUMNS]
        ours = summary(methods["allreduce"])[0] if "allreduce" in methods else None
        speedups = []
        for key in ("gloo-cubic", "gloo-bbr", "alltoall"):
            if ours is None or key not in methods:
                speedups.append("-")
                continue
            theirs = summary(methods[key])[0]
            timeout = methods[key]["timeout_s"]
            speedups.append(f"> {timeout / ours:.1f}" if theirs is None else f"{theirs / ours:.2f}")
        cells.append(" / ".join(speedups))
        rows.append("| " + " | ".join(cells) + " |")
    extra = [
        (r["scenario"], name, _cell(result, r["bounds"]["site_bound_s"]), _drops(result))
        for r in records
        for name, result in r["methods"].items()
        if name not in dict((key, 0) for _, key in COLUMNS) or name == "allreduce"
    ]
    if extra:
        rows += ["", "| scenario | variant | time | queue drops per run: all links (worst) |"]
        rows += ["|---|---|---|---|"]
        rows += [f"| {sc} | {name} | {cell} | {drops} |" for sc, name, cell, drops in extra]
    return "\n".join(rows)


def _drops(result: dict[str, Any]) -> str:
    """Packets the emulated links' queues dropped per run (warm-ups and set-up included),
    over all link directions and on the worst one."""
    links = result.get("link_bytes") or {}
    if not links:
        return "-"
    runs = max(1, len(result["times_s"]))
    total = sum(c.get("dropped_queue", 0) for c in links.values()) / runs
    worst, counts = max(links.items(), key=lambda kv: kv[1].get("dropped_queue", 0))
    return f"{total:.0f} ({worst} {counts.get('dropped_queue', 0) / runs:.0f})"


def version() -> str:
    return wangate.__version__ if hasattr(wangate, "__version__") else "?"
