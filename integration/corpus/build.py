"""Builds the offline Rust test corpus for every configuration.

Theory of operation
-------------------
The corpus is one cargo package (``integration/corpus``) with one binary per
program, so all programs of a configuration share one build of tokio. Crates
come from Debian's packaged sources (``.cargo/config.toml`` replaces
crates.io with ``/usr/share/cargo/registry`` and sets ``offline``).

A *configuration* is a toolchain plus a profile plus flags. Each one has its
own cargo target dir, ``<cache>/cargo-target/<config>`` (``cache_dir()``), so cargo's
own freshness check makes a warm build a no-op; the finished binaries are
copied (atomically, by rename) to ``integration/build/corpus/<config>/<program>``
when they changed. Checkouts share that file (a worktree's ``integration/build`` may
be a link), so a test runs, analyses and probes its own hard link of it: ``pinned()``.

Toolchains:

* ``new``: rustup's cargo and rustc (1.95 on this image, ``~/.cargo/bin``).
  Needs rustc >= 1.85 (async closures in ``nested``).
* ``old``: Debian's rustc 1.63 (``/usr/bin/rustc``) driven by Debian's cargo
  package (``/usr/bin/cargo``, cargo 1.65). Cargo 1.95 cannot drive rustc
  1.63: it asks rustc for ``--print=split-debuginfo``, which 1.63 rejects.
  Both cargos read the committed ``Cargo.lock`` because it is kept at lock
  format version 3 (cargo 1.65 cannot read version 4; cargo 1.95 keeps the
  version of an existing lock file). Cargo 1.65 warns that the ``[lints]``
  key is unused: harmless. Sources newer than 1.63 sit in modules left out by
  ``--cfg old_rustc`` (their first line says ``// corpus: min-rustc X.Y``).

A configuration whose toolchain is missing is skipped with a ``SkipReason``.

The modern corpus (``integration/corpus_modern/<release>``, one package per
Debian release: ``trixie`` with tokio 1.43, ``sid`` with tokio 1.53) builds
the same way under its own configs (``trixie-debug``, ``sid-release``, ...),
each package's ``.cargo/config.toml`` pointing at the crate sources that
``bash scripts/fetch-crates <release>`` unpacks into
``integration/build/crates/<release>`` (a link into the cache); a config whose crates were not
fetched is skipped with a ``SkipReason`` that says so. The ``*-dump`` configs
add ``--cfg tokio_unstable --cfg tokio_taskdump`` (tokio's own task dump).

Usage::

    python integration/corpus/build.py [--config NAME ...] [--program NAME ...]

and from Python: ``build(configs=None, programs=None)``,
``binary(config, program)`` and ``pinned(path)``.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
REPO_DIR = CORPUS_DIR.parent.parent
BUILD_DIR = REPO_DIR / "integration" / "build"
OUT_DIR = BUILD_DIR / "corpus"


def cache_dir() -> Path:
    """What outlives a clone: cargo's target dirs (the crates' builds), Debian's crates of
    other releases, the newer debuggers' chroots. ``$ASYNCRSP_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/asyncrsp``, else ``~/.cache/asyncrsp`` (the same rule as proxy/analysis/cache.py; the scripts say it in shell)."""
    env = os.environ.get("ASYNCRSP_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "asyncrsp"


CACHE_DIR = cache_dir()
# Shared by every clone: a clone's own crate is rebuilt (its paths differ), the
# dependencies are not. A lock per config keeps one clone's cargo run and copy whole.
TARGET_ROOT = CACHE_DIR / "cargo-target"

PROGRAMS: tuple[str, ...] = ("nested", "tokio_app", "tokio_bench", "stuck", "many_tasks", "poll_timing", "combinators",
                             "http_server", "crash", "deadlock", "first_poll", "lost_waker")
MODERN_DIR = REPO_DIR / "integration" / "corpus_modern"
CRATES_DIR = BUILD_DIR / "crates"  # scripts/fetch-crates: a link to <cache>/crates
# The modern corpus' programs per package (= Debian release of its crates).
MODERN_PROGRAMS: dict[str, tuple[str, ...]] = {
    "trixie": ("tk_dump", "tk_sync", "hyper_svc", "astd", "smol_app", "fut_exec", "stuck", "tk_join3", "tk_streams"),
    "sid": ("tk_dump", "tk_sync", "axum_svc", "stuck", "deadlock", "lost_waker"),
    # The gauntlet (integration/realworld): the authors' own examples in ../shared/realworld
    # and in sid's crate packages, built against sid's crates (`bash scripts/fetch-crates
    # realworld`); scripts/realworld.
    "realworld": ("tokio_chat", "tokio_tinydb", "tokio_tinyhttp", "tokio_proxy", "tokio_graceful_shutdown",
                  "tokio_echo_tcp", "hyper_gateway", "hyper_http_proxy", "hyper_echo", "hyper_state",
                  "hyper_send_file", "hyper_single_threaded", "hyper_multi_server", "axum_key_value_store",
                  "axum_chat", "axum_graceful_shutdown", "axum_sse", "axum_reverse_proxy", "smol_chat_server",
                  "smol_chat_client", "tungstenite_server", "async_std_a_chat", "h2_server"),
}
# A crate set whose package is not integration/corpus_modern/<set>.
PACKAGE_DIRS: dict[str, Path] = {"realworld": REPO_DIR / "integration" / "realworld"}
# ... and whose sources are all outside the clone (the gauntlet's programs in ../shared): built
# from one copy of its manifest in the cache (stable_package), the same for every clone.
SHARED_SOURCES = frozenset({"realworld"})

NEW_MIN_RUSTC = (1, 85)
OLD_RUSTC = Path("/usr/bin/rustc")
OLD_CARGO = Path("/usr/bin/cargo")


TASKDUMP_FLAGS = ("--cfg", "tokio_unstable", "--cfg", "tokio_taskdump")
AARCH64_TARGET = "aarch64-unknown-linux-gnu"
AARCH64_LINKER_ENV = "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
AARCH64_LINKER = "aarch64-linux-gnu-gcc"
# What a cross build needs besides the toolchain: the target's std (rustc's sysroot) and a linker.
TARGET_NEEDS: dict[str, tuple[tuple[Path, str], ...]] = {
    AARCH64_TARGET: ((Path("/usr/lib/rustlib") / AARCH64_TARGET / "lib", "libstd-rust-dev:arm64"),
                     (Path("/usr/bin") / AARCH64_LINKER, "gcc-aarch64-linux-gnu")),
}


@dataclass(frozen=True, slots=True)
class Config:
    """One way of building the corpus: a toolchain, a profile and flags."""

    name: str
    toolchain: str  # "new" (rustup 1.95) or "old" (Debian 1.63)
    release: bool
    profile_env: Mapping[str, str] = field(default_factory=dict)
    rustflags: tuple[str, ...] = ()
    # An explicit --target keeps RUSTFLAGS off host crates (proc macros, build
    # scripts): a proc macro cannot link with relocation-model=static.
    target: str | None = None
    # The modern corpus: the Debian release whose crates it builds against
    # (its package is integration/corpus_modern/<crates>); None: the 1.24 corpus.
    crates: str | None = None

    package: Path | None = None  # where it is built from, when not its package in this clone

    @property
    def package_dir(self) -> Path:
        if self.package is not None:
            return self.package
        if self.crates is None:
            return CORPUS_DIR
        return PACKAGE_DIRS.get(self.crates, MODERN_DIR / self.crates)

    @property
    def programs(self) -> tuple[str, ...]:
        return PROGRAMS if self.crates is None else MODERN_PROGRAMS[self.crates]


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("debug", "new", release=False),
        Config("release", "new", release=True),
        Config("release-fp", "new", release=True, rustflags=("-C", "force-frame-pointers=yes")),
        Config(
            "release-lines",
            "new",
            release=True,
            profile_env={"CARGO_PROFILE_RELEASE_DEBUG": "line-tables-only"},
        ),
        Config(
            "lto",
            "new",
            release=True,
            profile_env={"CARGO_PROFILE_RELEASE_LTO": "fat"},
        ),
        # Not position-independent (linked at 0x400000): gdbserver's fast
        # tracepoints need the code within 2 GiB of the in-process agent's
        # MAP_32BIT jump pads (proxy/capture/fast_sites.py).
        Config("debug-nopie", "new", release=False, rustflags=("-C", "relocation-model=static"),
               target="x86_64-unknown-linux-gnu"),
        Config("old-debug", "old", release=False, rustflags=("--cfg", "old_rustc")),
        Config("old-release", "old", release=True, rustflags=("--cfg", "old_rustc")),
        # AArch64 (run under qemu-aarch64): Debian's rustc 1.63 with libstd-rust-dev:arm64, the
        # only aarch64 std this offline machine has (scripts/arm64-toolchain installs it)
        *(Config(f"old-aarch64-{kind}", "old", release=kind == "release", rustflags=("--cfg", "old_rustc"),
                 target=AARCH64_TARGET, profile_env={AARCH64_LINKER_ENV: AARCH64_LINKER})
          for kind in ("debug", "release")),
        *(Config(f"{rel}-{kind}", "new", release=kind == "release", crates=rel)
          for rel in MODERN_PROGRAMS for kind in ("debug", "release")),
        *(Config(f"trixie-dump-{kind}", "new", release=kind == "release", crates="trixie",
                 rustflags=TASKDUMP_FLAGS) for kind in ("debug", "release")),
        # tokio 1.53 with tokio_unstable: the spawn location each task records (>= 1.46)
        *(Config(f"sid-unstable-{kind}", "new", release=kind == "release", crates="sid",
                 rustflags=("--cfg", "tokio_unstable")) for kind in ("debug", "release")),
    )
}


