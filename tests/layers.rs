//! The layers of `src/` and the one direction their dependencies run in.
//!
//! Each top-level module sits on one layer; a module may name (`crate::…`)
//! only modules on lower layers, or on its own layer when the two do not
//! name each other. Test code (`#[cfg(test)]` modules) is left out: a unit
//! test may reach up for the harness it needs. Comments are left out too.
//!
//! A new top-level module must be given a layer here, so the map stays
//! the architecture's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// From the bottom up. A module may name only those below it, and those
/// beside it on the same line that do not name it back.
const LAYERS: &[&[&str]] = &[
    // Typed errors: everything may fail.
    &["error"],
    // The words every layer shares: events, intent, rows, handlers, names.
    &["domain"],
    // The broker boundary: what the pipeline asks of a broker, and where a
    // message sits on a topic (positions), opaque to everything above.
    &["broker"],
    // Fault points, their seeded decisions and the log of what fired.
    &["faults"],
    // The raw and validated scenario, which names fault points.
    &["scenario"],
    // The database's adapter and the third party's stand-in (the email provider).
    &["store", "provider"],
    // What every part of one run shares: its scenario, store, broker,
    // injector, counters and shutdown signal. Not the reference system's:
    // the nemesis, the report and the harness hold it too.
    &["context"],
    // The checker: it reads ground truth, never the system under test.
    &["verifier"],
    // The reference system under test.
    &["pipeline"],
    // Faults struck from outside the components.
    &["nemesis"],
    // What people and CI read.
    &["report"],
    // One run.
    &["harness"],
    // Many runs.
    &["campaigns"],
    // One function per subcommand; every exit-code decision.
    &["commands"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to: `src/store/truth.rs` → `store`.
fn top(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// Files declared behind `#[cfg(test)]` (`#[cfg(test)] mod testing;`).
fn test_only_files(all: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in all {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            if w[0].trim() != "#[cfg(test)]" {
                continue;
            }
            let decl = w[1].trim().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                let dir = if f.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs") {
                    f.parent().unwrap().to_path_buf()
                } else {
                    f.with_extension("")
                };
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// The code of a file without its comments and without its inline
/// `#[cfg(test)] mod tests { … }` (by convention the file's last item).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string (a URL) keeps the line whole.
            Some(i) if l[..i].matches('"').count() % 2 == 0 => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every top-level module `text` names through `crate::`.
fn named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            // `crate::{a, b}` hides what it names from this check.
            out.insert("{".into());
        } else if name == "Error" {
            // lib.rs re-exports `error::Error` as `crate::Error`.
            out.insert("error".into());
        } else {
            out.insert(name);
        }
    }
    out
}

/// module → (module it names → the first file that names it).
fn imports() -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let skip = test_only_files(&all);
    let mut out: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for f in all.iter().filter(|f| !skip.contains(*f)) {
        let from = top(f);
        if from == "lib" || from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for to in named(&code(&text)) {
            if to != from {
                out.entry(from.clone()).or_default().entry(to).or_insert_with(|| f.clone());
            }
        }
    }
    out
}

#[test]
fn every_module_has_a_layer() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let tops: BTreeSet<String> = all.iter().map(|f| top(f)).filter(|t| t != "lib" && t != "main").collect();
    let missing: Vec<&String> = tops.iter().filter(|t| layer_of(t).is_none()).collect();
    assert!(missing.is_empty(), "top-level modules without a layer in tests/layers.rs: {missing:?}");
}

