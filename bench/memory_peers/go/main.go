// Go's golang.org/x/time/rate limiters, one per key in a sync.Map, doing
// bench_memory's "allowed" work: 10,000 keys of 12 bytes, capacity (burst)
// 1e9 at 1e6 tokens a second, cost 1, each goroutine (pinned to an OS thread)
// cycling through its keys in its own shuffled order, time.Now() per
// decision. Prints "name decisions_per_second" lines, the median of RUNS.
//
//	memory_peer_go [-seconds S] [-runs N] [-keys K]
package main

import (
	"flag"
	"fmt"
	"math/rand"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

func main() {
	seconds := flag.Float64("seconds", 1, "seconds a run")
	runs := flag.Int("runs", 5, "runs a configuration")
	nkeys := flag.Int("keys", 10000, "hot keys")
	flag.Parse()
	keys := make([]string, *nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%07d", i)
	}
	for _, c := range []struct {
		name     string
		threads  int
		disjoint bool
	}{{"1t", 1, false}, {"2t", 2, false}, {"2t_disjoint", 2, true}} {
		var m sync.Map
		get := func(k string) *rate.Limiter {
			if v, ok := m.Load(k); ok {
				return v.(*rate.Limiter)
			}
			v, _ := m.LoadOrStore(k, rate.NewLimiter(rate.Limit(1e6), 1000000000))
			return v.(*rate.Limiter)
		}
		orders := make([][]string, c.threads)
		for t := range orders {
			for i, k := range keys {
				if !c.disjoint || i%c.threads == t {
					orders[t] = append(orders[t], k)
				}
			}
			r := rand.New(rand.NewSource(int64(42 + t)))
			r.Shuffle(len(orders[t]), func(i, j int) { orders[t][i], orders[t][j] = orders[t][j], orders[t][i] })
		}
		one := func(d time.Duration) float64 {
			var stop atomic.Bool
			var wg sync.WaitGroup
			rates := make([]float64, c.threads)
			for t := 0; t < c.threads; t++ {
				wg.Add(1)
				go func(t int) {
					runtime.LockOSThread()
					defer wg.Done()
					o := orders[t]
					n, pos := 0, (t*len(o))/2%len(o)
					t0 := time.Now()
					for !stop.Load() {
						for j := 0; j < 1024; j++ {
							get(o[pos]).AllowN(time.Now(), 1)
							if pos++; pos == len(o) {
								pos = 0
							}
						}
						n += 1024
					}
					rates[t] = float64(n) / time.Since(t0).Seconds()
				}(t)
			}
			time.Sleep(d)
			stop.Store(true)
			wg.Wait()
			s := 0.0
			for _, r := range rates {
				s += r
			}
			return s
		}
		one(300 * time.Millisecond)
		res := make([]float64, *runs)
		for r := range res {
			res[r] = one(time.Duration(*seconds * float64(time.Second)))
		}
		sort.Float64s(res)
		fmt.Printf("go_xtime_%s %.0f\n", c.name, res[len(res)/2])
	}
}
