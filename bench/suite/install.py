#!/usr/bin/env python3
"""Installs what the contenders of bench/suite need, under one directory of
the bench build, and says what it found:

    python3 bench/suite/install.py --dir BUILD/suite

  venv/      a Python venv: bench/suite/requirements.txt (redis-py, limits,
             matplotlib) and hirate from this checkout (pip install ., its
             CMake build kept in py-build/ so that a rerun rebuilds only what
             changed, and skipped when the sources did not change)
  node/      npm ci of bench/peers/node/package-lock.json (ioredis,
             rate-limiter-flexible)
  go/        go mod download of bench/peers/go into go/mod (GOMODCACHE), the
             build cache in go/cache, the harness built as go/peer_go and the
             failover client (bench/peers/go/failover) as go/failover_go
  lua/       hirate's Lua module for Lua 5.4 and LuaJIT (the OpenResty
             contenders and bench/lua use it)

and writes DIR/setup.json: for each runtime whether it is usable (or the
reason it is not) and the versions of every component the report names.
Nothing here is fatal: a runtime that cannot be installed is reported as
missing, with the reason, and the suite runs the others. Progress goes to
stderr.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T0 = time.monotonic()


def step(msg):
    sys.stderr.write("[bench setup %3ds] %s\n" % (time.monotonic() - T0, msg))
    sys.stderr.flush()


class Failed(Exception):
    pass


def run(cmd, cwd=None, env=None, timeout=900):
    """Runs cmd; its stdout, or Failed naming the command and its last words."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise Failed("%s not found" % cmd[0])
    except subprocess.TimeoutExpired:
        raise Failed("`%s` took more than %d s" % (" ".join(map(str, cmd[:3])), timeout))
    if p.returncode != 0:
        tail = [l for l in (p.stderr or p.stdout).strip().splitlines() if l.strip()][-3:]
        raise Failed("`%s` failed (exit %d): %s" % (" ".join(map(str, cmd[:4])), p.returncode,
                                                     " / ".join(tail) or "no output"))
    return p.stdout


def first_line(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (p.stdout + p.stderr).strip()
    return text.splitlines()[0] if text else None


def digest(paths, extra=""):
    """A hash of the files' contents (directories: every file below them)."""
    h = hashlib.sha256(extra.encode())
    for p in paths:
        p = Path(p)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            if "__pycache__" in f.parts:
                continue
            h.update(str(f.relative_to(ROOT)).encode())
            try:
                h.update(f.read_bytes())
            except OSError:
                pass
    return h.hexdigest()


def stamp_ok(path, value):
    try:
        return Path(path).read_text() == value
    except OSError:
        return False


# ---- Python -------------------------------------------------------------------------

def setup_python(d):
    venv = d / "venv"
    py = venv / "bin" / "python"
    out = {"python": str(py)}
    python = os.environ.get("PYTHON", "python3")
    if not py.exists():
        step("python: making the venv %s" % venv)
        run([python, "-m", "venv", str(venv)])
    reqs = ROOT / "bench" / "suite" / "requirements.txt"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    want = digest([reqs])
    if not stamp_ok(venv / "requirements.stamp", want):
        step("python: pip install -r bench/suite/requirements.txt")
        run(pip + ["-r", str(reqs)])
        (venv / "requirements.stamp").write_text(want)
    # hirate from this checkout, rebuilt only when what the wheel is built
    # from changed.
    src = [ROOT / "core", ROOT / "lua", ROOT / "bindings" / "python", ROOT / "cmake",
           ROOT / "CMakeLists.txt", ROOT / "pyproject.toml"]
    want = digest([p for p in src if p.exists()])
    if not stamp_ok(venv / "hirate.stamp", want):
        step("python: pip install . (hirate, built in %s)" % (d / "py-build"))
        run(pip + ["-C", "build-dir=%s" % (d / "py-build"), str(ROOT)])
        (venv / "hirate.stamp").write_text(want)
    code = ("import json, sys, importlib.metadata as m\n"
            "v = {'Python': sys.version.split()[0]}\n"
            "for name in ('redis', 'limits', 'matplotlib', 'hirate'):\n"
            "    try: v[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: v[name] = None\n"
            "import hirate\n"
            "v['hirate.AsyncLimiter'] = hasattr(hirate, 'AsyncLimiter')\n"
            "try:\n"
            "    hirate.Limiter(limits='10/second; 1000/day').close()\n"
            "    v['hirate.Limiter(limits)'] = True\n"
            "except TypeError:\n"
            "    v['hirate.Limiter(limits)'] = False\n"
            "print(json.dumps(v))\n")
    out["versions"] = json.loads(run([str(py), "-c", code]))
    return out


# ---- Node ---------------------------------------------------------------------------

def setup_node(d):
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise Failed("node and npm not found on PATH (the Node contenders need Node.js 18 or "
                     "later with npm)")
    src = ROOT / "bench" / "peers" / "node"
    nd = d / "node"
    nd.mkdir(parents=True, exist_ok=True)
    want = digest([src / "package.json", src / "package-lock.json"])
    if not stamp_ok(nd / "install.stamp", want) or not (nd / "node_modules").is_dir():
        for f in ("package.json", "package-lock.json"):
            shutil.copyfile(src / f, nd / f)
        step("node: npm ci in %s" % nd)
        run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=nd)
        (nd / "install.stamp").write_text(want)
    versions = {"Node": run([node, "--version"]).strip().lstrip("v")}
    for pkg in ("ioredis", "rate-limiter-flexible"):
        meta = nd / "node_modules" / pkg / "package.json"
        versions[pkg] = json.loads(meta.read_text())["version"]
    return {"node": node, "node_path": str(nd / "node_modules"), "versions": versions}


