//! The seeded decisions: a pure function of (seed, point, occurrence).

use super::*;
use rand::{Rng, SeedableRng};

/// The decision for one occurrence: a pure function, usable by tests and by
/// anyone who wants to know in advance what a seed will do.
pub fn decide(seed: u64, point: FaultPoint, occurrence: u64, probability: f64) -> bool {
    if probability <= 0.0 {
        return false;
    }
    let mixed = splitmix(seed ^ point.salt()).wrapping_add(occurrence.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut rng = rand::rngs::StdRng::seed_from_u64(splitmix(mixed));
    rng.gen::<f64>() < probability
}

/// Mixed into the seed for the arming draws of [`Aimed::PerSecond`].
pub(super) const ARMING_SALT: u64 = 0x6172_6d69_6e67_0001;

/// Mixed into the seed for the windows an armed process lets pass.
pub(super) const SPREAD_SALT: u64 = 0x7370_7265_6164_0001;

/// A seeded draw in `0..below` for one occurrence of `point`: a pure
/// function, like [`decide`].
pub fn draw_below(seed: u64, point: FaultPoint, occurrence: u64, below: u64) -> u64 {
    if below <= 1 {
        return 0;
    }
    let mixed = splitmix(seed ^ point.salt()).wrapping_add(occurrence.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut rng = rand::rngs::StdRng::seed_from_u64(splitmix(mixed));
    rng.gen_range(0..below)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
