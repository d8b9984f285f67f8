#!/usr/bin/env node
// The Node contenders of the side-by-side benchmark, behind the harness
// protocol of bench/peers/README.md (bench/suite/suite.py drives them):
//
//   node harness.js speed|atomic|outage|fill --impl rlf|rlf-insured|rlf-union --url redis://HOST:PORT [...]
//
//   rlf          rate-limiter-flexible's RateLimiterRedis on one ioredis client,
//                points = capacity, duration = capacity / rate seconds
//                (a fixed window with the bucket's long-run rate and burst)
//   rlf-insured  the same with an insuranceLimiter (RateLimiterMemory of the
//                same points and duration), rate-limiter-flexible's answer to a
//                Redis that fails
//   rlf-union    several limits on one key (--limits "10/second; 1000/day"):
//                rate-limiter-flexible's RateLimiterUnion of one
//                RateLimiterRedis per limit (points N, duration the window),
//                all on the one ioredis client; a decision is allowed when
//                every limiter consumed (the union consumes in each of them,
//                at once, whatever the others answer)
//
// Concurrency is promises in flight on the one event loop and the one ioredis
// connection (which pipelines them), as a Node service would run it.
'use strict';

const Redis = require('ioredis');
const { RateLimiterRedis, RateLimiterMemory, RateLimiterUnion } = require('rate-limiter-flexible');
const { performance } = require('perf_hooks');

// Samples kept before keeping every 2nd, 4th, ... call.
const LAT_CAP = 1 << 18;

