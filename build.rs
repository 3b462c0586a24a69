// `sqlx::migrate!` embeds the migrations at compile time, but cargo does not
// know the macro reads them: without this, adding or editing a migration
// leaves the old schema in the binary until some source file changes.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
