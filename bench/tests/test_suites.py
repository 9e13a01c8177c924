"""The named bench suites: each runs scenarios of its own subject that exist, and every
shipped scenario is measured by some suite, ``bench.collectives`` or ``bench run all``."""

from __future__ import annotations

from bench.codecs import lab as codecs_lab
from bench.jobs import lab as jobs_lab
from bench.suite import SUITES
from bench.transport import fair
from wangate.lab.scenario import SCENARIO_DIR, load_scenario


def _scenarios(name: str) -> list[str]:
    return [s for names, _ in SUITES[name].runs for s in names]


def test_suites_are_named_by_subject_and_run_scenarios_of_it() -> None:
    assert set(SUITES) == {"loss", "fair", "critical", "failover", "codecs", "baselines"}
    for subject in ("loss", "critical", "failover"):
        names = _scenarios(subject)
        assert names and all(n.startswith(subject + "_") for n in names), (subject, names)
        assert all(load_scenario(n).flows for n in names)
    assert SUITES["critical"].floors == ("critical_bulk", "critical_jitter", "critical_nobulk")
    assert SUITES["failover"].floors == ("failover_degrade", "failover_blackhole")
    assert SUITES["fair"].drivers == (fair.run,) and load_scenario(fair.SCENARIO).flows == ()
    assert SUITES["codecs"].drivers == (codecs_lab.run,)
    assert load_scenario(codecs_lab.SCENARIO).name == "multipath_clean3"


def test_every_shipped_scenario_has_a_driver() -> None:
    shipped = {p.stem for p in SCENARIO_DIR.glob("*.toml")}
    in_suites = {s for name in SUITES for s in _scenarios(name)}
    in_suites |= {fair.SCENARIO, codecs_lab.SCENARIO}
    without_workload = {n for n in shipped if not load_scenario(n).flows}
    collectives = {
        "coll_3",
        "coll_3_half",
        "coll_4",
        "coll_3_quarter",
        "coll_3_half_quarter",
        "coll_4_quarter",
    }
    jobs = {jobs_lab.ONE_PATH, *jobs_lab.PLACEMENTS}  # python -m bench jobs
    assert without_workload == {"fair_tcp"} | collectives | jobs
    # the rest run under `bench run all`; every one of those is also in a suite
    assert shipped - without_workload <= in_suites
