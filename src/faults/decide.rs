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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
