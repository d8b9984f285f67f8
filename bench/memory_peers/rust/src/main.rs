//! Rust's governor keyed limiter (DefaultKeyedRateLimiter: a DashMap of
//! GCRA states, one compare-and-swap on a u64 a decision), doing
//! bench_memory's "allowed" work: 10,000 keys of 12 bytes, burst 1e9 at 1e6
//! a second, cost 1, each thread cycling through its keys in its own shuffled
//! order, the default clock (a monotonic read) per decision. Prints
//! "name decisions_per_second" lines, the median of RUNS.
//!
//!     memory_peer_rust [--seconds S] [--runs N] [--keys K]
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn opt(args: &[String], name: &str, def: f64) -> f64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(def)
}

fn shuffle(v: &mut [String], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = opt(&args, "--seconds", 1.0);
    let runs = opt(&args, "--runs", 5.0) as usize;
    let nkeys = opt(&args, "--keys", 10000.0) as usize;
    let keys: Vec<String> = (0..nkeys).map(|i| format!("user:{:07}", i)).collect();
    for (name, threads, disjoint) in [("1t", 1, false), ("2t", 2, false), ("2t_disjoint", 2, true)] {
        let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
            .allow_burst(NonZeroU32::new(1_000_000_000).unwrap());
        let lim = Arc::new(RateLimiter::keyed(quota));
        let orders: Vec<Arc<Vec<String>>> = (0..threads)
            .map(|t| {
                let mut o: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !disjoint || i % threads == t)
                    .map(|(_, k)| k.clone())
                    .collect();
                shuffle(&mut o, 0x5eed + t as u64);
                Arc::new(o)
            })
            .collect();
        let one = |d: Duration| -> f64 {
            let stop = Arc::new(AtomicBool::new(false));
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (lim, o, stop) = (lim.clone(), orders[t].clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut pos = (t * o.len() / 2) % o.len();
                        let mut n = 0u64;
                        let t0 = Instant::now();
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..1024 {
                                std::hint::black_box(lim.check_key(&o[pos]).is_ok());
                                pos += 1;
                                if pos == o.len() {
                                    pos = 0;
                                }
                            }
                            n += 1024;
                        }
                        n as f64 / t0.elapsed().as_secs_f64()
                    })
                })
                .collect();
            std::thread::sleep(d);
            stop.store(true, Ordering::Relaxed);
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        };
        one(Duration::from_millis(300));
        let mut res: Vec<f64> = (0..runs).map(|_| one(Duration::from_secs_f64(seconds))).collect();
        res.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("rust_governor_{} {:.0}", name, res[res.len() / 2]);
    }
}