#[test]
fn dependencies_run_down_the_layers_only() {
    let mut wrong = Vec::new();
    for (from, tos) in imports() {
        let Some(lf) = layer_of(&from) else { continue };
        for (to, file) in tos {
            let shown = file.strip_prefix(src()).unwrap().display().to_string();
            if to == "{" {
                wrong.push(format!("src/{shown} writes `crate::{{…}}`: name each path in full"));
                continue;
            }
            match layer_of(&to) {
                Some(lt) if lt > lf => wrong.push(format!("{from} imports {to}, a layer above it (src/{shown})")),
                None => wrong.push(format!("{from} imports {to}, which has no layer (src/{shown})")),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "imports that run up the layers:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_modules_import_each_other() {
    let map = imports();
    let mut both = Vec::new();
    for (a, tos) in &map {
        for b in tos.keys() {
            if a < b && map.get(b).is_some_and(|m| m.contains_key(a)) {
                both.push(format!("{a} ↔ {b}"));
            }
        }
    }
    assert!(both.is_empty(), "top-level modules that import each other: {both:?}");
}

#[test]
fn the_check_sees_an_upward_import() {
    // The reader itself: a `use` of a higher layer is seen, a comment is not.
    let text = "use crate::store::Store;\n// crate::commands in a comment\nfn f() { crate::harness::run(); }\n#[cfg(test)]\nmod tests {\n use crate::campaigns::x;\n}\n";
    let seen = named(&code(text));
    assert_eq!(seen, ["harness", "store"].iter().map(|s| s.to_string()).collect());
    assert!(layer_of("harness") > layer_of("store"));
}

#[test]
fn only_the_commands_print() {
    // The library computes and emits events; `commands/` and `main.rs`
    // print them. (A component process's protocol lines are its channel to
    // the harness, written with `writeln!`, not printing.)
    let mut all = Vec::new();
    files(&src(), &mut all);
    let skip = test_only_files(&all);
    let mut printing = Vec::new();
    for f in all.iter().filter(|f| !skip.contains(*f)) {
        let top = top(f);
        if top == "commands" || top == "main" {
            continue;
        }
        let text = code(&std::fs::read_to_string(f).unwrap());
        for mac in ["println!", "eprintln!", "print!(", "eprint!("] {
            if text.contains(mac) {
                printing.push(format!("{} uses {mac}", f.strip_prefix(src()).unwrap().display()));
            }
        }
    }
    assert!(printing.is_empty(), "the library prints: {printing:?}");
}

#[test]
fn only_the_one_signalling_function_calls_kill() {
    // Issue 41: `kill(0, …)` from a made-up pid killed chaos's own process
    // group. Every signal goes through `nemesis::signal::send`, which
    // refuses this process, its group and ids of 1 or less; so no other
    // file, test code included, may call kill(2) itself.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(&src(), &mut all);
    files(&root.join("tests"), &mut all);
    let one = src().join("nemesis").join("signal.rs");
    let needle = ["libc::", "kill("].concat();
    let callers: Vec<String> = all
        .iter()
        .filter(|f| **f != one && std::fs::read_to_string(f).unwrap().contains(&needle))
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(callers.is_empty(), "kill(2) called outside nemesis/signal.rs: {callers:?}");
    assert!(std::fs::read_to_string(&one).unwrap().contains(&needle), "the signalling function moved");
}

#[test]
fn the_checkers_never_hold_the_injector() {
    // Issue 38: the verifier reads the faults' history, a value the harness
    // takes once the run is over; the firings it finds confirmed it returns,
    // and the harness writes them into the injector. Holding the injector,
    // a checker could write into the nemesis's state, as the verifier once
    // did (it confirmed firings there itself).
    let mut all = Vec::new();
    files(&src().join("verifier"), &mut all);
    let skip = test_only_files(&all);
    let holding: Vec<String> = all
        .iter()
        .filter(|f| !skip.contains(*f) && code(&std::fs::read_to_string(f).unwrap()).contains("FaultInjector"))
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(all.len() > 5, "the verifier's files were not found");
    assert!(holding.is_empty(), "checkers that name the fault injector: {holding:?}");
}

#[test]
fn the_run_context_is_not_the_pipelines() {
    // Issue 38: the run's context lived in `pipeline/`, the reference
    // system's folder, and the nemesis and the report imported it from
    // there. It is `src/context.rs` now; no file of the pipeline defines it.
    let mut all = Vec::new();
    files(&src().join("pipeline"), &mut all);
    assert!(all.len() > 5, "the pipeline's files were not found");
    let defining: Vec<String> = all
        .iter()
        .filter(|f| {
            let text = code(&std::fs::read_to_string(f).unwrap());
            ["pub struct Ctx", "pub struct Stats", "pub struct Shutdown"].iter().any(|d| text.contains(d))
        })
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(defining.is_empty(), "the run's context defined in the pipeline: {defining:?}");
    let context = std::fs::read_to_string(src().join("context.rs")).expect("src/context.rs");
    assert!(context.contains("pub struct Ctx"), "the run's context moved again: update this test");
}

#[test]
fn only_the_broker_folder_names_a_broker_kind() {
    // Issue 38: Kafka was built by path in six files outside `src/broker/`
    // (the run, the declared run, the component process, the fault proxy's
    // lanes, `chaos clean`, `chaos doctor`). They go through
    // `broker::open`, `broker::attach` and `broker::ping` now, so a second
    // kind of broker is one folder and those three functions.
    let mut all = Vec::new();
    files(&src(), &mut all);
    let naming: Vec<String> = all
        .iter()
        .filter(|f| !f.starts_with(src().join("broker")))
        .filter(|f| {
            let text = code(&std::fs::read_to_string(f).unwrap());
            text.contains("broker::kafka") || text.contains("broker::{kafka")
        })
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(all.len() > 50, "the source files were not found");
    assert!(naming.is_empty(), "files outside src/broker/ that name the Kafka adapter: {naming:?}");
}

#[test]
fn the_pipeline_never_asks_how_its_broker_recovers() {
    // Issue 38: the broker trait carried the mock cluster's quirks
    // (`rewinds_in_place`, `stranded`) and the notifier branched on them.
    // A consumer now recovers as its adapter decides (`crash_in_place`,
    // `replace`), so the pipeline's code names neither the mock cluster
    // nor the embedded mode. Comments may.
    let mut all = Vec::new();
    files(&src().join("pipeline"), &mut all);
    let asking: Vec<String> = all
        .iter()
        .filter(|f| {
            let text = code(&std::fs::read_to_string(f).unwrap());
            ["embedded()", "rewinds_in_place", "stranded", "rewind_to_committed", "mock"]
                .iter()
                .any(|w| text.contains(w))
        })
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(all.len() > 5, "the pipeline's files were not found");
    assert!(asking.is_empty(), "pipeline files that ask which broker they run on: {asking:?}");
    let broker = code(&std::fs::read_to_string(src().join("broker/mod.rs")).unwrap());
    for quirk in ["rewinds_in_place", "stranded", "rewind_to_committed", "fn leader"] {
        assert!(!broker.contains(quirk), "the broker trait has {quirk} again");
    }
}

/// The functions of `text` longer than `max` lines, as (name, first line,
/// lines). The code is rustfmt's: a function's body ends at the first line
/// that is a lone `}` at its `fn`'s indentation.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let mut words = body;
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "async ", "const ", "unsafe "] {
            words = words.strip_prefix(prefix).unwrap_or(words);
        }
        let Some(rest) = words.strip_prefix("fn ") else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // A declaration without a body (a trait's) ends at its `;` before
        // any `{`; a one-line function closes on its own line.
        let declared_only = lines[i..].iter().take_while(|l| !l.contains('{')).any(|l| l.trim_end().ends_with(';'));
        if declared_only || body.trim_end().ends_with('}') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(n) = lines[i..].iter().position(|l| *l == close) {
            if n + 1 > max {
                out.push((name, i + 1, n + 1));
            }
        }
    }
    out
}

