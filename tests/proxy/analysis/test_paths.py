"""Source paths as people read them: a registry crate's from its directory,
the standard library's from library/, the program's own as they are; the
full path with --paths full and in JSON."""

from __future__ import annotations

import contextvars

import pytest

from proxy.analysis.model import SourceLoc
from proxy.analysis.paths import STYLE, set_style, short_path
from proxy.commands.document import _loc


@pytest.mark.parametrize("path,shown", [
    ("/usr/share/cargo/registry/tokio-1.53.2/src/sync/watch.rs", "tokio-1.53.2/src/sync/watch.rs"),
    ("/home/ci/.cargo/registry/src/index.crates.io-6f17d22bba15001f/tokio-1.38.0/src/lib.rs",
     "tokio-1.38.0/src/lib.rs"),  # the index directory's hash is no version
    ("/x/futures-util-0.3.31/src/async_await/select_mod.rs", "futures-util-0.3.31/src/async_await/select_mod.rs"),
    ("/x/tokio-1.0.0-alpha.1/src/lib.rs", "tokio-1.0.0-alpha.1/src/lib.rs"),
    ("/home/a/app-0.1.0/vendor/tokio-1.38.0/src/a.rs", "tokio-1.38.0/src/a.rs"),  # the innermost crate
    ("/rustc/90b35a6239c3d8bdabc530a6a0816f7ff89a0aaf/library/core/src/future/mod.rs",
     "library/core/src/future/mod.rs"),
    ("/usr/src/rustc-1.63.0/library/core/src/future/mod.rs", "rustc-1.63.0/library/core/src/future/mod.rs"),
    ("/work/app/src/main.rs", "/work/app/src/main.rs"),  # the program's own file
    ("src/main.rs", "src/main.rs"),
    ("/x/foo-1.2.3.rs", "/x/foo-1.2.3.rs"),  # a file's own name is never a crate directory
])
def test_short_path(path: str, shown: str) -> None:
    assert short_path(path) == shown


def test_style_full_and_json_keep_the_whole_path() -> None:
    loc = SourceLoc("/usr/share/cargo/registry/tokio-1.53.2/src/sync/watch.rs", 999)

    def render() -> tuple[str, str, object]:
        return str(loc), loc.full, _loc(loc)

    short = contextvars.copy_context().run(render)
    assert short[0] == "tokio-1.53.2/src/sync/watch.rs:999"
    assert short[1] == "/usr/share/cargo/registry/tokio-1.53.2/src/sync/watch.rs:999"
    assert short[2] == {"file": loc.file, "line": 999}

    def full() -> tuple[str, str, object]:
        set_style("full")
        return render()

    assert contextvars.copy_context().run(full) == (short[1], short[1], short[2])
    assert STYLE.get() == "short"  # the setting stays in the context that made it
    with pytest.raises(ValueError, match="--paths"):
        set_style("relative")
