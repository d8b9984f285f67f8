"""The Python examples of docs/python.md (the sections up to Flask)
run as written, against a real redis-server where they name one."""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
MINE = DOC[:DOC.index("## Flask")]
BLOCKS = re.findall(r"```python\n(.*?)```", MINE, re.S)


def test_the_sections_have_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("n", range(len(BLOCKS)))
def test_example_runs(n, redis, tls_redis, certs, request):
    # The test's own servers, and patience for a busy machine, where the
    # default 0.1 s could let the fallback decide instead of Redis.
    code = BLOCKS[n].replace('"redis://127.0.0.1:6379", ', f'"{redis.url}", timeout=5, ')
    if "redis+cluster://" in code:
        cluster = request.getfixturevalue("cluster")
        code = code.replace('"redis+cluster://10.0.0.1:7000,10.0.0.2:7000", ',
                            f'"{cluster.url}", timeout=5, connect_timeout=5, ')
    if "redis+sentinel://" in code:
        sentinel = request.getfixturevalue("sentinel")
        code = code.replace('"redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/mymaster", ',
                            f'"{sentinel.url}", timeout=5, connect_timeout=5, ')
    code = code.replace('"rediss://redis.example.com:6380", ',
                        f'"{tls_redis.url}", timeout=5, connect_timeout=5, ')
    code = code.replace('"/etc/ssl/redis-ca.pem"', repr(str(certs / "ca.crt")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"docs/python.md example {n + 1}", "exec"), {})   # noqa: S102
    assert out.getvalue(), "an example that prints nothing shows nothing"
    lines = out.getvalue().splitlines()
    if "rediss://" in code:
        assert lines == ["redis"]
    elif "user:42" in code:
        assert lines == ["True 99 redis"]
    if "hirate.ConfigError as e" in code:
        assert lines == [
            "EKEY key is empty", "EKEY key is 513 bytes; the most is 512",
            "-3 rate must be a finite number of tokens per second above 0, got 0"]
    if '("bob", 11)' in code:
        assert lines == ["6", "False", "[True, False]", "10"]
    if "zip(pairs" in code:
        assert lines == ["alice served", "bob refused"]
    if "parse_limits" in code:
        assert lines == [
            "LimitSpec(capacity=10, rate=10.0, count=10, window=1)",
            "LimitSpec(capacity=1000, rate=0.011574074074074073, count=1000, window=86400)"]
