"""Every code block of README.md and docs/*.md that claims to run, run
(CONTRIBUTING.md, "Code blocks in the docs", states the convention):

- ```c: a whole program (it has main) is compiled with -Wall -Wextra -Werror
  against the library just built and run, and must exit 0; ```c fragment is
  compiled, not run, as the body of a function that has `hirate_options o`
  (defaults filled) and `hirate_limiter *lim` in scope;
- ```python with the package just built; ```lua with the Lua 5.4 module
  just built; each must finish without an error;
- ```sh in a scratch directory that holds app.c (the page's first whole C
  program) and a scratch install of the library (PKG_CONFIG_PATH points at
  it), with the hirate tool on PATH; it must exit 0;
- a block marked norun (```sh norun) is shown, not run: a command that
  installs or builds, a transcript, or a part of a bigger program.

Blocks that name redis://127.0.0.1:6379 run against a throwaway
redis-server put in its place; REDIS_URL names it too. The pages whose
blocks of one language their own suite runs (with the servers and fixtures
they name) are listed in OWNED and left to it.

    HIRATE_INTEGRATION_BUILD=<build dir of tests/integration> \\
        python3 tests/docs/test_blocks.py
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from redis_server import RedisServer  # noqa: E402

PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RUN = {"c", "python", "lua", "sh"}
MARKS = {"norun", "fragment"}
# (page, language): the suite that runs those blocks.
OWNED = {
    ("docs/python.md", "python"): "tests/python/test_limiter_docs.py and test_http_docs.py",
    ("docs/lua.md", "lua"): "tests/lua/docs_spec.lua and sentinel_spec.lua (the rest: norun)",
}
FENCE = re.compile(r"^```([^\s`]*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
DEFAULT_REDIS = "redis://127.0.0.1:6379"


def blocks():
    """(page, line, lang, marks, text) of every fenced block of the pages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((str(page.relative_to(ROOT)), line, m.group(1), m.group(2).split(),
                          m.group(3)))
    return found


BUILD = Path(os.environ.get("HIRATE_INTEGRATION_BUILD", ROOT / "build-integration"))
REDIS = None
SCRATCH = None


def setUpModule():
    global REDIS, SCRATCH
    REDIS = RedisServer()
    SCRATCH = tempfile.TemporaryDirectory(prefix="hirate-docs-")
    prefix = Path(SCRATCH.name) / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD / "hirate"), "--prefix", str(prefix)],
                   check=True, capture_output=True)


def tearDownModule():
    if REDIS:
        REDIS.stop()
    if SCRATCH:
        SCRATCH.cleanup()


def run(argv, cwd, **env):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, REDIS_URL=REDIS.url, **env))


def with_server(text):
    return text.replace(DEFAULT_REDIS, REDIS.url)


C_PRELUDE = """#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hirate.h>
int fragment(void);
int fragment(void)
{
    hirate_options o;
    hirate_options_init(&o);
    hirate_limiter *lim = NULL;
"""
C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-D_POSIX_C_SOURCE=200809L"]


def cc(source, out, cwd, extra=()):
    lib = BUILD / "hirate" / "libhirate.a"
    return run(["cc", *C_FLAGS, *extra, "-I", str(ROOT / "core" / "include"), "-o", str(out),
                str(source), str(lib), "-lhiredis", "-lssl", "-lcrypto", "-lpthread", "-lm"],
               cwd)


class Blocks(unittest.TestCase):
    def test_the_pages_have_blocks_that_run(self):
        langs = [b[2] for b in blocks() if b[2] in RUN and "norun" not in b[3]]
        self.assertGreaterEqual(langs.count("c"), 8)
        self.assertGreaterEqual(langs.count("sh"), 1)

    def test_marks_are_known(self):
        for page, line, lang, marks, _ in blocks():
            with self.subTest(f"{page}:{line}"):
                self.assertLessEqual(set(marks), MARKS)
                if "fragment" in marks:
                    self.assertEqual(lang, "c", "fragment is a mark of C blocks only")

    def test_every_block_that_claims_to_run_runs(self):
        first_program = {}
        for page, line, lang, marks, text in blocks():
            if lang == "c" and "main(" in text and not marks:
                first_program.setdefault(page, text)
        ran = 0
        for page, line, lang, marks, text in blocks():
            if lang not in RUN or "norun" in marks or (page, lang) in OWNED:
                continue
            with self.subTest(f"{page}:{line} ({lang})"):
                with tempfile.TemporaryDirectory(dir=SCRATCH.name) as d:
                    self.run_block(Path(d), page, lang, marks, with_server(text),
                                   first_program.get(page))
                ran += 1
        self.assertGreaterEqual(ran, 10)

    def run_block(self, d, page, lang, marks, text, app):
        if lang == "c" and "fragment" in marks:
            body = "".join("    " + line for line in text.splitlines(True))
            (d / "block.c").write_text(C_PRELUDE + body + "\n    (void)o;\n    (void)lim;\n"
                                       "    return 0;\n}\n")
            p = cc(d / "block.c", d / "block.o", d, ["-c", "-Wno-unused-variable",
                                                     "-Wno-unused-but-set-variable"])
            self.assertEqual(p.returncode, 0, p.stderr)
        elif lang == "c":
            self.assertIn("main(", text, "a C block is a whole program, or marked fragment")
            (d / "block.c").write_text(text)
            p = cc(d / "block.c", d / "block", d)
            self.assertEqual(p.returncode, 0, p.stderr)
            p = run([str(d / "block")], d)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        elif lang == "python":
            p = run([sys.executable, "-c", text], d, PYTHONPATH=str(BUILD / "py"))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        elif lang == "lua":
            (d / "block.lua").write_text(text)
            p = run(["lua5.4", str(d / "block.lua")], d,
                    LUA_PATH=f"{ROOT}/bindings/lua/?.lua;;",
                    LUA_CPATH=f"{BUILD}/lua-5.4/?.so;;")
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        else:
            if app:
                (d / "app.c").write_text(with_server(app))
            prefix = Path(SCRATCH.name) / "prefix"
            pc = next(prefix.glob("lib*/pkgconfig"))
            tool = BUILD / "hirate" / "core" / "cli"
            p = run(["sh", "-ec", text], d, PKG_CONFIG_PATH=str(pc),
                    PATH=f"{tool}:{os.environ['PATH']}",
                    LD_LIBRARY_PATH=str(pc.parent))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
