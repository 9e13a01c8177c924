"""Builds wangate's native data plane (``wangate.engine._engine``) with the package.

Everything else is in pyproject.toml.  The engine links OpenSSL's libcrypto; when its
headers are missing the build stops with the package to install, instead of a
compiler error.  ``WANGATE_ENGINE_SANITIZE=1`` builds it with AddressSanitizer and
UndefinedBehaviorSanitizer (``make asan`` runs the suite against such a build).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = sorted(str(p) for p in Path("wangate/engine/src").glob("*.c"))
MISSING_OPENSSL = (
    "wangate's engine needs OpenSSL's libcrypto and its headers (openssl/evp.h), "
    "and none were found.  Install them and run pip again: on Debian or Ubuntu "
    "`apt-get install libssl-dev`, on Fedora or RHEL `dnf install openssl-devel`, "
    "on Alpine `apk add openssl-dev`."
)


def _has_openssl(compiler: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "probe.c")
        source.write_text("#include <openssl/evp.h>\nint main(void){return EVP_MAX_MD_SIZE>0?0:1;}\n")
        done = subprocess.run(
            [compiler, str(source), "-o", str(Path(tmp, "probe")), "-lcrypto"],
            capture_output=True,
        )
        return done.returncode == 0


class BuildEngine(build_ext):
    def run(self) -> None:
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            sys.exit("wangate's engine needs a C compiler (gcc or clang) to build")
        if not _has_openssl(compiler):
            sys.exit(MISSING_OPENSSL)
        super().run()


CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-D_GNU_SOURCE"]
LDFLAGS: list[str] = []
if os.environ.get("WANGATE_ENGINE_SANITIZE") == "1":
    CFLAGS = [*CFLAGS[:2], "-O1", "-g", "-fno-omit-frame-pointer",
              "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", *CFLAGS[2:]]
    LDFLAGS = ["-fsanitize=address,undefined"]

setup(
    ext_modules=[
        Extension(
            "wangate.engine._engine",
            sources=SOURCES,
            include_dirs=["wangate/engine/src"],
            libraries=["crypto"],
            extra_compile_args=CFLAGS,
            extra_link_args=LDFLAGS,
        )
    ],
    cmdclass={"build_ext": BuildEngine},
)
