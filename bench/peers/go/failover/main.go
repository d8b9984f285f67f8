// go-redis' side of the Sentinel failover measurement (bench/suite/suite.py,
// phase failover; bench/peers/README.md, "Following a failover"):
//
//	failover_go --url redis+sentinel://H:P[,H:P...]/SERVICE --prefix fo:go: [--interval-ms 10]
//
// go-redis v9's redis.NewFailoverClient as its documentation shows it,
// FailoverOptions with MasterName and SentinelAddrs only (every other
// option its default), running hirate's own script (lua/token_bucket.lua)
// with redis.NewScript(src).Run (EVALSHA, and EVAL on NOSCRIPT). One
// decision on a key of its own each ("rl:" + PREFIX + sequence number,
// capacity 10, rate 0.001/s, so each key lives 1,000 s), a sleep of
// --interval-ms between decisions, until SIGTERM. One line per decision on
// stdout:
//
//	SEQ UNIX_NS OK WHAT
//
// UNIX_NS the wall-clock time when the call returned, OK 1 when the script
// answered and 0 when it failed, WHAT "redis" or "error".
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	url := flag.String("url", "", "redis+sentinel://H:P[,H:P...]/SERVICE")
	prefix := flag.String("prefix", "fo:go:", "key prefix after rl:")
	intervalMs := flag.Int("interval-ms", 10, "sleep between decisions")
	script := flag.String("script", "", "hirate's lua/token_bucket.lua")
	flag.Parse()
	rest, ok := strings.CutPrefix(*url, "redis+sentinel://")
	hosts, service, _ := strings.Cut(rest, "/")
	service, _, _ = strings.Cut(service, "/")
	if !ok || hosts == "" || service == "" {
		fmt.Fprintln(os.Stderr, "failover_go: --url: expected redis+sentinel://H:P[,H:P...]/SERVICE")
		os.Exit(2)
	}
	path := *script
	if path == "" {
		exe, _ := os.Executable()
		path = filepath.Join(filepath.Dir(exe), "token_bucket.lua")
	}
	src, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover_go:", err)
		os.Exit(2)
	}
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    service,
		SentinelAddrs: strings.Split(hosts, ","),
	})
	sc := redis.NewScript(string(src))
	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; stop.Store(true) }()
	out := bufio.NewWriter(os.Stdout)
	ctx := context.Background()
	for seq := 0; !stop.Load(); seq++ {
		key := fmt.Sprintf("rl:%s%d", *prefix, seq)
		_, err := sc.Run(ctx, client, []string{key}, 10, "0.001", 1, 1).Result()
		now := time.Now().UnixNano()
		if err == nil {
			fmt.Fprintf(out, "%d %d 1 redis\n", seq, now)
		} else {
			fmt.Fprintf(out, "%d %d 0 error\n", seq, now)
		}
		out.Flush()
		time.Sleep(time.Duration(*intervalMs) * time.Millisecond)
	}
	client.Close()
}
