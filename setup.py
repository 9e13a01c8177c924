"""Builds wangate's native parts with the package: the data plane
(``wangate.engine._engine``) and the sans-IO core compiled by mypyc.

Everything else is in pyproject.toml.  The engine links OpenSSL's libcrypto; when its
headers are missing the build stops with the package to install, instead of a
compiler error.  ``WANGATE_ENGINE_SANITIZE=1`` builds it with AddressSanitizer and
UndefinedBehaviorSanitizer (``make asan`` runs the suite against such a build).

The core's per-datagram logic (scheduling, acks, loss detection, FEC bookkeeping,
reassembly) runs as C compiled from its typed Python by mypyc: the same source, the
same behaviour (mypyc checks the annotations at run time), 1.4-1.8x the datagrams
per CPU-second (bench/RESULTS.md).  The compiled modules lie beside their sources and
are imported in their place (delete them to run the core interpreted).
``WANGATE_COMPILE_CORE=0`` builds the engine alone and leaves compiled modules as they
are (``make asan`` swaps the engine that way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# the modules a datagram passes through, compiled; the rest of the core stays interpreted
# (the shell, the CLI and the codecs are not per-datagram work)
COMPILED_CORE = [
    f"wangate/core/{name}.py"
    for name in (
        "capacity",
        "coding",
        "control_outbox",
        "datagrams",
        "estimator",
        "fairqueue",
        "frames",
        "governor",
        "inbound",
        "liveness",
        "outbound",
        "outbound_message",
        "path_table",
        "paths",
        "rangeset",
        "scheduler",
        "selector",
        "sending",
        "sent_outcomes",
        "session",
        "timers",
    )
]
# The build's own environment has none of the run-time dependencies (numpy, aioquic):
# what the compiled modules import from the rest of the package is read for its types,
# its own errors left to `make lint`, and a missing library is Any.
MYPYC_OPTIONS = ["--follow-imports=silent", "--ignore-missing-imports"]
MYPYC_BUILD = {"multi_file": True, "group_name": "wangate_core"}  # one C file a module
COMPILE_CORE = os.environ.get("WANGATE_COMPILE_CORE", "1") != "0"
BUILDING_COMMANDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
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
        source.write_text(
            "#include <openssl/evp.h>\nint main(void){return EVP_MAX_MD_SIZE>0?0:1;}\n"
        )
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

    def finalize_options(self) -> None:
        # here, not at import, and only when building: pip runs this file for metadata too
        # (which asks build_ext for its sources), and mypyc type-checks and translates the
        # core each time it is called
        modules = self.distribution.ext_modules
        building = BUILDING_COMMANDS & set(self.distribution.commands)
        added = any(e.name.startswith("wangate.core.") for e in modules)
        if COMPILE_CORE and building and not added:
            from mypyc.build import mypycify

            modules.extend(mypycify(MYPYC_OPTIONS + COMPILED_CORE, **MYPYC_BUILD))
        super().finalize_options()

    def build_extension(self, ext: Extension) -> None:
        # the C files of one extension compiled side by side (build_ext does one at a
        # time), then linked as build_ext does
        compile_one = self.compiler.compile
        jobs = min(len(ext.sources), os.cpu_count() or 1)
        if jobs > 1:

            def compile_all(sources: list[str], **kwargs: object) -> list[str]:
                def one(source: str) -> list[str]:
                    return list(compile_one([source], **kwargs))  # type: ignore[arg-type]

                with ThreadPoolExecutor(jobs) as pool:
                    return [obj for objs in pool.map(one, sources) for obj in objs]

            self.compiler.compile = compile_all  # type: ignore[method-assign]
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_one  # type: ignore[method-assign]


CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-D_GNU_SOURCE"]
LDFLAGS: list[str] = []
if os.environ.get("WANGATE_ENGINE_SANITIZE") == "1":
    CFLAGS = [
        *CFLAGS[:2],
        "-O1",
        "-g",
        "-fno-omit-frame-pointer",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined",
        *CFLAGS[2:],
    ]
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