@dataclass(frozen=True, slots=True)
class SkipReason:
    """Why a (config, program) was not built: a missing toolchain."""

    config: str
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.config}: {self.reason}"


class CorpusError(Exception):
    """Bad request (unknown config/program) or a failed build."""


class BuildFailed(CorpusError):
    """cargo exited non-zero; carries the command and the end of its output."""

    def __init__(self, config: str, command: Sequence[str], output: str) -> None:
        tail = "\n".join(output.splitlines()[-40:])
        super().__init__(f"corpus build of {config!r} failed: {' '.join(command)}\n{tail}")
        self.config = config
        self.command = tuple(command)
        self.output = output


@dataclass(frozen=True, slots=True)
class Toolchain:
    """Resolved paths of one toolchain's cargo and rustc."""

    cargo: Path
    rustc: Path
    version: tuple[int, int]


def _rustc_version(rustc: Path) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [str(rustc), "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"rustc (\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2])) if match else None


def _new_toolchain() -> Toolchain | SkipReason:
    """rustup's cargo+rustc; PATH's cargo may be Debian's old one, so check."""
    home_bin = Path.home() / ".cargo" / "bin"
    candidates = [home_bin]
    found = shutil.which("cargo")
    if found:
        candidates.append(Path(found).parent)
    for directory in candidates:
        cargo, rustc = directory / "cargo", directory / "rustc"
        if not (cargo.exists() and rustc.exists()):
            continue
        version = _rustc_version(rustc)
        if version is not None and version >= NEW_MIN_RUSTC:
            return Toolchain(cargo, rustc, version)
    need = ".".join(map(str, NEW_MIN_RUSTC))
    return SkipReason("new", f"no cargo+rustc >= {need} in ~/.cargo/bin or PATH (install rustup)")


