//! Many runs at once: a sweep over seeds, the shrinker of a failing seed,
//! the self-test catalogue of classic mistakes, and the benchmark.

pub mod bench;
pub mod junit;
pub mod selftest;
pub mod shrink;
pub mod sweep;
