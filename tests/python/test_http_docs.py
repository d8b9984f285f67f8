"""The Python examples of docs/python.md's web sections (Flask, FastAPI and
Starlette, Headers, Client IP, Metrics and logs; Django's are
test_django_docs.py's) run as written, and print what their comments say:
each `print(...)  # text` line must print `text`."""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
MINE = DOC[DOC.index("## Flask"):]
# The Django section's examples are a project, run by test_django_docs.py.
_DJANGO = MINE.index("\n## Django\n")
MINE = MINE[:_DJANGO] + MINE[MINE.index("\n## ", _DJANGO + 1):]
BLOCKS = re.findall(r"```python\n(.*?)```", MINE, re.S)


def expected_output(code):
    return [m.group(1) for m in re.finditer(r"^\s*print\(.*\)\s+# (.*)$", code, re.M)]


def test_the_sections_have_examples():
    assert len(BLOCKS) >= 5
    assert sum(len(expected_output(code)) for code in BLOCKS) >= 10


@pytest.mark.parametrize("n", range(len(BLOCKS)))
def test_example_runs_and_prints_what_it_says(n):
    code = BLOCKS[n]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"docs/python.md web example {n + 1}", "exec"),   # noqa: S102
             {"__name__": "doc"})
    assert out.getvalue().splitlines() == expected_output(code)