def _old_toolchain() -> Toolchain | SkipReason:
    if not OLD_RUSTC.exists():
        return SkipReason("old", f"{OLD_RUSTC} missing (apt-get install rustc)")
    if not OLD_CARGO.exists():
        return SkipReason("old", f"{OLD_CARGO} missing (apt-get install cargo)")
    version = _rustc_version(OLD_RUSTC)
    if version is None:
        return SkipReason("old", f"{OLD_RUSTC} --version failed")
    return Toolchain(OLD_CARGO, OLD_RUSTC, version)


@lru_cache(maxsize=None)
def toolchain(kind: str) -> Toolchain | SkipReason:
    """The toolchain of kind ``new`` or ``old``, or why it is unavailable."""
    return _new_toolchain() if kind == "new" else _old_toolchain()


def output_path(config: str, program: str) -> Path:
    """Where the built binary of ``program`` under ``config`` lives."""
    return OUT_DIR / config / program


def _cargo_env(config: Config, tools: Toolchain) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CARGO_PROFILE_", "CARGO_BUILD_", "CARGO_TARGET_"))
        and k not in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC", "RUSTC_WRAPPER", "RUSTUP_TOOLCHAIN")
    }
    env["RUSTC"] = str(tools.rustc)
    env["RUSTDOC"] = str(tools.rustc.with_name("rustdoc"))
    # Put the chosen toolchain first so build scripts find the same rustc.
    env["PATH"] = f"{tools.rustc.parent}{os.pathsep}{env.get('PATH', '')}"
    env["RUSTFLAGS"] = " ".join(config.rustflags)
    env.update(config.profile_env)
    return env


