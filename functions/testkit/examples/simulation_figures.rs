//! The figures of the simulation's scenarios 5, 6 and 7 (the thundering herd, a
//! tenant beside a noisy neighbour, the soak), printed:
//! `cargo run --release -p entrega-testkit --example simulation_figures`.
//! `ENTREGA_SIM_SEED`, `ENTREGA_SIM_BACKLOG` (default 50 000) and
//! `ENTREGA_SIM_EVENTS` (default 100 000) set the runs; at these, the sizes,
//! the whole example takes about 40 s in a release build.

use std::time::Duration;

use entrega_testkit::sim::scenarios::{beside_a_slow_tenant, p99, soak, thundering_herd};
use entrega_testkit::sim::{env_or, seed_or};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let seed = seed_or(1);
    println!("{}", thundering_herd(seed).await);

    let backlog: usize = env_or("ENTREGA_SIM_BACKLOG", 50_000);
    let (alone, _, _) = beside_a_slow_tenant(seed, 0, Duration::ZERO, 10_000).await;
    let (beside, _, _) = beside_a_slow_tenant(seed, backlog, Duration::from_secs(2), 10_000).await;
    println!(
        "noisy neighbour, seed {seed}: B p99 {} ms alone, {} ms beside A's {backlog}-event backlog: {:.2}x",
        p99(&alone),
        p99(&beside),
        p99(&beside) as f64 / p99(&alone) as f64
    );

    println!(
        "{}",
        soak(seed, env_or("ENTREGA_SIM_EVENTS", 100_000)).await
    );
}
