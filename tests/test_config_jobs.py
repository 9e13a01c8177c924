"""[jobs]: declaring training jobs, their policies, who may join them, and reload."""

from __future__ import annotations

import grp
import pwd
import re
import shutil
from pathlib import Path

import pytest

from tests import test_config
from tests.test_config import CONFIG_NAME, REPO, VALID, load_text
from wangate.config import (
    Config,
    JobConfig,
    JobsConfig,
    job_admission_error,
    load_config,
    unknown_job_error,
)
from wangate.core.jobs import JobPolicy
from wangate.errors import ConfigError
from wangate.reload import jobs_changed, plan_reload

pki = test_config.pki  # the fixtures, shared
conf_dir = test_config.conf_dir

ROOT_GROUP = grp.getgrgid(0).gr_name
NOBODY = pwd.getpwuid(65534).pw_name

# VALID's peers: sh with fiber-a, fiber-b and inbound; gz with lte. Its peer_inbox_bytes
# is 4194304.
JOBS = f"""
[jobs]
placement = "share"

[jobs.llama-run3]
weight = 3
paths = ["fiber-a", "fiber-b"]
sites = ["bj", "sh"]
allow_gids = ["{ROOT_GROUP}", 4242]
allow_uids = ["{NOBODY}"]
max_inflight_bytes = 1048576

[jobs.eval]
paths = ["fiber-b", "inbound"]
sites = ["sh", "bj"]
"""
SH_PATHS = ["fiber-a", "fiber-b", "inbound"]


def with_jobs(jobs: str) -> str:
    return VALID + jobs


def test_a_full_section_parses_into_exact_values(conf_dir: Path) -> None:
    jobs = load_text(conf_dir, with_jobs(JOBS)).jobs
    assert jobs == JobsConfig(
        placement="share",
        jobs=(
            JobConfig("default"),
            JobConfig(
                "llama-run3",
                weight=3.0,
                paths=("fiber-a", "fiber-b"),
                sites=("bj", "sh"),
                allow_uids=(65534,),
                allow_gids=(0, 4242),
                max_inflight_bytes=1048576,
            ),
            JobConfig("eval", paths=("fiber-b", "inbound"), sites=("sh", "bj")),
        ),
    )
    assert jobs.names == ("default", "llama-run3", "eval")
    assert isinstance(jobs.jobs[1].weight, float)


def test_the_default_job_is_always_there(conf_dir: Path) -> None:
    config = load_text(conf_dir, VALID)
    assert config.jobs == JobsConfig("share", (JobConfig("default"),))
    assert config.jobs == JobsConfig()
    assert config.job("default") == JobConfig("default")
    assert config.job("llama-run3") is None
    only_one = load_text(conf_dir, with_jobs("[jobs.x]\n")).jobs
    assert only_one.names == ("default", "x")
    # declared (anywhere), it keeps its settings and comes first
    declared = load_text(conf_dir, with_jobs("[jobs.x]\n[jobs.default]\nweight = 2\n")).jobs
    assert declared.jobs == (JobConfig("default", weight=2.0), JobConfig("x"))
    assert load_text(conf_dir, with_jobs('[jobs]\nplacement = "spread"\n')).jobs == JobsConfig(
        "spread"
    )


def test_the_example_in_the_example_config_loads(tmp_path: Path, pki: Path) -> None:
    text = (REPO / "conf" / "example-bj.toml").read_text()
    start = text.index("# [jobs]\n")
    block = text[start : text.index("\n\n", text.index("# [jobs.eval]"))]
    lines = [line.removeprefix("# ") for line in block.splitlines()]
    # its groups and users need not exist here
    lines = [line for line in lines if not line.startswith(("allow_gids", "allow_uids"))]
    shutil.copytree(pki / "certs", tmp_path / "certs")
    (tmp_path / "bj.toml").write_text(text + "\n" + "\n".join(lines) + "\n")
    jobs = load_config(tmp_path / "bj.toml").jobs
    assert jobs.placement == "share"
    assert jobs.job("llama-run3") == JobConfig(
        "llama-run3",
        weight=3.0,
        paths=("fiber-a", "fiber-b"),
        sites=("bj", "sh"),
        max_inflight_bytes=4294967296,
    )
    assert jobs.job("eval") == JobConfig("eval", paths=("internet",))


