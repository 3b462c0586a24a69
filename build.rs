// `sqlx::migrate!` embeds the migrations at compile time, but cargo does not
// know the macro reads them: without this, adding or editing a migration
// leaves the old schema in the binary until some source file changes.
//
// CHAOS_COMMIT: the commit the binary is built from, for `--version` and a
// sweep's fingerprint, so that `chaos merge` can tell two builds apart
// (every build says 0.1.0). "unknown" outside a git checkout.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-env-changed=CHAOS_COMMIT");
    let commit = std::env::var("CHAOS_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
        let out = std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    });
    println!("cargo:rustc-env=CHAOS_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}