def _cargo_command(config: Config, tools: Toolchain, programs: Iterable[str]) -> list[str]:
    command = [str(tools.cargo), "build", "--target-dir", str(TARGET_ROOT / config.name)]
    if config.release:
        command.append("--release")
    if config.target:
        command += ["--target", config.target]
    if config.crates is not None:
        # The package's .cargo/config.toml names the crates by a path relative to the
        # clone; cargo identifies a directory source by its path, so every clone would
        # build the crates again in the shared target dir. Named by the cache's own path,
        # they are one source for every clone.
        registry = crates_registry(config.crates).resolve()
        command += ["--config", f'source.debian-{config.crates}.directory="{registry}"']
    for program in programs:
        command += ["--bin", program]
    return command


def _install(config: Config, program: str) -> Path:
    """Copies cargo's binary to the output dir by an atomic rename, unless the output
    already is a copy of that very build (a no-op build keeps the output's file)."""
    profile_dir = "release" if config.release else "debug"
    built = TARGET_ROOT / config.name / (config.target or "") / profile_dir / program
    target = output_path(config.name, program)
    if _same_build(built, target):
        # A rename puts a new file (inode) at the path, and uprobes attached to the old
        # file never fire in a program started from the new one (see pinned()).
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{program}.")
    os.close(fd)
    shutil.copy2(built, tmp)
    os.replace(tmp, target)
    return target


def _same_build(built: Path, target: Path) -> bool:
    """Is ``target`` the copy of ``built`` that ``_install`` made? Cargo writes a new file
    each time it links (a fresh mtime; a no-op build leaves it alone), copy2 gives the copy
    the built file's mtime to the nanosecond, and the copy is renamed into place whole."""
    try:
        have, want = target.stat(), built.stat()
    except FileNotFoundError:
        return False
    return (have.st_size, have.st_mtime_ns) == (want.st_size, want.st_mtime_ns)


PINNED_DIR = BUILD_DIR / "pinned"  # pinned()'s default: a directory per process, <pid>


def pinned(path: Path, directory: Path | None = None) -> Path:
    """A private name for ``path``'s file as it is now: a hard link (a copy across file
    systems) ``<directory>/<dev>-<inode>/<name>``; the same file pinned again gets the same
    name. By default ``directory`` is this process's own under ``PINNED_DIR``, removed at
    its exit.

    Fact (Linux): a uprobe belongs to a file (inode), not to a path. Every checkout's
    ``build()`` renames a new file over the shared corpus binary when its build differs
    (a checkout rebuilds after another one's: ``_claim``), and probes attached through
    the path before such a rename never fire in a program started through it after
    (0 entries: integration/test_uprobes.py::test_a_binary_replaced_between_the_attach_and_the_exec_...);
    an analysis of one file also finds no such sources or addresses in the other. A test
    that runs, analyses and probes its pinned name has one file throughout."""
    directory = _own_pin_dir() if directory is None else directory
    st = os.stat(path)
    known = directory / f"{st.st_dev:x}-{st.st_ino}" / path.name
    if known.exists():
        return known
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".pin-"))
    mine = staging / path.name
    try:
        os.link(path, mine)  # the same inode: no copy
    except OSError:
        shutil.copy2(path, mine)
    st = os.stat(mine)  # the file linked, if the path was replaced since the stat above
    final = directory / f"{st.st_dev:x}-{st.st_ino}"
    try:
        staging.rename(final)
    except OSError:  # pinned already (same inode): keep that one
        shutil.rmtree(staging, ignore_errors=True)
    return final / path.name


_pin_dir: Path | None = None


def _own_pin_dir() -> Path:
    """This process's pin directory; the ones of processes gone (killed before their
    exit) are removed on the way."""
    global _pin_dir
    if _pin_dir is None:
        PINNED_DIR.mkdir(parents=True, exist_ok=True)
        for other in PINNED_DIR.iterdir():
            if other.name.isdigit() and not _alive(int(other.name)):
                shutil.rmtree(other, ignore_errors=True)
        _pin_dir = PINNED_DIR / str(os.getpid())
        atexit.register(_remove_pin_dir, _pin_dir, os.getpid())
    return _pin_dir