JOB = "[jobs.x]\n"
ERROR_CASES = [
    ("jobs = 3\n" + VALID, "jobs", "expected a table, got integer"),
    (with_jobs('[jobs]\nplacement = "pack"\n'), "jobs.placement", (
        "'pack' is not a placement (share or spread)"
    )),
    (with_jobs("[jobs]\nplacement = 1\n"), "jobs.placement", "expected a string, got integer 1"),
    (with_jobs("[jobs]\nx = 3\n"), "jobs.x", (
        "expected a table (a job, [jobs.x]) or the key placement, got integer"
    )),
    (with_jobs('[jobs."a b"]\n'), 'jobs."a b"', (
        "job name 'a b' must be 1..64 characters of letters, digits, '.', '_' and '-', "
        "starting with a letter or digit"
    )),
    (with_jobs('[jobs."-x"]\n'), "jobs.-x", "job name '-x' must be 1..64 characters"),
    (with_jobs(f"[jobs.{'a' * 65}]\n"), f"jobs.{'a' * 65}", "must be 1..64 characters"),
    (with_jobs(JOB + "wieght = 2\n"), "jobs.x.wieght", (
        "unknown key (jobs.x takes: allow_gids, allow_uids, max_inflight_bytes, paths, sites, "
        "weight)"
    )),
    (with_jobs(JOB + "weight = 0\n"), "jobs.x.weight", "0 is out of range (> 0 and <= 1000)"),
    (with_jobs(JOB + "weight = -1.5\n"), "jobs.x.weight", "-1.5 is out of range"),
    (with_jobs(JOB + "weight = 1000.5\n"), "jobs.x.weight", "1000.5 is out of range"),
    (with_jobs(JOB + "weight = inf\n"), "jobs.x.weight", "inf is out of range"),
    (with_jobs(JOB + "weight = nan\n"), "jobs.x.weight", "nan is out of range"),
    (with_jobs(JOB + 'weight = "3"\n'), "jobs.x.weight", "expected a number, got string '3'"),
    (with_jobs(JOB + "weight = true\n"), "jobs.x.weight", "expected a number, got boolean"),
    (with_jobs(JOB + 'paths = "fiber-a"\n'), "jobs.x.paths", "expected an array, got string"),
    (with_jobs(JOB + "paths = []\n"), "jobs.x.paths", (
        "an empty list allows nothing; leave the key out to allow all"
    )),
    (with_jobs(JOB + 'paths = ["fiber-c"]\n'), "jobs.x.paths[0]", (
        "'fiber-c' is not a path of any peer (configured: fiber-a, fiber-b, inbound, lte)"
    )),
    (with_jobs(JOB + "paths = [1]\n"), "jobs.x.paths[0]", "expected a string, got integer 1"),
    (with_jobs(JOB + 'paths = ["lte", "fiber-a", "lte"]\n'), "jobs.x.paths[2]", (
        "'lte' is listed twice"
    )),
    (with_jobs(JOB + 'paths = ["fiber-a"]\n'), "jobs.x.paths", (
        "peer 'gz' has none of these paths (it has: lte), and the job spans it "
        "(jobs.x.sites is not set): its messages there could never be sent"
    )),
    (with_jobs(JOB + 'paths = ["lte"]\nsites = ["bj", "sh", "gz"]\n'), "jobs.x.paths", (
        "peer 'sh' has none of these paths (it has: fiber-a, fiber-b, inbound), and the job "
        "spans it (jobs.x.sites names it)"
    )),
    (with_jobs(JOB + 'sites = ["wh"]\n'), "jobs.x.sites[0]", (
        "'wh' is not this site or one of its [[peers]] (configured: bj, gz, sh)"
    )),
    (with_jobs(JOB + "sites = []\n"), "jobs.x.sites", "an empty list allows nothing"),
    (with_jobs(JOB + 'sites = ["sh", "sh"]\n'), "jobs.x.sites[1]", "'sh' is listed twice"),
    (with_jobs(JOB + 'allow_gids = ["no-such-group-wg"]\n'), "jobs.x.allow_gids[0]", (
        "no such group 'no-such-group-wg'"
    )),
    (with_jobs(JOB + 'allow_uids = ["no-such-user-wg"]\n'), "jobs.x.allow_uids[0]", (
        "no such user 'no-such-user-wg'"
    )),
    (with_jobs(JOB + "allow_uids = [1.5]\n"), "jobs.x.allow_uids[0]", (
        "expected a numeric id or a user name, got float 1.5"
    )),
    (with_jobs(JOB + "allow_gids = [-1]\n"), "jobs.x.allow_gids[0]", (
        "-1 is out of range (0..4294967294)"
    )),
    (with_jobs(JOB + "max_inflight_bytes = 0\n"), "jobs.x.max_inflight_bytes", (
        "0 is out of range (>= 1)"
    )),
    (with_jobs(JOB + "max_inflight_bytes = 1.5\n"), "jobs.x.max_inflight_bytes", (
        "expected an integer, got float 1.5"
    )),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "fragment"), ERROR_CASES)
