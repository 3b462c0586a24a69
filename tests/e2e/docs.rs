//! The user's references say what the code does: the README and `--help`
//! list every exit code and every fault point the code has.

use crate::common::*;
use chaos::commands::exit::Exit;
use chaos::faults::FaultPoint;

/// The README and the docs it leads to: the references a user reads.
fn readme() -> String {
    let mut text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut docs: Vec<_> = std::fs::read_dir(root().join("docs")).unwrap().flatten().map(|e| e.path()).collect();
    docs.sort();
    for d in docs.iter().filter(|d| d.extension().is_some_and(|e| e == "md")) {
        text.push('\n');
        text.push_str(&std::fs::read_to_string(d).unwrap());
    }
    text
}

#[test]
fn the_fault_point_reference_documents_every_fault_point() {
    // The generated table is the user's reference: every point and its key.
    let doc = std::fs::read_to_string(root().join("docs/fault-points.md")).unwrap();
    for p in FaultPoint::ALL {
        assert!(
            doc.contains(&format!("| `{}` | `{}` |", p.name(), p.key())),
            "docs/fault-points.md lacks {}",
            p.name()
        );
    }
    assert!(readme().contains("docs/fault-points.md"), "the README points to the fault point reference");
}

#[test]
fn the_fault_point_reference_is_the_registry() {
    // docs/fault-points.md is generated from `fault_points!`; CHAOS_BLESS=1
    // writes it again after the registry changed.
    let path = root().join("docs/fault-points.md");
    let want = chaos::faults::reference();
    if std::env::var_os("CHAOS_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "docs/fault-points.md differs from the registry: run `CHAOS_BLESS=1 cargo test --test e2e fault_point_reference`");
}

#[test]
fn the_json_schemas_are_the_types() {
    // docs/schema/ is generated from `Report` and `RawScenario`; CHAOS_BLESS=1
    // writes it again after a type changed.
    for (file, want) in
        [("report.schema.json", chaos::report_json_schema()), ("scenario.schema.json", chaos::scenario::json_schema())]
    {
        let path = root().join("docs/schema").join(file);
        if std::env::var_os("CHAOS_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/schema/{file} differs from the types: run `CHAOS_BLESS=1 cargo test --test e2e json_schemas`"
        );
        // What an installed binary prints is the same file.
        let of = file.split('.').next().unwrap();
        let printed = run(chaos().args(["schema", of]));
        assert_eq!(printed.code, 0, "{}", printed.stderr);
        assert!(printed.stdout == want, "chaos schema {of} differs from docs/schema/{file}");
    }
    // The sample report kept for readers is a real run of this chaos
    // (docs/reports.md says how to make it again): it holds to the schema
    // as every run's report does.
    let sample = root().join("reports/sample-payments-postgres-kafka.json");
    let text = std::fs::read_to_string(&sample).unwrap_or_else(|e| panic!("{}: {e}", sample.display()));
    assert_valid_report(&serde_json::from_str(&text).expect("the sample report is JSON"));
}

#[test]
fn the_readme_and_help_list_every_exit_code() {
    let readme = readme();
    let help = run(chaos().arg("--help"));
    assert_eq!(help.code, 0);
    for e in Exit::ALL {
        let code = e.code();
        assert!(readme.contains(&format!("\n| {code} | ")), "README's exit code table lacks {code} ({e:?})");
        assert!(help.stdout.contains(&format!(" {code} ")), "--help lacks exit code {code} ({e:?}):\n{}", help.stdout);
    }
}

#[test]
fn an_unwritable_reports_dir_exits_74_naming_the_path() {
    // A file where the reports directory should be: nothing can be written under it.
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let mut c = chaos();
    c.arg("run").arg(root().join("scenarios/smoke.toml")).arg("--reports-dir").arg(&blocker);
    Backend::Embedded.apply(&mut c);
    let ran = run(&mut c);
    assert_eq!(ran.code, 74, "stderr:\n{}", ran.stderr);
    assert!(ran.stderr.contains("not-a-dir"), "{}", ran.stderr);
}

#[test]
fn the_readme_layout_names_every_module_of_src() {
    // The Layout section is a newcomer's map: a module added, moved or
    // removed must show there.
    let readme = readme();
    let start = readme.find("## Layout").expect("a Layout section");
    let layout = &readme[start..];
    let layout = &layout[..layout[3..].find("\n## ").map_or(layout.len(), |i| i + 3)];
    let src = root().join("src");
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let shown = if entry.path().is_dir() { format!("src/{name}/") } else { format!("src/{name}") };
        assert!(layout.contains(&shown), "README's Layout does not name {shown}");
    }
    for token in layout.split_whitespace().filter(|t| t.starts_with("src/")) {
        let path = token.trim_end_matches(|c: char| !c.is_alphanumeric() && c != '/');
        assert!(root().join(path).exists(), "README's Layout names {path}, which does not exist");
    }
}

