//! The random source port: the jitter of retry delays and the nonces of slot holders
//! come from here, so a simulation can replay a run from its seed.

use std::sync::Mutex;

use rand::{RngCore, SeedableRng};

/// Where randomness comes from. Drawing never fails or blocks for long.
pub trait RandomSource: Send + Sync {
    fn next_u64(&self) -> u64;
}

/// The operating system's generator (per thread), for production.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemRandom;

impl RandomSource for SystemRandom {
    fn next_u64(&self) -> u64 {
        rand::thread_rng().next_u64()
    }
}

/// A seeded generator: the same seed draws the same numbers, in the order asked.
#[derive(Debug)]
pub struct SeededRandom(Mutex<rand::rngs::StdRng>);

impl SeededRandom {
    pub fn new(seed: u64) -> Self {
        Self(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)))
    }
}

impl RandomSource for SeededRandom {
    fn next_u64(&self) -> u64 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).next_u64()
    }
}

/// A [`RandomSource`] as a [`rand::Rng`], for the pure functions that take one.
pub struct RngOf<'a>(pub &'a dyn RandomSource);

impl RngCore for RngOf<'_> {
    fn next_u32(&mut self) -> u32 {
        (self.0.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.0.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    #[test]
    fn a_seed_replays_its_draws_and_another_seed_does_not() {
        let draws = |seed| {
            let source = SeededRandom::new(seed);
            let mut rng = RngOf(&source);
            (0..8)
                .map(|_| rng.gen_range(0..1_000_000))
                .collect::<Vec<u32>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }
}
