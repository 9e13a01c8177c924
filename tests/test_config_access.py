"""[site] allow_uids / allow_gids and [limits] max_local_connections: values and errors."""

from __future__ import annotations

import grp
import pwd
from pathlib import Path

import pytest

from tests import test_config
from tests.test_config import MINIMAL, edited, load_text
from wangate.config import LimitsConfig
from wangate.errors import ConfigError

pki = test_config.pki  # the fixtures, shared
conf_dir = test_config.conf_dir

SITE_LINE = 'socket = "/run/wangate/wangate.sock"'


def with_site_keys(keys: str) -> str:
    return edited(MINIMAL, SITE_LINE, f"{SITE_LINE}\n{keys}")


def with_limits(keys: str) -> str:
    return edited(MINIMAL, "[[peers]]", f"[limits]\n{keys}\n\n[[peers]]")


def test_defaults_leave_access_to_the_socket_group_and_cap_at_1024(conf_dir: Path) -> None:
    config = load_text(conf_dir, MINIMAL)
    assert config.site.allow_uids is None
    assert config.site.allow_gids is None  # None: the socket file's group
    assert config.limits.max_local_connections == 1024
    assert LimitsConfig().max_local_connections == 1024


def test_ids_by_number_and_by_name(conf_dir: Path) -> None:
    root_group = grp.getgrgid(0).gr_name
    nobody = pwd.getpwuid(65534).pw_name
    text = with_site_keys(
        f'allow_uids = [1000, "{nobody}", 1000, 0]\nallow_gids = ["{root_group}", 4242]'
    )
    site = load_text(conf_dir, text).site
    assert site.allow_uids == (1000, 65534, 0)  # file order, duplicates dropped
    assert site.allow_gids == (0, 4242)
    assert load_text(conf_dir, with_site_keys("allow_gids = []")).site.allow_gids == ()


def test_max_local_connections(conf_dir: Path) -> None:
    config = load_text(conf_dir, with_limits("max_local_connections = 16"))
    assert config.limits.max_local_connections == 16


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            "allow_uids = [1.5]",
            "site.allow_uids[0]: expected a numeric id or a user name, got float 1.5",
        ),
        (
            "allow_uids = [true]",
            "site.allow_uids[0]: expected a numeric id or a user name, got boolean True",
        ),
        ("allow_uids = 1000", "site.allow_uids: expected an array, got integer 1000"),
        ("allow_uids = [-1]", "site.allow_uids[0]: -1 is out of range (0..4294967294)"),
        (
            "allow_gids = [4294967295]",
            "site.allow_gids[0]: 4294967295 is out of range (0..4294967294)",
        ),
        ('allow_uids = [""]', "site.allow_uids[0]: must not be empty"),
        (
            'allow_uids = ["no-such-user-wg"]',
            "site.allow_uids[0]: no such user 'no-such-user-wg'",
        ),
        (
            'allow_gids = ["no-such-group-wg"]',
            "site.allow_gids[0]: no such group 'no-such-group-wg'",
        ),
        (
            "allow_gids = [[1]]",
            "site.allow_gids[0]: expected a numeric id or a group name, got array [1]",
        ),
        (
            "allow_users = [1000]",
            "site.allow_users: unknown key (site takes: allow_gids, allow_uids, listen, name, "
            "socket, socket_mode)",
        ),
    ],
)
def test_bad_access_keys(conf_dir: Path, keys: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, with_site_keys(keys))
    assert str(info.value) == f"conf/bj.toml: {message}"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("max_local_connections = 0", "0 is out of range (1..1048576)"),
        ("max_local_connections = 2000000", "2000000 is out of range (1..1048576)"),
        ('max_local_connections = "8"', "expected an integer, got string '8'"),
        ("max_local_connections = 1.0", "expected an integer, got float 1.0"),
    ],
)
def test_bad_max_local_connections(conf_dir: Path, keys: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, with_limits(keys))
    assert str(info.value) == f"conf/bj.toml: limits.max_local_connections: {message}"


def test_unknown_limits_key_lists_the_new_one(conf_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, with_limits("max_connections = 8"))
    assert str(info.value) == (
        "conf/bj.toml: limits.max_connections: unknown key (limits takes: client_budget_bytes, "
        "max_local_connections, max_message_bytes, partial_message_idle_s, peer_dead_s, "
        "peer_inbox_bytes)"
    )