/// The layering had left no function over 80 lines, and eleven slipped
/// back while the declared path grew: a reader takes a function in at once.
#[test]
fn no_function_is_over_80_lines() {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut long = Vec::new();
    for f in &all {
        let text = std::fs::read_to_string(f).unwrap();
        for (name, line, n) in long_functions(&text, 80) {
            long.push(format!("{}:{line} {name} ({n} lines)", f.strip_prefix(src()).unwrap().display()));
        }
    }
    assert!(long.is_empty(), "functions over 80 lines: {long:#?}");
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body: String = (0..81).map(|i| format!("        let x{i} = {i};\n")).collect();
    let text = format!("impl A {{\n    pub async fn long() {{\n{body}    }}\n\n    fn short() {{}}\n}}\n");
    assert_eq!(long_functions(&text, 80), vec![("long".to_string(), 2, 83)]);
    let trait_fn = "trait T {\n    fn decl(&self) -> u8;\n}\n";
    assert!(long_functions(trait_fn, 0).is_empty());
}

/// The library's surface: at most eight public modules, and the few items
/// the binary and the tests use from the rest re-exported at the root.
#[test]
fn lib_exposes_at_most_eight_public_modules() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let public: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).collect();
    assert!(public.len() <= 8, "{} public modules: {public:?}", public.len());
}

