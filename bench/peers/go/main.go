// The Go contenders of the side-by-side benchmark, behind the harness
// protocol of bench/peers/README.md (bench/suite/suite.py drives them):
//
//	peer_go speed|atomic|outage|fill --impl article|redis_rate --url redis://HOST:PORT [...]
//	peer_go ... --url rediss://HOST:PORT --tls-ca-file ca.crt    (TLS)
//	peer_go ... --url redis+cluster://HOST:PORT,HOST:PORT...     (Redis Cluster)
//
//	article     the seed article's limiter: go-redis v9, redis.NewScript(src).Run
//	            of the article's own token-bucket script (token_bucket.lua, as
//	            the article has it), key "rl:" + key, args capacity,
//	            refill_per_sec, 1, the reply read with Int64Slice
//	article-pipeline  the same script, 16 decisions a call: Pipelined with one
//	            EvalSha each (the script loaded first with Script.Load), as
//	            redis-benchmark -P 16 pipelines 16 calls
//	redis_rate  github.com/go-redis/redis_rate/v10, GCRA:
//	            Limit{Rate: capacity, Burst: capacity, Period: capacity/rate s}
//
// Concurrency is goroutines sharing one client (go-redis' own pool, default
// size), as a Go service would use it. A redis+cluster:// URL (its hosts are
// the seeds) makes that client a redis.ClusterClient, the seed article's
// client on a cluster: it routes each key to its slot's master, follows
// MOVED and ASK, and splits a pipeline by node, running the nodes' parts at
// once. Over TLS (rediss://) the client gets
// the tls.Config a Go service would give it: the CA of --tls-ca-file as
// RootCAs, the URL's host as ServerName, TLS 1.2 at least (crypto/tls'
// default otherwise).
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

//go:embed token_bucket.lua
var tokenBucketSrc string

// Samples a worker keeps before it starts keeping every 2nd, 4th, ... call.
const latCap = 1 << 18

type config struct {
	mode, impl, url, key  string
	tlsCAFile             string
	keys                  int
	concurrency, requests int
	calls, timeoutMs      int
	seconds, warmup, rate float64
	capacity              int
	seed                  uint64
}

// decider makes one decision on key: allowed, or an error.
type decider func(ctx context.Context, key string) (bool, error)

// batchSize is how many decisions article-pipeline sends in one call.
const batchSize = 16

// batchDecider makes one decision on each of keys, in one call: allowed[i],
// or an error for all (the pipeline failed) or for key i (errs[i]).
type batchDecider func(ctx context.Context, keys []string, allowed []bool, errs []error) error

func newClient(c *config) redis.UniversalClient {
	u, err := url.Parse(c.url)
	ok := err == nil && u.Host != ""
	cluster := ok && (u.Scheme == "redis+cluster" || u.Scheme == "rediss+cluster")
	if !ok || !(cluster || u.Scheme == "redis" || u.Scheme == "rediss") {
		die("--url: expected redis://HOST:PORT, rediss://HOST:PORT or "+
			"redis+cluster://HOST:PORT,HOST:PORT..., got %q", c.url)
	}
	secure := u.Scheme == "rediss" || u.Scheme == "rediss+cluster"
	if !secure && c.tlsCAFile != "" {
		die("--tls-ca-file needs a rediss:// URL")
	}
	timeout := time.Duration(c.timeoutMs) * time.Millisecond
	if cluster {
		// The seeds: "h1:p1,h2:p2" up to the path, as hirate reads them.
		hosts := strings.SplitN(c.url, "://", 2)[1]
		if i := strings.IndexAny(hosts, "/?"); i >= 0 {
			hosts = hosts[:i]
		}
		if i := strings.LastIndex(hosts, "@"); i >= 0 {
			hosts = hosts[i+1:]
		}
		opts := &redis.ClusterOptions{
			Addrs:        strings.Split(hosts, ","),
			DialTimeout:  250 * time.Millisecond,
			ReadTimeout:  timeout,
			WriteTimeout: timeout,
		}
		if secure {
			opts.TLSConfig = tlsConfig(c, opts.Addrs[0])
		}
		return redis.NewClusterClient(opts)
	}
	opts := &redis.Options{
		Addr:         u.Host,
		DialTimeout:  250 * time.Millisecond,
		ReadTimeout:  timeout,
		WriteTimeout: timeout,
	}
	if secure {
		opts.TLSConfig = tlsConfig(c, u.Host)
	}
	return redis.NewClient(opts)
}

