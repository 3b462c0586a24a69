//! Many runs at once: a sweep over seeds, the shrinker of a failing seed,
//! the self-test catalogue of classic mistakes, and the benchmark.

pub(crate) mod bench;
pub(crate) mod junit;
pub mod selftest;
pub(crate) mod shrink;
pub(crate) mod sweep;
