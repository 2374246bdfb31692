//! Quote generation through configfs-tsm cannot run without TDX: against stand-in report
//! entries (plain directories with its attribute files), the attester writes the report_data,
//! sends the quote it reads with the compressed collateral, refuses another provider or a write
//! by someone else in between, and says so when there is no configfs-tsm at all.

mod common;

use std::path::Path;

use mbx_attest::{
    AttestError, Attester, Collateral, DcapVerifier, Evidence, EvidenceKind, TsmAttester,
};

/// A stand-in report entry under `dir` answering with Intel's TDX sample quote.
fn entry(dir: &Path, provider: &str) -> std::path::PathBuf {
    let entry = dir.join("report").join("mbx-test");
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("provider"), format!("{provider}\n")).unwrap();
    std::fs::write(entry.join("generation"), "7\n").unwrap();
    std::fs::write(entry.join("inblob"), []).unwrap();
    std::fs::write(entry.join("outblob"), common::tdx().quote).unwrap();
    entry
}

#[test]
fn a_tdx_guest_quotes_its_report_data_and_sends_compressed_collateral() {
    let dir = tempfile::tempdir().unwrap();
    let entry = entry(dir.path(), "tdx_guest");
    let sample = common::tdx();
    let collateral = dir.path().join("collateral.json");
    std::fs::write(&collateral, &sample.collateral_json).unwrap();
    let attester = TsmAttester::new(&entry, &collateral).unwrap();
    assert!(attester.blocks());
    let ev = attester.evidence(&[0x42; 64]).unwrap();
    assert_eq!(ev.kind(), EvidenceKind::DcapDeflated);
    assert_eq!(std::fs::read(entry.join("inblob")).unwrap(), [0x42; 64]);
    let Evidence::Dcap(d) = ev else {
        unreachable!()
    };
    assert_eq!(d.quote(), sample.quote);
    assert!(matches!(d.collateral(), Collateral::Deflated(_)));
    // What it sends is what an endpoint checks: the sample verifies (at a time inside its
    // collateral's window, bound to its own report_data).
    let p = common::platform(common::tdx());
    DcapVerifier::new(0, 0)
        .verify_evidence(&d, &p.report_data, &p.policy, p.now)
        .unwrap();
    // An entry it did not make is left where it is.
    drop(attester);
    assert!(entry.exists());
}

#[test]
fn another_provider_or_another_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let collateral = dir.path().join("collateral.json");
    std::fs::write(&collateral, "{}").unwrap();
    let sev = entry(dir.path(), "sev_guest");
    let r = TsmAttester::new(&sev, &collateral)
        .unwrap()
        .evidence(&[0; 64]);
    assert!(
        matches!(&r, Err(AttestError::UnsupportedAttestationType(p)) if p == "sev_guest"),
        "{r:?}"
    );

    // `generation` and `outblob` as FIFOs, served in the order the attester reads them: 7, the
    // quote, then 8 (another write happened between ours and the quote). Each is opened only
    // once the attester has finished with the one before.
    let tdx = dir.path().join("report").join("mbx-test");
    std::fs::write(tdx.join("provider"), "tdx_guest\n").unwrap();
    for fifo in ["generation", "outblob"] {
        std::fs::remove_file(tdx.join(fifo)).unwrap();
        assert!(std::process::Command::new("mkfifo")
            .arg(tdx.join(fifo))
            .status()
            .unwrap()
            .success());
    }
    let (generation, outblob) = (tdx.join("generation"), tdx.join("outblob"));
    let served = std::thread::spawn(move || {
        std::fs::write(&generation, "7\n").unwrap();
        std::fs::write(&outblob, common::tdx().quote).unwrap();
        std::fs::write(&generation, "8\n").unwrap();
    });
    let r = TsmAttester::new(&tdx, &collateral)
        .unwrap()
        .evidence(&[0; 64]);
    served.join().unwrap();
    assert!(
        matches!(&r, Err(AttestError::Malformed(m)) if m.contains("someone else")),
        "{r:?}"
    );
}

#[test]
fn without_configfs_tsm_the_error_says_so_and_an_entry_it_made_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let r = TsmAttester::new(dir.path().join("no-tsm").join("mbx-1"), "c.json");
    assert!(matches!(r, Err(AttestError::NoTsmReports { .. })), "{r:?}");
    assert!(r.unwrap_err().to_string().contains("TDX guest"));
    // Where the report directory exists, the entry is made, and removed with the last
    // attester that uses it (a reload makes a second one while the first still serves).
    let made = dir.path().join("mbx-2");
    let attester = TsmAttester::new(&made, "c.json").unwrap();
    assert!(made.is_dir());
    let reloaded = TsmAttester::new(&made, "c.json").unwrap();
    drop(attester);
    assert!(made.is_dir());
    drop(reloaded);
    assert!(!made.exists());
    // This machine has no TDX: the default location reports the same.
    if !Path::new(mbx_attest::tsm::TSM_REPORT_DIR).exists() {
        let r = TsmAttester::new(TsmAttester::default_entry(), "c.json");
        assert!(matches!(r, Err(AttestError::NoTsmReports { .. })), "{r:?}");
    }
}
