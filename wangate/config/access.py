"""``[site]``'s local API access: the socket file's mode, and the users and groups
allowed to connect (``allow_uids`` / ``allow_gids``, also those of each ``[jobs.NAME]``),
by number or by a name looked up on this machine (wangate.localapi.access applies them)."""

from __future__ import annotations

import grp
import pwd
import re
from collections.abc import Callable

from wangate.config.reader import Reader, type_name

MAX_ID = 2**32 - 2  # uid_t / gid_t; (uid_t)-1 means "no id"
_SOCKET_MODE_STRING = re.compile(r"0?[0-7]{3}|0o[0-7]{3}")


def _id_kind(key: str) -> str:
    """What an entry of the list ``key`` (``site.allow_uids``, ``jobs.X.allow_gids``) names."""
    return "user" if key.endswith("allow_uids") else "group"


def user_label(uid: int) -> str:
    """``1000 (alice)``, or the number alone where no user has it."""
    try:
        return f"{uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return str(uid)


def group_label(gid: int) -> str:
    """``27 (sudo)``, or the number alone where no group has it."""
    try:
        return f"{gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return str(gid)


def uid_of(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def gid_of(name: str) -> int:
    return grp.getgrnam(name).gr_gid


def ids(
    reader: Reader, value: object, key: str, by_name: Callable[[str], int]
) -> tuple[int, ...] | None:
    """Numeric ids, or names looked up on this machine (``by_name``)."""
    if value is None:
        return None
    found: list[int] = []
    for index, item in enumerate(reader.array(value, key)):
        item_key = f"{key}[{index}]"
        if isinstance(item, str):
            try:
                number = by_name(reader.string(item, item_key))
            except KeyError:
                raise reader.error(item_key, f"no such {_id_kind(key)} {item!r}") from None
        elif isinstance(item, int) and not isinstance(item, bool):
            number = reader.integer(item, item_key, 0, MAX_ID)
        else:
            raise reader.error(
                item_key,
                f"expected a numeric id or a {_id_kind(key)} name, got {type_name(item)} {item!r}",
            )
        if number not in found:
            found.append(number)
    return tuple(found)


def socket_mode(reader: Reader, value: object) -> int:
    key = "site.socket_mode"
    if isinstance(value, str):
        if not _SOCKET_MODE_STRING.fullmatch(value):
            raise reader.error(key, f"{value!r} is not an octal mode like '0660'")
        return int(value.removeprefix("0o"), 8)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 0o777:
            raise reader.error(key, f"{value:#o} is not a file mode (0..0o777)")
        return value
    raise reader.error(key, f"expected an integer or an octal string, got {type_name(value)}")
