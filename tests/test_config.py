"""Configuration loading: exact values for valid files, a precise error for each mistake."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest

from wangate.certs import create_ca, issue_site_certificate
from wangate.config import (
    CompressionConfig,
    Config,
    CriticalConfig,
    FecConfig,
    LimitsConfig,
    MetricsConfig,
    PathConfig,
    PeerConfig,
    SiteConfig,
    TlsConfig,
    load_config,
    parse_config,
)
from wangate.errors import CodecError, ConfigError

REPO = Path(__file__).resolve().parent.parent
CONFIG_NAME = "conf/bj.toml"  # as the user types it, relative to the working directory

VALID = """\
[site]
name = "bj"
socket = "run/wangate.sock"
listen = ["0.0.0.0:7443", "[::]:7443"]
socket_mode = "0640"

[tls]
ca = "certs/ca.pem"
cert = "certs/bj.pem"
key = "certs/bj.key"

[limits]
max_message_bytes = 1048576
client_budget_bytes = 2097152
peer_inbox_bytes = 4194304

[compression]
default = "fp16"
min_lossy_bytes = 4096
[compression.tags]
"layer0.*" = "none"
"*.grad" = "int8+zstd:3"

[metrics]
listen = "127.0.0.1:9464"

[[peers]]
name = "sh"
[[peers.paths]]
name = "fiber-a"
local = "10.0.1.1"
remote = "10.0.1.2:7443"
mtu = 9000
[[peers.paths]]
name = "fiber-b"
remote = "[fd00::2]:7443"
[[peers.paths]]
name = "inbound"

[[peers]]
name = "gz"
[[peers.paths]]
name = "lte"
local = "fd00::1"
remote = "[FD00:0:0::3]:8443"
mtu = 1280
"""

MINIMAL = """\
[site]
name = "bj"
socket = "/run/wangate/wangate.sock"

[tls]
ca = "certs/ca.pem"
cert = "certs/bj.pem"
key = "certs/bj.key"

[[peers]]
name = "sh"
[[peers.paths]]
name = "fiber-a"
remote = "10.0.1.2:7443"
"""

SITE_BLOCK = VALID[: VALID.index("[tls]")]
TAGS_BLOCK = VALID[VALID.index("[compression.tags]") : VALID.index("[metrics]")]
GZ_PEER = VALID[VALID.index('[[peers]]\nname = "gz"') :]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """certs/: our CA with sites bj and sh; other/: another CA with site bj."""
    root = tmp_path_factory.mktemp("pki")
    create_ca(root / "certs")
    issue_site_certificate(root / "certs", "bj")
    issue_site_certificate(root / "certs", "sh")
    create_ca(root / "other")
    issue_site_certificate(root / "other", "bj")
    return root


@pytest.fixture
def conf_dir(tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding conf/certs and conf/other; returns conf/."""
    conf = tmp_path / "conf"
    conf.mkdir()
    shutil.copytree(pki / "certs", conf / "certs")
    shutil.copytree(pki / "other", conf / "other")
    monkeypatch.chdir(tmp_path)
    return conf


def load_text(conf: Path, text: str) -> Config:
    (conf / "bj.toml").write_text(text)
    return load_config(CONFIG_NAME)


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_valid_config_parses_into_exact_values(conf_dir: Path) -> None:
    config = load_text(conf_dir, VALID)
    certs = conf_dir / "certs"
    assert config == Config(
        path=Path(CONFIG_NAME),
        site=SiteConfig(
            name="bj",
            socket=conf_dir / "run" / "wangate.sock",
            listen=(("0.0.0.0", 7443), ("::", 7443)),
            socket_mode=0o640,
        ),
        tls=TlsConfig(ca=certs / "ca.pem", cert=certs / "bj.pem", key=certs / "bj.key"),
        peers=(
            PeerConfig(
                name="sh",
                paths=(
                    PathConfig("fiber-a", local="10.0.1.1", remote=("10.0.1.2", 7443), mtu=9000),
                    PathConfig("fiber-b", local=None, remote=("fd00::2", 7443), mtu=1500),
                    PathConfig("inbound", local=None, remote=None, mtu=1500),
                ),
            ),
            PeerConfig(
                name="gz",
                paths=(PathConfig("lte", local="fd00::1", remote=("fd00::3", 8443), mtu=1280),),
            ),
        ),
        limits=LimitsConfig(
            max_message_bytes=1 << 20, client_budget_bytes=2 << 20, peer_inbox_bytes=4 << 20
        ),
        compression=CompressionConfig(
            default="fp16",
            min_lossy_bytes=4096,
            tags=(("layer0.*", "none"), ("*.grad", "int8+zstd:3")),
        ),
        metrics=MetricsConfig(listen=("127.0.0.1", 9464)),
    )
    assert config.site.socket.is_absolute() and config.tls.ca.is_absolute()
    assert config.peer("gz") is config.peers[1]
    assert config.peer("sh").path("inbound") is config.peers[0].paths[2]