# ---- Go -----------------------------------------------------------------------------

def setup_go(d):
    go = shutil.which("go")
    if not go:
        raise Failed("go not found on PATH (the Go contenders need Go %s or later)"
                     % go_wants())
    gd = d / "go"
    env = dict(os.environ, GOMODCACHE=str(gd / "mod"), GOCACHE=str(gd / "cache"),
               GOFLAGS="-modcacherw")
    src = ROOT / "bench" / "peers" / "go"
    binary = gd / "peer_go"
    failover = gd / "failover_go"   # the Sentinel failover client (bench/peers/go/failover)
    goversion = run([go, "env", "GOVERSION"], env=env).strip()
    want = digest([src], goversion)
    if not stamp_ok(gd / "build.stamp", want) or not binary.exists() or not failover.exists():
        step("go: go mod download, go build (module cache %s)" % (gd / "mod"))
        run([go, "mod", "download"], cwd=src, env=env)
        run([go, "build", "-o", str(binary), "."], cwd=src, env=env)
        run([go, "build", "-o", str(failover), "./failover"], cwd=src, env=env)
        (gd / "build.stamp").write_text(want)
    versions = {"Go": goversion.removeprefix("go")}
    mod = (src / "go.mod").read_text()
    for path, name in (("github.com/redis/go-redis/v9", "go-redis"),
                       ("github.com/go-redis/redis_rate/v10", "redis_rate")):
        m = re.search(re.escape(path) + r"\s+(v\S+)", mod)
        versions[name] = m.group(1) if m else None
    return {"binary": str(binary), "failover": str(failover), "versions": versions}


def go_wants():
    m = re.search(r"^go (\S+)", (ROOT / "bench" / "peers" / "go" / "go.mod").read_text(), re.M)
    return m.group(1) if m else "1.21"


# ---- Lua modules (OpenResty contenders, bench/lua) ---------------------------------------

def setup_lua(d):
    ld = d / "lua"
    if not (ld / "CMakeCache.txt").exists():
        step("lua: configuring hirate's Lua module (Lua 5.4, LuaJIT) in %s" % ld)
        run(["cmake", "-S", str(ROOT), "-B", str(ld), "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
             "-DHIRATE_WERROR=ON", "-DHIRATE_BUILD_TESTS=OFF", "-DHIRATE_BUILD_BENCH=OFF",
             "-DHIRATE_BUILD_LUA=ON", "-DHIRATE_LUA_FLAVORS=5.4;luajit"])
    step("lua: building hirate.core for Lua 5.4 and LuaJIT")
    run(["cmake", "--build", str(ld), "-j", os.environ.get("JOBS", "2"), "--target",
         "hirate_lua_54", "hirate_lua_luajit"])
    return {"dir": str(ld), "luajit_cpath": str(ld / "lua-luajit")}


def setup_nginx(lua):
    missing = [t for t in ("nginx", "wrk") if not shutil.which(t)]
    if missing:
        raise Failed("%s not found (tools/deps.sh bench installs them)" % " and ".join(missing))
    if not os.path.exists("/usr/lib/nginx/modules/ngx_http_lua_module.so"):
        raise Failed("lua-nginx-module not installed (apt-get install libnginx-mod-http-lua)")
    if not lua.get("ok"):
        raise Failed("hirate's LuaJIT module is missing: %s" % lua.get("reason"))
    return {}


def tool_versions():
    def grab(cmd, pattern):
        line = first_line(cmd)
        m = re.search(pattern, line or "")
        return m.group(1) if m else None

    return {
        "redis-server": grab(["redis-server", "--version"], r"v=(\S+)"),
        "redis-benchmark": grab(["redis-benchmark", "--version"], r"redis-benchmark (\S+)"),
        "hiredis": (first_line(["pkg-config", "--modversion", "hiredis"]) or None),
        "gcc": grab(["gcc", "--version"], r"(\d+\.\d+\.\d+)"),
        "valgrind": grab(["valgrind", "--version"], r"valgrind-(\S+)"),
        "nginx": grab(["nginx", "-v"], r"nginx/(\S+)"),
        "lua-nginx-module": grab(["dpkg-query", "-W", "-f=${Version}", "libnginx-mod-http-lua"],
                                 r"(?:\d+:)?([^-\s]+)"),
        "LuaJIT": grab(["luajit", "-v"], r"LuaJIT (\S+)"),
        "Lua": grab(["lua5.4", "-v"], r"Lua (\S+)"),
        "wrk": grab(["wrk", "-v"], r"wrk (?:debian/)?(\S+)"),
        "cmake": grab(["cmake", "--version"], r"version (\S+)"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="where to install (e.g. build-bench/suite)")
    ap.add_argument("--skip", default="", help="runtimes not to set up, comma-separated "
                    "(python, node, go, lua, nginx)")
    args = ap.parse_args()
    d = Path(args.dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    setup = {"runtimes": {}, "versions": tool_versions()}
    for name, fn in (("python", setup_python), ("node", setup_node), ("go", setup_go),
                     ("lua", setup_lua), ("nginx", None)):
        if name in skip:
            setup["runtimes"][name] = {"ok": False, "reason": "skipped (--skip %s)" % name}
            continue
        try:
            res = fn(d) if fn else setup_nginx(setup["runtimes"]["lua"])
            res["ok"] = True
            setup["runtimes"][name] = res
            setup["versions"].update(res.pop("versions", {}))
        except Failed as e:
            step("%s: missing: %s" % (name, e))
            setup["runtimes"][name] = {"ok": False, "reason": str(e)}
    (d / "setup.json").write_text(json.dumps(setup, indent=1) + "\n")
    step("wrote %s" % (d / "setup.json"))


if __name__ == "__main__":
    main()
