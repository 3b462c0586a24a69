//! The `chaos` binary: parse, set up the process (signals, malloc, tracing,
//! the runtime), hand the subcommand to [`chaos::commands::execute`], and map
//! the result to an exit code. It owns Ctrl-C and SIGTERM: it delivers them
//! to the library ([`chaos::deliver_interrupt`]) and exits on the second.

use chaos::commands::cli::Cli;
use chaos::commands::exit::Exit;
use clap::Parser;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // librdkafka's threads each take a glibc malloc arena of their own, and
    // memory freed in one arena is not reused by the others: measured on the
    // 100,000-payment bench, peak RSS was 316 MB with the default arenas and
    // 163 MB with two, for a live heap of about 110 MB.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a malloc tuning call made before any thread starts.
    //
    // Blocks of 1 MB and more are mapped on their own, always: glibc's
    // threshold otherwise climbs to 32 MB as such blocks are freed, and the
    // checkers' columns then grow inside the heap, copied at each doubling
    // and leaving holes behind. Measured at a million payments: peak RSS
    // 593 MB with the climbing threshold, 562 MB with it fixed, the same
    // throughput.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    let cli = Cli::parse();
    // Logs go to stderr; stdout carries only tables and JSON.
    let default = match cli.verbose {
        0 => "warn,rdkafka=off,librdkafka=off,sqlx=off",
        1 => "info,rdkafka=warn,librdkafka=warn,sqlx=warn",
        _ => "debug,rdkafka=info,sqlx=info",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: a log piped to a file or a CI job stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .init();

    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if matches!(cli.command, chaos::commands::cli::Command::Component) {
        // One relay or notifier per process, restarted at every crash: one
        // worker thread is all it uses, and each thread is paid at every start.
        builder.worker_threads(1);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return Exit::Internal.into();
        }
    };
    rt.spawn(deliver_signals());
    let result = rt.block_on(chaos::commands::execute(cli.command));
    // Components may still be closing Kafka clients; do not wait for them.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("error: {}", chaos::redact(&e.to_string()));
            chaos::commands::exits::of_error(&e).into()
        }
    }
}

/// The binary owns Ctrl-C and SIGTERM: the first asks the library to stop
/// the run and still write its report (exit 130); a second, while that
/// stop takes its time, exits at once.
async fn deliver_signals() {
    loop {
        signal().await;
        if chaos::deliver_interrupt() >= 2 {
            eprintln!("error: interrupted again; exiting without waiting for the run to stop");
            std::process::exit(Exit::Interrupted.code() as i32);
        }
    }
}

/// Resolves on the next Ctrl-C or SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
