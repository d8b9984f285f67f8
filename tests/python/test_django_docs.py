"""docs/python.md's Django section runs as written: its blocks that name a
file (a first line "# mysite/settings.py") are written as a project into a
temporary directory, and each other block runs in a Python process of its
own on that project (Django's settings belong to a process), printing what
its comments say: each `print(...)  # text` line must print `text`."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
START = DOC.index("\n## Django\n")
SECTION = DOC[START:DOC.index("\n## ", START + 1)]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, re.S)
FILE_RE = re.compile(r"# ([\w/]+\.py)\n")
FILES = {m.group(1): code for code in BLOCKS for m in [FILE_RE.match(code)] if m}
SCRIPTS = [code for code in BLOCKS if not FILE_RE.match(code)]

RUN = """
import os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
import django
django.setup()
exec(compile(sys.stdin.read(), "docs/python.md Django example", "exec"), {"__name__": "doc"})
"""


def expected_output(code):
    return [m.group(1) for m in re.finditer(r"^\s*print\(.*\)\s+# (.*)$", code, re.M)]


def test_the_section_has_a_project_and_examples():
    assert sorted(FILES) == ["mysite/keys.py", "mysite/settings.py", "mysite/urls.py",
                             "mysite/views.py"]
    assert len(SCRIPTS) >= 1
    assert sum(len(expected_output(code)) for code in SCRIPTS) >= 7


@pytest.mark.parametrize("n", range(len(SCRIPTS)))
def test_example_runs_on_the_project_and_prints_what_it_says(tmp_path, n):
    for name, code in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HIRATE_", "DJANGO_")) and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(tmp_path)
    code = SCRIPTS[n]
    p = subprocess.run([sys.executable, "-c", RUN], input=code, capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=100)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == expected_output(code)