def test_defaults(conf_dir: Path) -> None:
    config = load_text(conf_dir, MINIMAL)
    assert config.site == SiteConfig(
        name="bj", socket=Path("/run/wangate/wangate.sock"), listen=(), socket_mode=0o660
    )
    assert config.peers == (
        PeerConfig("sh", (PathConfig("fiber-a", None, ("10.0.1.2", 7443), 1500),)),
    )
    assert config.limits == LimitsConfig(4 << 30, 8 << 30, 8 << 30)
    assert config.compression == CompressionConfig("none", 65536, ())
    assert config.metrics == MetricsConfig(None)


def test_parse_config_resolves_against_the_given_path(pki: Path) -> None:
    config = parse_config(MINIMAL, pki / "site.toml")
    assert config.path == pki / "site.toml"
    assert config.tls.cert == pki / "certs" / "bj.pem"


def test_no_peers_is_allowed(conf_dir: Path) -> None:
    text = MINIMAL[: MINIMAL.index("[[peers]]")]
    assert load_text(conf_dir, text).peers == ()


@pytest.mark.parametrize(
    ("mode", "expected"),
    [('"0660"', 0o660), ('"600"', 0o600), ('"0o640"', 0o640), ("0o600", 0o600), ("432", 0o660)],
)
def test_socket_mode_forms(conf_dir: Path, mode: str, expected: int) -> None:
    text = edited(MINIMAL, 'socket = "/run', f'socket_mode = {mode}\nsocket = "/run')
    assert load_text(conf_dir, text).site.socket_mode == expected


def test_max_datagram_size_follows_mtu_and_family() -> None:
    assert PathConfig("a", None, ("10.0.0.1", 1), 1500).max_datagram_size == 1472
    assert PathConfig("a", None, ("fd00::1", 1), 1500).max_datagram_size == 1452
    assert PathConfig("a", "10.0.0.1", None, 9000).max_datagram_size == 8972
    assert PathConfig("a", None, None, 1500).max_datagram_size == 1452  # unknown: v6 worst case


def test_unknown_peer_and_path_lookups(conf_dir: Path) -> None:
    config = load_text(conf_dir, MINIMAL)
    with pytest.raises(ConfigError) as info:
        config.peer("gz")
    assert str(info.value) == "conf/bj.toml: no peer named 'gz' (configured peers: sh)"
    with pytest.raises(ConfigError, match="peer 'sh' has no path named 'x'"):
        config.peer("sh").path("x")


