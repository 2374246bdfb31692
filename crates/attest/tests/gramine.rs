//! Gramine quote generation cannot run without SGX: its behaviour outside Gramine is tested, and
//! its locking against a stand-in for `/dev/attestation`.

use mbx_attest::{AttestError, Attester, GramineAttester};

#[test]
fn outside_gramine_reports_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let attester = GramineAttester::new(dir.path().join("collateral.json"))
        .with_attestation_dir(dir.path().join("attestation"));
    let err = attester.evidence(&[0; 64]).unwrap_err();
    assert!(
        matches!(err, AttestError::NotInsideGramine { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not inside Gramine"), "{err}");
    // Nothing was created where the pseudo-files would be.
    assert!(!dir.path().join("attestation").exists());
}

#[test]
fn default_location_is_dev_attestation() {
    // This machine has no Gramine: the real path reports the same error.
    if std::path::Path::new("/dev/attestation").exists() {
        return; // Inside Gramine after all; nothing to check here.
    }
    let err = GramineAttester::new("/nonexistent/collateral.json")
        .evidence(&[0; 64])
        .unwrap_err();
    assert!(
        matches!(&err, AttestError::NotInsideGramine { path } if path.starts_with("/dev/attestation")),
        "{err:?}"
    );
}

#[test]
fn non_dcap_attestation_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("attestation_type"), "none\n").unwrap();
    let err = GramineAttester::new(dir.path().join("collateral.json"))
        .with_attestation_dir(dir.path())
        .evidence(&[0; 64])
        .unwrap_err();
    assert!(
        matches!(&err, AttestError::UnsupportedAttestationType(t) if t == "none"),
        "{err:?}"
    );
}

/// A stand-in for Gramine's `/dev/attestation` with its one property that matters here: the quote
/// is made for the report_data written *last*, whoever wrote it. `user_report_data` and `quote`
/// are FIFOs served by two threads; a quote waits (up to a bound) for a second write, so two
/// sessions quoting at the same time would get each other's report_data unless the attester
/// lets only one at a time between its write and its read.
fn fake_gramine(dir: &std::path::Path) {
    use std::io::{Read, Write};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    std::fs::write(dir.join("attestation_type"), "dcap\n").unwrap();
    for fifo in ["user_report_data", "quote"] {
        let ok = std::process::Command::new("mkfifo")
            .arg(dir.join(fifo))
            .status()
            .unwrap();
        assert!(ok.success());
    }
    // Every report_data written so far, in order.
    let written = Arc::new((Mutex::new(Vec::<Vec<u8>>::new()), Condvar::new()));
    let (w, urd) = (written.clone(), dir.join("user_report_data"));
    std::thread::spawn(move || loop {
        let mut rd = Vec::new();
        std::fs::File::open(&urd)
            .unwrap()
            .read_to_end(&mut rd)
            .unwrap();
        w.0.lock().unwrap().push(rd);
        w.1.notify_all();
    });
    let quote = dir.join("quote");
    std::thread::spawn(move || {
        let (lock, cv) = &*written;
        let until = |n: usize| {
            let seen = lock.lock().unwrap();
            let bound = Duration::from_millis(500);
            let seen = cv
                .wait_timeout_while(seen, bound, |v| v.len() < n)
                .unwrap()
                .0;
            seen.last().cloned().unwrap_or_default()
        };
        for served in 0.. {
            // A quote is asked for after a write: the reader of the previous one is gone by
            // then (or a second writer would join its stream).
            until(served + 1);
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .open(&quote)
                .unwrap();
            let last = until(served + 2);
            let _ = out.write_all(&[b"quote for ".as_slice(), &last].concat());
        }
    });
}

#[test]
fn concurrent_sessions_each_get_a_quote_for_their_own_report_data() {
    let dir = tempfile::tempdir().unwrap();
    fake_gramine(dir.path());
    std::fs::write(dir.path().join("collateral.json"), "{}").unwrap();
    let attester =
        GramineAttester::new(dir.path().join("collateral.json")).with_attestation_dir(dir.path());
    let quotes: Vec<(u8, Vec<u8>)> = std::thread::scope(|s| {
        let sessions: Vec<_> = [1u8, 2]
            .into_iter()
            .map(|n| {
                let a = &attester;
                s.spawn(move || match a.evidence(&[n; 64]).unwrap() {
                    mbx_attest::Evidence::Dcap(d) => (n, d.quote().to_vec()),
                    other => panic!("{other:?}"),
                })
            })
            .collect();
        sessions.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (n, quote) in quotes {
        assert_eq!(
            quote,
            [b"quote for ".as_slice(), &[n; 64]].concat(),
            "session {n}"
        );
    }
}

#[test]
fn the_collateral_travels_compressed_and_follows_its_file() {
    let dir = tempfile::tempdir().unwrap();
    // Plain files: the quote is whatever the file holds.
    std::fs::write(dir.path().join("attestation_type"), "dcap\n").unwrap();
    std::fs::write(dir.path().join("user_report_data"), []).unwrap();
    std::fs::write(dir.path().join("quote"), b"quote").unwrap();
    let path = dir.path().join("collateral.json");
    let first = format!("{{\"tcbInfo\": \"{}\"}}", "ab".repeat(2000));
    std::fs::write(&path, &first).unwrap();
    let attester = GramineAttester::new(&path).with_attestation_dir(dir.path());
    let dcap = |a: &GramineAttester| match a.evidence(&[0; 64]).unwrap() {
        mbx_attest::Evidence::Dcap(d) => d,
        other => panic!("{other:?}"),
    };
    let ev = dcap(&attester);
    assert!(
        matches!(ev.collateral(), mbx_attest::Collateral::Deflated(z) if 10 * z.len() < first.len()),
        "{:?}",
        ev.collateral()
    );
    assert_eq!(ev.collateral_json().unwrap().as_ref(), first.as_bytes());
    assert_eq!(dcap(&attester.clone()).collateral(), ev.collateral());
    // A helper refreshed the file: the next evidence carries the new collateral.
    let second = first.replace("ab", "cd");
    std::fs::write(&path, &second).unwrap();
    assert_eq!(
        dcap(&attester).collateral_json().unwrap().as_ref(),
        second.as_bytes()
    );
}