def test_errors_name_the_file_the_job_and_the_key(
    conf_dir: Path, text: str, key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, text)
    message = str(info.value)
    assert message.startswith(f"{CONFIG_NAME}: {key}: "), message
    assert fragment in message, message


def test_jobs_is_an_allowed_top_level_section(conf_dir: Path) -> None:
    allowed = "collective, compression, critical, fec, jobs, limits"
    with pytest.raises(ConfigError, match=re.escape(allowed)):
        load_text(conf_dir, "[jbos]\n" + VALID)


# ------------------------------------------------------------------ policies


def jobs_with(placement: str, conf_dir: Path) -> Config:
    return load_text(conf_dir, with_jobs(JOBS.replace('"share"', f'"{placement}"')))


def test_share_gives_each_job_the_paths_it_may_use(conf_dir: Path) -> None:
    config = jobs_with("share", conf_dir)
    assert config.job_policies(SH_PATHS) == {
        "default": JobPolicy(1.0, None, 2097152),
        "llama-run3": JobPolicy(3.0, frozenset({"fiber-a", "fiber-b"}), 1048576),
        "eval": JobPolicy(1.0, frozenset({"fiber-b", "inbound"}), 2097152),
    }
    # towards gz, whose only path neither listing job may use
    assert config.job_policies(["lte"]) == {
        "default": JobPolicy(1.0, None, 2097152),
        "llama-run3": JobPolicy(3.0, frozenset(), 1048576),
        "eval": JobPolicy(1.0, frozenset(), 2097152),
    }


def test_spread_gives_jobs_paths_of_their_own_by_weight(conf_dir: Path) -> None:
    config = jobs_with("spread", conf_dir)
    # llama-run3 (3 of 4) takes 2 of the 3 paths; eval, which may use fiber-b and
    # inbound, the less loaded of them; default, where clients naming no job go, shares
    # every path and takes none from the others
    assert config.job_policies(SH_PATHS) == {
        "default": JobPolicy(1.0, None, 2097152),
        "llama-run3": JobPolicy(3.0, frozenset({"fiber-a", "fiber-b"}), 1048576),
        "eval": JobPolicy(1.0, frozenset({"inbound"}), 2097152),
    }
    assert config.job_policies(["lte"]) == {
        "default": JobPolicy(1.0, None, 2097152),
        "llama-run3": JobPolicy(3.0, frozenset(), 1048576),
        "eval": JobPolicy(1.0, frozenset(), 2097152),
    }


def test_the_default_inflight_cap_is_half_the_peer_inbox_once_there_are_two_jobs(
    conf_dir: Path,
) -> None:
    alone = load_text(conf_dir, VALID)
    assert alone.limits.peer_inbox_bytes == 4194304
    assert alone.job_policies(SH_PATHS) == {"default": JobPolicy(1.0, None, None)}
    alone_declared = load_text(conf_dir, with_jobs("[jobs.default]\nweight = 2\n"))
    assert alone_declared.job_policies(SH_PATHS) == {"default": JobPolicy(2.0, None, None)}
    two = load_text(conf_dir, with_jobs("[jobs.x]\n"))
    assert {name: p.max_inflight_bytes for name, p in two.job_policies(SH_PATHS).items()} == {
        "default": 2097152,
        "x": 2097152,
    }
    jobs = JobsConfig(jobs=(JobConfig("default"), JobConfig("x", max_inflight_bytes=7)))
    assert jobs.inflight_cap(jobs.jobs[0], 1) == 1  # never 0
    assert jobs.inflight_cap(jobs.jobs[0], 9) == 4
    assert jobs.inflight_cap(jobs.jobs[1], 9) == 7
    only_default = JobsConfig(jobs=(JobConfig("default", max_inflight_bytes=5),))
    assert only_default.inflight_cap(only_default.jobs[0], 9) == 5