/// `code` without the text of its string literals (raw ones included), so
/// that words a user reads (an invariant's name, a SQL column) do not count.
fn without_strings(code: &str) -> String {
    let (chars, mut out, mut i) = (code.chars().collect::<Vec<_>>(), String::new(), 0);
    while i < chars.len() {
        let raw = chars[i] == 'r'
            && matches!(chars.get(i + 1), Some('"' | '#'))
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'));
        if raw {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) == Some(&'"') {
                let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let rest: String = chars[i + 2 + hashes..].iter().collect();
                let end = rest.find(&close).map_or(chars.len(), |e| i + 2 + hashes + rest[..e].chars().count());
                out.push_str("\"\"");
                i = end + 1 + hashes;
                continue;
            }
        }
        if chars[i] == '"' && (i == 0 || chars[i - 1] != '\'') {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// The files outside `src/broker/` and the proxy's Kafka wire, tests
/// aside, whose code `matches`.
fn outside_the_broker(matches: fn(&str) -> bool) -> Vec<String> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    assert!(all.len() > 50, "the source files were not found");
    let skip = test_only_files(&all);
    let kafka_wire = src().join("nemesis/proxy/kafka.rs");
    all.iter()
        .filter(|f| !f.starts_with(src().join("broker")) && **f != kafka_wire && !skip.contains(*f))
        .filter(|f| matches(&code(&std::fs::read_to_string(f).unwrap())))
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect()
}

/// Whether `code` names a topic position in Kafka's words: `partition`,
/// `offset` or `watermark` (or their plurals) as a whole identifier. The
/// iterator method `.partition(` is not one.
fn names_a_position(code: &str) -> bool {
    let code = without_strings(code).replace(".partition(", ".split_by(");
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| matches!(w, "partition" | "partitions" | "offset" | "offsets" | "watermark" | "watermarks"))
}

#[test]
fn positions_are_the_brokers_words() {
    // Issue 38: bare (partition, offset) pairs travelled through the fault
    // log, the process protocol and six verifier files; 45 files outside
    // the broker named them. The broker owns `Position`, `Stretch` and
    // `Topic` now; only Kafka's own code (the adapter, the proxy's wire
    // code) and the scenario's `[topic] partitions`, with its echo in the
    // report, say partition.
    let naming = outside_the_broker(names_a_position);
    assert!(
        naming.len() <= 6,
        "{} files outside src/broker/ name a partition, an offset or a watermark: {naming:?}",
        naming.len()
    );
}

#[test]
fn the_position_check_sees_a_bare_offset() {
    assert!(names_a_position("fn f(partition: i32, at: i64) {}"));
    assert!(names_a_position("let lag = high - m.offset;"));
    assert!(!names_a_position("let s = \"partition 1, offsets 3..=4\"; let r = r#\"offset\"#;"));
    assert!(!names_a_position("let (a, b): (Vec<_>, Vec<_>) = v.into_iter().partition(|x| *x);"));
    assert!(!names_a_position("FaultPoint::NotifierBeforeOffsetCommit; let topic_partition = 1;"));
}

#[test]
fn the_checkers_read_the_runs_history_taken_once() {
    // Issue 38: each judge took the record of intent and the fault log
    // from the run's context itself, at its own moment. The history is
    // taken once, in `run/system.rs`, after every component stopped; the
    // judges read it (`run/history.rs`).
    let mut all = Vec::new();
    files(&src(), &mut all);
    let skip = test_only_files(&all);
    let allowed = [src().join("harness/run/system.rs")];
    let taking: Vec<String> = all
        .iter()
        .filter(|f| f.starts_with(src().join("harness")) && !skip.contains(*f) && !allowed.contains(f))
        .filter(|f| {
            let text = code(&std::fs::read_to_string(f).unwrap());
            ["intent.take()", "faults.history()", "faults.log()"].iter().any(|t| text.contains(t))
        })
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(all.iter().any(|f| allowed.contains(f)), "run/system.rs was not found");
    assert!(taking.is_empty(), "files of the harness that take the run's record themselves: {taking:?}");
}