func newDecider(c *config, capacity int, rate float64) (decider, redis.UniversalClient) {
	d, _, rdb := newDeciders(c, capacity, rate)
	return d, rdb
}

// newDeciders: the single decider of c's impl and, for article-pipeline,
// the batch one too.
func newDeciders(c *config, capacity int, rate float64) (decider, batchDecider, redis.UniversalClient) {
	rdb := newClient(c)
	switch c.impl {
	case "article":
		script := redis.NewScript(tokenBucketSrc)
		return func(ctx context.Context, key string) (bool, error) {
			res, err := script.Run(ctx, rdb, []string{"rl:" + key}, capacity, rate, 1).Int64Slice()
			if err != nil {
				return false, err
			}
			return res[0] == 1, nil
		}, nil, rdb
	case "article-pipeline":
		script := redis.NewScript(tokenBucketSrc)
		// On a ClusterClient ScriptLoad goes to every master: EvalSha in a
		// pipeline cannot fall back to EVAL as Run does.
		if err := script.Load(context.Background(), rdb).Err(); err != nil {
			die("SCRIPT LOAD: %v", err)
		}
		batch := func(ctx context.Context, keys []string, allowed []bool, errs []error) error {
			cmds := make([]*redis.Cmd, len(keys))
			// A failed pipeline fails each of its commands: counted below.
			_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, k := range keys {
					cmds[i] = script.EvalSha(ctx, p, []string{"rl:" + k}, capacity, rate, 1)
				}
				return nil
			})
			for i, cmd := range cmds {
				res, e := cmd.Int64Slice()
				errs[i] = e
				allowed[i] = e == nil && res[0] == 1
			}
			return nil
		}
		one := func(ctx context.Context, key string) (bool, error) {
			allowed, errs := []bool{false}, []error{nil}
			if err := batch(ctx, []string{key}, allowed, errs); err != nil {
				return false, err
			}
			return allowed[0], errs[0]
		}
		return one, batch, rdb
	case "redis_rate":
		limiter := redis_rate.NewLimiter(rdb)
		limit := redis_rate.Limit{
			Rate:   capacity,
			Burst:  capacity,
			Period: time.Duration(float64(capacity) / rate * float64(time.Second)),
		}
		return func(ctx context.Context, key string) (bool, error) {
			res, err := limiter.Allow(ctx, key, limit)
			if err != nil {
				return false, err
			}
			return res.Allowed > 0, nil
		}, nil, rdb
	}
	die("--impl: unknown client %q (article, article-pipeline, redis_rate)", c.impl)
	return nil, nil, nil
}

// tlsConfig: the name checked is addr's host (a cluster's nodes share one
// certificate name, the first seed's).
func tlsConfig(c *config, addr string) *tls.Config {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		die("--url: expected rediss://HOST:PORT, got %q", c.url)
	}
	cfg := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if c.tlsCAFile != "" {
		pem, err := os.ReadFile(c.tlsCAFile)
		if err != nil {
			die("--tls-ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			die("--tls-ca-file: no PEM certificate in %s", c.tlsCAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg
}

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "peer_go: "+format+"\n", args...)
	os.Exit(2)
}

func emit(v map[string]any) {
	b, err := json.Marshal(v)
	if err != nil {
		die("json: %v", err)
	}
	os.Stdout.Write(append(b, '\n'))
}

func errString(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}

func keyName(i int) string { return fmt.Sprintf("user:%06d", i) }

// ---- latency samples, decimated as they grow -----------------------------------

type lat struct {
	v            []int64
	stride, tick uint64
}

func (l *lat) add(ns int64) {
	l.tick++
	if l.tick < l.stride {
		return
	}
	l.tick = 0
	if len(l.v) == latCap {
		for i := 0; i < latCap/2; i++ {
			l.v[i] = l.v[2*i+1]
		}
		l.v = l.v[:latCap/2]
		l.stride *= 2
	}
	l.v = append(l.v, ns)
}

