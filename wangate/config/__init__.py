"""The gateway's TOML configuration, validated strictly.

``schema`` holds what a valid configuration is (one frozen dataclass per section),
``parse`` reads a file section by section with the generic checks of ``reader``,
``tls_material`` checks the certificate and key files, ``access`` the local API's
socket mode, users and groups, and ``jobs`` the training jobs and who may join each.
"""

from __future__ import annotations

from wangate.config.jobs import job_admission_error, unknown_job_error
from wangate.config.parse import load_config, parse_config
from wangate.config.schema import (
    MAX_MTU,
    MIN_MTU,
    CollectiveConfig,
    CompressionConfig,
    Config,
    CriticalConfig,
    FecConfig,
    JobConfig,
    JobsConfig,
    LimitsConfig,
    MetricsConfig,
    PathConfig,
    PeerConfig,
    SiteConfig,
    TlsConfig,
    WorkersConfig,
)

__all__ = [
    "MAX_MTU",
    "MIN_MTU",
    "CollectiveConfig",
    "CompressionConfig",
    "Config",
    "CriticalConfig",
    "FecConfig",
    "JobConfig",
    "JobsConfig",
    "LimitsConfig",
    "MetricsConfig",
    "PathConfig",
    "PeerConfig",
    "SiteConfig",
    "TlsConfig",
    "WorkersConfig",
    "job_admission_error",
    "load_config",
    "parse_config",
    "unknown_job_error",
]