function die(msg) {
  process.stderr.write(`harness.js: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  if (argv.length < 1 || argv[0].startsWith('-')) {
    die('usage: harness.js speed|atomic|outage|fill --impl rlf|rlf-insured --url redis://HOST:PORT [options] (see bench/peers/README.md)');
  }
  const c = {
    mode: argv[0], impl: null, url: null, key: 'fresh', keys: 100000, concurrency: 1,
    requests: 100, calls: 20, timeoutMs: 100, seconds: 2, warmup: 0.3, rate: 10,
    capacity: 100, seed: 1, limits: null,
  };
  const names = {
    '--impl': 'impl', '--url': 'url', '--key': 'key', '--keys': 'keys',
    '--concurrency': 'concurrency', '--requests': 'requests', '--calls': 'calls',
    '--timeout-ms': 'timeoutMs', '--seconds': 'seconds', '--warmup': 'warmup',
    '--rate': 'rate', '--capacity': 'capacity', '--seed': 'seed', '--limits': 'limits',
  };
  for (let i = 1; i < argv.length; i += 2) {
    const name = names[argv[i]];
    if (!name || i + 1 >= argv.length) die(`unknown option or missing value: ${argv[i]}`);
    const v = argv[i + 1];
    if (['impl', 'url', 'key', 'limits'].includes(name)) {
      c[name] = v;
    } else {
      const n = Number(v);
      if (!Number.isFinite(n) || n < 0) die(`${argv[i]}: expected a number, got "${v}"`);
      c[name] = n;
    }
  }
  if (!c.impl || !c.url) die('--impl and --url are required');
  if (!['rlf', 'rlf-insured', 'rlf-union'].includes(c.impl)) die(`--impl: unknown client "${c.impl}" (rlf, rlf-insured, rlf-union)`);
  if ((c.impl === 'rlf-union') !== (c.limits !== null)) die('--limits goes with --impl rlf-union, and only with it');
  if (c.limits !== null) c.windows = parseLimits(c.limits);
  if (!(c.rate > 0) || c.capacity < 1 || c.keys < 1 || c.concurrency < 1) die('a count or the rate is out of range');
  return c;
}

// The windows of a limit string as the suite writes it ("10/second; 1000/day"):
// [{points, duration}], duration in seconds. Only "N/unit" or "N per unit"
// with a unit of second, minute, hour or day, separated by ';' or ',';
// anything else is refused (this is a harness, not a grammar: hirate's is in
// docs/semantics.md).
function parseLimits(text) {
  const units = { second: 1, minute: 60, hour: 3600, day: 86400 };
  const out = text.split(/[;,]/).map((part) => {
    const m = /^\s*(\d+)\s*(?:\/|\s+per\s+)\s*(second|minute|hour|day)\s*$/.exec(part);
    if (!m || Number(m[1]) < 1) die(`--limits: cannot read "${part.trim()}" (N/second, N/minute, N/hour or N/day)`);
    return { points: Number(m[1]), duration: units[m[2]] };
  });
  return out;
}

function makeLimiter(c, capacity, rate) {
  const u = new URL(c.url);
  if (u.protocol !== 'redis:') die(`--url: expected redis://HOST:PORT, got "${c.url}"`);
  const redis = new Redis({
    host: u.hostname,
    port: Number(u.port || 6379),
    connectTimeout: 250,
    commandTimeout: c.timeoutMs,
    // rate-limiter-flexible's advice for ioredis: fail at once while
    // disconnected instead of queueing.
    enableOfflineQueue: false,
  });
  // Errors reach the calls that meet them; the client's own event must not
  // crash the process.
  redis.on('error', () => {});
  if (c.impl === 'rlf-union') {
    // One limiter per limit, each with a key prefix of its own: the union
    // names each one's result by it.
    const union = new RateLimiterUnion(...c.windows.map((w, i) => new RateLimiterRedis({
      storeClient: redis, keyPrefix: `rlflx${i}`, points: w.points, duration: w.duration })));
    // consume() resolves with every limiter's result when all consumed, and
    // rejects with the refusing limiters' results (RateLimiterRes) or, when
    // the store failed, with the Error.
    const decide = (key) => union.consume(key, 1).then(
      () => true,
      (e) => {
        for (const v of Object.values(e)) if (v instanceof Error) throw v;
        return false;
      });
    return { redis, decide };
  }
  // Its store keeps whole seconds (SET ... EX).
  const duration = Math.max(1, Math.round(capacity / rate));
  const opts = { storeClient: redis, points: capacity, duration };
  if (c.impl === 'rlf-insured') opts.insuranceLimiter = new RateLimiterMemory({ points: capacity, duration });
  const limiter = new RateLimiterRedis(opts);
  // consume() resolves when allowed, rejects with a RateLimiterRes when
  // refused and with an Error when the store failed.
  const decide = (key) => limiter.consume(key, 1).then(
    () => true,
    (e) => { if (e instanceof Error) throw e; return false; });
  return { redis, decide };
}

async function ready(redis) {
  if (redis.status === 'ready') return;
  await new Promise((resolve, reject) => {
    redis.once('ready', resolve);
    redis.once('end', () => reject(new Error('connection ended')));
  });
}

function keyName(i) {
  return 'user:' + String(i).padStart(6, '0');
}

class Lat {
  constructor() { this.v = new Float64Array(LAT_CAP); this.n = 0; this.stride = 1; this.tick = 0; }
  add(ms) {
    if (++this.tick < this.stride) return;
    this.tick = 0;
    if (this.n === LAT_CAP) {
      for (let i = 0; i < LAT_CAP / 2; i++) this.v[i] = this.v[2 * i + 1];
      this.n = LAT_CAP / 2;
      this.stride *= 2;
    }
    this.v[this.n++] = ms;
  }
  quantiles() {
    if (this.n === 0) return [0, 0];
    const s = this.v.slice(0, this.n).sort();
    const i99 = Math.min(this.n - 1, Math.floor(0.99 * this.n));
    return [s[Math.floor(this.n / 2)] * 1e3, s[i99] * 1e3];
  }
}

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

async function runSpeed(c) {
  const { redis, decide } = makeLimiter(c, c.capacity, c.rate);
  await ready(redis);
  const keys = Array.from({ length: c.keys }, (_, i) => keyName(i));
  // A seeded generator (mulberry32), so every run draws the same keys.
  let s = (c.seed * 2654435761) >>> 0;
  const rnd = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const WARM = 0, MEASURE = 1, STOP = 2;
  let phase = WARM;
  const lat = new Lat();
  let decisions = 0, allowed = 0, errors = 0, firstError = null;
  // Every call that returned, warm-up and the calls ending after the window
  // included: the driver divides the server's whole count of commands by it.
  let calls = 0;
  async function worker() {
    while (phase !== STOP) {
      const ph = phase;
      const t0 = performance.now();
      let ok = null, err = null;
      try {
        ok = await decide(keys[Math.floor(rnd() * keys.length)]);
      } catch (e) {
        err = e;
      }
      const dt = performance.now() - t0;
      calls++;
      if (phase !== MEASURE) continue; // only calls that end inside the window count
      if (ph !== MEASURE && errors === 0) firstError = null;
      if (err) {
        errors++;
        if (!firstError) firstError = String(err.message || err);
        continue;
      }
      decisions++;
      if (ok) allowed++;
      lat.add(dt);
    }
  }
  const workers = Array.from({ length: c.concurrency }, worker);
  await sleep(c.warmup);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  phase = MEASURE;
  await sleep(c.seconds);
  phase = STOP;
  const wall = (performance.now() - t0) / 1e3;
  const cpu = process.cpuUsage(cpu0);
  await Promise.all(workers);
  const [p50, p99] = lat.quantiles();
  emit({ decisions, allowed, errors, p50_us: p50, p99_us: p99,
    cpu_s: (cpu.user + cpu.system) / 1e6, wall_s: wall, calls_total: calls, error: firstError });
  redis.disconnect();
}

function tally(results) {
  let admitted = 0, refused = 0, errors = 0, error = null;
  for (const r of results) {
    if (r.status === 'rejected') {
      errors++;
      if (!error) error = String(r.reason && r.reason.message || r.reason);
    } else if (r.value) {
      admitted++;
    } else {
      refused++;
    }
  }
  return { admitted, refused, errors, error };
}

async function runAtomic(c) {
  const { redis, decide } = makeLimiter(c, c.capacity, c.rate);
  await ready(redis);
  // Every call is issued in the same tick: all are in flight together.
  const calls = [];
  for (let i = 0; i < c.requests; i++) calls.push(decide(c.key));
  const t = tally(await Promise.allSettled(calls));
  emit({ requests: c.requests, ...t });
  redis.disconnect();
}

async function runOutage(c) {
  const { redis, decide } = makeLimiter(c, c.capacity, c.rate);
  await ready(redis);
  try {
    // The warm-up key is the test key's own: harnesses run side by side on
    // one server, and each library stores its own kind of value.
    await decide(c.key + '-warmup');
  } catch (e) {
    die(`the warm-up decision failed: ${e.message}`);
  }
  emit({ ready: true });
  await new Promise((resolve) => {
    process.stdin.once('data', resolve);
    process.stdin.once('end', () => die('stdin closed before the go line'));
  });
  process.stdin.pause();
  const latUs = [];
  const results = [];
  for (let i = 0; i < c.calls; i++) {
    const t0 = performance.now();
    try {
      results.push({ status: 'fulfilled', value: await decide(c.key) });
    } catch (e) {
      results.push({ status: 'rejected', reason: e });
    }
    latUs.push((performance.now() - t0) * 1e3);
  }
  emit({ calls: c.calls, ...tally(results), lat_us: latUs });
  redis.disconnect();
}

async function runFill(c) {
  const { redis, decide } = makeLimiter(c, c.capacity, c.rate);
  await ready(redis);
  const results = [];
  for (let i = 0; i < c.keys; i++) {
    try {
      results.push({ status: 'fulfilled', value: await decide(keyName(i)) });
    } catch (e) {
      results.push({ status: 'rejected', reason: e });
    }
  }
  const t = tally(results);
  emit({ keys: c.keys, admitted: t.admitted, errors: t.errors, error: t.error });
  redis.disconnect();
}

const modes = { speed: runSpeed, atomic: runAtomic, outage: runOutage, fill: runFill };
const cfg = parseArgs(process.argv.slice(2));
if (!modes[cfg.mode]) die(`unknown mode "${cfg.mode}" (speed, atomic, outage, fill)`);
modes[cfg.mode](cfg).catch((e) => die(e && e.stack || String(e)));