# (description, edit of VALID as (old, new), key named, message fragment)
ERROR_CASES: list[tuple[str, tuple[str, str], str, str]] = [
    # syntax
    ("syntax", ('name = "bj"', 'name = "bj'), "", "TOML syntax error: "),
    # unknown keys, at every level
    ("unknown top", ("[metrics]", "[bogus]\nx = 1\n[metrics]"), "bogus", "unknown key"),
    ("unknown site", ('socket_mode = "0640"', "sockett = 1"), "site.sockett", "unknown key"),
    (
        "unknown tls",
        ('key = "certs/bj.key"', 'key = "certs/bj.key"\npass = 1'),
        "tls.pass",
        "unknown",
    ),
    ("unknown limits", ("peer_inbox_bytes", "peer_inbox"), "limits.peer_inbox", "unknown key"),
    ("unknown compr.", ("min_lossy_bytes", "min_lossy"), "compression.min_lossy", "unknown"),
    ("unknown metrics", ('listen = "127.0.0.1:9464"', "port = 1"), "metrics.port", "unknown"),
    ("unknown peer", ('name = "sh"', 'name = "sh"\nweight = 2'), "peers[0].weight", "unknown"),
    ("unknown path", ("mtu = 9000", "mtu = 9000\nrtt = 3"), "peers[0].paths[0].rtt", "unknown"),
    # missing required keys
    ("missing site", (SITE_BLOCK, ""), "site", "missing (required)"),
    ("missing s.name", ('name = "bj"', ""), "site.name", "missing (required)"),
    ("missing socket", ('socket = "run/wangate.sock"', ""), "site.socket", "missing"),
    ("missing tls.key", ('key = "certs/bj.key"', ""), "tls.key", "missing (required)"),
    ("missing tls.ca", ('ca = "certs/ca.pem"', ""), "tls.ca", "missing (required)"),
    ("missing p.name", ('name = "gz"', ""), "peers[1].name", "missing (required)"),
    ("missing path nm", ('name = "fiber-b"', ""), "peers[0].paths[1].name", "missing"),
    (
        "missing paths",
        (GZ_PEER, '[[peers]]\nname = "gz"\n'),
        "peers[1].paths",
        "missing (required)",
    ),
    (
        "empty paths",
        (GZ_PEER, '[[peers]]\nname = "gz"\npaths = []\n'),
        "peers[1].paths",
        "a peer needs at least one path",
    ),
    # wrong types
    ("site not table", (SITE_BLOCK, 'site = "bj"\n'), "site", "expected a table, got string"),
    ("name int", ('name = "bj"', "name = 3"), "site.name", "expected a string, got integer 3"),
    ("name empty", ('name = "bj"', 'name = ""'), "site.name", "must not be empty"),
    (
        "listen str",
        ('listen = ["0.0.0.0:7443", "[::]:7443"]', 'listen = "0.0.0.0:7443"'),
        "site.listen",
        "expected an array, got string",
    ),
    (
        "listen item",
        ('"0.0.0.0:7443", "[::]:7443"', '"0.0.0.0:7443", 7443'),
        "site.listen[1]",
        "expected a string, got integer 7443",
    ),
    ("mtu string", ("mtu = 9000", 'mtu = "9000"'), "peers[0].paths[0].mtu", "expected an integer"),
    ("mtu bool", ("mtu = 9000", "mtu = true"), "peers[0].paths[0].mtu", "got boolean True"),
    (
        "limit float",
        ("max_message_bytes = 1048576", "max_message_bytes = 1.5"),
        "limits.max_message_bytes",
        "expected an integer, got float 1.5",
    ),
    ("tags not table", (TAGS_BLOCK, 'tags = "x"\n'), "compression.tags", "expected a table"),
    ("local int", ('local = "10.0.1.1"', "local = 10"), "peers[0].paths[0].local", "a string"),
    (
        "socket_mode bool",
        ('socket_mode = "0640"', "socket_mode = true"),
        "site.socket_mode",
        "expected an integer or an octal string, got boolean",
    ),
    # bad addresses
    (
        "remote x:y",
        ('remote = "10.0.1.2:7443"', 'remote = "x:y"'),
        "peers[0].paths[0].remote",
        "'x:y' is not HOST:PORT",
    ),
    (
        "remote hostname",
        ('remote = "10.0.1.2:7443"', 'remote = "sh.example:7443"'),
        "peers[0].paths[0].remote",
        "'sh.example' is not an IP address literal",
    ),
    (
        "remote no port",
        ('remote = "10.0.1.2:7443"', 'remote = "10.0.1.2"'),
        "peers[0].paths[0].remote",
        "no ':PORT'",
    ),
    (
        "remote port 0",
        ('remote = "10.0.1.2:7443"', 'remote = "10.0.1.2:0"'),
        "peers[0].paths[0].remote",
        "port '0' is not a number in 1..65535",
    ),
    (
        "remote port big",
        ('remote = "10.0.1.2:7443"', 'remote = "10.0.1.2:65536"'),
        "peers[0].paths[0].remote",
        "port '65536' is not a number in 1..65535",
    ),
    (
        "remote port +",
        ('remote = "10.0.1.2:7443"', 'remote = "10.0.1.2:+80"'),
        "peers[0].paths[0].remote",
        "port '+80'",
    ),
    (
        "v6 no brackets",
        ('remote = "[fd00::2]:7443"', 'remote = "fd00::2:7443"'),
        "peers[0].paths[1].remote",
        "an IPv6 address needs brackets, like '[::1]:7443'",
    ),
    (
        "v6 no port",
        ('remote = "[fd00::2]:7443"', 'remote = "[fd00::2]"'),
        "peers[0].paths[1].remote",
        "an IPv6 address is written '[ADDRESS]:PORT'",
    ),
    (
        "v4 in brackets",
        ('remote = "[fd00::2]:7443"', 'remote = "[10.0.0.2]:7443"'),
        "peers[0].paths[1].remote",
        "only IPv6 addresses go in brackets",
    ),
    (
        "remote 0.0.0.0",
        ('remote = "10.0.1.2:7443"', 'remote = "0.0.0.0:7443"'),
        "peers[0].paths[0].remote",
        "the unspecified address cannot be dialled",
    ),
    (
        "remote multicast",
        ('remote = "10.0.1.2:7443"', 'remote = "239.1.1.1:7443"'),
        "peers[0].paths[0].remote",
        "a multicast address",
    ),
    (
        "remote broadcast",
        ('remote = "10.0.1.2:7443"', 'remote = "255.255.255.255:7443"'),
        "peers[0].paths[0].remote",
        "the broadcast address",
    ),
    ("listen bad", ('"[::]:7443"]', '"[::]:x"]'), "site.listen[1]", "'[::]:x' is not HOST:PORT"),
    (
        "metrics bad",
        ('listen = "127.0.0.1:9464"', 'listen = "localhost:9464"'),
        "metrics.listen",
        "'localhost:9464' is not HOST:PORT",
    ),
    (
        "local hostname",
        ('local = "10.0.1.1"', 'local = "eth0"'),
        "peers[0].paths[0].local",
        "'eth0' is not an IP address literal",
    ),
    (
        "local bad v4",
        ('local = "10.0.1.1"', 'local = "10.0.1.256"'),
        "peers[0].paths[0].local",
        "not an IP address literal",
    ),
    (
        "local bracketed",
        ('local = "fd00::1"', 'local = "[fd00::1]"'),
        "peers[1].paths[0].local",
        "not an IP address literal",
    ),
    (
        "local with port",
        ('local = "10.0.1.1"', 'local = "10.0.1.1:7443"'),
        "peers[0].paths[0].local",
        "not an IP address literal",
    ),
    (
        "local family",
        ('local = "10.0.1.1"', 'local = "fd00::9"'),
        "peers[0].paths[0].local",
        "'fd00::9' is IPv6 but remote '10.0.1.2' is not",
    ),
    (
        "local multicast",
        ('local = "10.0.1.1"', 'local = "224.0.0.1"'),
        "peers[0].paths[0].local",
        "multicast",
    ),
    # names
    ("site name", ('name = "bj"', 'name = "-bj"'), "site.name", "'-bj' is not a valid name"),
    ("peer name", ('name = "sh"', 'name = "s h"'), "peers[0].name", "'s h' is not a valid name"),
    (
        "path name",
        ('name = "fiber-a"', 'name = "fiber/a"'),
        "peers[0].paths[0].name",
        "'fiber/a' is not a valid name",
    ),
    (
        "path name long",
        ('name = "fiber-a"', f'name = "{"f" * 64}"'),
        "peers[0].paths[0].name",
        "is not a valid name",
    ),
    # structure
    ("site name ip", ('name = "bj"', 'name = "10.0.0.1"'), "site.name", "not an IP address"),
    ("peer is site", ('name = "gz"', 'name = "bj"'), "peers[1].name", "'bj' is this site's own"),
    (
        "peer twice",
        ('name = "gz"', 'name = "sh"'),
        "peers[1].name",
        "peer 'sh' is listed twice (also peers[0])",
    ),
    (
        "path twice",
        ('name = "fiber-b"', 'name = "fiber-a"'),
        "peers[0].paths[1].name",
        "path 'fiber-a' is listed twice for this peer",
    ),
    (
        "listen twice",
        (
            'listen = ["0.0.0.0:7443", "[::]:7443"]',
            'listen = ["0.0.0.0:7443", "[::]:7443", "[0::0]:7443"]',
        ),
        "site.listen[2]",
        "'[0::0]:7443' is listed twice",
    ),
    (
        "no remote either side",
        ('listen = ["0.0.0.0:7443", "[::]:7443"]', "listen = []"),
        "peers[0].paths[2].remote",
        "missing, and site.listen is empty: no remote on either side, so nobody could ever connect",
    ),
    (
        "mtu low",
        ("mtu = 9000", "mtu = 1279"),
        "peers[0].paths[0].mtu",
        "1279 is out of range (1280..65535)",
    ),
    ("mtu high", ("mtu = 9000", "mtu = 65536"), "peers[0].paths[0].mtu", "out of range"),
    (
        "socket_mode str",
        ('socket_mode = "0640"', 'socket_mode = "0980"'),
        "site.socket_mode",
        "'0980' is not an octal mode like '0660'",
    ),
    (
        "socket_mode int",
        ('socket_mode = "0640"', "socket_mode = 0o1777"),
        "site.socket_mode",
        "0o1777 is not a file mode (0..0o777)",
    ),
    (
        "limit zero",
        ("peer_inbox_bytes = 4194304", "peer_inbox_bytes = 0"),
        "limits.peer_inbox_bytes",
        "0 is out of range (>= 1)",
    ),
    (
        "limit negative",
        ("client_budget_bytes = 2097152", "client_budget_bytes = -5"),
        "limits.client_budget_bytes",
        "-5 is out of range (>= 1)",
    ),
    (
        "message over budget",
        ("max_message_bytes = 1048576", "max_message_bytes = 3145728"),
        "limits.max_message_bytes",
        "3145728 is larger than limits.client_budget_bytes (2097152): such a message could never",
    ),
    (
        "min_lossy negative",
        ("min_lossy_bytes = 4096", "min_lossy_bytes = -1"),
        "compression.min_lossy_bytes",
        "out of range (>= 0)",
    ),
    (
        "empty tag glob",
        ('"layer0.*" = "none"', '"" = "none"'),
        'compression.tags.""',
        "an empty tag pattern matches nothing",
    ),
    (
        "tag spec type",
        ('"layer0.*" = "none"', '"layer0.*" = 3'),
        'compression.tags."layer0.*"',
        "expected a string",
    ),
    # certificate files
    (
        "missing cert",
        ('cert = "certs/bj.pem"', 'cert = "certs/nope.pem"'),
        "tls.cert",
        "nope.pem: No such file or directory",
    ),
    (
        "missing ca",
        ('ca = "certs/ca.pem"', 'ca = "ca.pem"'),
        "tls.ca",
        "conf/ca.pem: No such file or directory",
    ),
    ("unreadable key", ('key = "certs/bj.key"', 'key = "certs"'), "tls.key", "Is a directory"),
    (
        "ca not pem",
        ('ca = "certs/ca.pem"', 'ca = "certs/bj.key"'),
        "tls.ca",
        "holds no PEM certificate",
    ),
    ("ca is a leaf", ('ca = "certs/ca.pem"', 'ca = "certs/sh.pem"'), "tls.ca", "is not a CA"),
    (
        "cert not pem",
        ('cert = "certs/bj.pem"', 'cert = "certs/bj.key"'),
        "tls.cert",
        "holds no PEM certificate",
    ),
    (
        "key not pem",
        ('key = "certs/bj.key"', 'key = "certs/bj.pem"'),
        "tls.key",
        "is not an unencrypted PEM private key",
    ),
    (
        "key mismatch",
        ('key = "certs/bj.key"', 'key = "certs/sh.key"'),
        "tls.key",
        "certs/sh.key is not the key of",
    ),
    (
        "cert other CA",
        (
            'cert = "certs/bj.pem"\nkey = "certs/bj.key"',
            'cert = "other/bj.pem"\nkey = "other/bj.key"',
        ),
        "tls.cert",
        "does not verify against our CA",
    ),
    (
        "cert other site",
        (
            'cert = "certs/bj.pem"\nkey = "certs/bj.key"',
            'cert = "certs/sh.pem"\nkey = "certs/sh.key"',
        ),
        "tls.cert",
        "sh.pem is for site 'sh', but site.name is 'bj'",
    ),
]