#[test]
fn the_readme_lists_every_selftest_variant() {
    let readme = readme();
    for v in chaos::CATALOGUE {
        assert!(readme.contains(&format!("| {} |", v.name)), "README's catalogue table lacks {}", v.name);
    }
}

#[test]
fn every_planted_bug_still_finds_the_code_it_plants_in() {
    // scripts/plant-bugs.py patches source text; a refactor that moves that
    // text silently turns a plant into a no-op.
    let out = std::process::Command::new("python3")
        .arg(root().join("scripts/plant-bugs.py"))
        .arg("--check")
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.ends_with("plants find their code")).unwrap_or_else(|| panic!("{stdout}"));
    let (found, all) = line.split_whitespace().next().and_then(|n| n.split_once('/')).expect("N/M");
    assert_eq!(found, all, "{stdout}");
    assert!(all.parse::<u32>().unwrap() >= 13, "{stdout}");
}

#[test]
fn only_the_kafka_adapter_names_rdkafka() {
    // The broker boundary: the relay, notifier, workload and verifier talk
    // to src/broker/'s traits; rdkafka's types stay inside the adapter.
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.path().is_dir() {
                walk(&e.path(), out);
            } else if e.path().extension().is_some_and(|x| x == "rs") {
                out.push(e.path());
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    let adapter = root().join("src/broker/kafka");
    for f in files.iter().filter(|f| !f.starts_with(&adapter)) {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(!text.contains("rdkafka::"), "{} names rdkafka; go through src/broker/ instead", f.display());
    }
    assert!(files.len() > 30, "walked {} files", files.len());
}

/// Every relative link of the README and of docs/ leads to a file that
/// exists.
#[test]
fn every_link_in_the_readme_and_the_docs_leads_somewhere() {
    let mut pages = vec![root().join("README.md")];
    pages.extend(
        std::fs::read_dir(root().join("docs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut broken = Vec::new();
    let mut seen = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let target = rest.split(')').next().unwrap().split('#').next().unwrap().trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            seen += 1;
            if !page.parent().unwrap().join(target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(seen >= 10, "only {seen} links found");
    assert!(broken.is_empty(), "links to nothing: {broken:?}");
}

/// Every command the README shows runs as shown: each `chaos run` in a
/// code block, on the backend its environment names, ends with the exit
/// code its sample output says (PASS 0, FAIL 1); each script it names
/// exists and knows the subcommand; each `chaos <command>` it names in the
/// text is a command.
#[test]
fn every_command_in_the_readme_runs() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    // The commands run one after the other in a folder of their own, as a
    // newcomer's would in a checkout: `chaos init my.toml` then `chaos run
    // my.toml`, the reports in its reports/.
    let work = tempfile::tempdir().unwrap();
    for shared in ["scenarios", "scripts", "examples"] {
        std::os::unix::fs::symlink(root().join(shared), work.path().join(shared)).unwrap();
    }
    let mut in_block = false;
    let mut lines = text.lines().peekable();
    let mut ran = 0;
    while let Some(line) = lines.next() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        let command = line.strip_prefix("$ ").unwrap_or(line).split(" #").next().unwrap().trim();
        let words = shell_words(command);
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> =
            words.iter().take_while(|w| w.contains('=')).filter_map(|w| w.split_once('=')).collect();
        let argv: Vec<&str> = words[envs.len()..].to_vec();
        let args: &[&str] = match argv.as_slice() {
            ["chaos", rest @ ..] => rest,
            ["cargo", "run", "--release", "--", rest @ ..] => rest,
            [script, rest @ ..] if script.starts_with("scripts/") => {
                let path = root().join(script);
                let body = std::fs::read_to_string(&path)
                    .unwrap_or_else(|_| panic!("README names {script}, which does not exist"));
                use std::os::unix::fs::PermissionsExt;
                assert!(path.metadata().unwrap().permissions().mode() & 0o111 != 0, "{script} is not executable");
                if let Some(sub) = rest.first() {
                    assert!(
                        body.contains(&format!("{sub})")) || body.contains(&format!("{sub}|")),
                        "{script} has no {sub:?}"
                    );
                }
                continue;
            }
            _ => continue,
        };
        // The sample output under a `$ chaos run` says how it ends.
        let expected = match lines.peek() {
            Some(next) if next.starts_with("FAIL") => 1,
            _ => 0,
        };
        let mut c = chaos();
        c.current_dir(work.path()).args(args);
        let backend =
            if envs.iter().any(|(k, _)| *k == "DATABASE_URL") { Backend::Services } else { Backend::Embedded };
        backend.apply(&mut c);
        let out = run(&mut c);
        assert_eq!(out.code, expected, "README: {command}\nstdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} chaos commands found in the README's code blocks");
    // The commands the text names are commands.
    for (i, _) in text.match_indices("`chaos ") {
        let sub = text[i + 7..].split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap();
        let help = run(chaos().args([sub, "--help"]));
        assert_eq!(help.code, 0, "README names `chaos {sub}`, which is no command: {}", help.stderr);
    }
}

/// Splits a README command line as a shell would for the quoting the README
/// uses: double quotes keep one argument together (`--consumer "python3 x.py"`).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => (quoted, any) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

/// The counts the README and the measurements state of the README itself
/// stay true: "`--tables` lists all N" is the N of its own payments sample
/// runs' "X of N invariants hold", and the README's size in measurements.md is
/// within a kilobyte of its size today.
#[test]
fn the_readmes_counts_agree_with_its_samples_and_its_size() {
    let readme = readme();
    let number_before = |text: &str, marker: &str| -> Vec<u64> {
        text.match_indices(marker)
            .filter_map(|(at, _)| {
                let digits: String = text[..at]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_digit())
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                digits.parse().ok()
            })
            .collect()
    };
    let listed: Vec<u64> = readme
        .match_indices("lists all ")
        .filter_map(|(at, m)| readme[at + m.len()..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect();
    let sampled = number_before(&readme, " invariants hold");
    assert!(!listed.is_empty() && !sampled.is_empty(), "the README states no count: {listed:?} {sampled:?}");
    // The first two samples are the payments runs that sentence speaks of.
    assert!(
        sampled.iter().take(2).all(|n| listed == [*n]),
        "the README lists {listed:?} invariants; its payments samples show {sampled:?}"
    );
    let measurements = std::fs::read_to_string(root().join("docs/measurements.md")).unwrap();
    let row = measurements.lines().find(|l| l.starts_with("| the README | ")).expect("the README's size row");
    let kb: f64 = row["| the README | ".len()..].split(' ').next().unwrap().parse().expect("a size in KB");
    let actual = std::fs::read_to_string(root().join("README.md")).unwrap().len() as f64 / 1000.0;
    assert!((kb - actual).abs() <= 1.0, "docs/measurements.md says the README is {kb} KB; it is {actual:.1} KB");
}

/// The conventions of a CLI: a completion script bash accepts, naming every
/// subcommand, and a man page with them; a shell it does not know is a
/// usage error.
#[test]
fn completions_and_the_man_page_are_generated() {
    let bash = run(chaos().args(["completions", "bash"]));
    assert_eq!(bash.code, 0, "{}", bash.stderr);
    let man = run(chaos().arg("man"));
    assert_eq!(man.code, 0, "{}", man.stderr);
    assert!(man.stdout.starts_with(".ie") && man.stdout.contains(".TH chaos 1"), "{}", &man.stdout[..200]);
    for sub in ["run", "report", "sweep", "merge", "init", "selftest", "clean", "doctor", "bench", "schema"] {
        assert!(bash.stdout.contains(&format!("chaos__subcmd__{sub}")), "the completions lack {sub}");
        assert!(man.stdout.contains(&format!("chaos\\-{sub}")), "the man page lacks {sub}");
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("chaos.bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let syntax = std::process::Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(syntax.status.success(), "bash refuses the script: {}", String::from_utf8_lossy(&syntax.stderr));
    assert_eq!(run(chaos().args(["completions", "nosh"])).code, 2);
}