# ------------------------------------------------------------------ who may join


RESTRICTED = JobConfig("llama-run3", allow_gids=(0, 4242424), allow_uids=(65534,))
DAEMON_UID = 990


@pytest.mark.parametrize(
    ("job", "uid", "gids"),
    [
        (JobConfig("open"), 1002, [1002]),  # no lists: whoever may use the socket
        (RESTRICTED, 65534, [65534]),  # its uid is listed
        (RESTRICTED, 1002, [4242424]),  # its primary group
        (RESTRICTED, 1002, [1002, 5, 0]),  # a supplementary group
        (RESTRICTED, 0, [0]),  # root
        (RESTRICTED, DAEMON_UID, [1002]),  # the daemon's user
        (JobConfig("closed", allow_uids=(), allow_gids=()), 0, []),
        (JobConfig("users", allow_uids=(7,)), 7, []),
    ],
)
def test_admitted(job: JobConfig, uid: int, gids: list[int]) -> None:
    assert job_admission_error(job, uid, gids, DAEMON_UID) is None


def test_refused_says_who_the_job_admits_and_who_the_process_is() -> None:
    assert job_admission_error(RESTRICTED, 1002, [1003, 1002, 1003], DAEMON_UID) == (
        f"job 'llama-run3' admits groups 0 ({ROOT_GROUP}), 4242424 and users 65534 "
        f"({NOBODY}); this process runs as uid 1002 gids 1002, 1003"
    )
    assert job_admission_error(JobConfig("g", allow_gids=(4242424,)), 1002, [], 1) == (
        "job 'g' admits groups 4242424; this process runs as uid 1002 gids none"
    )
    assert job_admission_error(JobConfig("u", allow_uids=(4242424,)), 1002, [0], 1) == (
        "job 'u' admits users 4242424; this process runs as uid 1002 gids 0"
    )
    closed = JobConfig("closed", allow_uids=(), allow_gids=())
    assert job_admission_error(closed, 1002, [1002], 1) == (
        "job 'closed' admits only root and the daemon's user; this process runs as uid 1002 "
        "gids 1002"
    )


def test_unknown_job_names_the_file_and_the_jobs(conf_dir: Path) -> None:
    config = load_text(conf_dir, with_jobs(JOBS))
    assert unknown_job_error("x", config) == (
        f"no job 'x' in {CONFIG_NAME} (jobs: default, llama-run3, eval)"
    )


# ------------------------------------------------------------------ reload


def test_reload_adds_removes_and_changes_jobs_live(conf_dir: Path) -> None:
    running = load_text(conf_dir, with_jobs(JOBS))
    new_jobs = JOBS.replace("weight = 3", "weight = 5").replace("[jobs.eval]", "[jobs.train2]")
    new = load_text(conf_dir, with_jobs(new_jobs.replace('"share"', '"spread"')))
    assert jobs_changed(running.jobs, new.jobs) == (("train2",), ("eval",), ("llama-run3",))
    assert jobs_changed(running.jobs, running.jobs) == ((), (), ())
    plan = plan_reload(running, new)
    assert plan.jobs_added == ("train2",)
    assert plan.jobs_removed == ("eval",)
    assert plan.jobs_changed == ("llama-run3",)
    assert plan.placement_changed
    assert plan.restart_needed == ()
    assert plan.effective.jobs == new.jobs
    assert plan.changes == [
        "job train2 added",
        "job eval removed",
        "job llama-run3 changed",
        "job placement now spread",
    ]
    # back to only the default job: the declared ones go, default stays
    back = plan_reload(plan.effective, load_text(conf_dir, VALID))
    assert (back.jobs_added, back.jobs_removed, back.jobs_changed) == (
        (),
        ("llama-run3", "train2"),
        (),
    )
    assert back.effective.jobs == JobsConfig(placement="share")
