//! The fuzz targets of `levee_server::fuzz` on stable, in CI: every target over a seed
//! corpus (the importers' real-world files, the docs' policies and manifests, hand-made
//! edge cases) and over seeded random inputs — arbitrary bytes and mutations of the seeds —
//! with proptest. No panic, and no input takes more than a bound. The same bodies run under
//! cargo-fuzz (`fuzz/`, nightly) for coverage-guided search; crashes it finds are added to
//! `tests/data/fuzz/<target>/` and so replayed here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use levee_server::fuzz::TARGETS;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Longest any single input may take (debug build, shared CI machine).
const PER_INPUT: Duration = Duration::from_secs(5);

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Seeds: the importers' corpus, the docs (policies and manifests are in their code
/// blocks; whole files exercise the error paths), crash reproducers, and edge cases.
fn seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for dir in ["tests/data/corpus", "tests/data/fuzz", "../docs"] {
        for f in files(&Path::new(ROOT).join(dir)) {
            if f.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&f).unwrap();
                // Each fenced block on its own, then the whole file.
                for block in text.split("```").skip(1).step_by(2) {
                    let body = block.split_once('\n').map(|(_, b)| b).unwrap_or(block);
                    out.push(body.as_bytes().to_vec());
                }
                out.push(text.into_bytes());
            } else if let Ok(bytes) = std::fs::read(&f) {
                out.push(bytes);
            }
        }
    }
    let edge: &[&[u8]] = &[
        b"",
        b"{}",
        b"null",
        b"[]",
        b"\xff\xfe\x00",
        b"{\"policy\":{\"dependencies\":{\"a\":{\"attempt_timeout\":\"99999999999999999999h\"}}}}",
        b"{\"policy\":{\"dependencies\":{\"a\":{\"attempt_timeout\":\"-1s\"}}}}",
        b"{\"flags\":{\"x\":{\"type\":\"float\",\"value\":1e400}}}",
        b"999999999999999999999999m",
        b"18446744073709551616",
        b"1n",
        b"0S",
        b"CRITICAL_PLUS",
        b"sheddable\x00",
        b"a: &a [*a, *a, *a, *a, *a, *a, *a, *a]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n",
        b"---\n---\n---\n",
        b"key: !!binary AAAA",
        b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    ];
    out.extend(edge.iter().map(|e| e.to_vec()));
    assert!(out.len() > 50, "the seed corpus was found: {} seeds", out.len());
    out
}

fn run(name: &str, target: fn(&[u8]), input: &[u8]) {
    let start = Instant::now();
    target(input);
    let took = start.elapsed();
    assert!(took < PER_INPUT, "{name} took {took:?} on an input of {} bytes", input.len());
}

#[test]
fn fuzz_targets_survive_the_seed_corpus() {
    let seeds = seeds();
    for (name, target) in TARGETS {
        for s in &seeds {
            run(name, *target, s);
        }
    }
}

/// Seeded, so a failure reproduces; `PROPTEST_CASES` raises the count locally.
fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    TestRunner::new_with_rng(
        Config { cases, failure_persistence: None, ..Config::default() },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    )
}

/// A seed with bytes replaced, inserted, removed or spliced from another seed.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    (0..n, 0..n, prop::collection::vec((any::<u8>(), any::<prop::sample::Index>(), 0u8..4), 1..16)).prop_map(
        move |(a, b, edits)| {
            let mut out = seeds[a].clone();
            for (byte, at, op) in edits {
                let i = if out.is_empty() { 0 } else { at.index(out.len()) };
                match op {
                    0 if !out.is_empty() => out[i] = byte,
                    1 => out.insert(i, byte),
                    2 if !out.is_empty() => {
                        out.remove(i);
                    }
                    _ => {
                        let other = &seeds[b];
                        let j = at.index(other.len().max(1)).min(other.len());
                        out.truncate(i);
                        out.extend_from_slice(&other[j..]);
                    }
                }
            }
            out
        },
    )
}

#[test]
fn fuzz_targets_survive_random_and_mutated_inputs() {
    let seeds = seeds();
    for (name, target) in TARGETS {
        let mut r = runner();
        r.run(&prop::collection::vec(any::<u8>(), 0..512), |input| {
            run(name, *target, &input);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name} on random bytes: {e}"));
        let mut r = runner();
        r.run(&mutated(seeds.clone()), |input| {
            run(name, *target, &input);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name} on a mutated seed: {e}"));
    }
}

/// The cargo-fuzz crate has one binary per target of `levee_server::fuzz::TARGETS`, each
/// calling the shared body, so the nightly and the stable runs fuzz the same code.
#[test]
fn cargo_fuzz_crate_has_every_target() {
    let toml = std::fs::read_to_string(Path::new(ROOT).join("../fuzz/Cargo.toml")).unwrap();
    let bins: Vec<&str> = toml
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .map(|n| n.trim_end_matches('"'))
        .filter(|n| *n != "levee-fuzz")
        .collect();
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(bins, names);
    let workspace = std::fs::read_to_string(Path::new(ROOT).join("../Cargo.toml")).unwrap();
    assert!(workspace.contains("exclude = [\"fuzz\"]"), "fuzz/ stays out of the workspace");
    for name in names {
        let src =
            std::fs::read_to_string(Path::new(ROOT).join(format!("../fuzz/fuzz_targets/{name}.rs"))).unwrap();
        assert!(src.contains("levee_server::fuzz::") && src.contains("fuzz_target!"), "{name}: {src}");
    }
}