@pytest.mark.parametrize(
    ("edit", "key", "fragment"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_errors_name_the_file_and_the_key(
    conf_dir: Path, edit: tuple[str, str], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, edited(VALID, *edit))
    message = str(info.value)
    assert message.startswith(f"{CONFIG_NAME}: {key}: " if key else f"{CONFIG_NAME}: "), message
    assert fragment in message


def test_syntax_error_gives_the_line(conf_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, edited(VALID, "mtu = 9000", "mtu = = 9000"))
    assert str(info.value).startswith("conf/bj.toml: TOML syntax error: ")
    assert f"line {VALID.splitlines().index('mtu = 9000') + 1}," in str(info.value)


def test_peers_must_be_an_array_of_tables(conf_dir: Path) -> None:
    text = 'peers = "sh"\n' + MINIMAL[: MINIMAL.index("[[peers]]")]
    with pytest.raises(ConfigError, match=r"^conf/bj\.toml: peers: expected an array, got string"):
        load_text(conf_dir, text)
    text = 'peers = ["sh"]\n' + MINIMAL[: MINIMAL.index("[[peers]]")]
    with pytest.raises(ConfigError, match=r"^conf/bj\.toml: peers\[0\]: expected a table"):
        load_text(conf_dir, text)


def test_unknown_key_lists_the_allowed_ones(conf_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, edited(VALID, 'socket_mode = "0640"', "sockt = 1"))
    assert str(info.value) == (
        "conf/bj.toml: site.sockt: unknown key (site takes: allow_gids, allow_uids, listen, name, "
        "socket, socket_mode)"
    )


def test_missing_or_undecodable_file(conf_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("conf/nope.toml")
    assert str(info.value) == "conf/nope.toml: cannot read: No such file or directory"
    (conf_dir / "bj.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"^conf/bj\.toml: not UTF-8 text"):
        load_config(CONFIG_NAME)


def _fake_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    def validate_codec_spec(spec: str) -> None:
        if spec not in ("none", "fp16", "int8+zstd:3"):
            raise CodecError(f"bad codec spec {spec!r}")

    module = types.ModuleType("wangate.codec")
    module.validate_codec_spec = validate_codec_spec  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wangate.codec", module)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (('default = "fp16"', 'default = "fp17"'), "compression.default"),
        (('"*.grad" = "int8+zstd:3"', '"*.grad" = "fp17"'), 'compression.tags."*.grad"'),
    ],
)
def test_codec_specs_are_checked_by_the_codec(
    conf_dir: Path, monkeypatch: pytest.MonkeyPatch, edit: tuple[str, str], key: str
) -> None:
    _fake_codec(monkeypatch)
    assert load_text(conf_dir, VALID).compression.default == "fp16"
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, edited(VALID, *edit))
    assert str(info.value) == (
        f"conf/bj.toml: {key}: 'fp17' is not a valid codec spec: bad codec spec 'fp17'"
    )


def test_codec_specs_with_the_real_codec(conf_dir: Path) -> None:
    codec = pytest.importorskip("wangate.codec")
    if not hasattr(codec, "validate_codec_spec"):
        pytest.skip("wangate.codec has no validate_codec_spec yet")
    assert load_text(conf_dir, VALID).compression.tags[1] == ("*.grad", "int8+zstd:3")
    with pytest.raises(ConfigError, match=r'^conf/bj\.toml: compression\.tags\."\*\.grad": '):
        load_text(conf_dir, edited(VALID, '"*.grad" = "int8+zstd:3"', '"*.grad" = "int9"'))


@pytest.mark.parametrize("name", ["example-bj.toml", "example-sh.toml"])
def test_example_configs_load(tmp_path: Path, pki: Path, name: str) -> None:
    shutil.copy(REPO / "conf" / name, tmp_path / name)
    shutil.copytree(pki / "certs", tmp_path / "certs")
    config = load_config(tmp_path / name)
    assert [len(peer.paths) for peer in config.peers] == [3]
    assert [path.name for path in config.peers[0].paths] == ["fiber-a", "fiber-b", "internet"]
    assert config.peers[0].name == {"bj": "sh", "sh": "bj"}[config.site.name]


def test_fec_and_critical_sections(conf_dir: Path) -> None:
    defaults = load_text(conf_dir, MINIMAL)
    assert defaults.fec == FecConfig(True, 64, 0, 16, 2)
    assert defaults.critical == CriticalConfig(0)
    text = MINIMAL + (
        "\n[fec]\nenabled = false\nk = 32\nmin_repair = 1\nmax_repair = 8\n"
        "critical_min_repair = 4\n"
        "\n[critical]\nhost_delay_target_ms = 8\n"
    )
    config = load_text(conf_dir, text)
    assert config.fec == FecConfig(False, 32, 1, 8, 4)
    assert config.critical == CriticalConfig(8)


@pytest.mark.parametrize(
    ("section", "key", "fragment"),
    [
        ("[fec]\nk = 0", "fec.k", "1..128"),
        ("[fec]\nmin_repair = 9\nmax_repair = 8", "fec.min_repair", "larger than fec.max_repair"),
        ("[fec]\nenabled = 1", "fec.enabled", "expected a boolean"),
        ("[fec]\ncritical_min_repair = 129", "fec.critical_min_repair", "0..128"),
        ("[critical]\nhost_delay_target_ms = -1", "critical.host_delay_target_ms", "0..10000"),
        ("[critical]\nhost_delay_target_ms = 2.5", "critical.host_delay_target_ms", "integer"),
        ("[critical]\ntarget = 3", "critical.target", "unknown key"),
    ],
)
def test_fec_and_critical_errors(conf_dir: Path, section: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, MINIMAL + "\n" + section + "\n")
    message = str(info.value)
    assert message.startswith(f"{CONFIG_NAME}: {key}: "), message
    assert fragment in message


def test_partial_message_idle_timeout(conf_dir: Path) -> None:
    config = load_text(conf_dir, MINIMAL + "\n[limits]\npartial_message_idle_s = 30\n")
    assert config.limits == LimitsConfig(4 << 30, 8 << 30, 8 << 30, 30)
    assert load_text(conf_dir, MINIMAL).limits.partial_message_idle_s == 60
    with pytest.raises(ConfigError) as info:
        load_text(conf_dir, MINIMAL + "\n[limits]\npartial_message_idle_s = 0\n")
    assert str(info.value).startswith(f"{CONFIG_NAME}: limits.partial_message_idle_s: ")


def test_proto_wire_md_shows_every_fec_key_with_its_default() -> None:
    import dataclasses
    import tomllib

    from wangate.config import FecConfig

    text = (Path(__file__).resolve().parent.parent / "proto" / "wire.md").read_text()
    section = text[text.index("### Settings (`[fec]`)") :]
    block = section[section.index("```toml\n") + 8 : section.index("```\n", 8)]
    documented = tomllib.loads(block)["fec"]
    defaults = {f.name: f.default for f in dataclasses.fields(FecConfig)}
    assert documented == defaults