/// The words of a loop that belongs to the run's skeleton: waiting on a
/// signal, turning the nemesis on or off, the calm, the stall of the
/// workload, and the verdict.
const THE_SKELETONS_WORDS: [&str; 8] = [
    "interrupt::requested",
    "set_acting(",
    "acting.begin",
    "acting.stop",
    "calm_after(",
    "verdict::verdict",
    "Judged {",
    "judgeable(",
];

/// Which of the skeleton's words `code` says.
fn skeletons_words(code: &str) -> Vec<&'static str> {
    THE_SKELETONS_WORDS.iter().copied().filter(|w| code.contains(w)).collect()
}

#[test]
fn no_system_kind_owns_a_phase_of_the_run() {
    // Issue 65: each kind of system had its own drive, its own loop that
    // turned the faults off and drained, and its own judge, and they
    // drifted (an incomplete payments run was verified, a declared one was
    // not; a stalled relay was judged only at zero lag on one path). The
    // skeleton (`run/phases.rs`) owns every phase; a kind answers
    // questions (`run/reference.rs`, `run/declared/`).
    let run = src().join("harness/run");
    let mut kinds = vec![run.join("reference.rs")];
    files(&run.join("declared"), &mut kinds);
    let skip = test_only_files(&kinds);
    let owning: Vec<String> = kinds
        .iter()
        .filter(|f| !skip.contains(*f))
        .filter_map(|f| {
            let words = skeletons_words(&code(&std::fs::read_to_string(f).unwrap()));
            (!words.is_empty()).then(|| format!("{} says {words:?}", f.strip_prefix(src()).unwrap().display()))
        })
        .collect();
    assert!(kinds.len() >= 4, "the kinds' files were not found: {kinds:?}");
    assert!(owning.is_empty(), "a system kind runs a phase of the run itself: {owning:?}");
    let skeleton = code(&std::fs::read_to_string(run.join("phases.rs")).expect("run/phases.rs"));
    assert_eq!(skeletons_words(&skeleton).len(), THE_SKELETONS_WORDS.len(), "the skeleton's phases moved");
}

#[test]
fn the_phase_check_sees_a_kind_with_its_own_drain_loop() {
    let own = "loop { tokio::select! { r = drain(ctx) => {}, _ = crate::harness::interrupt::requested() => {} } }";
    assert_eq!(skeletons_words(own), vec!["interrupt::requested"]);
    assert!(skeletons_words("fn left(ctx: &Ctx) -> Left { todo!() }").is_empty());
}

#[test]
fn the_report_and_the_judge_read_the_history_never_the_injector() {
    // Issue 65: the report's skeleton read the live injector for the
    // faults' counts and log, and the judges read it again for the
    // firings that replay the run, after the checkers were done. The
    // history (taken once, in `run/system.rs`) carries all three.
    let mut all = Vec::new();
    files(&src().join("report"), &mut all);
    let mut skip = test_only_files(&all);
    // The live progress line reads the injector while the run goes on;
    // it draws nothing of the report.
    skip.insert(src().join("report/progress.rs"));
    let holding: Vec<String> = all
        .iter()
        .filter(|f| !skip.contains(*f) && code(&std::fs::read_to_string(f).unwrap()).contains("FaultInjector"))
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(all.len() > 5, "the report's files were not found");
    assert!(holding.is_empty(), "report files that name the fault injector: {holding:?}");
    let phases = code(&std::fs::read_to_string(src().join("harness/run/phases.rs")).expect("run/phases.rs"));
    let judge = phases.split("async fn judge(").nth(1).expect("the skeleton's judge");
    let judge = judge.split("\n}\n").next().unwrap();
    for read in ["ctx.faults", "ctx.intent", "ctx.store.unpublished"] {
        assert!(!judge.contains(read), "the judge reads `{read}` itself: take it into the history");
    }
}

