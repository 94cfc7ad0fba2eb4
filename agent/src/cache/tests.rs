use super::*;

fn body(deadline: &str) -> String {
    format!(r#"{{"policy":{{"default_deadline":"{deadline}"}}}}"#)
}

fn store(cache: &DiskCache, revision: u64, body: &str) -> PathBuf {
    cache
        .store(revision, &policy::content_hash(body.as_bytes()), body, Timestamp::from_unix_ms(1_000))
        .unwrap()
}

fn reasons(report: &LoadReport) -> Vec<&'static str> {
    report.skipped.iter().map(CacheError::reason).collect()
}

#[test]
fn missing_directory_is_an_empty_cache_without_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let report = DiskCache::new(tmp.path(), "prod", "checkout").load();
    assert!(report.snapshot.is_none());
    assert!(report.skipped.is_empty());
}

#[test]
fn round_trip_keeps_body_hash_and_written_at() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(tmp.path(), "prod", "checkout");
    let path = store(&cache, 7, &body("700ms"));
    assert_eq!(path, tmp.path().join("prod/checkout/rev-00000000000000000007.json"));
    let snap = cache.load().snapshot.unwrap();
    assert_eq!(snap.revision, 7);
    assert_eq!(snap.body, body("700ms"));
    assert_eq!(snap.hash, policy::content_hash(body("700ms").as_bytes()));
    assert_eq!(snap.written_at, Timestamp::from_unix_ms(1_000));
    assert_eq!(snap.config.policy.default_deadline, Duration::from_millis(700));
}

#[test]
fn keeps_only_the_newest_three_generations() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(tmp.path(), "prod", "checkout");
    for rev in 1..=5 {
        store(&cache, rev, &body(&format!("{rev}00ms")));
    }
    let mut names: Vec<String> =
        fs::read_dir(cache.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "rev-00000000000000000003.json",
            "rev-00000000000000000004.json",
            "rev-00000000000000000005.json"
        ]
    );
    assert_eq!(cache.load().snapshot.unwrap().revision, 5);
}

/// CP-2: every kind of broken newest file is skipped with its own reason, and the newest
/// valid older generation is used.
#[test]
fn cp_2_each_broken_generation_is_skipped_with_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(tmp.path(), "prod", "checkout");
    store(&cache, 1, &body("100ms"));
    let dir = cache.dir().to_path_buf();
    let at = |rev: u64| dir.join(file_name(rev));

    // rev 2: body edited after writing (hash mismatch).
    let p2 = store(&cache, 2, &body("200ms"));
    let text = fs::read_to_string(&p2).unwrap().replace("200ms", "900ms");
    fs::write(&p2, text).unwrap();
    // rev 3: envelope of another service.
    let other = DiskCache::new(tmp.path(), "prod", "other");
    let p = store(&other, 3, &body("300ms"));
    fs::copy(&p, at(3)).unwrap();
    // rev 4: valid envelope whose body fails validation (reserve >= deadline).
    let bad = r#"{"policy":{"default_deadline":"10ms","reserve":"50ms"}}"#;
    let env = Envelope {
        schema_version: SCHEMA_VERSION,
        environment: "prod".into(),
        service: "checkout".into(),
        revision: 4,
        hash: policy::content_hash(bad.as_bytes()),
        written_at: Timestamp::from_unix_ms(0),
        body: bad.into(),
    };
    fs::write(at(4), serde_json::to_vec(&env).unwrap()).unwrap();
    // rev 5: an older schema version.
    let mut old = env.clone();
    old.schema_version = 0;
    old.revision = 5;
    fs::write(at(5), serde_json::to_vec(&old).unwrap()).unwrap();
    // rev 6: garbage bytes.
    fs::write(at(6), [0xff, 0x00, 0x13, 0x37]).unwrap();
    // rev 7: truncated mid-write (written elsewhere first: storing here would prune).
    let scratch = tempfile::tempdir().unwrap();
    let full =
        fs::read(store(&DiskCache::new(scratch.path(), "prod", "checkout"), 7, &body("700ms"))).unwrap();
    fs::write(at(7), &full[..full.len() / 2]).unwrap();

    let report = cache.load();
    assert_eq!(reasons(&report), vec!["malformed", "malformed", "schema", "invalid", "mismatch", "hash"]);
    let snap = report.snapshot.expect("generation 1 is valid");
    assert_eq!(snap.revision, 1);
    assert_eq!(snap.config.policy.default_deadline, Duration::from_millis(100));
}

#[test]
fn file_renamed_to_another_revision_is_a_mismatch() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(tmp.path(), "prod", "checkout");
    let p = store(&cache, 2, &body("200ms"));
    fs::rename(&p, cache.dir().join(file_name(9))).unwrap();
    let report = cache.load();
    assert_eq!(reasons(&report), vec!["mismatch"]);
    assert!(report.snapshot.is_none());
}

#[test]
fn unrelated_files_in_the_directory_are_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(tmp.path(), "prod", "checkout");
    store(&cache, 3, &body("300ms"));
    fs::write(cache.dir().join("notes.txt"), "hello").unwrap();
    fs::write(cache.dir().join("rev-12.json"), "{}").unwrap();
    fs::write(cache.dir().join(".tmp-abc"), "partial").unwrap();
    let report = cache.load();
    assert!(report.skipped.is_empty());
    assert_eq!(report.snapshot.unwrap().revision, 3);
}