// quantiles merges the workers' samples at the largest stride among them, so
// that each kept sample stands for the same number of calls.
func quantiles(ls []*lat) (p50, p99 float64) {
	stride := uint64(1)
	for _, l := range ls {
		if l.stride > stride {
			stride = l.stride
		}
	}
	var all []int64
	for _, l := range ls {
		step := int(stride / l.stride)
		for j := step - 1; j < len(l.v); j += step {
			all = append(all, l.v[j])
		}
	}
	if len(all) == 0 {
		return 0, 0
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	i99 := int(0.99 * float64(len(all)))
	if i99 >= len(all) {
		i99 = len(all) - 1
	}
	return float64(all[len(all)/2]) / 1e3, float64(all[i99]) / 1e3
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// ---- modes --------------------------------------------------------------------

const (
	phaseWarm int32 = iota
	phaseMeasure
	phaseStop
)

type worker struct {
	decisions, allowed, errors int64
	err                        error
	lat                        lat
}

func runSpeed(c *config) {
	decide, batch, rdb := newDeciders(c, c.capacity, c.rate)
	defer rdb.Close()
	keys := make([]string, c.keys)
	for i := range keys {
		keys[i] = keyName(i)
	}
	var phase atomic.Int32
	workers := make([]*worker, c.concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{lat: lat{stride: 1}}
		workers[i] = w
		rng := rand.New(rand.NewPCG(c.seed, uint64(i)+1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			n := uint64(len(keys))
			if batch != nil {
				batchWorker(ctx, w, batch, keys, rng, &phase)
				return
			}
			for {
				ph := phase.Load()
				if ph == phaseStop {
					return
				}
				t0 := time.Now()
				ok, err := decide(ctx, keys[rng.Uint64N(n)])
				d := time.Since(t0)
				if phase.Load() != phaseMeasure {
					continue // only calls that end inside the measured window count
				}
				if ph != phaseMeasure && w.errors == 0 {
					w.err = nil // a failure of the warm-up is not data
				}
				if err != nil {
					w.errors++
					if w.err == nil {
						w.err = err
					}
					continue
				}
				w.decisions++
				if ok {
					w.allowed++
				}
				w.lat.add(d.Nanoseconds())
			}
		}()
	}
	time.Sleep(time.Duration(c.warmup * float64(time.Second)))
	cpu0 := cpuSeconds()
	t0 := time.Now()
	phase.Store(phaseMeasure)
	time.Sleep(time.Duration(c.seconds * float64(time.Second)))
	phase.Store(phaseStop)
	wall := time.Since(t0).Seconds()
	cpu1 := cpuSeconds()
	wg.Wait()
	var decisions, allowed, errs int64
	var first error
	ls := make([]*lat, len(workers))
	for i, w := range workers {
		decisions += w.decisions
		allowed += w.allowed
		errs += w.errors
		if first == nil {
			first = w.err
		}
		ls[i] = &w.lat
	}
	p50, p99 := quantiles(ls)
	emit(map[string]any{"decisions": decisions, "allowed": allowed, "errors": errs,
		"p50_us": p50, "p99_us": p99, "cpu_s": cpu1 - cpu0, "wall_s": wall,
		"error": errString(first)})
}

// batchWorker is runSpeed's loop for a batch decider: batchSize keys a call,
// the call's wall time one latency sample, each decision counted.
func batchWorker(ctx context.Context, w *worker, batch batchDecider, keys []string,
	rng *rand.Rand, phase *atomic.Int32) {
	n := uint64(len(keys))
	ks := make([]string, batchSize)
	allowed := make([]bool, batchSize)
	errs := make([]error, batchSize)
	for {
		ph := phase.Load()
		if ph == phaseStop {
			return
		}
		for i := range ks {
			ks[i] = keys[rng.Uint64N(n)]
		}
		t0 := time.Now()
		err := batch(ctx, ks, allowed, errs)
		d := time.Since(t0)
		if phase.Load() != phaseMeasure {
			continue
		}
		if ph != phaseMeasure && w.errors == 0 {
			w.err = nil
		}
		if err != nil {
			w.errors += batchSize
			if w.err == nil {
				w.err = err
			}
			continue
		}
		done := false
		for i := range ks {
			if errs[i] != nil {
				w.errors++
				if w.err == nil {
					w.err = errs[i]
				}
				continue
			}
			done = true
			w.decisions++
			if allowed[i] {
				w.allowed++
			}
		}
		if done {
			w.lat.add(d.Nanoseconds())
		}
	}
}

func runAtomic(c *config) {
	decide, rdb := newDecider(c, c.capacity, c.rate)
	defer rdb.Close()
	var admitted, refused, errs atomic.Int64
	var firstErr atomic.Value
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := 0; i < c.requests; i++ {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			ok, err := decide(context.Background(), c.key)
			switch {
			case err != nil:
				errs.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			case ok:
				admitted.Add(1)
			default:
				refused.Add(1)
			}
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	emit(map[string]any{"requests": c.requests, "admitted": admitted.Load(),
		"refused": refused.Load(), "errors": errs.Load(), "error": firstErr.Load()})
}

func runOutage(c *config) {
	decide, rdb := newDecider(c, c.capacity, c.rate)
	defer rdb.Close()
	ctx := context.Background()
	// The warm-up key is the test key's own: harnesses run side by side on
	// one server, and each library stores its own kind of value.
	if _, err := decide(ctx, c.key+"-warmup"); err != nil {
		die("the warm-up decision failed: %v", err)
	}
	emit(map[string]any{"ready": true})
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		die("stdin closed before the go line")
	}
	latUs := make([]float64, 0, c.calls)
	var admitted, refused, errs int
	var first error
	for i := 0; i < c.calls; i++ {
		t0 := time.Now()
		ok, err := decide(ctx, c.key)
		latUs = append(latUs, float64(time.Since(t0).Nanoseconds())/1e3)
		switch {
		case err != nil:
			errs++
			if first == nil {
				first = err
			}
		case ok:
			admitted++
		default:
			refused++
		}
	}
	emit(map[string]any{"calls": c.calls, "admitted": admitted, "refused": refused,
		"errors": errs, "error": errString(first), "lat_us": latUs})
}

func runFill(c *config) {
	decide, rdb := newDecider(c, c.capacity, c.rate)
	defer rdb.Close()
	ctx := context.Background()
	var admitted, errs int
	var first error
	for i := 0; i < c.keys; i++ {
		ok, err := decide(ctx, keyName(i))
		if err != nil {
			errs++
			if first == nil {
				first = err
			}
		} else if ok {
			admitted++
		}
	}
	emit(map[string]any{"keys": c.keys, "admitted": admitted, "errors": errs,
		"error": errString(first)})
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "" || os.Args[1][0] == '-' {
		die("usage: peer_go speed|atomic|outage|fill --impl article|article-pipeline|redis_rate --url redis://HOST:PORT [options] (see bench/peers/README.md)")
	}
	c := &config{mode: os.Args[1]}
	fs := flag.NewFlagSet("peer_go", flag.ExitOnError)
	fs.StringVar(&c.impl, "impl", "", "article, article-pipeline or redis_rate")
	fs.StringVar(&c.url, "url", "", "redis://HOST:PORT, rediss://HOST:PORT (TLS) or redis+cluster://HOST:PORT,...")
	fs.StringVar(&c.tlsCAFile, "tls-ca-file", "", "the CA that signed the server's certificate (rediss://)")
	fs.StringVar(&c.key, "key", "fresh", "the key of atomic and outage")
	fs.IntVar(&c.keys, "keys", 100000, "key space of speed and fill")
	fs.IntVar(&c.concurrency, "concurrency", 1, "goroutines of speed")
	fs.IntVar(&c.requests, "requests", 100, "goroutines of atomic")
	fs.IntVar(&c.calls, "calls", 20, "decisions of outage")
	fs.IntVar(&c.timeoutMs, "timeout-ms", 100, "read and write timeout")
	fs.Float64Var(&c.seconds, "seconds", 2, "measured seconds of speed")
	fs.Float64Var(&c.warmup, "warmup", 0.3, "unrecorded seconds of speed")
	fs.Float64Var(&c.rate, "rate", 10, "tokens per second")
	fs.IntVar(&c.capacity, "capacity", 100, "bucket size")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed of the key draws")
	fs.Parse(os.Args[2:])
	if c.url == "" || c.impl == "" {
		die("--impl and --url are required")
	}
	if c.keys < 1 || c.concurrency < 1 || c.requests < 1 || c.calls < 1 || c.capacity < 1 ||
		!(c.rate > 0) || !(c.seconds > 0) || c.warmup < 0 || c.timeoutMs < 1 {
		die("a count, the rate or a duration is out of range")
	}
	switch c.mode {
	case "speed":
		runSpeed(c)
	case "atomic":
		runAtomic(c)
	case "outage":
		runOutage(c)
	case "fill":
		runFill(c)
	default:
		die("unknown mode %q (speed, atomic, outage, fill)", c.mode)
	}
}