/// Whether `code` asks the broker a question in Kafka's shape (a group's
/// lag or committed offsets, a topic's watermarks, each partition's answer
/// rather than the boundary's one figure) or opens a `Position` or
/// `Stretch` into the numbers of a place (`.at()`, `.as_row()`), or makes
/// one from them. A lane is the boundary's word (a log has numbered lanes,
/// `Topic::lanes` of them, and groups that take from it); where a message
/// sits in its lane is the broker's.
fn reads_kafkas_answers(code: &str) -> bool {
    let code = without_strings(code);
    [
        ".group_lag(",
        ".watermarks(",
        ".group_members(",
        ".group_stable(",
        ".group_committed(",
        ".written_to(",
        "Position::new(",
        "Stretch::new(",
        ".at()",
        ".as_row()",
    ]
    .iter()
    .any(|w| code.contains(w))
}

#[test]
fn the_broker_row_of_the_development_doc_names_every_file_that_reads_kafkas_answers() {
    // Issue 65: docs/development.md said a second broker touched "the
    // folder and 3 lines". The trait's answers are Kafka's in shape, so
    // each file outside the folder that reads them would have to be read
    // again for a broker whose lanes, groups or positions differ. The row
    // names them, and this test keeps it true as the list shrinks.
    let reading = outside_the_broker(reads_kafkas_answers);
    // Issue 65: at most the dead letters' columns (the contract's).
    assert!(reading.len() <= 3, "{} files outside src/broker/ read Kafka's answers: {reading:?}", reading.len());
    let doc = std::fs::read_to_string(src().join("../docs/development.md")).unwrap();
    let row = doc.lines().find(|l| l.starts_with("| a broker |")).expect("the broker row of docs/development.md");
    let count = format!("{} files outside `src/broker/`", reading.len());
    assert!(row.contains(&count), "the broker row must say \"{count}\": {reading:?}");
    for f in &reading {
        assert!(row.contains(&format!("`{f}`")), "the broker row must name `{f}`: {reading:?}");
    }
}

#[test]
fn the_kafka_answer_check_sees_a_lag_and_an_opened_position() {
    assert!(reads_kafkas_answers("let lag = ctx.broker.group_lag(&g, &t).await;"));
    assert!(reads_kafkas_answers("let (l, a) = (p.lane(), p.at());"));
    assert!(reads_kafkas_answers("let (lane, place) = m.position.as_row();"));
    assert!(!reads_kafkas_answers("let same = a.lane() == b.lane(); let n = broker.backlog(&g, &t).await;"));
    assert!(!reads_kafkas_answers("let s = \".group_lag(\"; let at = deadline;"));
}

/// Whether `code` reads a report's section of one kind of system to
/// decide what to draw: a declared system's figures (`r.system`), or its
/// absence, which meant the payments pipeline.
fn asks_which_kind_ran(code: &str) -> bool {
    let code = without_strings(code);
    code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .any(|w| w.ends_with(".system") || w.contains(".system."))
}

#[test]
fn nothing_under_the_report_asks_which_kind_of_system_ran() {
    // Issue 65: eight branches on `r.system` under `src/report/` chose a
    // declared system's words or the payments pipeline's, so a new kind
    // of system touched five report files. The kind chooses its words
    // once (`report::shown::Shown`, from `harness/run/system.rs`); the
    // reports draw them. Only the report's assembly carries the section
    // across (`system: sections.system`).
    let mut all = Vec::new();
    files(&src().join("report"), &mut all);
    let skip = test_only_files(&all);
    let asking: Vec<String> = all
        .iter()
        .filter(|f| !skip.contains(*f))
        .filter(|f| {
            let text = code(&std::fs::read_to_string(f).unwrap()).replace("system: sections.system,", "");
            asks_which_kind_ran(&text)
        })
        .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
        .collect();
    assert!(all.len() > 5, "the report's files were not found");
    assert!(asking.is_empty(), "report files that ask which kind of system ran: {asking:?}");
}

#[test]
fn the_kind_check_sees_a_branch_on_the_system_section() {
    assert!(asks_which_kind_ran("match &r.system { Some(f) => a(f), None => b() }"));
    assert!(asks_which_kind_ran("if r.system.is_none() { x() }"));
    assert!(asks_which_kind_ran("let d = report.system.as_ref();"));
    assert!(!asks_which_kind_ran("let s = \"r.system\"; let t = r.shown.driven; mod system;"));
}