def _remove_pin_dir(directory: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that exits through Python
        shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's
        pass
    return True


def _check_programs(programs: Iterable[str], known: Sequence[str] = PROGRAMS) -> list[str]:
    names = list(programs)
    unknown = [p for p in names if p not in known]
    if unknown:
        raise CorpusError(f"unknown program(s) {unknown}; known: {', '.join(known)}")
    return names


def crates_registry(release: str) -> Path:
    """Where ``scripts/fetch-crates <release>`` unpacks the cargo directory source."""
    return CRATES_DIR / release / "root" / "usr" / "share" / "cargo" / "registry"


def _target_missing(config: Config) -> SkipReason | None:
    """A cross build whose std or linker is not installed."""
    for path, package in TARGET_NEEDS.get(config.target or "", ()):
        if not path.exists():
            return SkipReason(config.name, f"{path} missing: {package} not installed (bash scripts/arm64-toolchain)")
    return None


def _inputs_missing(config: Config) -> SkipReason | None:
    if (missing := _target_missing(config)) is not None:
        return missing
    if config.crates is None or crates_registry(config.crates).is_dir():
        return None
    return SkipReason(config.name, f"Debian {config.crates}'s crates not fetched: run "
                                   f"`bash scripts/fetch-crates {config.crates}` (needs Debian's mirror)")


def _config(name: str) -> Config:
    try:
        return CONFIGS[name]
    except KeyError:
        raise CorpusError(f"unknown config {name!r}; known: {', '.join(CONFIGS)}") from None


def build_config(name: str, programs: Sequence[str] | None = None) -> dict[str, Path] | SkipReason:
    """Builds ``programs`` (default: all of the config's package) under one config with one cargo run."""
    config = _config(name)
    names = _check_programs(config.programs if programs is None else programs, config.programs)
    tools = toolchain(config.toolchain)
    if isinstance(tools, SkipReason):
        return SkipReason(name, tools.reason)
    missing = _inputs_missing(config)
    if missing is not None:
        return missing
    if config.crates in SHARED_SOURCES:
        config = replace(config, package=stable_package(config.package_dir))
    command = _cargo_command(config, tools, names)
    lock = TARGET_ROOT / f"{config.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        # Another clone's cargo run on the same target dir would replace the binary
        # between this run and its copy.
        fcntl.flock(held, fcntl.LOCK_EX)
        _claim(config, tools)
        result = subprocess.run(
            command,
            cwd=config.package_dir,
            env=_cargo_env(config, tools),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise BuildFailed(name, command, result.stdout + result.stderr)
        _clone_stamp(config).write_text(str(config.package_dir))
        return {program: _install(config, program) for program in names}


def stable_package(package: Path) -> Path:
    """A package whose every source is outside the clone (``../shared``), as one copy of its
    manifest in the cache, its bins' paths made absolute: cargo's fingerprints hold the
    package's path, so each clone building its own ``integration/realworld`` cleaned and
    relinked every program in the shared target dir (``_claim``), one clone after another.
    From the copy (named by the manifest's hash and where the sources are) a warm build is
    cargo's no-op for every clone."""
    text = (package / "Cargo.toml").read_text()
    text = re.sub(r'^path = "([^"]+)"', lambda m: f'path = "{(package / m.group(1)).resolve()}"', text, flags=re.M)
    lock = (package / "Cargo.lock").read_bytes()
    config = (package / ".cargo" / "config.toml").read_bytes()
    digest = hashlib.sha256(text.encode() + b"\0" + lock + b"\0" + config).hexdigest()[:16]
    where = CACHE_DIR.resolve() / "packages" / f"{package.name}-{digest}"
    if not (where / "Cargo.toml").exists():
        tmp = Path(tempfile.mkdtemp(dir=where.parent if where.parent.exists() else _mkdir(where.parent)))
        (tmp / ".cargo").mkdir()
        (tmp / ".cargo" / "config.toml").write_bytes(config)
        (tmp / "Cargo.lock").write_bytes(lock)
        (tmp / "Cargo.toml").write_text(text)
        try:
            tmp.rename(where)
        except OSError:  # another clone made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return where


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _clone_stamp(config: Config) -> Path:
    return TARGET_ROOT / f"{config.name}.clone"


def _claim(config: Config, tools: Toolchain) -> None:
    """Fact (cargo 1.65 and 1.95): cargo's fingerprints of a package are relative to the
    package, so with the target dir shared by every clone, a clone whose sources are older
    than another clone's build takes that build as fresh, the other clone's paths inside.
    When the last build came from another clone, this package's own artifacts are cleaned
    first (the crates' builds are kept)."""
    try:
        last = _clone_stamp(config).read_text()
    except OSError:
        last = None
    if last == str(config.package_dir):
        return
    with (config.package_dir / "Cargo.toml").open("rb") as fh:
        package = tomllib.load(fh)["package"]["name"]
    command = [str(tools.cargo), "clean", "-p", package, "--target-dir", str(TARGET_ROOT / config.name)]
    if config.release:
        command.append("--release")
    if config.target:
        command += ["--target", config.target]
    subprocess.run(command, cwd=config.package_dir, env=_cargo_env(config, tools),
                   stdin=subprocess.DEVNULL, capture_output=True, text=True)


def build(
    configs: Iterable[str] | None = None, programs: Iterable[str] | None = None
) -> dict[tuple[str, str], Path | SkipReason]:
    """Builds every (config, program) asked for (default: all of both).

    Configs are built one after another (one cargo at a time: 2 cores).
    Raises ``BuildFailed`` when cargo fails, ``CorpusError`` on bad names.
    """
    config_names = list(CONFIGS) if configs is None else list(configs)
    asked = None if programs is None else list(programs)
    for name in config_names:
        _check_programs(asked or (), _config(name).programs)
    results: dict[tuple[str, str], Path | SkipReason] = {}
    for name in config_names:
        names = CONFIGS[name].programs if asked is None else asked
        built = build_config(name, names)
        for program in names:
            results[(name, program)] = built if isinstance(built, SkipReason) else built[program]
    return results


class ToolchainMissing(CorpusError):
    """The config's toolchain is not installed; carries the SkipReason."""

    def __init__(self, skip: SkipReason) -> None:
        super().__init__(str(skip))
        self.skip = skip


_built_this_process: dict[tuple[str, str], Path] = {}


def binary(config: str, program: str) -> Path:
    """The binary of ``program`` under ``config``, built on first use.

    The first call in a process runs cargo (a no-op ~0.1 s when fresh, so a
    changed source is always rebuilt); later calls return the cached path.
    Raises ``CorpusError`` with the skip reason when the toolchain is missing
    (tests turn that into a skip via ``skip_reason``).
    """
    key = (config, program)
    if key not in _built_this_process:
        built = build_config(config, [program])
        if isinstance(built, SkipReason):
            raise ToolchainMissing(built)
        _built_this_process[key] = built[program]
    return _built_this_process[key]


def skip_reason(config: str) -> SkipReason | None:
    """Why ``config`` cannot be built here, or None when it can."""
    tools = toolchain(_config(config).toolchain)
    return SkipReason(config, tools.reason) if isinstance(tools, SkipReason) else _inputs_missing(CONFIGS[config])


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", choices=list(CONFIGS), help="default: all")
    every = sorted({p for c in CONFIGS.values() for p in c.programs})
    parser.add_argument("--program", action="append", choices=every, help="default: all of each config")
    return parser.parse_args(argv)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    status = 0
    for name in args.config or list(CONFIGS):
        programs = [p for p in args.program if p in CONFIGS[name].programs] if args.program \
            else list(CONFIGS[name].programs)
        if not programs:
            continue
        started = time.monotonic()
        cpu_before = _children_cpu()
        try:
            built = build_config(name, programs)
        except CorpusError as error:
            print(error, file=sys.stderr)
            status = 1
            continue
        elapsed, cpu = time.monotonic() - started, _children_cpu() - cpu_before
        if isinstance(built, SkipReason):
            print(f"{name:14} {built}")
        else:
            print(f"{name:14} built {len(built)} program(s) in {elapsed:6.1f} s wall, {cpu:6.1f} s CPU")
    return status


if __name__ == "__main__":
    sys.exit(main())
